package cpu_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// The tests of bf16 activations check each op's rounding points: on
// hand-worked values where a tie or a rounding shows which way the op went,
// and otherwise against the f32 device's own arithmetic rounded where the
// op's comment says. Every expected value is exact, so the comparisons are
// too.

// bf16 is x rounded to the nearest bfloat16, ties to even.
func bf16(x float64) float64 { return roundTo64(x, 7, -126) }

// assertExact fails at the first element of got that is not want's.
func assertExact(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
			return
		}
	}
}

// differs fails the test when the rounding model under test (want) agrees
// everywhere with an alternative one: then the case tells them apart nowhere.
func differs(t *testing.T, what string, want, other []float64) {
	t.Helper()
	if slices.Equal(want, other) {
		t.Errorf("%s: the case does not tell the rounding points apart", what)
	}
}

func TestNewDeviceAct(t *testing.T) {
	for _, c := range []struct {
		dt   kernels.DType
		ok   bool
		name string
	}{{kernels.F32, true, "threads)"}, {kernels.BF16, true, "bf16 activations)"}, {kernels.F16, false, ""}, {kernels.I32, false, ""}} {
		dev, err := cpu.NewDeviceAct(c.dt)
		if !c.ok {
			if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") {
				t.Errorf("%s activations: error %v", c.dt, err)
			}
			continue
		}
		if err != nil || dev.ActDType() != c.dt || !strings.HasSuffix(dev.Name(), c.name) {
			t.Errorf("%s activations: %v, act %s, name %q", c.dt, err, dev.ActDType(), dev.Name())
		}
	}
	if dt := cpu.NewDevice().ActDType(); dt != kernels.F32 {
		t.Errorf("NewDevice has %s activations", dt)
	}
}

// panicMessage is what f panics with, or "".
func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

// A device takes activations of its own type only (the ops' contract).
func TestActivationTypes(t *testing.T) {
	f32, bf := newFixture(t, 29), newFixtureAct(t, 29, kernels.BF16)
	a := f32.dev.Alloc(kernels.BF16, 2, 3)
	if msg := panicMessage(func() { f32.ops.Add(a, a, a) }); !strings.Contains(msg, "want f32 activations") {
		t.Errorf("bf16 add on an f32 device: panic %q", msg)
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16} {
		x := bf.dev.Alloc(dt, 1, 2)
		if msg := panicMessage(func() { bf.ops.Add(bf.dev.Alloc(kernels.BF16, 1, 2), x, x) }); !strings.Contains(msg, "want bf16 activations") {
			t.Errorf("%s add on a bf16 device: panic %q", dt, msg)
		}
	}
}

// Linear rounds once, after the bias; an f32 out is not rounded.
func TestBF16Linear(t *testing.T) {
	f := newFixtureAct(t, 30, kernels.BF16)
	x := f.tensor(kernels.BF16, []float32{1, 1.0 / 256}, 1, 2)
	w := f.tensor(kernels.F32, []float32{1, 1, 1, 1, 3, 0}, 3, 2)
	bias := f.tensor(kernels.F32, []float32{0, 1.0 / 512, 0}, 3)
	out := f.dev.Alloc(kernels.BF16, 1, 3)
	f.ops.Linear(out, x, w, bias)
	// 1+2⁻⁸ is the tie between 1 and 1+2⁻⁷: to even, 1. Adding the bias
	// 2⁻⁹ before rounding passes the tie (after, it would give 1 again).
	assertExact(t, "bf16 out", f.read(out), []float64{1, 1 + 1.0/128, 3})
	logits := f.dev.Alloc(kernels.F32, 1, 3)
	f.ops.Linear(logits, x, w, bias)
	assertExact(t, "f32 out", f.read(logits), []float64{1 + 1.0/256, 1 + 1.0/256 + 1.0/512, 3})
}

