package naive

import (
	"github.com/fuselm/fuselm/kernels"
)

// MoERoute is one block per token (moe_route).
func (o *ops) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpMoERoute
	n, experts, k := logits.Rows(), logits.Cols(), r.TopK
	need(logits.DType == kernels.F32, op, "logits are %v", logits)
	need(experts <= routeThreads, op, "%d experts, at most %d", experts, routeThreads)
	need(k > 0 && k <= maxTopK && k <= experts, op, "top-%d of %d experts (at most %d)", k, experts, maxTopK)
	need(idx.DType == kernels.I32 && idx.Rows() == n && idx.Cols() == k, op, "idx %v for top-%d of %v", idx, k, logits)
	need(weight.DType == kernels.F32 && weight.Rows() == n && weight.Cols() == k, op, "weight %v for top-%d of %v",
		weight, k, logits)
	limited := r.Method == kernels.RouteGroupLimited
	need(!limited || (r.Groups > 0 && experts%r.Groups == 0 && r.TopKGroups > 0 && r.TopKGroups <= r.Groups), op,
		"%d experts in %d groups, top %d groups", experts, r.Groups, r.TopKGroups)
	o.launch("moe_route", n, routeThreads, o.d.Ptr(idx), int32(idx.Pitch), o.d.Ptr(weight), int32(weight.Pitch),
		o.d.Ptr(logits), int32(logits.Pitch), int32(experts), int32(k), b32(limited), int32(r.Groups),
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
	n, hidden, k := x.Rows(), x.Cols(), idx.Cols()
	need(isAct(x) && isAct(out) && out.Rows() == n && out.Cols() == hidden, op, "out %v, x %v", out, x)
	need(idx.DType == kernels.I32 && idx.Rows() == n && weight.DType == kernels.F32 && weight.Rows() == n &&
		weight.Cols() == k, op, "idx %v, weight %v for %d tokens", idx, weight, n)
	need(isAct(gateUp) && len(gateUp.Shape) == 3 && gateUp.Shape[2] == hidden && gateUp.Shape[1]%2 == 0, op,
		"gateUp %v for hidden size %d (bf16, as x for cuBLAS)", gateUp, hidden)
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	need(isAct(down) && len(down.Shape) == 3 && down.Shape[0] == experts && down.Shape[1] == hidden &&
		down.Shape[2] == inter, op, "down %v for gateUp %v", down, gateUp)
	need(gateUp.Packed() && down.Packed(), op, "expert weights must be packed")
	if n == 0 {
		return
	}

	meta := o.moeMetaFor(experts)
	counts, offsets := meta.p, meta.skip(int64(experts)).p
	cursor := meta.skip(int64(2*experts + 1)).p
	choices := n * k
	ip := int32(idx.Pitch)
	padded := n <= moeGraphTokens
	rows := choices
	var first []int32 // exact layout: expert e's rows are [first[e], first[e+1])
	if padded {
		rows = experts * n
		o.launchItems("iota_i32", int64(experts), cursor, int32(experts), int32(n))
	} else {
		o.launchItems("iota_i32", int64(experts), counts, int32(experts), int32(0))
		o.launchItems("moe_count", int64(choices), counts, o.d.Ptr(idx), ip, int32(n), int32(k), int32(experts))
		o.launch("moe_offsets", 1, 1, offsets, cursor, counts, int32(experts))
		all, err := o.d.ReadI32(o.moeMeta)
		if err != nil {
			o.d.Fail(err)
			return
		}
		first = all[experts : 2*experts+1]
	}
	slots := o.scratch(slotMoESlot, kernels.I32, choices, 1)
	o.launchItems("moe_assign", int64(choices), slots.p, cursor, o.d.Ptr(idx), ip, int32(n), int32(k), int32(experts))
	xs := o.scratch(slotMoEX, kernels.BF16, rows, hidden)
	o.copyRows(xs, slots.p, o.mat(x), 0, k, n, choices, hidden)

	h := o.scratch(slotMoEH, kernels.BF16, rows, 2*inter)
	act := o.scratch(slotMoEAct, kernels.BF16, rows, inter)
	ys := xs // the gathered tokens are spent once gate_up has read them
	gu, dn := o.mat(gateUp), o.mat(down)
	guSize, dnSize := int64(2*inter)*int64(hidden), int64(hidden)*int64(inter)
	if padded {
		o.gemmBatched(true, n, 2*inter, hidden, 1, xs, int64(n*hidden), gu, guSize, 0, h, int64(n*2*inter), experts)
		o.swiglu(act, h, rows, inter)
		o.gemmBatched(true, n, hidden, inter, 1, act, int64(n*inter), dn, dnSize, 0, ys, int64(n*hidden), experts)
	} else {
		for e := range experts {
			r0, m := int(first[e]), int(first[e+1]-first[e])
			o.gemm(true, m, 2*inter, hidden, 1, xs.sub(r0, 0), gu.skip(int64(e)*guSize), 0, h.sub(r0, 0))
		}
		o.swiglu(act, h, rows, inter)
		for e := range experts {
			r0, m := int(first[e]), int(first[e+1]-first[e])
			o.gemm(true, m, hidden, inter, 1, act.sub(r0, 0), dn.skip(int64(e)*dnSize), 0, ys.sub(r0, 0))
		}
	}
	om := o.mat(out)
	v := vecFor(hidden, om, ys)
	o.launchItems(vname("moe_combine", v), int64(n)*int64(hidden/v), om.p, int32(om.pitch), ys.p, slots.p,
		o.d.Ptr(weight), int32(weight.Pitch), int32(n), int32(k), int32(hidden))
}

// moeMetaFor is the i32 device array [counts E | offsets E+1 | cursor E],
// allocated at the first MoE call (before any graph capture) and regrown for
// more experts.
func (o *ops) moeMetaFor(experts int) mat {
	size := 3*experts + 1
	if o.moeMeta == nil || o.moeMeta.Numel() != size {
		if o.moeMeta != nil {
			o.d.Free(o.moeMeta)
		}
		o.moeMeta = o.d.Alloc(kernels.I32, size)
	}
	return o.mat(o.moeMeta)
}
