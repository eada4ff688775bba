package fused

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// RMSNorm is one pass of rms_norm: each row read once into registers.
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	kernels.CheckRMSNorm(o.D.ActDType(), out, x, w)
	o.norm(kernels.OpRMSNorm, "rms_norm", out, nil, x, w, eps)
}

// AddRMSNorm is one pass of add_rms_norm: the residual add, its f32 sum of
// squares and the scaling, each row read once and both results written once
// (naive makes three passes and five row reads).
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	kernels.CheckAddRMSNorm(o.D.ActDType(), out, resid, x, w)
	o.norm(kernels.OpAddRMSNorm, "add_rms_norm", out, resid, x, w, eps)
}

// norm launches kernel (rms_norm or add_rms_norm): one block per row, the
// fewest vector accesses per thread (NV) that let a block of at most
// maxNormThreads hold the row.
func (o *ops) norm(op kernels.Op, kernel string, out, resid, x, w *kernels.Tensor, eps float32) {
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
	v := cudaset.VecFor(cols, ms...)
	accesses := cols / v
	items := 0
	for _, nv := range normItems {
		if accesses <= maxNormThreads*nv {
			items = nv
			break
		}
	}
	o.Need(items > 0, op, "rows of %d elements: at most %d", cols, maxNormThreads*normItems[len(normItems)-1]*v)
	const warp = 32
	threads := max(warp, (accesses+items*warp-1)/(items*warp)*warp)
	o.Launch(normKernel(kernel, w.DType, v, items), n, threads,
		om.P, int32(om.Pitch), rm.P, int32(rm.Pitch), xm.P, int32(xm.Pitch), wm.P, int32(cols), eps)
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
	span := ropeVec // elements of one access
	if r.Interleaved {
		kernel, span = "rope_interleaved", 2*ropeVec
	}
	xp, cp := o.D.Ptr(x), o.D.Ptr(r.Cos)
	sp := o.D.Ptr(r.Sin)
	bf := kernels.BF16.Size()
	v := ropeVec
	if half%ropeVec != 0 || x.Pitch%span != 0 || headStride%span != 0 || offset%span != 0 ||
		xp%uintptr(span*bf) != 0 || r.Cos.Pitch%ropeVec != 0 || cp%16 != 0 || sp%16 != 0 {
		v = 1
	}
	o.Launch(vname(kernel, v), t, cudaset.ThreadsFor(heads*half/v),
		xp, int32(x.Pitch), int32(heads), int32(headStride), int32(offset), o.D.Ptr(pos),
		cp, sp, int32(r.Cos.Pitch), int32(r.Cos.Rows()), int32(r.Dim))
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