// Add rounds the sum; AddRMSNorm rounds resid + x and normalises that.
func TestBF16Add(t *testing.T) {
	f := newFixtureAct(t, 31, kernels.BF16)
	const eps = 1e-6
	a := []float32{1, 1, 1, 3}
	b := f.tensor(kernels.BF16, []float32{1.0 / 256, 3.0 / 256, 1.0 / 256, 0}, 2, 2)
	// 1+2⁻⁸ ties to 1 (even), 1+3·2⁻⁸ ties to 1+2⁻⁶ (even, not 1+2⁻⁷).
	want := []float64{1, 1 + 1.0/64, 1, 3}
	sum := f.dev.Alloc(kernels.BF16, 2, 2)
	f.ops.Add(sum, f.tensor(kernels.BF16, a, 2, 2), b)
	assertExact(t, "add", f.read(sum), want)

	resid, w := f.tensor(kernels.BF16, a, 2, 2), f.tensor(kernels.BF16, []float32{1.5, -0.75}, 2)
	out, norm := f.dev.Alloc(kernels.BF16, 2, 2), f.dev.Alloc(kernels.BF16, 2, 2)
	f.ops.AddRMSNorm(out, resid, b, w, eps)
	f.ops.RMSNorm(norm, sum, w, eps)
	assertExact(t, "add+norm: resid", f.read(resid), want)
	assertExact(t, "add+norm: out", f.read(out), f.read(norm))
	f.sync()
}

// AddAddRMSNorm rounds x + y as Add does, then adds that into the residual
// and rounds as AddRMSNorm does: on ties that tell this apart from one
// rounding of resid + x + y, and from the residual taking x (or y) first,
// and on random rows bit for bit the parts, Add into x then AddRMSNorm.
func TestBF16AddAddRMSNorm(t *testing.T) {
	f := newFixtureAct(t, 33, kernels.BF16)
	const eps = 1e-6
	xv, yv, rv := []float64{1, 1}, []float64{1.0 / 256, 1.0 / 128}, []float64{1.0 / 256, 1.0 / 256}
	var want, once, xFirst, yFirst []float64
	for j := range xv {
		x, y, r := xv[j], yv[j], rv[j]
		want = append(want, bf16(r+bf16(x+y)))
		once = append(once, bf16(r+x+y))
		xFirst = append(xFirst, bf16(bf16(r+x)+y))
		yFirst = append(yFirst, bf16(bf16(r+y)+x))
	}
	// 1+2⁻⁸ ties to 1, then 2⁻⁸ + 1 to 1 again; 1+2⁻⁷ is exact, then
	// 2⁻⁸ + 1+2⁻⁷ ties to 1+2⁻⁶.
	assertExact(t, "the worked values", want, []float64{1, 1 + 1.0/64})
	differs(t, "one rounding of resid + x + y", want, once)
	differs(t, "resid + x first", want, xFirst)
	differs(t, "resid + y first", want, yFirst)
	f32s := func(v []float64) []float32 {
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return out
	}
	x, y := f.tensor(kernels.BF16, f32s(xv), 1, 2), f.tensor(kernels.BF16, f32s(yv), 1, 2)
	resid, w := f.tensor(kernels.BF16, f32s(rv), 1, 2), f.tensor(kernels.BF16, []float32{1.5, -0.75}, 2)
	out, norm := f.dev.Alloc(kernels.BF16, 1, 2), f.dev.Alloc(kernels.BF16, 1, 2)
	f.ops.AddAddRMSNorm(out, resid, x, y, w, eps)
	assertExact(t, "resid", f.read(resid), want)
	f.ops.RMSNorm(norm, f.tensor(kernels.BF16, f32s(want), 1, 2), w, eps)
	assertExact(t, "out", f.read(out), f.read(norm))
	assertExact(t, "x, left as it was", f.read(x), xv)

	const n, d = 5, 64
	xs, ys, rs := f.normal(n*d, 3), f.normal(n*d, 3), f.normal(n*d, 1)
	wv := f.tensor(kernels.BF16, f.normal(d, 1), d)
	run := func(parts bool) []float64 {
		x, y, resid := f.tensor(kernels.BF16, xs, n, d), f.tensor(kernels.BF16, ys, n, d), f.tensor(kernels.BF16, rs, n, d)
		out := f.dev.Alloc(kernels.BF16, n, d)
		if parts {
			kernels.AddAddRMSNormParts(f.ops, out, resid, x, y, wv, eps)
		} else {
			f.ops.AddAddRMSNorm(out, resid, x, y, wv, eps)
		}
		return append(f.read(out), f.read(resid)...)
	}
	assertExact(t, "random rows: out and resid", run(false), run(true))
	f.sync()
}

