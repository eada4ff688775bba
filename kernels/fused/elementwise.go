package fused

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// RMSNorm is one pass of rms_norm: each row read once into registers.
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	kernels.CheckRMSNorm(o.D.ActDType(), out, x, w)
	o.norm(kernels.OpRMSNorm, "rms_norm", out, nil, x, nil, w, eps)
}

// AddRMSNorm is one pass of add_rms_norm: the residual add, its f32 sum of
// squares and the scaling, each row read once and both results written once
// (naive makes three passes and five row reads).
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	kernels.CheckAddRMSNorm(o.D.ActDType(), out, resid, x, w)
	o.norm(kernels.OpAddRMSNorm, "add_rms_norm", out, resid, x, nil, w, eps)
}

// AddAddRMSNorm is add then add_rms_norm in one pass, add_add_rms_norm:
// each row's x + y rounded as add rounds it, then added into the residual
// and normalised as add_rms_norm does, one launch of a decode step's chain
// instead of two (the MoE's routed and shared outputs, then the next
// norm). It takes a row in add_rms_norm's shape for the vector width out,
// w and resid allow, so that it sums the squares as add_rms_norm sums
// them over the parts' sum in x; it declines where x or y is not aligned
// for that width (add_rms_norm would read x in narrower accesses and sum
// in another order), and the Dispatch runs add and add_rms_norm. It
// leaves x as it was.
func (o *ops) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	const op = kernels.OpAddAddRMSNorm
	kernels.CheckAddAddRMSNorm(o.D.ActDType(), out, resid, x, y, w)
	v, ok := o.addAddVec(out, resid, x, y, w)
	o.Need(ok, op, "x or y not aligned for the %d-wide accesses of out, w and resid: add and add_rms_norm run it", v)
	o.norm(op, "add_add_rms_norm", out, resid, x, y, w, eps)
}

// addAddVec is the access width add_add_rms_norm takes rows in, that of
// out, w and resid, and whether x and y allow it.
func (o *ops) addAddVec(out, resid, x, y, w *kernels.Tensor) (int, bool) {
	cols := x.Cols()
	v := cudaset.VecFor(cols, o.Mat(out), o.Mat(w), o.Mat(resid))
	return v, cudaset.VecFor(cols, o.Mat(x), o.Mat(y)) >= v
}

// addAddReleasing reports whether add_add_rms_norm has an instance that
// releases the kernel after it first (add_add_rms_norm_rf: bf16 weights,
// 16-byte accesses) for these operands, and takes them.
func (o *ops) addAddReleasing(out, resid, x, y, w *kernels.Tensor) bool {
	v, ok := o.addAddVec(out, resid, x, y, w)
	return ok && v == cudaset.VecWidth && w.DType == kernels.BF16 && normShapeOf(x.Cols(), o.Mat(out), o.Mat(w), o.Mat(resid), o.Mat(x), o.Mat(y)).items > 0
}

// norm launches kernel (rms_norm, add_rms_norm, or add_add_rms_norm where
// y is set): one block per row, as normShape shapes it.
func (o *ops) norm(op kernels.Op, kernel string, out, resid, x, y, w *kernels.Tensor, eps float32) {
	n, cols := x.Rows(), x.Cols()
	if n == 0 {
		return
	}
	om, xm, wm := o.Mat(out), o.Mat(x), o.Mat(w)
	ms := []cudaset.Mat{om, xm, wm}
	var rm cudaset.Mat
	if resid != nil {
		rm = o.Mat(resid)
		ms = append(ms, rm)
	}
	args := []any{om.P, int32(om.Pitch), rm.P, int32(rm.Pitch), xm.P, int32(xm.Pitch)}
	if y != nil {
		ym := o.Mat(y)
		ms = append(ms, ym)
		args = append(args, ym.P, int32(ym.Pitch))
	}
	ns := normShapeOf(cols, ms...)
	o.Need(ns.items > 0, op, "rows of %d elements: at most %d", cols, maxNormThreads*normItems[len(normItems)-1]*ns.vec)
	o.Launch(normKernel(kernel, w.DType, ns.vec, ns.items), n, ns.threads, append(args, wm.P, int32(cols), eps)...)
}

// normShape is how rms_norm takes a row: vec-wide accesses, items of them
// a thread (NV), threads a block. Its f32 sum of squares follows from it,
// so a kernel that normalises a row as rms_norm does (rms_norm_rope) takes
// the same shape.
type normShape struct{ vec, items, threads int }

