package fused

import (
	"math"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestMoEFoldVariants checks, without a GPU, where the folded decode path
// is moe_experts' default and that its four-launch path stays selectable
// beside it: folded at decode's tiling, grouped_mma chosen there runs, and
// neither is accepted at prefill's.
func TestMoEFoldVariants(t *testing.T) {
	o := &ops{}
	dec := o.TuningKey(kernels.OpMoEExperts, kernels.Shape{"N": 16, "topk": 6, "E": 64})
	if dec != "tiling="+foldTiling || o.VariantFor(kernels.OpMoEExperts, dec) != foldedVariant {
		t.Fatalf("decode key %q runs %q untuned, want %s", dec, o.VariantFor(kernels.OpMoEExperts, dec), foldedVariant)
	}
	if err := o.UseVariant(kernels.OpMoEExperts, dec, "grouped_mma"); err != nil || o.VariantFor(kernels.OpMoEExperts, dec) != "grouped_mma" {
		t.Errorf("grouped_mma at decode: %v, now %q", err, o.VariantFor(kernels.OpMoEExperts, dec))
	}
	if got := o.VariantFor(kernels.OpGroupGemm, dec); got != "grouped_mma" {
		t.Errorf("group_gemm at decode's tiling runs %q: it has no folded variant", got)
	}
	for _, v := range []string{foldedVariant, "grouped_mma"} {
		if err := o.UseVariant(kernels.OpMoEExperts, "tiling="+prefillTiling, v); err == nil {
			t.Errorf("%s accepted at prefill's tiling", v)
		}
	}
	if err := o.UseVariant(kernels.OpGroupGemm, dec, foldedVariant); err == nil {
		t.Errorf("group_gemm accepted the folded variant")
	}
	c := foldConfig()
	o.moeCounters = &kernels.Tensor{}
	for _, s := range []struct {
		tokens, choices, hidden int
		want                    bool
	}{{1, 6, 2048, true}, {foldTokens, 6 * foldTokens, 2048, true}, {foldTokens + 1, 6 * foldTokens, 2048, false},
		{1, 6, foldCounters*c.BN + 1, false}} {
		if got := o.foldTakes(c, s.tokens, s.choices, s.hidden); got != s.want {
			t.Errorf("%d tokens, %d choices, hidden %d: folds %v, want %v", s.tokens, s.choices, s.hidden, got, s.want)
		}
	}
	defer func(n int) { foldTokens = n }(foldTokens)
	foldTokens = foldMax
	if o.foldTakes(c, foldMax, foldMax+1, 2048) {
		t.Errorf("%d choices fold: more than a block ranks", foldMax+1)
	}
}

// TestMoEFoldExact holds the folded decode path (two launches, taken for
// every case up to foldMax choices, past the default's foldTokens) against
// moe_experts' four (grouped_mma chosen at the same key) on the same
// inputs, bit for bit: the same rows and products, the same weighted sum in
// k order. Cases: one token and DeepSeek-V2-Lite's dims; tokens sharing
// their experts (16 rows an expert: one whole m-tile; 21: a second, short
// one); hidden sizes of no n-tile; more choices than the fold takes (both
// paths then the four launches). Each folded run is repeated, so a counter
// left behind by the first shows in the second; the output starts as NaN,
// so a column no block sums shows too.
func TestMoEFoldExact(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	set, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	o := set.(*ops)
	rng := rand.New(rand.NewSource(23))
	random := normalOn(t, dev, rng)
	key := "tiling=" + foldTiling
	defer func(n int) { foldTokens = n }(foldTokens)
	foldTokens = foldMax // fold every case the kernels take, not only the default's
	for _, c := range []struct {
		n, hidden, inter, experts, k int
		shared                       bool // every token picks the same experts
	}{
		{1, 2048, 1408, 16, 6, false}, {3, 512, 256, 64, 6, false}, {16, 2048, 1408, 16, 6, true},
		{16, 512, 256, 64, 6, false}, {21, 512, 256, 64, 6, true}, {21, 520, 264, 8, 6, false},
		{5, 1000, 96, 64, 6, false}, {22, 512, 256, 64, 6, false},
	} {
		choices := c.n * c.k
		x := random(kernels.BF16, 1, c.n, c.hidden)
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), c.experts, 2*c.inter, c.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), c.experts, c.hidden, c.inter)
		ids := make([]int, choices)
		ws := make([]float32, choices)
		first := rng.Perm(c.experts)
		for tok := range c.n {
			pick := first
			if !c.shared {
				pick = rng.Perm(c.experts)
			}
			for j := range c.k {
				ids[tok*c.k+j] = pick[j]
				ws[tok*c.k+j] = float32(rng.Float64())
			}
		}
		idx := intsOn(t, dev, ids)
		idx.Shape, idx.Pitch = []int{c.n, c.k}, c.k
		weight := tensorOn(t, dev, kernels.F32, ws, c.n, c.k)
		run := func(variant string) []float32 {
			if err := o.UseVariant(kernels.OpMoEExperts, key, variant); err != nil {
				t.Fatal(err)
			}
			out := dev.Alloc(kernels.BF16, c.n, c.hidden)
			dev.MemsetD8(dev.Ptr(out), 0xff, c.n*c.hidden*2)
			o.MoEExperts(out, x, idx, weight, gateUp, down)
			v := read(t, dev, out)
			dev.Free(out)
			return v
		}
		want := run("grouped_mma")
		folds := o.foldTakes(configFor(choices, c.experts), c.n, choices, c.hidden)
		if folds != (choices <= foldMax) {
			t.Errorf("n=%d: folds %v with %d choices", c.n, folds, choices)
		}
		for rep := range 2 {
			got := run(foldedVariant)
			bad, at := 0, -1
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					if bad == 0 {
						at = i
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("n=%d H=%d I=%d E=%d shared=%v (folded %v), run %d: %d of %d outputs differ from the four launches', first at %d: %g against %g",
					c.n, c.hidden, c.inter, c.experts, c.shared, folds, rep, bad, len(want), at, got[at], want[at])
			}
		}
		out := dev.Alloc(kernels.BF16, c.n, c.hidden)
		if err := o.UseVariant(kernels.OpMoEExperts, key, "grouped_mma"); err != nil {
			t.Fatal(err)
		}
		msFour := msPerCall(t, dev, func() { o.MoEExperts(out, x, idx, weight, gateUp, down) })
		if err := o.UseVariant(kernels.OpMoEExperts, key, foldedVariant); err != nil {
			t.Fatal(err)
		}
		msTwo := msPerCall(t, dev, func() { o.MoEExperts(out, x, idx, weight, gateUp, down) })
		t.Logf("n=%d H=%d I=%d E=%d shared=%v: folded %v; %.2f µs, four launches %.2f µs (alone, back to back)",
			c.n, c.hidden, c.inter, c.experts, c.shared, folds, msTwo*1e3, msFour*1e3)
		for _, a := range []*kernels.Tensor{x, gateUp, down, idx, weight, out} {
			dev.Free(a)
		}
	}
}
