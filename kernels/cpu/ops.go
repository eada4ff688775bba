package cpu

import (
	"fmt"
	"math"

	"github.com/fuselm/fuselm/kernels"
)

func init() {
	kernels.Register(kernels.SetInfo{Name: "cpu", Device: "cpu", New: New})
}

// New builds the cpu kernel set; dev must be a *Device.
func New(dev kernels.Device) (kernels.Ops, error) {
	d, ok := dev.(*Device)
	if !ok {
		return nil, fmt.Errorf("the cpu kernel set runs on the cpu device, not on %s", dev.Name())
	}
	return &ops{dev: d, act: d.act, bf16: d.act == kernels.BF16}, nil
}

// ops implements kernels.Ops on a Device. Activations are f32 tensors of the
// device, or bf16 ones on a device made so; weights are f32, bf16 or f16
// (widened to f32 a row at a time).
//
// Every op computes in float32. With bf16 activations it widens its inputs
// and rounds its outputs to bf16 (round to nearest even), and rounds in
// between where torch's eager bf16 path through HF's modeling code (Qwen2,
// DeepseekV2, on CUDA) does. Its results are then HF's bit for bit, except
// where an f32 value computed another way (a sum in another order, exp,
// cos) falls on the other side of a bf16 rounding boundary, or attention
// spans more keys than a fused kernel's block (see weightedSum):
//
//   - Linear: once, after the bias. An f32 out is not rounded: the router's
//     logits are f32 in HF too, the model's logits are not (lm_head returns
//     bf16), which differs from HF by that last rounding.
//   - RMSNorm: the normalised x before the multiply by w, then the product.
//     AddRMSNorm also rounds resid + x, which is the next norm's input;
//     AddAddRMSNorm rounds x + y (Add's sum) before it, then as AddRMSNorm.
//   - Add: the sum.
//   - RoPE with rotate_half pairs (Qwen2's apply_rotary_pos_emb in bf16):
//     cos and sin, each product and the sum; with interleaved pairs
//     (DeepSeek-V2's apply_rotary_emb, in f32): the result only.
//   - SwiGLU: silu(gate), then the product with up.
//   - LinearSwiGLU: gate and up (Linear's output), then as SwiGLU.
//   - RMSNormRoPE: as RMSNorm and RoPE, its parts.
//   - RoPEAttentionDecode: as RoPE and AttentionDecode, its parts.
//   - LinearAdd: the projection (Linear's output), then the sum (Add's).
//   - Attention: as torch's scaled_dot_product_attention on CUDA (HF's
//     default "sdpa"): scores, softmax and the weighted sum of values in
//     f32, the output rounded; where SDPA would run a fused kernel (flash,
//     memory-efficient or cuDNN: kernels.SDPAFused) the softmax numerators are
//     rounded too before they weigh the values, as those kernels do.
//   - MLA: k_nope = W_UK·c and v = W_UV·c (kv_b_proj's bf16 output, which
//     HF caches), then attention as above; so no absorbed form.
//     MLADecodeRoPE: as RMSNormRoPE and MLADecode, its parts.
//   - MoEExperts: each expert's gate/up and down projection and its SwiGLU
//     as above; the routing-weighted sum over a token's experts in f32, then
//     once (transformers' grouped_mm experts). MoERouted: as MoERoute then
//     MoEExperts.
//
// Embedding copies rows (rounding an f32 table); Argmax reads widened
// values; MoERoute is f32 as HF's router.
//
// AttentionPrefill also takes f16 operands (the contract allows them for
// the kernel benchmarks' fp16 rows): it then reads and writes f16 and
// computes in f32 throughout, p unrounded, as the reference the f16
// kernels are held against.
type ops struct {
	dev  *Device
	act  kernels.DType // the activations' type, which the views take besides f32
	bf16 bool          // act is bf16: round where HF's bf16 path rounds
}

// as is o for an op's operands of type dt (the device's activations, or
// the f16 of an f16 prefill): views take dt, and nothing is rounded to
// bf16 unless dt is bf16.
func (o *ops) as(dt kernels.DType) *ops { return &ops{dev: o.dev, act: dt, bf16: dt == kernels.BF16} }

// Embedding is out[i,:] = table[ids[i],:]: out [N,D] act; table [V,D] any
// float type; ids [N] i32. A row whose id is out of range is zeroed and
// reported at Sync.
func (o *ops) Embedding(out, table, ids *kernels.Tensor) {
	const op = kernels.OpEmbedding
	kernels.CheckEmbedding(o.dev.ActDType(), out, table, ids)
	om, commit := o.out(op, "out", out)
	tw, id := weightArg(op, "table", table), ints(op, "ids", ids)
	kernels.Parallel(len(id), grainFor(om.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst, v := om.row(i), id[i]
			if v < 0 || int(v) >= tw.rows {
				o.dev.fail("%s: token id %d at %d is outside the table's %d rows", op, v, i, tw.rows)
				clear(dst)
				continue
			}
			copy(dst, tw.row(int(v), dst))
		}
	})
	commit()
}

