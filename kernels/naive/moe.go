package naive

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
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

// MoEExperts is HF's expert loop: each chosen expert's gate_up projection,
// SwiGLU and down projection over the tokens that chose it, and nothing for
// the experts nobody chose:
//
//  1. moe_count, moe_offsets and moe_assign sort the choices (t, k) by
//     expert on the device (expert e's rows of the sorted buffer are
//     [offsets[e], offsets[e+1])), and copy_rows gathers x[t] there;
//  2. gate_up projection, SwiGLU (silu, mul), down projection over those rows;
//  3. moe_combine sums each token's K rows weighted, in f32.
//
// The projections of a call of at most moeGraphTokens tokens are
// moe_expert_gemm, which reads the offsets on the device, so that a decode
// step runs inside a CUDA graph; larger calls (prefill) read the offsets back
// once (a sync, as HF's loop does) and make one cuBLAS GEMM per chosen expert.
// Either way each chosen expert's weights are read once per step (see
// moe_expert_gemm for steps of more than expertRows tokens).
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
	o.LaunchItems("iota_i32", int64(experts), counts, int32(experts), int32(0))
	o.LaunchItems("moe_count", int64(choices), counts, o.D.Ptr(idx), ip, int32(n), int32(k), int32(experts))
	o.Launch("moe_offsets", 1, 1, offsets, cursor, counts, int32(experts))
	slots := o.Scratch(scrMoESlot, kernels.I32, choices, 1)
	o.LaunchItems("moe_assign", int64(choices), slots.P, cursor, o.D.Ptr(idx), ip, int32(n), int32(k), int32(experts))
	xs := o.Scratch(scrMoEX, kernels.BF16, choices, hidden)
	o.CopyRows(xs, slots.P, o.Mat(x), 0, k, n, choices, hidden)

	h := o.Scratch(scrMoEH, kernels.BF16, choices, 2*inter)
	act := o.Scratch(scrMoEAct, kernels.BF16, choices, inter)
	ys := xs // the gathered tokens are spent once gate_up has read them
	gu, dn := o.Mat(gateUp), o.Mat(down)
	if n <= moeGraphTokens {
		o.expertGemm(h, xs, gu, offsets, experts, 2*inter, hidden)
		o.swiglu(act, h, choices, inter)
		o.expertGemm(ys, act, dn, offsets, experts, hidden, inter)
	} else {
		all, err := o.D.ReadI32(o.moeMeta)
		if err != nil {
			o.D.Fail(err)
			return
		}
		first := all[experts : 2*experts+1]
		o.GemmGroups(first, xs, gu, h, 2*inter, hidden)
		o.swiglu(act, h, choices, inter)
		o.GemmGroups(first, act, dn, ys, hidden, inter)
	}
	o.CombineRows(o.Mat(out), ys, slots.P, weight, n, k, hidden)
}

// MoERouted is the set's MoERoute then its MoEExperts over the routes.
// naive fuses nothing: a Dispatch runs the two as their own ops unless the
// spec names moe_routed itself.
func (o *ops) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	kernels.CheckMoERouted(o.D.ActDType(), out, idx, weight, x, logits, gateUp, down, r)
	o.MoERoute(idx, weight, logits, r)
	o.MoEExperts(out, x, idx, weight, gateUp, down)
}

// expertGemm is moe_expert_gemm: y = x·w[e]ᵀ over every expert's rows of the
// sorted x [rows, kk], y [rows, n], w [E, n, kk], offsets i32 [E+1] on the
// device.
func (o *ops) expertGemm(y, x, w cudaset.Mat, offsets uintptr, experts, n, kk int) {
	v := cudaset.VecFor(kk, x, w)
	cols := expertWarps * expertCols
	o.LaunchGrid(vname("moe_expert_gemm", v), cuda.Dim3{X: uint32((n + cols - 1) / cols), Y: uint32(experts), Z: 1},
		cuda.Dim3{X: 32 * expertWarps, Y: 1, Z: 1}, 0, y.P, int32(y.Pitch), x.P, w.P, offsets, int32(n), int32(kk))
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
