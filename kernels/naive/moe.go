package naive

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// MoERoute is one block per token (moe_route).
func (o *ops) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpMoERoute
	kernels.CheckMoERoute(idx, weight, logits, r)
	n, experts, k := logits.Rows(), logits.Cols(), r.TopK
	o.Need(experts <= routeThreads, op, "%d experts, at most %d", experts, routeThreads)
	o.Need(k <= maxTopK, op, "top-%d, at most %d", k, maxTopK)
	limited := r.Method == kernels.RouteGroupLimited
	o.Launch("moe_route", n, routeThreads, o.D.Ptr(idx), int32(idx.Pitch), o.D.Ptr(weight), int32(weight.Pitch),
		o.D.Ptr(logits), int32(logits.Pitch), int32(experts), int32(k), b32(limited), int32(r.Groups),
		int32(r.TopKGroups), b32(r.NormTopK), r.Scale)
}

func b32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// MoEExperts is HF's expert loop made of GEMMs over tokens sorted by expert:
//
//  1. moe_assign gives every choice (t, k) a row of a sorted buffer, and
//     copy_rows gathers x[t] there;
//  2. gate_up GEMM, SwiGLU (silu, mul), down GEMM over those rows;
//  3. moe_combine sums each token's K rows weighted, in f32.
//
// With at most moeGraphTokens tokens nothing is read on the host: expert e's
// rows are [e*N, e*N+N) (an expert takes a token at most once) and each GEMM
// is one strided-batched call over all experts with N rows each, E×N rows of
// work of which N×K are real; rows no choice filled hold stale data that no
// output reads. Above that, moe_count and moe_offsets pack the rows and the
// counts are read back (a sync) for per-expert GEMMs of exact sizes.
func (o *ops) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	op := kernels.OpMoEExperts
	kernels.CheckMoEExperts(o.D.ActDType(), out, x, idx, weight, gateUp, down)
	o.Need(cudaset.IsBF16(gateUp) && cudaset.IsBF16(down), op, "expert weights %v, %v (bf16, as x for cuBLAS)", gateUp, down)
	n, hidden, k := x.Rows(), x.Cols(), idx.Cols()
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	if n == 0 {
		return
	}

	meta := o.moeMetaFor(experts)
	counts, offsets := meta.P, meta.Skip(int64(experts)).P
	cursor := meta.Skip(int64(2*experts + 1)).P
	choices := n * k
	ip := int32(idx.Pitch)
	padded := n <= moeGraphTokens
	rows := choices
	var first []int32 // exact layout: expert e's rows are [first[e], first[e+1])
	if padded {
		rows = experts * n
		o.LaunchItems("iota_i32", int64(experts), cursor, int32(experts), int32(n))
	} else {
		o.LaunchItems("iota_i32", int64(experts), counts, int32(experts), int32(0))
		o.LaunchItems("moe_count", int64(choices), counts, o.D.Ptr(idx), ip, int32(n), int32(k), int32(experts))
		o.Launch("moe_offsets", 1, 1, offsets, cursor, counts, int32(experts))
		all, err := o.D.ReadI32(o.moeMeta)
		if err != nil {
			o.D.Fail(err)
			return
		}
		first = all[experts : 2*experts+1]
	}
	slots := o.Scratch(scrMoESlot, kernels.I32, choices, 1)
	o.LaunchItems("moe_assign", int64(choices), slots.P, cursor, o.D.Ptr(idx), ip, int32(n), int32(k), int32(experts))
	xs := o.Scratch(scrMoEX, kernels.BF16, rows, hidden)
	o.CopyRows(xs, slots.P, o.Mat(x), 0, k, n, choices, hidden)

	h := o.Scratch(scrMoEH, kernels.BF16, rows, 2*inter)
	act := o.Scratch(scrMoEAct, kernels.BF16, rows, inter)
	ys := xs // the gathered tokens are spent once gate_up has read them
	gu, dn := o.Mat(gateUp), o.Mat(down)
	guSize, dnSize := int64(2*inter)*int64(hidden), int64(hidden)*int64(inter)
	if padded {
		o.GemmBatched(true, n, 2*inter, hidden, 1, xs, int64(n*hidden), gu, guSize, 0, h, int64(n*2*inter), experts)
		o.swiglu(act, h, rows, inter)
		o.GemmBatched(true, n, hidden, inter, 1, act, int64(n*inter), dn, dnSize, 0, ys, int64(n*hidden), experts)
	} else {
		for e := range experts {
			r0, m := int(first[e]), int(first[e+1]-first[e])
			o.Gemm(true, m, 2*inter, hidden, 1, xs.Sub(r0, 0), gu.Skip(int64(e)*guSize), 0, h.Sub(r0, 0))
		}
		o.swiglu(act, h, rows, inter)
		for e := range experts {
			r0, m := int(first[e]), int(first[e+1]-first[e])
			o.Gemm(true, m, hidden, inter, 1, act.Sub(r0, 0), dn.Skip(int64(e)*dnSize), 0, ys.Sub(r0, 0))
		}
	}
	om := o.Mat(out)
	v := cudaset.VecFor(hidden, om, ys)
	o.LaunchItems(vname("moe_combine", v), int64(n)*int64(hidden/v), om.P, int32(om.Pitch), ys.P, slots.P,
		o.D.Ptr(weight), int32(weight.Pitch), int32(n), int32(k), int32(hidden))
}

// moeMetaFor is the i32 device array [counts E | offsets E+1 | cursor E],
// allocated at the first MoE call (before any graph capture) and regrown for
// more experts.
func (o *ops) moeMetaFor(experts int) cudaset.Mat {
	size := 3*experts + 1
	if o.moeMeta == nil || o.moeMeta.Numel() != size {
		if o.moeMeta != nil {
			o.D.Free(o.moeMeta)
		}
		o.moeMeta = o.D.Alloc(kernels.I32, size)
	}
	return o.Mat(o.moeMeta)
}
