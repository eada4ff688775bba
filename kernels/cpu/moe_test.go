package cpu_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestMoERoute checks routing on hand-worked logits. With
//
//	logits = [0, 3, 2.5, 2.4, 1, 2.9, 0.5, 2.8]
//
// greedy top 3 is experts 1, 5, 7; in 4 groups of 2 the group maxima are
// 3, 2.5, 2.9, 2.8, so the best 2 groups are {0,1} and {4,5} and the top 3
// of those experts is 1, 5, 4.
func TestMoERoute(t *testing.T) {
	logits := []float32{0, 3, 2.5, 2.4, 1, 2.9, 0.5, 2.8}
	for _, c := range []struct {
		name   string
		logits []float32
		r      kernels.Routing
		idx    []int32
	}{
		{"greedy", logits, kernels.Routing{Method: kernels.RouteGreedy, TopK: 3, Scale: 1}, []int32{1, 5, 7}},
		{"greedy norm scaled", logits, kernels.Routing{Method: kernels.RouteGreedy, TopK: 3, NormTopK: true, Scale: 2}, []int32{1, 5, 7}},
		{"group-limited", logits, kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 3, Groups: 4, TopKGroups: 2, Scale: 16}, []int32{1, 5, 4}},
		{"group-limited norm", logits, kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 3, Groups: 4, TopKGroups: 2, NormTopK: true, Scale: 1}, []int32{1, 5, 4}},
		{"one group of all", logits, kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 3, Groups: 1, TopKGroups: 1, Scale: 1}, []int32{1, 5, 7}},
		{"top 1, no norm", logits, kernels.Routing{Method: kernels.RouteGreedy, TopK: 1, NormTopK: true, Scale: 3}, []int32{1}},
		{"ties to the lower index", []float32{1, 2, 2, 0}, kernels.Routing{Method: kernels.RouteGreedy, TopK: 2, Scale: 1}, []int32{1, 2}},
		{"group ties", []float32{2, 0, 0, 2}, kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 2, Groups: 2, TopKGroups: 1, Scale: 1}, []int32{0, 1}},
		// Only 2 experts survive the group limit, so the third pick is a
		// masked one (score 0, the lowest index).
		{"k beyond the kept groups", []float32{1, 0.5, 3, 2}, kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 3, Groups: 2, TopKGroups: 1, Scale: 1}, []int32{2, 3, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 50)
			e, k := len(c.logits), c.r.TopK
			// Token 0 has the logits, token 1 the same shifted (softmax is
			// shift-invariant), token 2 a reversal of them.
			var all []float32
			rev := make([]float32, e)
			for j, v := range c.logits {
				all = append(all, v)
				rev[e-1-j] = v
			}
			for _, v := range c.logits {
				all = append(all, v+5)
			}
			all = append(all, rev...)
			idx, w := f.ints(make([]int32, 3*k), 3, k), f.dev.Alloc(kernels.F32, 3, k)
			f.ops.MoERoute(idx, w, f.tensor(kernels.F32, all, 3, e), &c.r)
			f.sync()
			got, _ := f.dev.ReadI32(idx)
			gw := f.read(w)

			scores := softmax64(widen(c.logits))
			want := make([]float64, k)
			var sum float64
			for j, ex := range c.idx {
				want[j] = scores[ex]
				if j == 2 && c.name == "k beyond the kept groups" {
					want[j] = 0
				}
				sum += want[j]
			}
			for j := range want {
				if c.r.NormTopK && k > 1 {
					want[j] /= sum
				}
				want[j] *= float64(c.r.Scale)
			}
			for tok := range 3 {
				wantIdx := c.idx
				if tok == 2 {
					wantIdx = make([]int32, k)
					for j, ex := range c.idx {
						wantIdx[j] = int32(e-1) - ex
					}
					if c.name == "ties to the lower index" || c.name == "group ties" || c.name == "k beyond the kept groups" {
						continue // reversal changes which of the tied ones comes first
					}
				}
				if fmt.Sprint(got[tok*k:(tok+1)*k]) != fmt.Sprint(wantIdx) {
					t.Errorf("token %d: experts %v, want %v", tok, got[tok*k:(tok+1)*k], wantIdx)
				}
				assertClose(t, fmt.Sprintf("token %d weights", tok), gw[tok*k:(tok+1)*k], want, 1e-6)
			}
		})
	}
}

// TestMoEExperts holds the expert mixture against a per-token float64
// evaluation of each chosen expert's SwiGLU MLP.
func TestMoEExperts(t *testing.T) {
	for i, s := range []struct{ n, h, inter, e, k int }{{1, 8, 4, 3, 1}, {7, 13, 7, 5, 2}, {33, 16, 24, 8, 3}, {70, 40, 13, 64, 6}} {
		for _, wdt := range weightTypes {
			t.Run(fmt.Sprintf("N=%d,H=%d,I=%d,E=%d,K=%d,%s", s.n, s.h, s.inter, s.e, s.k, wdt), func(t *testing.T) {
				f := newFixture(t, int64(60+i))
				x := f.randn(kernels.F32, 1, s.n, s.h)
				var ids []int32
				for range s.n {
					for _, ex := range f.rng.Perm(s.e)[:s.k] {
						ids = append(ids, int32(ex))
					}
				}
				weights := f.randn(kernels.F32, 1, s.n, s.k)
				gateUp := f.randn(wdt, 1/math.Sqrt(float64(s.h)), s.e, 2*s.inter, s.h)
				down := f.randn(wdt, 1/math.Sqrt(float64(s.inter)), s.e, s.h, s.inter)
				out := f.dev.Alloc(kernels.F32, s.n, s.h)
				f.ops.MoEExperts(out, x, f.ints(ids, s.n, s.k), weights, gateUp, down)
				f.sync()

				xs, ws := rowsOf(f.read(x), s.h), f.read(weights)
				gu, dn := rowsOf(f.read(gateUp), s.h), rowsOf(f.read(down), s.inter)
				var want []float64
				for tok := range s.n {
					y := make([]float64, s.h)
					for j := range s.k {
						ex := int(ids[tok*s.k+j])
						a := make([]float64, s.inter)
						for r := range s.inter {
							g := dot64(gu[ex*2*s.inter+r], xs[tok])
							u := dot64(gu[ex*2*s.inter+s.inter+r], xs[tok])
							a[r] = g / (1 + math.Exp(-g)) * u
						}
						for c := range s.h {
							y[c] += ws[tok*s.k+j] * dot64(dn[ex*s.h+c], a)
						}
					}
					want = append(want, y...)
				}
				assertClose(t, "out", f.read(out), want, 1e-5)

				// The output may replace the input.
				f.ops.MoEExperts(x, x, f.ints(ids, s.n, s.k), weights, gateUp, down)
				assertClose(t, "out in place of x", f.read(x), want, 1e-5)
			})
		}
	}
	f := newFixture(t, 69)
	f.ops.MoEExperts(f.dev.Alloc(kernels.F32, 1, 4), f.randn(kernels.F32, 1, 1, 4), f.ints([]int32{0, 3}, 1, 2),
		f.randn(kernels.F32, 1, 1, 2), f.randn(kernels.BF16, 1, 3, 4, 4), f.randn(kernels.BF16, 1, 3, 4, 2))
	if err := f.dev.Sync(); err == nil {
		t.Error("expert 3 of 3: no error")
	}
}