// RMSNorm is out = x / sqrt(mean(x²) + eps) · w per row: out, x [N,D] act,
// pitched, out may be x; w [D].
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	const op = kernels.OpRMSNorm
	kernels.CheckRMSNorm(o.dev.ActDType(), out, x, w)
	xm, wv := o.in(op, "x", x), weightArg(op, "w", w)
	om, commit := o.out(op, "out", out)
	g := wv.vector()
	kernels.Parallel(xm.rows, grainFor(xm.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			normRow(om.row(i), xm.row(i), g, eps, o.bf16)
		}
	})
	commit()
}

// AddRMSNorm is resid += x, then out = RMSNorm(resid).
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	kernels.CheckAddRMSNorm(o.dev.ActDType(), out, resid, x, w)
	o.addNorm(kernels.OpAddRMSNorm, out, resid, x, nil, w, eps)
}

// AddAddRMSNorm is resid += x + y, the sum rounded as Add rounds it
// before it is added, then out = RMSNorm(resid); x is left as it was.
func (o *ops) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	kernels.CheckAddAddRMSNorm(o.dev.ActDType(), out, resid, x, y, w)
	o.addNorm(kernels.OpAddAddRMSNorm, out, resid, x, y, w, eps)
}

// addNorm is op's residual add and norm, row by row: resid += x, or
// resid += bf16(x + y) where y is set, then resid rounded and out =
// RMSNorm(resid).
func (o *ops) addNorm(op kernels.Op, out, resid, x, y, w *kernels.Tensor, eps float32) {
	xm, wv := o.in(op, "x", x), weightArg(op, "w", w)
	var ym mat
	if y != nil {
		ym = o.in(op, "y", y)
	}
	rm, commitResid := o.inout(op, "resid", resid)
	om, commit := o.out(op, "out", out)
	g := wv.vector()
	kernels.Parallel(xm.rows, grainFor(xm.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			r := rm.row(i)
			if y == nil {
				for j, v := range xm.row(i) {
					r[j] += v
				}
			} else {
				b := ym.row(i)
				for j, v := range xm.row(i) {
					s := v + b[j]
					if o.bf16 {
						s = roundBF16(s)
					}
					r[j] += s
				}
			}
			o.round(r)
			normRow(om.row(i), r, g, eps, o.bf16)
		}
	})
	commitResid()
	commit()
}

// normRow is out = x·rsqrt(mean(x²)+eps)·w, the mean taken in float64 and
// rounded to float32 like HF's f32 variance. With bf16, x·rsqrt(...) is
// rounded to bf16 before the multiply by w, as HF's
// `self.weight * hidden_states.to(input_dtype)`.
func normRow(out, x, w []float32, eps float32, bf16 bool) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	variance := float32(ss / float64(len(x)))
	inv := float32(1 / math.Sqrt(float64(variance+eps)))
	w = w[:len(x)]
	out = out[:len(x)]
	for j, v := range x {
		h := v * inv
		if bf16 {
			h = roundBF16(h)
		}
		out[j] = h * w[j]
	}
}

// Add is out = a + b: all [N,D] act; out may be a or b.
func (o *ops) Add(out, a, b *kernels.Tensor) {
	const op = kernels.OpAdd
	kernels.CheckAdd(o.dev.ActDType(), out, a, b)
	am, bm := o.in(op, "a", a), o.in(op, "b", b)
	om, commit := o.out(op, "out", out)
	addRows(om, am, bm)
	commit()
}

// addRows writes out = a + b row by row, a's element first (Add's and
// LinearAdd's sum); out may be a or b.
func addRows(out, a, b mat) {
	kernels.Parallel(out.rows, grainFor(out.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst, y := out.row(i), b.row(i)
			for j, v := range a.row(i) {
				dst[j] = v + y[j]
			}
		}
	})
}

// RoPE rotates dims [offset, offset+r.Dim) of each head of every token of x
// in place by the angles of the token's position: pairs (2i, 2i+1) when
// r.Interleaved, else (i, i+Dim/2); x [T, ≥heads·headStride] act, pitched;
// pos [T] i32; r.Cos, r.Sin [MaxPos, Dim/2] f32. A token whose position is
// outside the tables is left as it is and reported at Sync.
//
// With bf16 activations, rotate_half pairs round as Qwen2's
// apply_rotary_pos_emb in bf16, q·cos + rotate_half(q)·sin with cos and sin
// cast to bf16: every product and sum; interleaved pairs rotate in f32 and
// round once, as DeepSeek-V2's apply_rotary_emb (x.float() times freqs_cis,
// then .type_as(x)).
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	const op = kernels.OpRoPE
	kernels.CheckRoPE(o.dev.ActDType(), x, heads, headStride, offset, pos, r)
	ps := ints(op, "pos", pos)
	xm, commit := o.inout(op, "x", x)
	cos, sin := floats(op, "cos", r.Cos), floats(op, "sin", r.Sin)
	halfBF16 := o.bf16 && !r.Interleaved
	half := r.Dim / 2
	for t, p := range ps {
		if p < 0 || int(p) >= cos.rows {
			o.dev.fail("%s: position %d of token %d is outside the %d-position table", op, p, t, cos.rows)
		}
	}
	kernels.Parallel(xm.rows, grainFor(heads*r.Dim), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			p := int(ps[t])
			if p < 0 || p >= cos.rows {
				continue
			}
			c, s, row := cos.row(p), sin.row(p), xm.row(t)
			for h := range heads {
				v := row[h*headStride+offset : h*headStride+offset+r.Dim]
				for i := range half {
					a, b := 2*i, 2*i+1
					if !r.Interleaved {
						a, b = i, i+half
					}
					x0, x1 := v[a], v[b]
					if halfBF16 {
						cb, sb := roundBF16(c[i]), roundBF16(s[i])
						v[a] = roundBF16(roundBF16(x0*cb) - roundBF16(x1*sb))
						v[b] = roundBF16(roundBF16(x1*cb) + roundBF16(x0*sb))
						continue
					}
					v[a] = x0*c[i] - x1*s[i]
					v[b] = x1*c[i] + x0*s[i]
				}
			}
		}
	})
	commit()
}