// normShapeOf is rms_norm's shape for rows of cols elements of the
// matrices ms: the widest access every row start allows, and the fewest
// accesses a thread (NV) that let a block of at most maxNormThreads hold
// the row; items is 0 where none does.
func normShapeOf(cols int, ms ...cudaset.Mat) normShape {
	v := cudaset.VecFor(cols, ms...)
	accesses := cols / v
	for _, nv := range normItems {
		if accesses <= maxNormThreads*nv {
			const warp = 32
			return normShape{vec: v, items: nv, threads: max(warp, (accesses+nv*warp-1)/(nv*warp)*warp)}
		}
	}
	return normShape{vec: v}
}

// RoPE is one block per token rotating all its heads in place, ropeVec
// pairs per thread where the rows allow 8- or 16-byte accesses.
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRoPE(o.D.ActDType(), x, heads, headStride, offset, pos, r)
	t, half := x.Rows(), r.Dim/2
	if t == 0 || heads == 0 {
		return
	}
	kernel := "rope_half"
	if r.Interleaved {
		kernel = "rope_interleaved"
	}
	v := o.ropeVecFor(x, headStride, offset, r)
	o.Launch(vname(kernel, v), t, cudaset.ThreadsFor(heads*half/v),
		o.D.Ptr(x), int32(x.Pitch), int32(heads), int32(headStride), int32(offset), o.D.Ptr(pos),
		o.D.Ptr(r.Cos), o.D.Ptr(r.Sin), int32(r.Cos.Pitch), int32(r.Cos.Rows()), int32(r.Dim))
}

// ropeVecFor is the pairs a thread of rope rotates in x's heads, headStride
// apart and rotated from offset: ropeVec where every access of them and of
// the tables is 8- or 16-byte aligned, else 1.
func (o *ops) ropeVecFor(x *kernels.Tensor, headStride, offset int, r *kernels.Rope) int {
	span := ropeVec // elements of one access
	if r.Interleaved {
		span = 2 * ropeVec
	}
	bf := kernels.BF16.Size()
	if r.Dim/2%ropeVec != 0 || x.Pitch%span != 0 || headStride%span != 0 || offset%span != 0 ||
		o.D.Ptr(x)%uintptr(span*bf) != 0 || r.Cos.Pitch%ropeVec != 0 || o.D.Ptr(r.Cos)%16 != 0 || o.D.Ptr(r.Sin)%16 != 0 {
		return 1
	}
	return ropeVec
}

// RMSNormRoPE is MLA's kv_a_layernorm and both ropes in one launch of
// rms_norm_rope (a block a token's kv row, one its q row) instead of three:
// each is a dependent hop of a decode step's chain of overlapped launches,
// and the three move a few KB. It runs only where rms_norm would take the
// latent in one 16-byte access a thread (rmsNormRopeShape) and rope would
// take ropeVec pairs a thread in q and in k_pe, so that its results are
// the three launches' bit for bit; it declines other calls, and the
// Dispatch runs rms_norm and rope.
func (o *ops) RMSNormRoPE(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRMSNormRoPE(o.D.ActDType(), q, kv, w, heads, headStride, offset, pos, r)
	ns, threads := o.normRopeTakes(kernels.OpRMSNormRoPE, q, kv, w, headStride, offset, heads, r)
	t := kv.Rows()
	if t == 0 {
		return
	}
	o.LaunchGrid(rmsNormRopeKernel(r.Interleaved, w.DType), cuda.Dim3{X: uint32(t), Y: 2}, cuda.Dim3{X: uint32(threads)}, 0,
		o.normRopeArgs(q, kv, w, eps, heads, headStride, offset, pos, r, ns)...)
}

// normRopeTakes is rms_norm_rope's shape for the call: rms_norm's shape for
// the latent (normT, the threads its sum runs over) and the block's
// threads. It declines (for op) a call rms_norm would not take in one
// 16-byte access a thread or rope in ropeVec pairs a thread, where
// rms_norm_rope's results would not be the parts' bit for bit.
func (o *ops) normRopeTakes(op kernels.Op, q, kv, w *kernels.Tensor, headStride, offset, heads int, r *kernels.Rope) (normShape, int) {
	rank := w.Numel()
	kvm := o.Mat(kv)
	ns := normShapeOf(rank, kvm, kvm, o.Mat(w))
	o.Need(ns.vec == rmsNormRopeShape.vec && ns.items == rmsNormRopeShape.items, op,
		"a latent of %d that rms_norm takes in %d-wide accesses, %d a thread: rms_norm and rope run it", rank, ns.vec, ns.items)
	o.Need(o.ropeVecFor(q, headStride, offset, r) == ropeVec && o.ropeVecFor(kv, kv.Cols(), rank, r) == ropeVec, op,
		"q's or k_pe's rope dims not aligned for %d pairs a thread: rms_norm and rope run them", ropeVec)
	return ns, max(ns.threads, cudaset.ThreadsFor(heads*r.Dim/2/ropeVec))
}