// f32Twin is a fixture on an f32 device, whose ops compute the f32 parts of
// the bf16 ops: the same code, without the rounding.
func f32Twin(t *testing.T) *fixture { return newFixture(t, 0) }

// RMSNorm rounds x·rsqrt(mean(x²)+eps) before the weight, then the product.
func TestBF16RMSNorm(t *testing.T) {
	f, g := newFixtureAct(t, 32, kernels.BF16), f32Twin(t)
	const n, d, eps = 8, 64, 1e-6
	x := f.randn(kernels.BF16, 2, n, d)
	wv := f.normal(d, 0.3)
	for i := range wv {
		wv[i]++
	}
	w := f.tensor(kernels.BF16, wv, d)
	out := f.dev.Alloc(kernels.BF16, n, d)
	f.ops.RMSNorm(out, x, w, eps)

	h := g.dev.Alloc(kernels.F32, n, d) // x·rsqrt(mean(x²)+eps) in f32
	g.ops.RMSNorm(h, g.tensor(kernels.F32, narrow(f.read(x)), n, d), g.tensor(kernels.F32, fill(d, 1), d), eps)
	hv, ww := g.read(h), f.read(w)
	want, once := make([]float64, n*d), make([]float64, n*d)
	for i, v := range hv {
		want[i] = bf16(bf16(v) * ww[i%d])
		once[i] = bf16(v * ww[i%d])
	}
	assertExact(t, "rms norm", f.read(out), want)
	differs(t, "rms norm", want, once)
}

// SwiGLU rounds silu(gate), then its product with up.
func TestBF16SwiGLU(t *testing.T) {
	f, g := newFixtureAct(t, 33, kernels.BF16), f32Twin(t)
	const n, i = 7, 64
	gu := f.randn(kernels.BF16, 2, n, 2*i)
	out := f.dev.Alloc(kernels.BF16, n, i)
	f.ops.SwiGLU(out, gu)

	guv := f.read(gu)
	gate := make([]float64, 0, 2*n*i) // the gates with up = 1: silu(gate) in f32
	for _, r := range rowsOf(guv, 2*i) {
		gate = append(append(gate, r[:i]...), widen(fill(i, 1))...)
	}
	s := g.dev.Alloc(kernels.F32, n, i)
	g.ops.SwiGLU(s, g.tensor(kernels.F32, narrow(gate), n, 2*i))
	sv := g.read(s)
	want, once := make([]float64, n*i), make([]float64, n*i)
	for k, v := range sv {
		up := guv[(k/i)*2*i+i+k%i]
		want[k] = bf16(bf16(v) * up)
		once[k] = bf16(v * up)
	}
	assertExact(t, "swiglu", f.read(out), want)
	differs(t, "swiglu", want, once)
}

// RoPE with rotate_half pairs rounds cos, sin, each product and the sum;
// with interleaved pairs, the f32 rotation once.
func TestBF16RoPE(t *testing.T) {
	const positions, tokens, heads, dim = 40, 5, 3, 16
	half := dim / 2
	for _, interleaved := range []bool{false, true} {
		f, g := newFixtureAct(t, 34, kernels.BF16), f32Twin(t)
		cos, sin := make([]float32, positions*half), make([]float32, positions*half)
		for p := range positions {
			for i := range half {
				a := float64(p) * math.Pow(10000, -2*float64(i)/dim)
				cos[p*half+i], sin[p*half+i] = float32(1.1*math.Cos(a)), float32(1.1*math.Sin(a))
			}
		}
		rope := func(f *fixture) *kernels.Rope {
			return &kernels.Rope{Dim: dim, Interleaved: interleaved,
				Cos: f.tensor(kernels.F32, cos, positions, half), Sin: f.tensor(kernels.F32, sin, positions, half)}
		}
		pos := []int32{0, 39, 7, 8, 21}
		x := f.randn(kernels.BF16, 1, tokens, heads*dim)
		before := f.read(x)
		f.ops.RoPE(x, heads, dim, 0, f.ints(pos, tokens), rope(f))
		f.sync()

		want, once := make([]float64, len(before)), make([]float64, len(before))
		if interleaved {
			y := g.tensor(kernels.F32, narrow(before), tokens, heads*dim)
			g.ops.RoPE(y, heads, dim, 0, g.ints(pos, tokens), rope(g))
			for i, v := range g.read(y) {
				want[i] = bf16(v)
			}
			assertExact(t, "interleaved", f.read(x), want)
			continue
		}
		for tk, p := range pos {
			for h := range heads {
				for i := range half {
					a, b := tk*heads*dim+h*dim+i, tk*heads*dim+h*dim+i+half
					c, s := float64(cos[int(p)*half+i]), float64(sin[int(p)*half+i])
					cb, sb := bf16(c), bf16(s)
					x0, x1 := before[a], before[b]
					want[a] = bf16(bf16(x0*cb) - bf16(x1*sb))
					want[b] = bf16(bf16(x1*cb) + bf16(x0*sb))
					once[a], once[b] = bf16(x0*c-x1*s), bf16(x1*c+x0*s)
				}
			}
		}
		assertExact(t, "rotate_half", f.read(x), want)
		differs(t, "rotate_half", want, once)
	}
}

