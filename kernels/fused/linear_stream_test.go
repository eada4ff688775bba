package fused

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestLinearStreamPlan checks linear_stream's plans without a GPU: whole K
// in one stage where x leaves room for two (its rows packed), narrower
// stages where it does not, refusals past 16 rows, K not a multiple of 32, or x too big for a
// block; every plan fits an H200 block; and the default takes it only under
// linStreamBytes and up to linStreamRows rows, where it is built.
func TestLinearStreamPlan(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		m, n, k    int
		ks, stages int
		why        string
	}{
		{m: 1, n: 3072, k: 2048, ks: 2048, stages: 2},  // DeepSeek-V2-Lite's q: 24 rows a block, two tiles
		{m: 1, n: 576, k: 2048, ks: 2048, stages: 1},   // kv_a: 5 rows a block, one stage
		{m: 1, n: 5632, k: 2048, ks: 2048, stages: 3},  // shared experts' gate_up
		{m: 1, n: 2048, k: 10944, ks: 2816, stages: 2}, // the dense layer's down: K in four stages
		{m: 16, n: 4608, k: 3584, ks: 1024, stages: 3}, // Qwen2-7B's qkv at batch 16: x takes half the block
		{m: 16, n: 3584, k: 18944, why: "leaves no room"},
		{m: 17, n: 64, k: 64, why: "takes 1 to 16"},
		{m: 1, n: 64, k: 200, why: "multiple of 32"},
	} {
		p, err := planStream(c.m, c.n, c.k, h200.SMs, h200.SharedPerBlock)
		switch {
		case c.why != "":
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Errorf("M=%d N=%d K=%d: %v, %v; want an error saying %q", c.m, c.n, c.k, p, err, c.why)
			}
		case err != nil:
			t.Errorf("M=%d N=%d K=%d: %v", c.m, c.n, c.k, err)
		case p.ks != c.ks || p.stages != c.stages || p.shared > h200.SharedPerBlock || p.blocks != min(h200.SMs, c.n):
			t.Errorf("M=%d N=%d K=%d: %v, want stages of %d k, %d slots, within %d bytes", c.m, c.n, c.k, p, c.ks, c.stages, h200.SharedPerBlock)
		case p.ks >= c.k && p.shared != lsBars+lsRed+(c.m*lsXRow(c.k)*2+127)/128*128+p.stages*lsRows*c.k*2:
			t.Errorf("M=%d N=%d K=%d: %v, want slots of %d whole rows packed", c.m, c.n, c.k, p, lsRows)
		}
	}
	o := &ops{ls: &lsKit{}}
	for k, want := range map[linearKey]string{ // the defaults as they stand
		{1, 3072, 2048}: linStream, {1, 5632, 2048}: linStream, {1, 3584, 3584}: linStream, {2, 3072, 2048}: linCuBLAS,
		{1, 3584, 18944}: linStream, {1, 37888, 3584}: linStream, {1, 102400, 2048}: linSkinny, {1, 152064, 3584}: linSkinny,
		{16, 2048, 2816}: linStream, {16, 64, 2048}: linStream, {16, 2048, 10944}: linCuBLAS, {17, 2048, 2048}: linCuBLAS,
	} {
		if got := linearDefaultOn(o, k, h200); got != want {
			t.Errorf("untouched defaults: %s runs %q, want %q", k, got, want)
		}
	}
	defer func(r int, b int64) { linStreamRows, linStreamBytes = r, b }(linStreamRows, linStreamBytes)
	linStreamRows, linStreamBytes = linMaxRows, 64<<20
	o.ls = &lsKit{err: fmt.Errorf("no Hopper here")}
	if got := o.linearDefault(linearKey{1, 3072, 2048}); got != linCuBLAS {
		t.Errorf("without linear_stream built, 1×3072×2048 runs %q", got)
	}
	o.ls = &lsKit{}
	o.Kit = nil
	for _, c := range []struct {
		k    linearKey
		want string
	}{
		{linearKey{1, 3072, 2048}, linStream}, {linearKey{16, 4608, 3584}, linStream},
		{linearKey{16, 3584, 18944}, linCuBLAS}, // x does not fit: cuBLAS (130 MiB: under skinny's)
		{linearKey{1, 37888, 3584}, linSkinny},  // over linStreamBytes, over linSkinnyBytes
		{linearKey{1, 3584, 18944}, linCuBLAS},  // over linStreamBytes, under linSkinnyBytes
		{linearKey{17, 3072, 2048}, linCuBLAS},
	} {
		if got := linearDefaultOn(o, c.k, h200); got != c.want {
			t.Errorf("%s runs %q by default, want %q", c.k, got, c.want)
		}
	}
}

// linearDefaultOn is o.linearDefault on target t's SMs and shared memory,
// for a test without a device.
func linearDefaultOn(o *ops, k linearKey, t kernels.Target) string {
	saved := streamTarget
	defer func() { streamTarget = saved }()
	streamTarget = func(*ops) (int, int) { return t.SMs, t.SharedPerBlock }
	return o.linearDefault(k)
}

