package fused

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
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
	if got := o.VariantFor(kernels.OpGroupGemm, dec); got != dynVariant {
		t.Errorf("group_gemm at decode's tiling runs %q: it has no folded variant, and runs %s there", got, dynVariant)
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

// TestMoERoutedVariants checks, without a GPU, moe_routed's variants: the
// routing gate/up at decode's tiling by default and unfused beside it, and
// unfused only at the others, where moe_experts does not fold.
func TestMoERoutedVariants(t *testing.T) {
	o := &ops{}
	op := kernels.OpMoERouted
	dec := o.TuningKey(op, kernels.Shape{"N": 8, "topk": 6, "E": 64})
	if dec != "tiling="+foldTiling || o.VariantFor(op, dec) != routedVariant {
		t.Fatalf("decode key %q runs %q untuned, want %s", dec, o.VariantFor(op, dec), routedVariant)
	}
	if err := o.UseVariant(op, dec, routedUnfused); err != nil || o.VariantFor(op, dec) != routedUnfused {
		t.Errorf("%s at decode: %v, now %q", routedUnfused, err, o.VariantFor(op, dec))
	}
	pre := o.TuningKey(op, kernels.Shape{"N": 11041, "topk": 6, "E": 64})
	if pre != "tiling="+prefillTiling || o.VariantFor(op, pre) != routedUnfused {
		t.Errorf("prefill key %q runs %q untuned, want %s", pre, o.VariantFor(op, pre), routedUnfused)
	}
	if err := o.UseVariant(op, pre, routedVariant); err == nil {
		t.Errorf("%s accepted at prefill's tiling", routedVariant)
	}
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		s    kernels.Shape
		want []string
	}{
		{kernels.Shape{"N": 1, "H": 2048, "I": 1408, "E": 64, "topk": 6}, []string{routedUnfused, routedVariant}},
		{kernels.Shape{"N": 300, "H": 2048, "I": 1408, "E": 64, "topk": 6}, []string{routedUnfused}},
	} {
		var names []string
		for _, v := range variants(op, c.s, h200) {
			if v.Valid() {
				names = append(names, v.Name)
			}
		}
		if !slices.Equal(names, c.want) {
			t.Errorf("%s: variants %v, want %v", c.s, names, c.want)
		}
	}
}