// Attention weighs the values with bf16 softmax numerators where torch's
// SDPA would run a fused kernel (head dim 8), in f32 where it falls back to
// its math backend (257: no fused kernel takes it).
//
// One cached position (k = 0, v = -1) and one new token (q = k = e₀, v = 129
// in the first dim): the scores are 0 and Scale, so e = exp(Scale) = 0.5017
// and in f32 the output is (−1 + 129e)/(1+e) = 42.431, 42.5 in bf16. A fused
// kernel weighs with bf16(e) = 0.5 and divides by the f32 sum 1+e:
// (−1 + 64.5)/(1+e) = 42.285, 42.25 in bf16.
func TestBF16Attention(t *testing.T) {
	const scale = -0.68975294 // ln 0.5017
	for _, c := range []struct {
		d    int
		want float64
	}{{8, 42.25}, {257, 42.5}} {
		f := newFixtureAct(t, 35, kernels.BF16)
		d := c.d
		first := func(v0, v1 float32) []float32 { // two rows of d, v0 and v1 in their first dims
			v := make([]float32, 2*d)
			v[0], v[d] = v0, v1
			return v
		}
		kc, vc := f.tensor(kernels.BF16, first(0, 0), 1, 1, 2, d), f.tensor(kernels.BF16, first(-1, 0), 1, 1, 2, d)
		q := f.tensor(kernels.BF16, first(1, 0)[:d], 1, d)
		k, v := f.tensor(kernels.BF16, first(1, 0)[:d], 1, d), f.tensor(kernels.BF16, first(129, 0)[:d], 1, d)
		out := f.dev.Alloc(kernels.BF16, 1, d)
		f.ops.AttentionPrefill(&kernels.AttnArgs{Out: out, Q: q, K: k, V: v, KCache: kc, VCache: vc,
			Batch: f.batch([]int{1}, []int{1}, 2), Heads: 1, KVHeads: 1, HeadDim: d, Scale: scale})
		f.sync()
		want := make([]float64, d)
		want[0] = c.want
		assertExact(t, fmt.Sprintf("D=%d: out", d), f.read(out), want)
		assertExact(t, fmt.Sprintf("D=%d: v cache", d), f.read(vc), widen(first(-1, 129)))
	}
}

