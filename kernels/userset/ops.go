package userset

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The launchers: each checks the op's contract (kernels.Check...), maps
// the op's arguments onto its ABI's parameters, in order, and launches the
// user's kernel on the grid and shared memory the manifest's expressions
// give for the call's sizes. A call the kernel cannot take (weights of
// another dtype than the manifest's, f16 attention) is declined: the
// fallback runs it.

// launch runs b with the sizes of one call and the ABI's arguments; an
// expression that cannot be evaluated, or a grid or shared memory out of
// the device's bounds, fails the device with a line naming the file and the
// op (reported at Sync).
func (o *ops) launch(b *bound, sizes map[string]int64, args ...any) {
	d := o.kit.D
	sizes["block"], sizes["sms"] = int64(b.spec.Block), int64(o.kit.SMs)
	fail := func(format string, a ...any) {
		d.Fail(fmt.Errorf("kernel set %s: %s (%s, entry %s): %s", o.set, b.op, b.path, b.spec.Entry, fmt.Sprintf(format, a...)))
	}
	var grid [3]int64
	for i := range grid {
		grid[i] = 1
	}
	for i, e := range b.grid {
		v, err := e.eval(sizes)
		if err != nil {
			fail("grid: %v", err)
			return
		}
		if v <= 0 { // an empty problem: nothing to launch
			return
		}
		grid[i] = v
	}
	if grid[0] > 1<<31-1 || grid[1] > 65535 || grid[2] > 65535 {
		fail("grid %dx%dx%d exceeds the device's (2³¹−1 × 65535 × 65535)", grid[0], grid[1], grid[2])
		return
	}
	shared, err := b.shared.eval(sizes)
	if err != nil {
		fail("shared: %v", err)
		return
	}
	if shared < 0 || int(shared)+b.static > o.kit.MaxShared {
		fail("%d bytes of dynamic shared memory (and %d static) exceed the %d a block may have", shared, b.static, o.kit.MaxShared)
		return
	}
	if int(shared) > b.optedInTo && shared > 48<<10 {
		if err := b.f.SetMaxDynamicShared(int(shared)); err != nil {
			fail("%v", err)
			return
		}
		b.optedInTo = int(shared)
	}
	d.Launch(b.f, cuda.Dim3{X: uint32(grid[0]), Y: uint32(grid[1]), Z: uint32(grid[2])},
		cuda.Dim3{X: uint32(b.spec.Block)}, int(shared), args...)
}

func (o *ops) ptr(t *kernels.Tensor) uintptr { return o.kit.D.Ptr(t) }

// declineWeights declines a call whose weights are not of the dtype the
// manifest says the kernel takes.
func (o *ops) declineWeights(b *bound, w *kernels.Tensor) {
	o.kit.Need(w.DType == b.wdt, b.op, "%s takes %s weights (its manifest), not %s", b.path, b.wdt, w.DType)
}

// RMSNorm: kernel(out, out_pitch, x, x_pitch, w, rows, cols, eps).
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	b := o.k[kernels.OpRMSNorm]
	if b == nil {
		o.NotOwned.RMSNorm(out, x, w, eps)
		return
	}
	kernels.CheckRMSNorm(o.kit.D.ActDType(), out, x, w)
	o.declineWeights(b, w)
	rows, cols := x.Rows(), x.Cols()
	o.launch(b, map[string]int64{"rows": int64(rows), "cols": int64(cols)},
		o.ptr(out), int32(out.Pitch), o.ptr(x), int32(x.Pitch), o.ptr(w), int32(rows), int32(cols), eps)
}

// AddRMSNorm: kernel(out, out_pitch, resid, resid_pitch, x, x_pitch, w,
// rows, cols, eps).
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	b := o.k[kernels.OpAddRMSNorm]
	if b == nil && o.residualAdd != nil {
		kernels.CheckAddRMSNorm(o.kit.D.ActDType(), out, resid, x, w)
		o.declineWeights(o.k[kernels.OpRMSNorm], w)
		rows, cols := resid.Rows(), resid.Cols()
		if n := int64(rows) * int64(cols); n > 0 {
			blocks := min((n+cudaset.BlockThreads-1)/cudaset.BlockThreads, int64(o.kit.SMs*cudaset.BlocksPerSM))
			o.kit.D.Launch(o.residualAdd, cuda.Dim3{X: uint32(blocks)}, cuda.Dim3{X: cudaset.BlockThreads}, 0,
				o.ptr(resid), int32(resid.Pitch), o.ptr(x), int32(x.Pitch), int32(rows), int32(cols))
		}
		o.RMSNorm(out, resid, w, eps)
		return
	}
	if b == nil {
		o.NotOwned.AddRMSNorm(out, resid, x, w, eps)
		return
	}
	kernels.CheckAddRMSNorm(o.kit.D.ActDType(), out, resid, x, w)
	o.declineWeights(b, w)
	rows, cols := resid.Rows(), resid.Cols()
	o.launch(b, map[string]int64{"rows": int64(rows), "cols": int64(cols)},
		o.ptr(out), int32(out.Pitch), o.ptr(resid), int32(resid.Pitch), o.ptr(x), int32(x.Pitch), o.ptr(w),
		int32(rows), int32(cols), eps)
}