// TestLinearStreamKernels runs the shared kerneltest's linear,
// linear_swiglu, linear_add and the add_rms_norm_linear pair's cases with linear_stream the default
// wherever it takes the problem (the decode cases of 1 to 16 rows whose K
// is a multiple of 32: bias, f32 out, pitched x and out, N or I of no tile;
// linear_swiglu's with SwiGLU in its epilogue, linear_add's with the add,
// out addend or not), then the decode graph with it the default, so that
// its prefetch before the grid wait is replayed overlapped.
func TestLinearStreamKernels(t *testing.T) {
	dev, _ := openHopperSet(t, "linear_stream", func(o *ops) error { return o.ls.err })
	defer func(r int, b int64) { linStreamRows, linStreamBytes = r, b }(linStreamRows, linStreamBytes)
	linStreamRows, linStreamBytes = linMaxRows, math.MaxInt64
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpLinear, kernels.OpLinearSwiGLU, kernels.OpLinearAdd,
		kernels.OpNormLinear, kernels.OpNormSwiGLU)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// TestLinearStreamExact holds linear_stream against cuBLAS (cudaset.Addmm,
// naive's) much closer than the kerneltest's 2%, on the decode shapes of
// both models at 1, 5 and 16 rows (stages of all of K, K in several stages
// with a short last one, one row a block or 35, f32 logits, a bf16 bias
// against the f32 sum rounded once), and times both, for a first look
// (infer bench linear is the measurement).
func TestLinearStreamExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_stream", func(o *ops) error { return o.ls.err })
	random := normalOn(t, dev, rand.New(rand.NewSource(19)))
	for _, s := range []struct {
		m, n, k int
		bias    bool
		out     kernels.DType
	}{
		{1, 3072, 2048, false, kernels.BF16}, {5, 576, 2048, false, kernels.BF16}, {16, 2048, 2816, false, kernels.BF16},
		{1, 2048, 10944, false, kernels.BF16}, {16, 4608, 3584, true, kernels.BF16}, {3, 4608, 3584, true, kernels.BF16},
		{1, 102400, 2048, false, kernels.F32}, {16, 100, 96, false, kernels.F32}, {2, 5, 64, true, kernels.BF16},
	} {
		x := random(kernels.BF16, 1, s.m, s.k)
		w := random(kernels.BF16, 1/math.Sqrt(float64(s.k)), s.n, s.k)
		var b *kernels.Tensor
		if s.bias {
			b = random(kernels.BF16, 0.5, s.n)
		}
		acc := dev.Alloc(kernels.F32, s.m, s.n)
		o.Gemm(true, s.m, s.n, s.k, 1, o.Mat(x), o.Mat(w), 0, o.Mat(acc))
		ref := read(t, dev, acc)
		var bv []float32
		if s.bias {
			bv = read(t, dev, b)
		}
		for i := range ref {
			if bv != nil {
				ref[i] += bv[i%s.n]
			}
			if s.out == kernels.BF16 {
				ref[i] = roundBF16(ref[i])
			}
		}
		want := dev.Alloc(s.out, s.m, s.n)
		refMs := msPerCall(t, dev, func() { o.Addmm(want, x, w, b) })
		got := dev.Alloc(s.out, s.m, s.n)
		dev.MemsetD8(dev.Ptr(got), 0xff, s.m*s.n*s.out.Size()) // NaN: an element the kernel does not write shows
		p, err := planStream(s.m, s.n, s.k, o.SMs, o.MaxShared)
		if err != nil || !o.streamTakes(got, x, w) {
			t.Fatalf("M=%d N=%d K=%d: linear_stream refuses it: %v", s.m, s.n, s.k, err)
		}
		o.stream(got, x, w, b)
		d := kernels.Compare(read(t, dev, got), ref)
		if err := o.linearStreamWaits(); err != nil {
			t.Fatal(err)
		}
		ms := msPerCall(t, dev, func() { o.stream(got, x, w, b) })
		skMs := msPerCall(t, dev, func() { o.skinny(want, x, w, b) })
		gb := float64(s.n) * float64(s.k) * 2 / 1e9
		t.Logf("M=%d N=%d K=%d bias=%v out=%v %v: rel %.2e, max %.3g at %d; %.2f µs (%.0f GB/s), skinny %.2f µs, cuBLAS %.2f µs",
			s.m, s.n, s.k, s.bias, s.out, p, d.Rel, d.Max, d.MaxAt, ms*1e3, gb/ms*1e3, skMs*1e3, refMs*1e3)
		if d.Unwritten > 0 || d.Rel > 1e-3 {
			t.Errorf("M=%d N=%d K=%d bias=%v out=%v: against the f32 product rounded once %+v", s.m, s.n, s.k, s.bias, s.out, d)
		}
		for _, a := range []*kernels.Tensor{x, w, b, acc, want, got} {
			if a != nil {
				dev.Free(a)
			}
		}
	}
}

// bitsDiffer is how many of got's values are not want's bit for bit, and
// the first of them (-1 for none).
func bitsDiffer(want, got []float32) (n, first int) {
	first = -1
	for i := range want {
		if i >= len(got) || math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			if n == 0 {
				first = i
			}
			n++
		}
	}
	return n, first
}

