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

// TestLinearWgmmaHost checks linear_wgmma's host side without a GPU: every
// instance fits an H100/H200 block with its register split (and
// TestInstancesHeader that linear_wgmma.cu instantiates them), w's copies
// are whole core matrices shared evenly by a cluster's blocks, the grid of
// the clustered instances is whole clusters, the variants are offered on
// sm_90a only, cuBLAS stays the untuned default, and a choice of them
// follows whether the kernel was built and the key's K.
func TestLinearWgmmaHost(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range lwConfigs {
		if c.shared() > h200.SharedPerBlock {
			t.Errorf("%+v: %d bytes of shared memory, an sm_90a block gets %d", c, c.shared(), h200.SharedPerBlock)
		}
		for _, swiglu := range []bool{false, true} {
			if r := c.wRows(swiglu); r%8 != 0 || r*max(1, c.Cluster) > c.BN || c.BN%r != 0 {
				t.Errorf("%+v (swiglu %v): copies of %d rows of w", c, swiglu, r)
			}
		}
	}
	mc2, _ := lwConfigNamed("wgmma_mc2")
	if mc2.Cluster != 2 || mc2.kernel() != "linear_wgmma_n256_s4_c2" || mc2.swigluKernel() != "linear_wgmma_swiglu_n256_s4_c2" {
		t.Errorf("wgmma_mc2: %+v, kernels %s and %s", mc2, mc2.kernel(), mc2.swigluKernel())
	}
	kit := &lwKit{clusters: map[string]int{"wgmma_mc2": 66}}
	for _, c := range []struct {
		m, n          int
		swiglu        bool
		units, blocks int
	}{
		// Qwen2-7B's o at W1's prompt: 85 m-tiles (the last cluster's
		// second block past M) by 14 n-tiles; gate_up with SwiGLU at
		// 16,384 rows (I = 18,944 columns out, 128 a tile); one row (one
		// cluster, its second block's tile past M); 300 rows by 1,000.
		{10816, 3584, false, 43 * 14, 132}, {16384, 18944, true, 64 * 148, 132}, {1, 64, false, 1, 2}, {300, 1000, false, 2 * 4, 16},
	} {
		u := mc2.units(c.m, c.n, c.swiglu)
		if g := kit.grid(mc2, 132, u); u != c.units || int(g) != c.blocks {
			t.Errorf("wgmma_mc2 at M=%d N=%d swiglu=%v: %d units on %d blocks, want %d on %d", c.m, c.n, c.swiglu, u, g, c.units, c.blocks)
		}
	}
	if u := lwConfigs[0].units(10816, 3584, false); u != 85*14 || kit.grid(lwConfigs[0], 132, u) != 132 {
		t.Errorf("wgmma at M=10816 N=3584: %d tiles", u)
	}
	if lwProducerRegs*128+lwConsumerRegs*256 > 65536/lwThreads/8*8*lwThreads || lwProducerRegs%8 != 0 || lwConsumerRegs%8 != 0 {
		t.Errorf("setmaxnreg %d/%d: over the registers the block is launched with, or not multiples of 8", lwProducerRegs, lwConsumerRegs)
	}
	gateUp := kernels.Shape{"M": 16384, "N": 37888, "K": 3584}
	if got := valid(variants(kernels.OpLinear, gateUp, h200)); fmt.Sprint(got) != "[cublas wgmma wgmma_n128 wgmma_mc2 wgmma_n128_mc2 wgmma_hold wgmma_hold_mc2]" {
		t.Errorf("linear at W1's gate_up on sm_90a: %v", got)
	}
	if got := valid(variants(kernels.OpLinear, gateUp, kernels.Targets["sm_80"])); fmt.Sprint(got) != "[cublas]" {
		t.Errorf("linear at W1's gate_up on sm_80: %v", got)
	}
	o := &ops{}
	key := o.TuningKey(kernels.OpLinear, gateUp)
	if v := o.VariantFor(kernels.OpLinear, key); v != linCuBLAS {
		t.Errorf("%s runs %q untuned, want cublas until linear_wgmma is measured", key, v)
	}
	o.lw = &lwKit{err: fmt.Errorf("no Hopper here")}
	if err := o.UseVariant(kernels.OpLinear, key, "wgmma"); err == nil || !strings.Contains(err.Error(), "no Hopper here") {
		t.Errorf("UseVariant wgmma without linear_wgmma: %v", err)
	}
	o.lw = &lwKit{fit: map[string]lwConfig{"wgmma": lwConfigs[0]}, why: map[string]error{"wgmma_n128": fmt.Errorf("too big")}}
	if err := o.UseVariant(kernels.OpLinear, key, "wgmma"); err != nil || o.VariantFor(kernels.OpLinear, key) != "wgmma" {
		t.Errorf("UseVariant wgmma: %v, now %q", err, o.VariantFor(kernels.OpLinear, key))
	}
	if err := o.UseVariant(kernels.OpLinear, key, "wgmma_n128"); err == nil || !strings.Contains(err.Error(), "too big") {
		t.Errorf("UseVariant wgmma_n128 where it does not fit: %v", err)
	}
	if err := o.UseVariant(kernels.OpLinear, "M=300,N=50,K=100", "wgmma"); err == nil || !strings.Contains(err.Error(), "K a multiple of 8") {
		t.Errorf("UseVariant wgmma at K=100: %v", err)
	}
	defer func(v string, rows int) { linWgmmaDefault, linWgmmaRows = v, rows }(linWgmmaDefault, linWgmmaRows)
	linWgmmaDefault, linWgmmaRows = "wgmma", 128
	for _, c := range []struct {
		k    linearKey
		want string
	}{
		{linearKey{16384, 4608, 3584}, "wgmma"}, {linearKey{128, 3584, 18944}, "wgmma"},
		{linearKey{127, 3584, 3584}, linCuBLAS}, {linearKey{16, 37888, 3584}, linSkinny},
	} {
		if got := o.linearDefault(c.k); got != c.want {
			t.Errorf("with linWgmmaDefault wgmma from 128 rows, %s runs %q, want %q", c.k, got, c.want)
		}
	}
	linWgmmaDefault = "wgmma_n128" // not fitting here: cuBLAS
	if got := o.linearDefault(linearKey{16384, 4608, 3584}); got != linCuBLAS {
		t.Errorf("with a default that cannot run, %q runs", got)
	}
}

