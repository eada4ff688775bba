package naive

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// Embedding gathers table rows with copy_rows (sidx = ids).
func (o *ops) Embedding(out, table, ids *kernels.Tensor) {
	kernels.CheckEmbedding(o.D.ActDType(), out, table, ids)
	n, dim := out.Rows(), out.Cols()
	o.CopyRows(o.Mat(out), 0, o.Mat(table), o.D.Ptr(ids), 1, table.Rows(), n, dim)
}

// Linear is one cuBLAS GEMM, out = x·wᵀ, as torch's addmm: with a bias, out
// is first filled with the bias rows and the GEMM adds to it (beta = 1);
// cudaset.Addmm, which fused runs too for the rows it leaves to cuBLAS.
func (o *ops) Linear(out, x, w, bias *kernels.Tensor) {
	kernels.CheckLinear(o.D.ActDType(), out, x, w, bias)
	o.Addmm(out, x, w, bias)
}

// RMSNorm is rms_rstd (a per-row reduction into a scratch rstd) then
// rms_scale (out = w · bf16(x·rstd)).
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	kernels.CheckRMSNorm(o.D.ActDType(), out, x, w)
	n, dim := x.Rows(), x.Cols()
	if n == 0 {
		return
	}
	xm, om, wm := o.Mat(x), o.Mat(out), o.Mat(w)
	rstd := o.Scratch(scrRstd, kernels.F32, n, 1)
	v := cudaset.VecFor(dim, xm, om, wm)
	o.Launch(vname("rms_rstd", v), n, cudaset.ThreadsFor(dim/v), rstd.P, xm.P, int32(xm.Pitch), int32(dim), eps)
	o.LaunchItems(rmsScaleKernel(w.DType, v), int64(n)*int64(dim/v),
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), rstd.P, wm.P, int32(n), int32(dim))
}

// AddRMSNorm is the add kernel (resid += x) then RMSNorm's two kernels.
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	kernels.CheckAddRMSNorm(o.D.ActDType(), out, resid, x, w)
	o.Add(resid, resid, x)
	o.RMSNorm(out, resid, w, eps)
}

// Add is one elementwise kernel.
func (o *ops) Add(out, a, b *kernels.Tensor) {
	kernels.CheckAdd(o.D.ActDType(), out, a, b)
	n, dim := out.Rows(), out.Cols()
	o.binary("add", o.Mat(out), o.Mat(a), o.Mat(b), n, dim)
}

// AddAddRMSNorm is the set's Add (x += y) then its AddRMSNorm: the
// launches eager torch makes for the MoE's routed + shared experts'
// outputs and the decoder layer's residual add and norm after it.
func (o *ops) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	kernels.CheckAddAddRMSNorm(o.D.ActDType(), out, resid, x, y, w)
	kernels.AddAddRMSNormParts(o, out, resid, x, y, w, eps)
}

// binary launches the elementwise kernel name ("add", "mul") over [rows, cols].
func (o *ops) binary(name string, out, a, b cudaset.Mat, rows, cols int) {
	v := cudaset.VecFor(cols, out, a, b)
	o.LaunchItems(vname(name, v), int64(rows)*int64(cols/v),
		out.P, int32(out.Pitch), a.P, int32(a.Pitch), b.P, int32(b.Pitch), int32(rows), int32(cols))
}

// RoPE is one in-place elementwise kernel over every rotated pair.
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRoPE(o.D.ActDType(), x, heads, headStride, offset, pos, r)
	t := x.Rows()
	cos, sin := r.Cos, r.Sin
	kernel := "rope_half"
	if r.Interleaved {
		kernel = "rope_interleaved"
	}
	o.LaunchItems(kernel, int64(t)*int64(heads)*int64(r.Dim/2),
		o.D.Ptr(x), int32(x.Pitch), int32(t), int32(heads), int32(headStride), int32(offset), o.D.Ptr(pos),
		o.D.Ptr(cos), o.D.Ptr(sin), int32(cos.Pitch), int32(cos.Rows()), int32(r.Dim))
}

// RMSNormRoPE is the set's RMSNorm of kv's latent, then its RoPE of q's
// heads and of k_pe: four launches, as HF's eager kv_a_layernorm and
// apply_rotary_emb launch theirs one by one.
func (o *ops) RMSNormRoPE(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRMSNormRoPE(o.D.ActDType(), q, kv, w, heads, headStride, offset, pos, r)
	kernels.RMSNormRoPEParts(o, q, kv, w, eps, heads, headStride, offset, pos, r)
}

// RoPEAttentionDecode is the set's RoPE of the q and k heads, then its
// AttentionDecode: the launches HF's eager apply_rotary_pos_emb and
// attention make one by one.
func (o *ops) RoPEAttentionDecode(a *kernels.AttnArgs, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRoPEAttnDecode(o.D.ActDType(), a, pos, r)
	kernels.RoPEAttentionDecodeParts(o, a, pos, r)
}

