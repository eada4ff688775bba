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

// TestWgmmaHost checks group_wgmma's host side without a GPU: every
// instance fits an H100/H200 block (TestInstancesHeader checks that
// group_wgmma.cu instantiates them), the variant is offered at the prefill
// tiling on sm_90a only, and choosing it follows the tuning key and whether
// the kernel was built.
func TestWgmmaHost(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range gwConfigs {
		if c.sharedTMA() > h200.SharedPerBlock {
			t.Errorf("%+v: %d bytes of shared memory with the output boxes, an sm_90a block gets %d", c, c.sharedTMA(),
				h200.SharedPerBlock)
		}
	}
	if gwProducerRegs*128+gwConsumerRegs*256 > 65536 || gwProducerRegs%8 != 0 || gwConsumerRegs%8 != 0 {
		t.Errorf("setmaxnreg %d/%d: over the register file or not multiples of 8", gwProducerRegs, gwConsumerRegs)
	}
	w3 := kernels.Shape{"M": 66246, "N": 2816, "K": 2048, "E": 64}
	names := func(vs []kernels.Variant) (n []string) {
		for _, v := range vs {
			if v.Valid() {
				n = append(n, v.Name)
			}
		}
		return n
	}
	if got := names(variants(kernels.OpGroupGemm, w3, h200)); fmt.Sprint(got) != "[grouped_mma grouped_wgmma]" {
		t.Errorf("group_gemm at W3 on sm_90a: %v", got)
	}
	if got := names(variants(kernels.OpGroupGemm, w3, kernels.Targets["sm_80"])); fmt.Sprint(got) != "[grouped_mma]" {
		t.Errorf("group_gemm at W3 on sm_80: %v", got)
	}
	if got := names(variants(kernels.OpGroupGemm, kernels.Shape{"M": 96, "N": 2816, "K": 2048, "E": 64}, h200)); fmt.Sprint(got) != "[grouped_mma grouped_mma_dyn]" {
		t.Errorf("group_gemm at decode on sm_90a: %v", got)
	}
	o := &ops{}
	key := o.TuningKey(kernels.OpGroupGemm, w3)
	if key != "tiling=m128" || o.VariantFor(kernels.OpGroupGemm, key) != "grouped_mma" {
		t.Fatalf("key %q runs %q untuned", key, o.VariantFor(kernels.OpGroupGemm, key))
	}
	o.gw = &gwKit{err: fmt.Errorf("no Hopper here")}
	if err := o.UseVariant(kernels.OpGroupGemm, key, wgmmaVariant); err == nil || !strings.Contains(err.Error(), "no Hopper here") {
		t.Errorf("UseVariant grouped_wgmma without group_wgmma: %v", err)
	}
	o.gw = &gwKit{config: gwConfigs[0]}
	if err := o.UseVariant(kernels.OpMoEExperts, key, wgmmaVariant); err != nil || o.VariantFor(kernels.OpMoEExperts, key) != wgmmaVariant {
		t.Errorf("UseVariant grouped_wgmma: %v, now %q", err, o.VariantFor(kernels.OpMoEExperts, key))
	}
	if err := o.UseVariant(kernels.OpMoEExperts, "tiling=m16", wgmmaVariant); err == nil {
		t.Errorf("grouped_wgmma accepted at decode's tiling")
	}
	if err := o.UseVariant(kernels.OpMoEExperts, key, "cublas_per_expert"); err != nil || o.VariantFor(kernels.OpMoEExperts, key) != "cublas_per_expert" {
		t.Errorf("back to cublas_per_expert: %v, now %q", err, o.VariantFor(kernels.OpMoEExperts, key))
	}
	untuned := "grouped_mma" // group_gemm's own default where group_wgmma can run
	if prefillWgmma {
		untuned = wgmmaVariant
	}
	if got := o.VariantFor(kernels.OpGroupGemm, key); got != untuned {
		t.Errorf("group_gemm follows moe_experts' choice (cublas_per_expert): runs %q, want its own default %q", got, untuned)
	}
}

// TestWgmmaCompiles compiles group_wgmma.cu as the set does, with ptxas's
// report, and fails on a serialized wgmma pipeline or a setmaxnreg ignored
// (C75xx); spills are logged (the gathering n256 instance has 4 bytes).
func TestWgmmaCompiles(t *testing.T) {
	hopperCompileReport(t, gwModule(), "FUSELM_WGMMA_CUBIN", true)
}

// TestWgmmaKernels runs the shared kerneltest with group_wgmma chosen for
// group_gemm and moe_experts at the prefill tiling (the cases of 300 rows
// in 4 groups and of 300 tokens run it), gathering in the producer and
// gathering first; a timed-out wait fails it with where it waited.
func TestWgmmaKernels(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	if p := dev.Props(); p.Arch != hopperArch {
		t.Skipf("group_wgmma runs on %s only; %s is %s", hopperArch, p.Name, p.Arch)
	}
	defer func(on, g bool) { prefillWgmma, wgmmaGather = on, g }(prefillWgmma, wgmmaGather)
	prefillWgmma = true
	for _, gather := range []bool{true, false} {
		wgmmaGather = gather
		t.Run(fmt.Sprintf("gather=%v", gather), func(t *testing.T) {
			kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpGroupGemm, kernels.OpMoEExperts)
		})
	}
}

// TestWgmmaTMAOutExact runs moe_experts on group_wgmma at the prefill's
// tiling with the down projection's output by tensor stores and by stores
// from registers, and holds the two outputs equal bit for bit: 2,048
// tokens at DeepSeek-V2-Lite's dims (W5's prefill) and at dims of partial
// tiles (hidden 200: a last box of 8 columns), distinct routing.
func TestWgmmaTMAOutExact(t *testing.T) {
	dev, o := openHopperSet(t, "group_wgmma", func(o *ops) error { return o.gw.ready() })
	defer func(on, tma bool) { prefillWgmma, wgmmaTMAOut = on, tma }(prefillWgmma, wgmmaTMAOut)
	prefillWgmma = true
	rng := rand.New(rand.NewSource(5))
	random := normalOn(t, dev, rng)
	for _, c := range []struct{ n, hidden, inter, experts, k int }{{2048, 2048, 1408, 64, 6}, {2048, 200, 96, 16, 4}} {
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), c.experts, 2*c.inter, c.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), c.experts, c.hidden, c.inter)
		x := random(kernels.BF16, 1, c.n, c.hidden)
		idx, weight := routesOn(t, dev, rng, "distinct", c.n, c.k, c.experts)
		if cfg := configFor(c.n*c.k, c.experts); cfg.Name != prefillTiling {
			t.Fatalf("%d tokens run tiling %s, not %s", c.n, cfg.Name, prefillTiling)
		}
		var outs [2][]float32
		for i, tma := range []bool{false, true} {
			wgmmaTMAOut = tma
			out := dev.Alloc(kernels.BF16, c.n, c.hidden)
			o.MoEExperts(out, x, idx, weight, gateUp, down)
			if err := o.wgmmaWaits(); err != nil {
				t.Fatal(err)
			}
			got, err := dev.ReadF32(out) // bf16 widened exactly
			if err != nil {
				t.Fatal(err)
			}
			outs[i] = got
		}
		bad := 0
		for i := range outs[0] {
			if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("N=%d H=%d I=%d E=%d K=%d: %d of %d outputs differ between the two stores", c.n, c.hidden, c.inter, c.experts, c.k, bad, len(outs[0]))
		}
	}
}
