package naive

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
)

// Embedding gathers table rows with copy_rows (sidx = ids).
func (o *ops) Embedding(out, table, ids *kernels.Tensor) {
	n, dim := out.Rows(), out.Cols()
	need(out.DType == kernels.BF16 || out.DType == kernels.F32, kernels.OpEmbedding, "out is %v", out)
	need(isFloat(table) && table.Cols() == dim, kernels.OpEmbedding, "table %v for out %v", table, out)
	need(ids.DType == kernels.I32 && ids.Packed() && ids.Numel() == n, kernels.OpEmbedding, "ids %v for out %v", ids, out)
	o.copyRows(o.mat(out), 0, o.mat(table), o.d.Ptr(ids), 1, table.Rows(), n, dim)
}

// copyRows launches copy_rows: dst[didx[r] or r] = src[sidx[r] or r/sdiv]
// for r < rows (index pointers 0 when absent).
func (o *ops) copyRows(dst mat, didx uintptr, src mat, sidx uintptr, sdiv, srows, rows, cols int) {
	v := vecFor(cols, dst, src)
	o.launchItems(fmt.Sprintf("copy_rows_%s_%s_v%d", dst.dt, src.dt, v), int64(rows)*int64(cols/v),
		dst.p, int32(dst.pitch), didx, src.p, int32(src.pitch), sidx, int32(sdiv), int32(srows), int32(rows), int32(cols))
}

// Linear is one cuBLAS GEMM, out = x·wᵀ, as torch's addmm: with a bias, out
// is first filled with the bias rows and the GEMM adds to it (beta = 1).
func (o *ops) Linear(out, x, w, bias *kernels.Tensor) {
	n, k, m := x.Rows(), x.Cols(), w.Rows()
	need(isAct(x), kernels.OpLinear, "x is %v", x)
	need(isAct(w) && w.Cols() == k, kernels.OpLinear, "w %v for x %v (cuBLAS multiplies bf16 by bf16)", w, x)
	need((isAct(out) || out.DType == kernels.F32) && out.Rows() == n && out.Cols() == m, kernels.OpLinear,
		"out %v for x %v, w %v", out, x, w)
	beta := float32(0)
	if bias != nil {
		need(isFloat(bias) && bias.Numel() == m, kernels.OpLinear, "bias %v for w %v", bias, w)
		b := o.mat(bias)
		b.pitch = 0 // every row reads the bias
		o.copyRows(o.mat(out), 0, b, 0, 1, 1, n, m)
		beta = 1
	}
	o.gemm(true, n, m, k, 1, o.mat(x), o.mat(w), beta, o.mat(out))
}

// RMSNorm is rms_rstd (a per-row reduction into a scratch rstd) then
// rms_scale (out = w · bf16(x·rstd)).
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	n, dim := x.Rows(), x.Cols()
	need(isAct(x) && isAct(out) && out.Rows() == n && out.Cols() == dim, kernels.OpRMSNorm, "out %v, x %v", out, x)
	need(isFloat(w) && w.Numel() == dim, kernels.OpRMSNorm, "w %v for x %v", w, x)
	if n == 0 {
		return
	}
	xm, om, wm := o.mat(x), o.mat(out), o.mat(w)
	rstd := o.scratch(slotRstd, kernels.F32, n, 1)
	v := vecFor(dim, xm, om, wm)
	o.launch(vname("rms_rstd", v), n, threadsFor(dim/v), rstd.p, xm.p, int32(xm.pitch), int32(dim), eps)
	o.launchItems(fmt.Sprintf("rms_scale_%s_v%d", w.DType, v), int64(n)*int64(dim/v),
		om.p, int32(om.pitch), xm.p, int32(xm.pitch), rstd.p, wm.p, int32(n), int32(dim))
}

// AddRMSNorm is the add kernel (resid += x) then RMSNorm's two kernels.
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	o.Add(resid, resid, x)
	o.RMSNorm(out, resid, w, eps)
}