// RMSNormRoPE is RMSNorm of kv's latent in place, then RoPE of q's heads
// and of k_pe (kernels.RMSNormRoPEParts), rounded as those ops round.
func (o *ops) RMSNormRoPE(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRMSNormRoPE(o.dev.ActDType(), q, kv, w, heads, headStride, offset, pos, r)
	kernels.RMSNormRoPEParts(o, q, kv, w, eps, heads, headStride, offset, pos, r)
}

// RoPEAttentionDecode is RoPE of a.Q's and a.K's heads in place, then
// AttentionDecode (kernels.RoPEAttentionDecodeParts).
func (o *ops) RoPEAttentionDecode(a *kernels.AttnArgs, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckRoPEAttnDecode(o.dev.ActDType(), a, pos, r)
	kernels.RoPEAttentionDecodeParts(o, a, pos, r)
}

// SwiGLU is out = silu(gate)·up with gate = gateUp[:, :I], up = gateUp[:, I:];
// out [N,I] act; gateUp [N,2I] act.
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	const op = kernels.OpSwiGLU
	kernels.CheckSwiGLU(o.dev.ActDType(), out, gateUp)
	gm := o.in(op, "gateUp", gateUp)
	om, commit := o.out(op, "out", out)
	kernels.Parallel(om.rows, grainFor(om.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			swiglu(om.row(i), gm.row(i), o.bf16)
		}
	})
	commit()
}

// swiglu is out[j] = silu(gu[j]) · gu[I+j] with I = len(out); with bf16,
// silu's result is rounded to bf16 before the multiply, as HF's
// `act_fn(gate) * up` on bf16 tensors.
func swiglu(out, gu []float32, bf16 bool) {
	n := len(out)
	g, u := gu[:n], gu[n:2*n]
	for j := range out {
		s := silu(g[j])
		if bf16 {
			s = roundBF16(s)
		}
		out[j] = s * u[j]
	}
}

// silu is g·sigmoid(g) = g / (1 + e^-g).
func silu(g float32) float32 { return g / (1 + float32(math.Exp(float64(-g)))) }

// Argmax is out[b] = the lowest index of the largest element of logits row
// b: out [B] i32, or [B,2] with the element's value (f32 bits) beside it;
// logits [B,V] f32 or act. NaN counts as the largest.
func (o *ops) Argmax(out, logits *kernels.Tensor) {
	const op = kernels.OpArgmax
	kernels.CheckArgmax(o.dev.ActDType(), out, logits)
	res, lm := ints(op, "out", out), o.in(op, "logits", logits)
	stride := len(res) / lm.rows
	kernels.Parallel(lm.rows, grainFor(lm.cols), func(lo, hi int) {
		for b := lo; b < hi; b++ {
			row := lm.row(b)
			i := argmax(row)
			res[b*stride] = int32(i)
			if stride == 2 {
				res[b*stride+1] = int32(math.Float32bits(row[i]))
			}
		}
	})
}

// DecodeAdvance makes the next decode step's inputs from this step's
// choices: ids[b] = choice[b,0], past[b] += 1, pos[b] = past[b]. ids, pos,
// past [B] i32; choice [B,2] i32 (Argmax's out).
func (o *ops) DecodeAdvance(ids, pos, past, choice *kernels.Tensor) {
	const op = kernels.OpDecodeAdvance
	kernels.CheckDecodeAdvance(ids, pos, past, choice)
	id, p, n, c := ints(op, "ids", ids), ints(op, "pos", pos), ints(op, "past", past), ints(op, "choice", choice)
	for b := range n {
		id[b] = c[2*b]
		n[b]++
		p[b] = n[b]
	}
}

// argmax is the lowest index of the largest element of v, NaN counting as
// the largest (as torch.argmax); a row of -inf gives 0.
func argmax(v []float32) int {
	best, arg := float32(math.Inf(-1)), 0
	for j, x := range v {
		if x != x {
			return j
		}
		if x > best {
			best, arg = x, j
		}
	}
	return arg
}