// TestF16AttentionPrefill: a prefill takes f16 operands on an f32 and on a
// bf16 device (the kernel benchmarks' fp16 rows) and computes them in f32,
// p unrounded: TestBF16Attention's problem gives (−1 + 129e)/(1+e) =
// 42.431, 42.4375 in f16, where bf16 operands give 42.25. A decode, or a
// prefill mixing f16 and the activations, is refused.
func TestF16AttentionPrefill(t *testing.T) {
	const scale = -0.68975294 // ln 0.5017
	const d = 8
	for _, act := range []kernels.DType{kernels.F32, kernels.BF16} {
		f := newFixtureAct(t, 36, act)
		first := func(v0, v1 float32) []float32 {
			v := make([]float32, 2*d)
			v[0], v[d] = v0, v1
			return v
		}
		args := func(dt, cache kernels.DType) *kernels.AttnArgs {
			return &kernels.AttnArgs{Out: f.dev.Alloc(dt, 1, d), Q: f.tensor(dt, first(1, 0)[:d], 1, d),
				K: f.tensor(dt, first(1, 0)[:d], 1, d), V: f.tensor(dt, first(129, 0)[:d], 1, d),
				KCache: f.tensor(cache, first(0, 0), 1, 1, 2, d), VCache: f.tensor(cache, first(-1, 0), 1, 1, 2, d),
				Batch: f.batch([]int{1}, []int{1}, 2), Heads: 1, KVHeads: 1, HeadDim: d, Scale: scale}
		}
		a := args(kernels.F16, kernels.F16)
		f.ops.AttentionPrefill(a)
		f.sync()
		want := make([]float64, d)
		want[0] = 42.4375
		assertExact(t, fmt.Sprintf("%s device: out", act), f.read(a.Out), want)
		assertExact(t, fmt.Sprintf("%s device: v cache", act), f.read(a.VCache), widen(first(-1, 129)))

		if msg := panicMessage(func() { f.ops.AttentionDecode(args(kernels.F16, kernels.F16)) }); !strings.Contains(msg, "want "+act.String()) {
			t.Errorf("%s device: an f16 decode: %q", act, msg)
		}
		if msg := panicMessage(func() { f.ops.AttentionPrefill(args(kernels.F16, act)) }); !strings.Contains(msg, "cache "+act.String()) {
			t.Errorf("%s device: f16 operands over %s caches: %q", act, act, msg)
		}
	}
}

// MLA decompresses the cache with kv_b_proj and rounds k_nope and v to bf16,
// then attends as Attention does: held against a float64 model of that,
// which its f32 sums may leave on the other side of a rounding boundary for
// a few elements, by one bf16 step.
func TestBF16MLA(t *testing.T) {
	for _, s := range []struct{ nope, rope, v int }{{16, 8, 12}, {16, 8, 16}} {
		t.Run(fmt.Sprintf("nope=%d,rope=%d,v=%d", s.nope, s.rope, s.v), func(t *testing.T) {
			f := newFixtureAct(t, 36, kernels.BF16)
			const heads, rank, maxSeq = 3, 32, 12
			lens, past := []int{3, 1}, []int{2, 7}
			nb, dq, width := len(lens), s.nope+s.rope, rank+s.rope
			q := f.randn(kernels.BF16, 1, 4, heads*dq)
			kv := f.randn(kernels.BF16, 1, 4, width)
			wkvb := f.randn(kernels.BF16, 1/math.Sqrt(rank), heads*(s.nope+s.v), rank)
			cache := f.randn(kernels.BF16, 1, nb, maxSeq, width)
			out := f.dev.Alloc(kernels.BF16, 4, heads*s.v)
			scale := float32(1 / math.Sqrt(float64(dq)))
			f.ops.MLAPrefill(&kernels.MLAArgs{Out: out, Q: q, KV: kv, Cache: cache, WKVB: wkvb, Batch: f.batch(lens, past, maxSeq),
				Heads: heads, NopeDim: s.nope, RopeDim: s.rope, VDim: s.v, Rank: rank, Scale: scale})
			f.sync()

			qs, cs, ws := rowsOf(f.read(q), heads*dq), rowsOf(f.read(cache), width), rowsOf(f.read(wkvb), rank)
			fused := (s.nope+s.rope)%8 == 0 && s.v%8 == 0
			var want []float64
			t0 := 0
			for b := range nb {
				for i := range lens[b] {
					p := past[b] + i
					for h := range heads {
						qh := qs[t0+i][h*dq : (h+1)*dq]
						vals := make([][]float64, p+1)
						sc := make([]float64, p+1)
						for j := range p + 1 {
							c := cs[b*maxSeq+j]
							var dotq float64
							for n := range s.nope {
								dotq += qh[n] * bf16(dot64(ws[h*(s.nope+s.v)+n], c[:rank]))
							}
							sc[j] = (dotq + dot64(qh[s.nope:], c[rank:])) * float64(scale)
							vals[j] = make([]float64, s.v)
							for m := range s.v {
								vals[j][m] = bf16(dot64(ws[h*(s.nope+s.v)+s.nope+m], c[:rank]))
							}
						}
						m := slices.Max(sc)
						var sum float64
						e := make([]float64, len(sc))
						for j, x := range sc {
							e[j] = math.Exp(x - m)
							sum += e[j]
						}
						for mm := range s.v {
							var acc float64
							for j := range sc {
								pj := e[j]
								if fused {
									pj = bf16(pj)
								}
								acc += pj * vals[j][mm]
							}
							want = append(want, bf16(acc/sum))
						}
					}
				}
				t0 += lens[b]
			}
			got := f.read(out)
			var off int
			for i := range got {
				if got[i] != want[i] {
					off++
					if ulp := math.Ldexp(1, int(math.Floor(math.Log2(math.Abs(want[i]))))-7); math.Abs(got[i]-want[i]) > ulp {
						t.Fatalf("out[%d] = %v, want %v", i, got[i], want[i])
					}
				}
			}
			if off > len(got)/50 {
				t.Errorf("%d of %d outputs one bf16 step off the model", off, len(got))
			}
		})
	}
}

