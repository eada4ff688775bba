package cpu_test

import (
	"fmt"
	"math"
	"math/cmplx"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

var weightTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}

// sentinel fills the columns of a wider matrix that a view's op must leave
// alone.
const sentinel = 12345

func TestLinear(t *testing.T) {
	f := newFixture(t, 10)
	for _, s := range []struct{ n, k, m int }{
		{1, 1, 1}, {1, 7, 13}, {3, 13, 7}, {7, 33, 5}, {13, 64, 33}, {33, 13, 17}, {70, 129, 37}, {130, 40, 70},
	} {
		for _, wdt := range weightTypes {
			for _, variant := range []string{"packed", "bias", "pitched", "pitched+bias"} {
				name := fmt.Sprintf("N=%d,K=%d,M=%d,%s,%s", s.n, s.k, s.m, wdt, variant)
				pitched := variant == "pitched" || variant == "pitched+bias"
				x := f.randn(kernels.F32, 1, s.n, s.k)
				if pitched {
					x = f.randn(kernels.F32, 1, s.n, s.k+5).ColSlice(3, 3+s.k)
				}
				w := f.randn(wdt, 1/math.Sqrt(float64(s.k)), s.m, s.k)
				var bias *kernels.Tensor
				if variant == "bias" || variant == "pitched+bias" {
					bias = f.randn(wdt, 1, s.m)
				}
				whole := f.tensor(kernels.F32, fill(s.n*(s.m+3), sentinel), s.n, s.m+3)
				out := whole.ColSlice(0, s.m)
				if pitched {
					out = whole.ColSlice(2, 2+s.m)
				}
				f.ops.Linear(out, x, w, bias)
				f.sync()

				xs, ws := rowsOf(f.read(x), s.k), rowsOf(f.read(w), s.k)
				var b []float64
				if bias != nil {
					b = f.read(bias)
				}
				want := make([]float64, 0, s.n*(s.m+3))
				c0 := out.Offset - whole.Offset
				for i := range s.n {
					for j := range s.m + 3 {
						if j < c0 || j >= c0+s.m {
							want = append(want, sentinel)
							continue
						}
						v := dot64(xs[i], ws[j-c0])
						if b != nil {
							v += b[j-c0]
						}
						want = append(want, v)
					}
				}
				assertClose(t, name, f.read(whole), want, 2e-6)
			}
		}
	}
}

func TestEmbedding(t *testing.T) {
	f := newFixture(t, 11)
	for _, wdt := range weightTypes {
		table := f.randn(wdt, 1, 13, 7)
		ids := []int32{12, 0, 5, 5, 1}
		out := f.tensor(kernels.F32, fill(5*7, sentinel), 5, 7)
		f.ops.Embedding(out, table, f.ints(ids, 5))
		f.sync()
		tab := rowsOf(f.read(table), 7)
		var want []float64
		for _, id := range ids {
			want = append(want, tab[id]...)
		}
		assertClose(t, "embedding "+wdt.String(), f.read(out), want, 0)
	}
	// A bad id is a device error at Sync, its row zeroed.
	out := f.tensor(kernels.F32, fill(2*7, sentinel), 2, 7)
	f.ops.Embedding(out, f.randn(kernels.BF16, 1, 13, 7), f.ints([]int32{3, 13}, 2))
	if err := f.dev.Sync(); err == nil {
		t.Error("token id 13 of a 13-row table: no error at Sync")
	}
	if got := f.read(out); got[7] != 0 || got[13] != 0 {
		t.Errorf("row of a bad id = %v, want zeros", got[7:])
	}
	if err := f.dev.Sync(); err != nil {
		t.Errorf("second Sync returned %v again", err)
	}
}

// rmsNorm64 is HF's Qwen2RMSNorm in float64.
func rmsNorm64(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * w[i]
	}
	return out
}