// normRopeArgs are rms_norm_rope's arguments from q to dim (norm_rope.cuh),
// with normT from ns.
func (o *ops) normRopeArgs(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor,
	r *kernels.Rope, ns normShape) []any {
	return []any{o.D.Ptr(q), int32(q.Pitch), int32(heads), int32(headStride), int32(offset), o.D.Ptr(kv), int32(kv.Pitch),
		o.D.Ptr(w), int32(w.Numel()), eps, int32(ns.threads), o.D.Ptr(pos),
		o.D.Ptr(r.Cos), o.D.Ptr(r.Sin), int32(r.Cos.Pitch), int32(r.Cos.Rows()), int32(r.Dim)}
}

// SwiGLU is one vectorized pass of swiglu.
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	kernels.CheckSwiGLU(o.D.ActDType(), out, gateUp)
	o.swiglu(o.Mat(out), o.Mat(gateUp), out.Rows(), out.Cols())
}

// swiglu launches swiglu over rows of inter outputs: out = silu(gu[:, :inter])
// · gu[:, inter:].
func (o *ops) swiglu(out, gu cudaset.Mat, rows, inter int) {
	v := cudaset.VecFor(inter, out, gu, gu.Sub(0, inter))
	o.LaunchItems(vname("swiglu", v), int64(rows)*int64(inter/v), out.P, int32(out.Pitch), gu.P, int32(gu.Pitch),
		int32(rows), int32(inter))
}

// Add is out = a + b in one pass, launched to overlap the kernel before it;
// the arithmetic is naive's.
func (o *ops) Add(out, a, b *kernels.Tensor) {
	kernels.CheckAdd(o.D.ActDType(), out, a, b)
	rows, cols := out.Rows(), out.Cols()
	om, am, bm := o.Mat(out), o.Mat(a), o.Mat(b)
	v := cudaset.VecFor(cols, om, am, bm)
	o.LaunchItems(vname("add", v), int64(rows)*int64(cols/v),
		om.P, int32(om.Pitch), am.P, int32(am.Pitch), bm.P, int32(bm.Pitch), int32(rows), int32(cols))
}

// argmaxChunk and argmaxThreads are elementwise.cu's ARGMAX_CHUNK, the
// columns of one block of argmax_split, and ARGMAX_THREADS; argmaxMaxRows
// is the most rows one call takes: its counters are allocated once, with
// the set, so that no launch allocates or clears anything and a captured
// graph replays it.
const (
	argmaxChunk   = 4096
	argmaxThreads = 256
	argmaxMaxRows = 4096
)

// Argmax is argmax_split: each row cut into blocks of argmaxChunk columns
// over the SMs, the row's last block reducing theirs in the same launch
// (naive's one block a row reads a vocabulary at a fraction of the memory's
// rate).
func (o *ops) Argmax(out, logits *kernels.Tensor) {
	kernels.CheckArgmax(o.D.ActDType(), out, logits)
	rows, cols := logits.Rows(), logits.Cols()
	o.Need(rows <= argmaxMaxRows, kernels.OpArgmax, "%d rows: argmax_split counts the finished blocks of at most %d (naive runs more)",
		rows, argmaxMaxRows)
	if rows == 0 {
		return
	}
	splits := (cols + argmaxChunk - 1) / argmaxChunk
	part := o.Scratch("argmax.part", kernels.I32, rows*splits, 2)
	o.LaunchGrid(argmaxKernel(logits.DType), cuda.Dim3{X: uint32(splits), Y: uint32(rows)},
		cuda.Dim3{X: argmaxThreads}, 0,
		o.D.Ptr(out), int32(out.Numel()/rows), o.D.Ptr(logits), int32(logits.Pitch), int32(cols), part.P,
		o.D.Ptr(o.argmaxCounters))
}