// MoEExperts rounds each expert's projections and SwiGLU as Linear and
// SwiGLU do, and the routing-weighted sum over a token's experts once. The
// weights are powers of two, so that the f32 sum is exact.
func TestBF16MoEExperts(t *testing.T) {
	f := newFixtureAct(t, 37, kernels.BF16)
	const n, h, inter, e, k = 5, 16, 8, 4, 3
	x := f.randn(kernels.BF16, 1, n, h)
	gateUp := f.randn(kernels.BF16, 1/math.Sqrt(h), e, 2*inter, h)
	down := f.randn(kernels.BF16, 1/math.Sqrt(inter), e, h, inter)
	var ids []int32
	for range n {
		for _, ex := range f.rng.Perm(e)[:k] {
			ids = append(ids, int32(ex))
		}
	}
	ws := []float32{0.5, 0.25, 0.125, 0.25, 0.5, 0.125, 0.125, 0.5, 0.25, 1, 0.5, 0.25, 0.25, 0.25, 0.5}
	out := f.dev.Alloc(kernels.BF16, n, h)
	f.ops.MoEExperts(out, x, f.ints(ids, n, k), f.tensor(kernels.F32, ws, n, k), gateUp, down)
	f.sync()

	// Each (token, expert) through the bf16 Linear and SwiGLU ops.
	xs := rowsOf(f.read(x), h)
	want, eager := make([]float64, 0, n*h), make([]float64, 0, n*h)
	for tk := range n {
		ys := make([][]float64, e) // the token's experts' outputs by expert
		for j := range k {
			ex := int(ids[tk*k+j])
			gu, a, y := f.dev.Alloc(kernels.BF16, 1, 2*inter), f.dev.Alloc(kernels.BF16, 1, inter), f.dev.Alloc(kernels.BF16, 1, h)
			f.ops.Linear(gu, f.tensor(kernels.BF16, narrow(xs[tk]), 1, h), gateUp.Slice(ex, ex+1).Reshape(2*inter, h), nil)
			f.ops.SwiGLU(a, gu)
			f.ops.Linear(y, a, down.Slice(ex, ex+1).Reshape(h, inter), nil)
			ys[ex] = f.read(y)
			for i := range ys[ex] {
				ys[ex][i] *= float64(ws[tk*k+j])
			}
		}
		for i := range h {
			var sum, acc float64 // acc: index_add_ in bf16, expert by expert (the eager loop)
			for _, y := range ys {
				if y != nil {
					sum += y[i]
					acc = bf16(acc + bf16(y[i]))
				}
			}
			want, eager = append(want, bf16(sum)), append(eager, acc)
		}
	}
	assertExact(t, "moe experts", f.read(out), want)
	differs(t, "moe experts", want, eager)
}

// Embedding rounds an f32 table's rows into bf16 activations.
func TestBF16Embedding(t *testing.T) {
	f := newFixtureAct(t, 38, kernels.BF16)
	table := f.tensor(kernels.F32, []float32{1 + 1.0/256, 1 + 3.0/256, 0.1, 2}, 2, 2)
	out := f.dev.Alloc(kernels.BF16, 3, 2)
	f.ops.Embedding(out, table, f.ints([]int32{1, 0, 1}, 3))
	f.sync()
	assertExact(t, "embedding", f.read(out), []float64{bf16(float64(float32(0.1))), 2, 1, 1 + 1.0/64, bf16(float64(float32(0.1))), 2})
}