func TestRMSNorm(t *testing.T) {
	f := newFixture(t, 12)
	const eps = 1e-6
	for _, s := range []struct{ n, d int }{{1, 7}, {3, 13}, {13, 64}, {33, 33}} {
		for _, wdt := range weightTypes {
			name := fmt.Sprintf("N=%d,D=%d,%s", s.n, s.d, wdt)
			w := f.randn(wdt, 1, s.d)
			wv := f.read(w)

			// out beside x
			x := f.randn(kernels.F32, 3, s.n, s.d)
			out := f.dev.Alloc(kernels.F32, s.n, s.d)
			f.ops.RMSNorm(out, x, w, eps)
			var want []float64
			for _, r := range rowsOf(f.read(x), s.d) {
				want = append(want, rmsNorm64(r, wv, eps)...)
			}
			assertClose(t, name+" out", f.read(out), want, 1e-6)

			// in place
			f.ops.RMSNorm(x, x, w, eps)
			assertClose(t, name+" in place", f.read(x), want, 1e-6)

			// pitched: the first d columns of a wider x, into the middle of a wider out
			xw := f.randn(kernels.F32, 1, s.n, s.d+4)
			ow := f.tensor(kernels.F32, fill(s.n*(s.d+2), sentinel), s.n, s.d+2)
			f.ops.RMSNorm(ow.ColSlice(1, 1+s.d), xw.ColSlice(0, s.d), w, eps)
			want = want[:0]
			for _, r := range rowsOf(f.read(xw), s.d+4) {
				want = append(want, sentinel)
				want = append(want, rmsNorm64(r[:s.d], wv, eps)...)
				want = append(want, sentinel)
			}
			assertClose(t, name+" pitched", f.read(ow), want, 1e-6)

			// add then norm
			resid, y := f.randn(kernels.F32, 1, s.n, s.d), f.randn(kernels.F32, 1, s.n, s.d)
			r0, y0 := f.read(resid), f.read(y)
			out = f.dev.Alloc(kernels.F32, s.n, s.d)
			f.ops.AddRMSNorm(out, resid, y, w, eps)
			sum := make([]float64, len(r0))
			for i := range r0 {
				sum[i] = r0[i] + y0[i]
			}
			want = want[:0]
			for _, r := range rowsOf(sum, s.d) {
				want = append(want, rmsNorm64(r, wv, eps)...)
			}
			assertClose(t, name+" add: resid", f.read(resid), sum, 1e-7)
			assertClose(t, name+" add: out", f.read(out), want, 1e-6)
			f.sync()
		}
	}
}

func TestAdd(t *testing.T) {
	f := newFixture(t, 13)
	for _, alias := range []string{"out", "a", "b"} {
		a, b := f.randn(kernels.F32, 1, 7, 13), f.randn(kernels.F32, 1, 7, 13)
		av, bv := f.read(a), f.read(b)
		out := map[string]*kernels.Tensor{"out": f.dev.Alloc(kernels.F32, 7, 13), "a": a, "b": b}[alias]
		f.ops.Add(out, a, b)
		want := make([]float64, len(av))
		for i := range av {
			want[i] = av[i] + bv[i]
		}
		assertClose(t, "add into "+alias, f.read(out), want, 1e-7)
	}
}

// rope64 rotates one head's dims the way HF does: Qwen2's
// x·cos + rotate_half(x)·sin with cos, sin repeated over both halves, or
// DeepSeek-V2's complex product of consecutive pairs with cos + i·sin.
func rope64(v, cos, sin []float64, interleaved bool) []float64 {
	half := len(cos)
	out := make([]float64, len(v))
	if interleaved {
		for i := range half {
			z := complex(v[2*i], v[2*i+1]) * complex(cos[i], sin[i])
			out[2*i], out[2*i+1] = real(z), imag(z)
		}
		return out
	}
	rot := append(append([]float64{}, v[half:]...), v[:half]...)
	for i := range half {
		rot[i] = -rot[i]
	}
	for j := range v {
		out[j] = v[j]*cos[j%half] + rot[j]*sin[j%half]
	}
	return out
}

func TestRoPE(t *testing.T) {
	f := newFixture(t, 14)
	const positions = 50
	for _, s := range []struct {
		name                               string
		t, heads, stride, offset, dim, pad int
		interleaved                        bool
	}{
		{"qwen2 q", 7, 3, 8, 0, 8, 0, false},
		{"qwen2 k of qkv", 5, 2, 16, 0, 16, 40, false},
		{"partial", 13, 2, 13, 0, 6, 3, false},
		{"deepseek q_pe", 7, 3, 14, 10, 4, 0, true},
		{"deepseek k_pe", 33, 1, 13, 7, 6, 5, true},
	} {
		half := s.dim / 2
		cos, sin := make([]float32, positions*half), make([]float32, positions*half)
		for p := range positions {
			for i := range half {
				a := float64(p) * math.Pow(10000, -2*float64(i)/float64(s.dim))
				z := cmplx.Rect(1.1, a) // the table may hold an attention factor
				cos[p*half+i], sin[p*half+i] = float32(real(z)), float32(imag(z))
			}
		}
		r := &kernels.Rope{Dim: s.dim, Interleaved: s.interleaved,
			Cos: f.tensor(kernels.F32, cos, positions, half), Sin: f.tensor(kernels.F32, sin, positions, half)}
		pos := make([]int32, s.t)
		for i := range pos {
			pos[i] = int32(f.rng.Intn(positions))
		}
		width := s.heads*s.stride + s.pad
		whole := f.randn(kernels.F32, 1, s.t, width)
		before := rowsOf(f.read(whole), width)
		c0 := s.pad / 2 // x starts c0 columns into the wider matrix
		f.ops.RoPE(whole.ColSlice(c0, c0+s.heads*s.stride), s.heads, s.stride, s.offset, f.ints(pos, s.t), r)
		f.sync()
		cs, sn := rowsOf(f.read(r.Cos), half), rowsOf(f.read(r.Sin), half)
		var want []float64
		for i, row := range before {
			row = append([]float64{}, row...)
			for h := range s.heads {
				a := c0 + h*s.stride + s.offset
				copy(row[a:], rope64(row[a:a+s.dim], cs[pos[i]], sn[pos[i]], s.interleaved))
			}
			want = append(want, row...)
		}
		assertClose(t, s.name, f.read(whole), want, 1e-7)
	}
	// A position outside the tables is a device error.
	r := &kernels.Rope{Dim: 2, Cos: f.randn(kernels.F32, 1, 4, 1), Sin: f.randn(kernels.F32, 1, 4, 1)}
	f.ops.RoPE(f.randn(kernels.F32, 1, 1, 2), 1, 2, 0, f.ints([]int32{4}, 1), r)
	if err := f.dev.Sync(); err == nil {
		t.Error("position 4 of a 4-position table: no error")
	}
}