// TestMoERoutedExact holds moe_routed's chain (moe_gate_up_route, every
// gate/up block routing the tokens itself, then the folded down and
// combine) against moe_route then moe_experts on the same set, bit for bit:
// out, idx and weight. Routes: DeepSeek-V2-Lite's (greedy top-6 of 64
// experts, one group), group-limited (8 groups, top 3, normalised and
// scaled), and logits of exact ties (a quarter of a token's experts share
// its best score: the tie order decides), at 1, 3, 5 and 8 tokens
// (foldTokens; routeFoldTokens raised to it), at V2-Lite's expert dims and
// at dims of no tile. Past foldTokens, and with the variant unfused chosen, the call must decline
// (the Dispatch then runs the parts). Outputs start as NaN (idx as -1), so
// that one left unwritten shows; each chain runs twice, so that a counter
// the down kernel leaves behind shows in the second.
func TestMoERoutedExact(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	defer func(n int) { routeFoldTokens = n }(routeFoldTokens)
	routeFoldTokens = foldTokens // route in the gate/up blocks every case the fold takes, not only the default's
	set, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	o := set.(*ops)
	rng := rand.New(rand.NewSource(29))
	random := normalOn(t, dev, rng)
	lite := kernels.Routing{Method: kernels.RouteGreedy, TopK: 6, Groups: 1, TopKGroups: 1, Scale: 1}
	limited := kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, NormTopK: true, Scale: 2.5}
	const experts = 64
	for _, c := range []struct {
		name             string
		n, hidden, inter int
		r                kernels.Routing
		ties             bool
	}{
		{"v2-lite", 1, 2048, 1408, lite, false}, {"v2-lite", 3, 2048, 1408, lite, false},
		{"v2-lite", 8, 2048, 1408, lite, false}, {"group-limited", 8, 2048, 1408, limited, false},
		{"ties", 1, 520, 264, lite, true}, {"ties", 8, 520, 264, lite, true},
		{"ties, group-limited", 5, 520, 264, limited, true}, {"group-limited", 3, 1000, 96, limited, false},
		{"v2-lite, past the fold", 9, 512, 256, lite, false}, {"v2-lite, past the fold", 16, 2048, 1408, lite, false},
	} {
		name := fmt.Sprintf("%s n=%d H=%d I=%d", c.name, c.n, c.hidden, c.inter)
		k := c.r.TopK
		vals := make([]float32, c.n*experts)
		for i := range vals {
			if c.ties {
				vals[i] = float32(rng.Intn(4)) * 0.5
			} else {
				vals[i] = float32(rng.NormFloat64() * 2)
			}
		}
		logits := tensorOn(t, dev, kernels.F32, vals, c.n, experts)
		x := random(kernels.BF16, 1, c.n, c.hidden)
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), experts, 2*c.inter, c.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), experts, c.hidden, c.inter)
		out, idx, weight := dev.Alloc(kernels.BF16, c.n, c.hidden), dev.Alloc(kernels.I32, c.n, k), dev.Alloc(kernels.F32, c.n, k)
		poison := func() {
			dev.MemsetD8(dev.Ptr(out), 0xff, c.n*c.hidden*2)
			dev.MemsetD8(dev.Ptr(idx), 0xff, c.n*k*4)
			dev.MemsetD8(dev.Ptr(weight), 0xff, c.n*k*4)
		}
		type result struct {
			out, weight []float32
			idx         []int32
		}
		results := func() result {
			ids, err := dev.ReadI32(idx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return result{out: read(t, dev, out), weight: read(t, dev, weight), idx: ids}
		}
		parts := func() {
			o.MoERoute(idx, weight, logits, &c.r)
			o.MoEExperts(out, x, idx, weight, gateUp, down)
		}
		whole := func() (kernels.Unsupported, bool) {
			return kernels.Declined(func() { o.MoERouted(out, idx, weight, x, logits, gateUp, down, &c.r) })
		}
		poison()
		parts()
		want := results()
		folds := c.n <= foldTokens
		for rep := range 2 {
			poison()
			if u, declined := whole(); declined != !folds {
				t.Fatalf("%s: declined %v (%v), want %v", name, declined, u, !folds)
			} else if declined {
				break
			}
			got := results()
			if !slices.Equal(got.idx, want.idx) {
				t.Errorf("%s, run %d: experts %v, moe_route's %v", name, rep, got.idx, want.idx)
			}
			for _, v := range []struct {
				what      string
				got, want []float32
			}{{"weight", got.weight, want.weight}, {"out", got.out, want.out}} {
				if bad, at := bitsDiffer(v.got, v.want); bad > 0 {
					t.Errorf("%s, run %d: %d of %d %s values differ from moe_route then moe_experts', first at %d: %g against %g",
						name, rep, bad, len(v.want), v.what, at, v.got[at], v.want[at])
				}
			}
		}
		key := o.TuningKey(kernels.OpMoERouted, kernels.Shape{"N": c.n, "topk": k, "E": experts})
		if folds {
			if err := o.UseVariant(kernels.OpMoERouted, key, routedUnfused); err != nil {
				t.Fatal(err)
			}
			if _, declined := whole(); !declined {
				t.Errorf("%s: ran whole with %s chosen", name, routedUnfused)
			}
			if err := o.UseVariant(kernels.OpMoERouted, key, routedVariant); err != nil {
				t.Fatal(err)
			}
			msParts := msPerCall(t, dev, parts)
			msWhole := msPerCall(t, dev, func() { whole() })
			t.Logf("%s: moe_routed %.2f µs, moe_route then moe_experts %.2f µs (alone, back to back)", name, msWhole*1e3, msParts*1e3)
		}
		for _, a := range []*kernels.Tensor{logits, x, gateUp, down, out, idx, weight} {
			dev.Free(a)
		}
	}
}