// TestLinearStreamCompiles compiles linear_stream's module, every epilogue
// with and without the norm first, by NVRTC without a GPU (nvrtcReport:
// no spills, every kernel there).
func TestLinearStreamCompiles(t *testing.T) { nvrtcReport(t, lsModule()) }

// TestLinearStreamNormExact holds linear_stream normalising x as it loads
// it (add_rms_norm_linear's and add_rms_norm_linear_swiglu's variant
// stream) against the parts the fused set runs without it, add_rms_norm
// then linear_stream (or linear_stream with SwiGLU), bit for bit in out
// and in the residual: rows whose norm add_rms_norm takes in 32 to 1,024
// threads (its sum of squares the kernel must follow; 16 rows of 8,192
// are more x than a block holds), Qwen2-7B's qkv
// (bias) and gate/up, DeepSeek-V2-Lite's dense gate/up, at 1, 3 and 16
// rows, each launched twice in a row (the count of blocks that have read
// the residual must be back at 0 for the second), then times both at one
// row for a first look.
func TestLinearStreamNormExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_stream", func(o *ops) error { return o.ls.err })
	rng := rand.New(rand.NewSource(29))
	normal := normalOn(t, dev, rng)
	const eps = 1e-6
	for _, s := range []struct {
		n, k         int // w's rows (2I with swiglu), K
		bias, swiglu bool
	}{
		{4608, 3584, true, false}, {2 * 18944, 3584, false, true}, {2 * 10944, 2048, false, true},
		{200, 96, true, false}, {64, 544, false, true}, {300, 5120, true, false}, {96, 8192, false, false},
	} {
		w := normal(kernels.BF16, 1/math.Sqrt(float64(s.k)), s.n, s.k)
		norm := tensorOn(t, dev, kernels.BF16, func() []float32 {
			g := gaussians(rng, s.k, 0.2)
			for i := range g {
				g[i]++
			}
			return g
		}(), s.k)
		var bias *kernels.Tensor
		if s.bias {
			bias = normal(kernels.BF16, 0.5, s.n)
		}
		outs := s.n
		if s.swiglu {
			outs = s.n / 2
		}
		for _, m := range []int{1, 3, linMaxRows} {
			sms, shared := streamTarget(o)
			if _, err := planStream(m, s.n, s.k, sms, shared); err != nil {
				t.Logf("M=%d N=%d K=%d: linear_stream does not take it (%v)", m, s.n, s.k, err)
				continue
			}
			x := normal(kernels.BF16, 3, m, s.k)
			r0 := gaussians(rng, m*s.k, 1)
			residA, residB := tensorOn(t, dev, kernels.BF16, r0, m, s.k), tensorOn(t, dev, kernels.BF16, r0, m, s.k)
			h := dev.Alloc(kernels.BF16, m, s.k)
			want, got := dev.Alloc(kernels.BF16, m, outs), dev.Alloc(kernels.BF16, m, outs)
			name := fmt.Sprintf("M=%d N=%d K=%d swiglu=%v", m, s.n, s.k, s.swiglu)
			parts := func() {
				o.AddRMSNorm(h, residA, x, norm, eps)
				ok := false
				if s.swiglu {
					ok = o.streamSwiGLU(want, h, w)
				} else {
					ok = o.stream(want, h, w, bias)
				}
				if !ok {
					t.Fatalf("%s: linear_stream refuses the problem", name)
				}
			}
			whole := func() {
				if !o.streamNorm(got, h, residB, x, norm, eps, w, bias, s.swiglu) {
					t.Fatalf("%s: linear_stream normalising x refuses it", name)
				}
			}
			for round := range 2 {
				parts()
				dev.MemsetD8(dev.Ptr(got), 0xff, m*outs*2) // NaN: an element the kernel does not write shows
				whole()
				if err := o.linearStreamWaits(); err != nil {
					t.Fatal(err)
				}
				if n, at := bitsDiffer(read(t, dev, want), read(t, dev, got)); n > 0 {
					t.Errorf("%s, launch %d: %d of %d outputs differ from add_rms_norm then linear_stream, the first [%d,%d]",
						name, round+1, n, m*outs, at/outs, at%outs)
				}
				if n, at := bitsDiffer(read(t, dev, residA), read(t, dev, residB)); n > 0 {
					t.Errorf("%s, launch %d: %d of %d residual elements differ from add_rms_norm's, the first [%d,%d]",
						name, round+1, n, m*s.k, at/s.k, at%s.k)
				}
			}
			if m == 1 && s.k == 3584 {
				ms := msPerCall(t, dev, whole)
				pairMs := msPerCall(t, dev, parts)
				t.Logf("%s: %.2f µs, add_rms_norm + linear_stream %.2f µs", name, ms*1e3, pairMs*1e3)
			}
			for _, a := range []*kernels.Tensor{x, residA, residB, h, want, got} {
				dev.Free(a)
			}
		}
		for _, a := range []*kernels.Tensor{w, norm, bias} {
			if a != nil {
				dev.Free(a)
			}
		}
	}
}