func TestSwiGLU(t *testing.T) {
	f := newFixture(t, 15)
	for _, s := range []struct{ n, i int }{{1, 1}, {7, 13}, {33, 64}} {
		gu := f.randn(kernels.F32, 3, s.n, 2*s.i)
		out := f.dev.Alloc(kernels.F32, s.n, s.i)
		f.ops.SwiGLU(out, gu)
		var want []float64
		for _, r := range rowsOf(f.read(gu), 2*s.i) {
			for j := range s.i {
				g := r[j]
				want = append(want, g/(1+math.Exp(-g))*r[s.i+j])
			}
		}
		assertClose(t, fmt.Sprintf("N=%d,I=%d", s.n, s.i), f.read(out), want, 1e-6)
	}
}

func TestArgmax(t *testing.T) {
	f := newFixture(t, 16)
	inf := float32(math.Inf(1))
	rows := [][]float32{
		{1, 3, 2, 3, 0},            // tie: the first
		{-inf, -inf, -5, -inf, -5}, // tie at -5
		{1, nan32, 2, nan32, 2},    // NaN counts as the largest, the first one wins (torch.argmax)
		{-inf, -inf, -inf, -inf, -inf},
		{7, 1, 2, 3, 4},
		{0, 0, 0, 0, 9},
	}
	want := []int32{1, 2, 1, 0, 0, 4}
	var vals []float32
	for _, r := range rows {
		vals = append(vals, r...)
	}
	out := f.ints(make([]int32, len(rows)), len(rows))
	f.ops.Argmax(out, f.tensor(kernels.F32, vals, len(rows), 5))
	got, _ := f.dev.ReadI32(out)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d %v: argmax %d, want %d", i, rows[i], got[i], want[i])
		}
	}
	// Many rows and a long vocabulary, in parallel.
	const b, v = 37, 5003
	logits := f.normal(b*v, 1)
	for r := range b {
		logits[r*v+(r*131)%v] = 10
	}
	out = f.ints(make([]int32, b), b)
	f.ops.Argmax(out, f.tensor(kernels.F32, logits, b, v))
	got, _ = f.dev.ReadI32(out)
	for r := range b {
		if got[r] != int32((r*131)%v) {
			t.Errorf("row %d: argmax %d, want %d", r, got[r], (r*131)%v)
		}
	}
}

// TestDecodeAdvance: each row's chosen token becomes its next id, its
// length grows by one and its next position is the new length; ids, pos
// and past are views into one buffer, as a decode step's inputs are.
func TestDecodeAdvance(t *testing.T) {
	f := newFixture(t, 17)
	const B = 3
	in := f.ints([]int32{-1, -1, -1, 9, 9, 9, 0, 4, 130}, 3*B)
	ids, pos, past := kernels.NewTensor(in.Buf, kernels.I32, 0, B), kernels.NewTensor(in.Buf, kernels.I32, B, B),
		kernels.NewTensor(in.Buf, kernels.I32, 2*B, B)
	choice := f.ints([]int32{7, int32(math.Float32bits(2.5)), 0, -1, 151935, int32(math.Float32bits(-3))}, B, 2)
	f.ops.DecodeAdvance(ids, pos, past, choice)
	f.sync()
	got, _ := f.dev.ReadI32(in)
	if want := []int32{7, 0, 151935, 1, 5, 131, 1, 5, 131}; !slices.Equal(got, want) {
		t.Errorf("ids, pos, past %v, want %v", got, want)
	}
	// A view sharing elements with another is a programming error.
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "share elements") {
			t.Errorf("pos overlapping past: %v, want a panic saying they share elements", r)
		}
	}()
	f.ops.DecodeAdvance(ids, kernels.NewTensor(in.Buf, kernels.I32, 2*B-1, B), past, choice)
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}