// TestLinearWgmmaCompiles compiles linear_wgmma.cu as the set does, with
// ptxas's report, and fails on a serialized wgmma pipeline, setmaxnreg
// ignored (C75xx) or spills. With FUSELM_LINEAR_WGMMA_CUBIN=path it writes
// the cubin there, for `cuobjdump -sass path`.
func TestLinearWgmmaCompiles(t *testing.T) {
	hopperCompileReport(t, lwModule(), "FUSELM_LINEAR_WGMMA_CUBIN", false)
}

// TestLinearWgmmaNVRTCCompiles is TestLinearWgmmaCompiles without a GPU:
// linear_wgmma.cu by the NVRTC library at $FUSELM_NVRTC (nvrtcReport);
// skipped when FUSELM_NVRTC is unset.
func TestLinearWgmmaNVRTCCompiles(t *testing.T) { nvrtcReport(t, lwModule()) }

// TestLinearWgmmaKernels runs the shared kerneltest's linear cases (1 to
// 1,000 rows, K and N of no tile, bias, pitched x and out; those linear_wgmma
// cannot take, f32 out or K not a multiple of 8, run cuBLAS) with each
// instance of linear_wgmma the default from one row (the clustered ones
// at odd m-tile counts too: 1, 3 and 9 m-tiles leave the last cluster's
// second block past M), then once more per 128×256 instance with swaths of
// 2 m-tiles (of 2 pairs with clusters of two), so that the cases of 3 to 8
// m-tiles end on a short swath.
func TestLinearWgmmaKernels(t *testing.T) { runLwInstances(t, kernels.OpLinear) }

// runLwInstances runs the shared kerneltest's cases of op with each
// instance of linear_wgmma the default from one row, then once more per
// 128×256 instance with short swaths.
func runLwInstances(t *testing.T, op kernels.Op) {
	dev, _ := openHopperSet(t, "linear_wgmma", func(o *ops) error { return o.lw.err })
	defer func(v string, rows, g int) { linWgmmaDefault, linWgmmaRows, lwGroup = v, rows, g }(linWgmmaDefault, linWgmmaRows, lwGroup)
	linWgmmaRows = 1
	for _, c := range lwConfigs {
		linWgmmaDefault = c.Variant
		t.Run(c.Variant, func(t *testing.T) {
			kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), op)
		})
	}
	for _, c := range lwShortSwaths() {
		linWgmmaDefault, lwGroup = c.Variant, 2*c.Cluster
		t.Run(fmt.Sprintf("%s,group=%d", c.Variant, lwGroup), func(t *testing.T) {
			kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), op)
		})
	}
}

// lwShortSwaths are the instances the kernel tests run once more with
// short swaths: those of 128×256 tiles, with clusters and without.
func lwShortSwaths() []lwConfig {
	var cs []lwConfig
	for _, c := range lwConfigs {
		if c.BN == 256 {
			cs = append(cs, c)
		}
	}
	return cs
}