// RoPE: kernel(x, pitch, tokens, heads, head_stride, offset, pos, cos, sin,
// cs_pitch, max_pos, dim, interleaved).
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	b := o.k[kernels.OpRoPE]
	if b == nil {
		o.NotOwned.RoPE(x, heads, headStride, offset, pos, r)
		return
	}
	kernels.CheckRoPE(o.kit.D.ActDType(), x, heads, headStride, offset, pos, r)
	t := x.Rows()
	inter := int32(0)
	if r.Interleaved {
		inter = 1
	}
	o.launch(b, map[string]int64{"tokens": int64(t), "heads": int64(heads), "dim": int64(r.Dim),
		"pairs": int64(t) * int64(heads) * int64(r.Dim/2)},
		o.ptr(x), int32(x.Pitch), int32(t), int32(heads), int32(headStride), int32(offset), o.ptr(pos),
		o.ptr(r.Cos), o.ptr(r.Sin), int32(r.Cos.Pitch), int32(r.Cos.Rows()), int32(r.Dim), inter)
}

// SwiGLU: kernel(out, out_pitch, gate_up, gate_up_pitch, rows, cols).
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	b := o.k[kernels.OpSwiGLU]
	if b == nil {
		o.NotOwned.SwiGLU(out, gateUp)
		return
	}
	kernels.CheckSwiGLU(o.kit.D.ActDType(), out, gateUp)
	rows, cols := out.Rows(), out.Cols()
	o.launch(b, map[string]int64{"rows": int64(rows), "cols": int64(cols)},
		o.ptr(out), int32(out.Pitch), o.ptr(gateUp), int32(gateUp.Pitch), int32(rows), int32(cols))
}

// AttentionPrefill appends the new keys and values to the cache (the row
// mover every set uses), then runs kernel(out, out_pitch, q, q_pitch,
// k_cache, v_cache, start, past, batch, heads, kv_heads, head_dim,
// max_seq, scale, causal).
func (o *ops) AttentionPrefill(a *kernels.AttnArgs) {
	b := o.k[kernels.OpAttnPrefill]
	if b == nil {
		o.NotOwned.AttentionPrefill(a)
		return
	}
	o.kit.Need(a.Q.DType == kernels.BF16, b.op, "the ABI's attention is bf16; q is %s", a.Q.DType)
	a.Check(b.op, o.kit.D.ActDType(), true)
	bt := a.Batch
	if bt.Tokens == 0 {
		return
	}
	o.kit.AppendKV(a.KCache, a.VCache, a.K, a.V, bt, a.KVHeads, a.HeadDim)
	var maxNew, maxKeys int
	for r := range bt.Rows {
		n := bt.Start[r+1] - bt.Start[r]
		maxNew, maxKeys = max(maxNew, n), max(maxKeys, bt.Past[r]+n)
	}
	causal := int32(1)
	if a.NonCausal {
		causal = 0
	}
	o.launch(b, map[string]int64{"batch": int64(bt.Rows), "tokens": int64(bt.Tokens), "heads": int64(a.Heads),
		"kv_heads": int64(a.KVHeads), "head_dim": int64(a.HeadDim), "max_seq": int64(bt.MaxSeq),
		"max_new": int64(maxNew), "max_keys": int64(maxKeys)},
		o.ptr(a.Out), int32(a.Out.Pitch), o.ptr(a.Q), int32(a.Q.Pitch), o.ptr(a.KCache), o.ptr(a.VCache),
		o.ptr(bt.StartDev), o.ptr(bt.PastDev), int32(bt.Rows), int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim),
		int32(bt.MaxSeq), a.Scale, causal)
}

// AttentionDecode appends the new keys and values, then runs kernel(out,
// out_pitch, q, q_pitch, k_cache, v_cache, past, batch, heads, kv_heads,
// head_dim, max_seq, scale). Nothing is read on the host but the shapes,
// so that a graph replays it with new lengths.
func (o *ops) AttentionDecode(a *kernels.AttnArgs) {
	b := o.k[kernels.OpAttnDecode]
	if b == nil {
		o.NotOwned.AttentionDecode(a)
		return
	}
	o.kit.Need(a.Q.DType == kernels.BF16, b.op, "the ABI's attention is bf16; q is %s", a.Q.DType)
	a.Check(b.op, o.kit.D.ActDType(), false)
	bt := a.Batch
	if bt.Rows == 0 {
		return
	}
	o.kit.AppendKV(a.KCache, a.VCache, a.K, a.V, bt, a.KVHeads, a.HeadDim)
	o.launch(b, map[string]int64{"batch": int64(bt.Rows), "heads": int64(a.Heads), "kv_heads": int64(a.KVHeads),
		"head_dim": int64(a.HeadDim), "max_seq": int64(bt.MaxSeq)},
		o.ptr(a.Out), int32(a.Out.Pitch), o.ptr(a.Q), int32(a.Q.Pitch), o.ptr(a.KCache), o.ptr(a.VCache),
		o.ptr(bt.PastDev), int32(bt.Rows), int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim), int32(bt.MaxSeq), a.Scale)
}