// Add is one elementwise kernel.
func (o *ops) Add(out, a, b *kernels.Tensor) {
	n, dim := out.Rows(), out.Cols()
	for _, t := range []*kernels.Tensor{out, a, b} {
		need(isAct(t) && t.Rows() == n && t.Cols() == dim, kernels.OpAdd, "out %v, a %v, b %v", out, a, b)
	}
	o.binary("add", o.mat(out), o.mat(a), o.mat(b), n, dim)
}

// binary launches the elementwise kernel name ("add", "mul") over [rows, cols].
func (o *ops) binary(name string, out, a, b mat, rows, cols int) {
	v := vecFor(cols, out, a, b)
	o.launchItems(vname(name, v), int64(rows)*int64(cols/v),
		out.p, int32(out.pitch), a.p, int32(a.pitch), b.p, int32(b.pitch), int32(rows), int32(cols))
}

// RoPE is one in-place elementwise kernel over every rotated pair.
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	t := x.Rows()
	need(isAct(x), kernels.OpRoPE, "x is %v", x)
	need(r.Dim > 0 && r.Dim%2 == 0, kernels.OpRoPE, "rotated dims %d", r.Dim)
	need(heads >= 0 && offset >= 0 && (heads == 0 || (heads-1)*headStride+offset+r.Dim <= x.Cols()), kernels.OpRoPE,
		"%d heads of stride %d rotated at [%d,%d) overflow x %v", heads, headStride, offset, offset+r.Dim, x)
	need(pos.DType == kernels.I32 && pos.Packed() && pos.Numel() == t, kernels.OpRoPE, "pos %v for x %v", pos, x)
	cos, sin := r.Cos, r.Sin
	need(cos.DType == kernels.F32 && sin.DType == kernels.F32 && cos.Cols() >= r.Dim/2 &&
		cos.Pitch == sin.Pitch && cos.Rows() == sin.Rows(), kernels.OpRoPE, "tables cos %v, sin %v for %d dims", cos, sin, r.Dim)
	kernel := "rope_half"
	if r.Interleaved {
		kernel = "rope_interleaved"
	}
	o.launchItems(kernel, int64(t)*int64(heads)*int64(r.Dim/2),
		o.d.Ptr(x), int32(x.Pitch), int32(t), int32(heads), int32(headStride), int32(offset), o.d.Ptr(pos),
		o.d.Ptr(cos), o.d.Ptr(sin), int32(cos.Pitch), int32(cos.Rows()), int32(r.Dim))
}

// SwiGLU is silu(gate) then the mul kernel, as torch eager: both round to
// bf16.
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	n, inter := out.Rows(), out.Cols()
	need(isAct(out) && isAct(gateUp) && gateUp.Rows() == n && gateUp.Cols() == 2*inter, kernels.OpSwiGLU,
		"out %v, gateUp %v", out, gateUp)
	o.swiglu(o.mat(out), o.mat(gateUp), n, inter)
}

// swiglu is out = silu(gateUp[:, :inter]) · gateUp[:, inter:] over rows:
// silu writes out, mul multiplies it in place.
func (o *ops) swiglu(out, gateUp mat, rows, inter int) {
	up := gateUp.sub(0, inter)
	v := vecFor(inter, out, gateUp, up)
	o.launchItems(vname("silu", v), int64(rows)*int64(inter/v),
		out.p, int32(out.pitch), gateUp.p, int32(gateUp.pitch), int32(rows), int32(inter))
	o.binary("mul", out, out, up, rows, inter)
}

// Argmax is one block per row.
func (o *ops) Argmax(out, logits *kernels.Tensor) {
	rows := logits.Rows()
	need(logits.DType == kernels.F32 || logits.DType == kernels.BF16, kernels.OpArgmax, "logits are %v", logits)
	need(out.DType == kernels.I32 && out.Packed() && out.Numel() == rows, kernels.OpArgmax, "out %v for logits %v", out, logits)
	o.launch("argmax_"+logits.DType.String(), rows, argmaxThreads,
		o.d.Ptr(out), o.d.Ptr(logits), int32(logits.Pitch), int32(logits.Cols()))
}