// TestLinearWgmmaCuBLAS holds each instance against cuBLAS much closer
// than the kerneltest's 2%: without a bias against cudaset.Addmm (what
// naive runs; both sum in f32 and round once), with one against cuBLAS's
// f32 product plus the bf16 bias rounded once on the host (Addmm rounds
// twice there), so that they differ only where their orders of summation
// round an element to the other side of a bf16 step. Shapes: of no tile (once with an f32 bias, which lwBias
// rounds into a bf16 copy), Qwen2-7B's qkv (with bias) and down at 1,000
// rows, and 9 m-tiles of qkv over K = 1,024 (more tiles than SMs, and more
// pairs of m-tiles than clusters, the last pair's second tile past M). It also times both, for a first look (infer bench linear is
// the measurement).
func TestLinearWgmmaCuBLAS(t *testing.T) {
	dev, o := openHopperSet(t, "linear_wgmma", func(o *ops) error { return o.lw.err })
	random := normalOn(t, dev, rand.New(rand.NewSource(21)))
	for _, s := range []struct {
		m, n, k int
		bias    bool
		biasDT  kernels.DType
	}{{300, 1000, 520, true, kernels.BF16}, {300, 1000, 520, true, kernels.F32}, {1000, 4608, 3584, true, kernels.BF16},
		{1000, 3584, 18944, false, 0}, {129, 264, 200, false, 0}, {1100, 4608, 1024, true, kernels.BF16}} {
		x := random(kernels.BF16, 1, s.m, s.k)
		w := random(kernels.BF16, 1/math.Sqrt(float64(s.k)), s.n, s.k)
		var b *kernels.Tensor
		if s.bias {
			b = random(s.biasDT, 0.5, s.n)
		}
		want := dev.Alloc(kernels.BF16, s.m, s.n)
		o.Addmm(want, x, w, b)
		ref := read(t, dev, want)
		refMs := msPerCall(t, dev, func() { o.Addmm(want, x, w, b) })
		if s.bias {
			// cuBLAS with beta = 1 over the bias rows rounds its product
			// before it adds them (the log below says by how much): the
			// reference is cuBLAS's f32 product, the bias in bf16 added on
			// the host and rounded once, as the kernel and HF's addmm do.
			acc := dev.Alloc(kernels.F32, s.m, s.n)
			o.Gemm(true, s.m, s.n, s.k, 1, o.Mat(x), o.Mat(w), 0, o.Mat(acc))
			sum, bv := read(t, dev, acc), read(t, dev, b)
			for i := range sum {
				sum[i] = roundBF16(sum[i] + roundBF16(bv[i%s.n]))
			}
			t.Logf("M=%d N=%d K=%d bias (%v): cuBLAS's addmm against the sum rounded once: %+v", s.m, s.n, s.k, s.biasDT,
				kernels.Compare(ref, sum))
			ref = sum
			dev.Free(acc)
		}
		for _, c := range lwConfigs {
			got := dev.Alloc(kernels.BF16, s.m, s.n)
			dev.MemsetD8(dev.Ptr(got), 0xff, s.m*s.n*2) // NaN: an element the kernel does not write shows
			cfg, err := o.lw.config(c.Variant)
			if err != nil {
				t.Logf("%s: %v", c.Variant, err)
				continue
			}
			o.linearWgmma(cfg, got, x, w, b)
			d := kernels.Compare(read(t, dev, got), ref)
			if err := o.linearWgmmaWaits(); err != nil {
				t.Fatal(err)
			}
			ms := msPerCall(t, dev, func() { o.linearWgmma(cfg, got, x, w, b) })
			flop := 2 * float64(s.m) * float64(s.n) * float64(s.k)
			t.Logf("M=%d N=%d K=%d bias=%v (%v) %s: rel %.2e, max %.3g at %d; %.3f ms (%.0f TFLOP/s), cuBLAS %.3f ms (%.0f)",
				s.m, s.n, s.k, s.bias, s.biasDT, c.Variant, d.Rel, d.Max, d.MaxAt, ms, flop/ms/1e9, refMs, flop/refMs/1e9)
			if d.Unwritten > 0 || d.Rel > 1e-3 {
				t.Errorf("M=%d N=%d K=%d bias=%v (%v) %s: against cuBLAS %+v", s.m, s.n, s.k, s.bias, s.biasDT, c.Variant, d)
			}
			dev.Free(got)
		}
		for _, a := range []*kernels.Tensor{x, w, b, want} {
			if a != nil {
				dev.Free(a)
			}
		}
	}
}

// roundBF16 rounds a finite float32 to the nearest bf16, ties to even.
func roundBF16(f float32) float32 {
	b := math.Float32bits(f)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}