// SwiGLU is silu(gate) then the mul kernel, as torch eager: both round to
// bf16.
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	kernels.CheckSwiGLU(o.D.ActDType(), out, gateUp)
	n, inter := out.Rows(), out.Cols()
	o.swiglu(o.Mat(out), o.Mat(gateUp), n, inter)
}

// LinearSwiGLU is the set's Linear into a scratch [N, 2I] then its SwiGLU,
// as HF's eager gate_up projection and act_fn(gate) * up.
func (o *ops) LinearSwiGLU(out, x, w *kernels.Tensor) {
	kernels.CheckLinearSwiGLU(o.D.ActDType(), out, x, w)
	gateUp := o.ScratchTensor(scrGateUp, out.DType, x.Rows(), w.Rows())
	o.Linear(gateUp, x, w, nil)
	o.SwiGLU(out, gateUp)
}

// LinearAdd is the set's Linear into a scratch [N, M] then its Add of
// addend and it into out (which may be addend), as HF's eager projection
// and residual sum.
func (o *ops) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	kernels.CheckLinearAdd(o.D.ActDType(), out, x, w, bias, addend)
	lin := o.ScratchTensor(scrLinear, out.DType, x.Rows(), w.Rows())
	o.Linear(lin, x, w, bias)
	o.Add(out, addend, lin)
}

// swiglu is out = silu(gateUp[:, :inter]) · gateUp[:, inter:] over rows:
// silu writes out, mul multiplies it in place.
func (o *ops) swiglu(out, gateUp cudaset.Mat, rows, inter int) {
	up := gateUp.Sub(0, inter)
	v := cudaset.VecFor(inter, out, gateUp, up)
	o.LaunchItems(vname("silu", v), int64(rows)*int64(inter/v),
		out.P, int32(out.Pitch), gateUp.P, int32(gateUp.Pitch), int32(rows), int32(inter))
	o.binary("mul", out, out, up, rows, inter)
}

// Argmax is one block per row; out [B] or [B,2] (the value beside the index).
func (o *ops) Argmax(out, logits *kernels.Tensor) {
	kernels.CheckArgmax(o.D.ActDType(), out, logits)
	rows := logits.Rows()
	o.Launch(argmaxKernel(logits.DType), rows, argmaxThreads,
		o.D.Ptr(out), int32(out.Numel()/rows), o.D.Ptr(logits), int32(logits.Pitch), int32(logits.Cols()))
}

// DecodeAdvance is decode_advance, one thread a row: the next step's ids,
// positions and lengths made on the device from this step's choices.
func (o *ops) DecodeAdvance(ids, pos, past, choice *kernels.Tensor) {
	kernels.CheckDecodeAdvance(ids, pos, past, choice)
	rows := past.Numel()
	o.LaunchItems("decode_advance", int64(rows),
		o.D.Ptr(ids), o.D.Ptr(pos), o.D.Ptr(past), o.D.Ptr(choice), int32(rows))
}

// AddRMSNormLinear is the set's AddRMSNorm into h, then its Linear of h.
func (o *ops) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckAddRMSNormLinear(o.D.ActDType(), out, h, resid, x, norm, w, bias)
	kernels.AddRMSNormLinearParts(o, out, h, resid, x, norm, eps, w, bias)
}

// AddAddRMSNormLinear is the set's AddAddRMSNorm into h, then its Linear
// of h.
func (o *ops) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckAddAddRMSNormLinear(o.D.ActDType(), out, h, resid, x, y, norm, w, bias)
	kernels.AddAddRMSNormLinearParts(o, out, h, resid, x, y, norm, eps, w, bias)
}

// AddRMSNormLinearSwiGLU is the set's AddRMSNorm into h, then its
// LinearSwiGLU of h.
func (o *ops) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckAddRMSNormLinearSwiGLU(o.D.ActDType(), out, h, resid, x, norm, w)
	kernels.AddRMSNormLinearSwiGLUParts(o, out, h, resid, x, norm, eps, w)
}

// LinearAddRMSNormLinear is the set's Linear into mid, then its
// AddRMSNormLinear of mid.
func (o *ops) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinear(o.D.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w, bias)
	kernels.LinearAddRMSNormLinearParts(o, mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
}

// LinearAddRMSNormLinearSwiGLU is the set's Linear into mid, then its
// AddRMSNormLinearSwiGLU of mid.
func (o *ops) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinearSwiGLU(o.D.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w)
	kernels.LinearAddRMSNormLinearSwiGLUParts(o, mid, x, w0, bias0, out, h, resid, norm, eps, w)
}
