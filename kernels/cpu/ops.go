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
	return &ops{dev: d}, nil
}

// ops implements kernels.Ops on a Device. Activations are f32 tensors of the
// device, weights f32, bf16 or f16 (widened to f32 a row at a time).
type ops struct {
	dev *Device
}

// Embedding is out[i,:] = table[ids[i],:]: out [N,D] f32; table [V,D] any
// float type; ids [N] i32. A row whose id is out of range is zeroed and
// reported at Sync.
func (o *ops) Embedding(out, table, ids *kernels.Tensor) {
	const op = kernels.OpEmbedding
	om, tw, id := act(op, "out", out), weightArg(op, "table", table), ints(op, "ids", ids)
	check(len(id) == om.rows && tw.cols == om.cols, op, "out %v from table %v by ids %v", out, table, ids)
	parallel(len(id), grainFor(om.cols), func(lo, hi int) {
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
}

// RMSNorm is out = x / sqrt(mean(x²) + eps) · w per row: out, x [N,D] f32,
// pitched, out may be x; w [D].
func (o *ops) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	const op = kernels.OpRMSNorm
	om, xm, wv := act(op, "out", out), act(op, "x", x), weightArg(op, "w", w)
	check(om.rows == xm.rows && om.cols == xm.cols && wv.rows == 1 && wv.cols == xm.cols, op,
		"out %v = norm(x %v) · w %v", out, x, w)
	g := wv.vector()
	parallel(xm.rows, grainFor(xm.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			normRow(om.row(i), xm.row(i), g, eps)
		}
	})
}

// AddRMSNorm is resid += x, then out = RMSNorm(resid).
func (o *ops) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	const op = kernels.OpRMSNorm
	om, rm, xm, wv := act(op, "out", out), act(op, "resid", resid), act(op, "x", x), weightArg(op, "w", w)
	check(om.rows == xm.rows && rm.rows == xm.rows && om.cols == xm.cols && rm.cols == xm.cols &&
		wv.rows == 1 && wv.cols == xm.cols, op, "out %v = norm(resid %v += x %v) · w %v", out, resid, x, w)
	g := wv.vector()
	parallel(xm.rows, grainFor(xm.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			r := rm.row(i)
			for j, v := range xm.row(i) {
				r[j] += v
			}
			normRow(om.row(i), r, g, eps)
		}
	})
}

// normRow is out = x·rsqrt(mean(x²)+eps)·w, the mean taken in float64 and
// rounded to float32 like HF's f32 variance.
func normRow(out, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	variance := float32(ss / float64(len(x)))
	inv := float32(1 / math.Sqrt(float64(variance+eps)))
	w = w[:len(x)]
	out = out[:len(x)]
	for j, v := range x {
		out[j] = (v * inv) * w[j]
	}
}

// Add is out = a + b: all [N,D] f32; out may be a or b.
func (o *ops) Add(out, a, b *kernels.Tensor) {
	const op = kernels.OpAdd
	om, am, bm := act(op, "out", out), act(op, "a", a), act(op, "b", b)
	check(om.rows == am.rows && om.rows == bm.rows && om.cols == am.cols && om.cols == bm.cols, op,
		"out %v = a %v + b %v", out, a, b)
	parallel(om.rows, grainFor(om.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst, y := om.row(i), bm.row(i)
			for j, v := range am.row(i) {
				dst[j] = v + y[j]
			}
		}
	})
}

// RoPE rotates dims [offset, offset+r.Dim) of each head of every token of x
// in place by the angles of the token's position: pairs (2i, 2i+1) when
// r.Interleaved, else (i, i+Dim/2); x [T, ≥heads·headStride] f32, pitched;
// pos [T] i32; r.Cos, r.Sin [MaxPos, Dim/2] f32. A token whose position is
// outside the tables is left as it is and reported at Sync.
func (o *ops) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	const op = kernels.OpRoPE
	xm, ps := act(op, "x", x), ints(op, "pos", pos)
	cos, sin := act(op, "cos", r.Cos), act(op, "sin", r.Sin)
	half := r.Dim / 2
	check(r.Dim%2 == 0 && len(ps) == xm.rows && heads*headStride <= xm.cols && offset+r.Dim <= headStride &&
		cos.cols == half && sin.cols == half && sin.rows == cos.rows, op,
		"x %v, %d heads %d apart, dims [%d,%d), pos %v, tables %v", x, heads, headStride, offset, offset+r.Dim, pos, r.Cos)
	for t, p := range ps {
		if p < 0 || int(p) >= cos.rows {
			o.dev.fail("%s: position %d of token %d is outside the %d-position table", op, p, t, cos.rows)
		}
	}
	parallel(xm.rows, grainFor(heads*r.Dim), func(lo, hi int) {
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
					v[a] = x0*c[i] - x1*s[i]
					v[b] = x1*c[i] + x0*s[i]
				}
			}
		}
	})
}

// SwiGLU is out = silu(gate)·up with gate = gateUp[:, :I], up = gateUp[:, I:];
// out [N,I] f32; gateUp [N,2I] f32.
func (o *ops) SwiGLU(out, gateUp *kernels.Tensor) {
	const op = kernels.OpSwiGLU
	om, gm := act(op, "out", out), act(op, "gateUp", gateUp)
	check(om.rows == gm.rows && gm.cols == 2*om.cols, op, "out %v from gateUp %v", out, gateUp)
	parallel(om.rows, grainFor(om.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			swiglu(om.row(i), gm.row(i))
		}
	})
}

// swiglu is out[j] = silu(gu[j]) · gu[I+j] with I = len(out).
func swiglu(out, gu []float32) {
	n := len(out)
	g, u := gu[:n], gu[n:2*n]
	for j := range out {
		out[j] = silu(g[j]) * u[j]
	}
}

// silu is g·sigmoid(g) = g / (1 + e^-g).
func silu(g float32) float32 { return g / (1 + float32(math.Exp(float64(-g)))) }

// Argmax is out[b] = the lowest index of the largest element of logits row
// b: out [B] i32; logits [B,V] f32. NaNs are never the largest.
func (o *ops) Argmax(out, logits *kernels.Tensor) {
	const op = kernels.OpArgmax
	res, lm := ints(op, "out", out), act(op, "logits", logits)
	check(len(res) == lm.rows && lm.cols > 0, op, "out %v for logits %v", out, logits)
	parallel(lm.rows, grainFor(lm.cols), func(lo, hi int) {
		for b := lo; b < hi; b++ {
			res[b] = int32(argmax(lm.row(b)))
		}
	})
}

// argmax is the lowest index of the largest element of v; NaNs are never
// the largest, and a row of NaN or -inf gives 0.
func argmax(v []float32) int {
	best, arg := float32(math.Inf(-1)), 0
	for j, x := range v {
		if x > best {
			best, arg = x, j
		}
	}
	return arg
}
