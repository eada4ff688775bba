package fused

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestRouterCompiles compiles router.cu as the set does, with ptxas's
// report (spills or a stack frame fail it); skipped when FUSELM_NVRTC is
// unset.
func TestRouterCompiles(t *testing.T) { nvrtcReport(t, routerModule()) }

// TestLinearRouteExact holds linear_route to what it replaces, on the GPU:
// its logits to the f64 sums of the same bf16 products (to f32's rounding
// of a sum of that many terms), launch to launch identical, and its routes
// to moe_route's of its own logits bit for bit; x pitched, DeepSeek-V2-Lite's
// router and smaller and odd ones, greedy and group-limited. It logs the
// launch beside the router's linear then moe_route, each alone, back to
// back.
func TestLinearRouteExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_route", func(o *ops) error { return o.rtErr() })
	rng := rand.New(rand.NewSource(61))
	small := kernels.Routing{Method: kernels.RouteGreedy, TopK: 2, Groups: 1, TopKGroups: 1, Scale: 1}
	for _, c := range []struct {
		n, experts, hidden, pad int
		r                       kernels.Routing
	}{
		{1, 64, 2048, 0, liteRouting}, {9, 64, 2048, 0, liteRouting}, {16, 64, 2048, 0, liteRouting},
		{16, 64, 2048, 64, limitedRouting}, {5, 8, 64, 8, small}, {16, 63, 1000, 0, liteRouting}, {3, 20, 2000, 0, liteRouting},
	} {
		name := fmt.Sprintf("N=%d E=%d H=%d pad=%d top-%d", c.n, c.experts, c.hidden, c.pad, c.r.TopK)
		random := normalOn(t, dev, rng)
		xs := random(kernels.BF16, 1, c.n, c.hidden+c.pad)
		x := xs.ColSlice(0, c.hidden)
		w := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), c.experts, c.hidden)
		k := c.r.TopK
		logits, idx, weight := dev.Alloc(kernels.F32, c.n, c.experts), dev.Alloc(kernels.I32, c.n, k), dev.Alloc(kernels.F32, c.n, k)
		wantIdx, wantW := dev.Alloc(kernels.I32, c.n, k), dev.Alloc(kernels.F32, c.n, k)
		xv, wv := read(t, dev, xs), read(t, dev, w)
		var got [2][]float32
		for rep := range 2 {
			for _, b := range []*kernels.Tensor{logits, idx, weight} {
				dev.MemsetD8(dev.Ptr(b), 0xff, b.Rows()*b.Cols()*4)
			}
			if u, declined := kernels.Declined(func() { o.LinearRoute(idx, weight, logits, x, w, &c.r) }); declined {
				t.Fatalf("%s: declined: %v", name, u)
			}
			got[rep] = read(t, dev, logits)
		}
		if !slices.Equal(got[0], got[1]) {
			t.Errorf("%s: the logits differ between two launches", name)
		}
		bad := 0
		for i := range c.n {
			for e := range c.experts {
				sum, mag := 0.0, 0.0
				for h := range c.hidden {
					p := float64(xv[i*(c.hidden+c.pad)+h]) * float64(wv[e*c.hidden+h])
					sum += p
					mag += math.Abs(p)
				}
				if g := float64(got[0][i*c.experts+e]); math.Abs(g-sum) > 1e-6*mag+1e-7 && bad < 5 {
					bad++
					t.Errorf("%s: logit [%d, %d] = %g, want %g (Σ|products| %g)", name, i, e, g, sum, mag)
				}
			}
		}
		o.MoERoute(wantIdx, wantW, logits, &c.r)
		gi, err := dev.ReadI32(idx)
		if err != nil {
			t.Fatal(err)
		}
		wi, err := dev.ReadI32(wantIdx)
		if err != nil {
			t.Fatal(err)
		}
		bits := func(v []float32) []uint32 {
			b := make([]uint32, len(v))
			for i, f := range v {
				b[i] = math.Float32bits(f)
			}
			return b
		}
		if gw, ww := bits(read(t, dev, weight)), bits(read(t, dev, wantW)); !slices.Equal(gi, wi) || !slices.Equal(gw, ww) {
			t.Errorf("%s: routes %v, weights' bits %v; moe_route of the same logits %v, %v", name, gi, gw, wi, ww)
		}
		if c.n == 16 && c.experts == 64 && c.pad == 0 {
			parts := msPerCall(t, dev, func() {
				o.Linear(logits, x, w, nil)
				o.MoERoute(idx, weight, logits, &c.r)
			})
			whole := msPerCall(t, dev, func() { o.LinearRoute(idx, weight, logits, x, w, &c.r) })
			t.Logf("%s: linear_route %.2f µs, linear then moe_route %.2f µs (alone, back to back)", name, whole*1e3, parts*1e3)
		}
		for _, b := range []*kernels.Tensor{xs, w, logits, idx, weight, wantIdx, wantW} {
			dev.Free(b)
		}
	}
}
