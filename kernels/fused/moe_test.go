package fused

import (
	"fmt"
	"maps"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
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
	dev, o := openSet(t)
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

// TestMoEDynVariants checks, without a GPU, where the persistent grid
// (dynVariant) is offered and chosen: at decode's tiling, for moe_experts
// (the folded variant's default past the fold; chosen, in every call) and
// group_gemm (its default), with grouped_mma, a block a tile, selectable
// beside it for both, and moe_experts' folded path on the persistent grid
// (foldDynVariant) and in one launch (oneVariant) too; at no other tiling.
func TestMoEDynVariants(t *testing.T) {
	o := &ops{}
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		op   kernels.Op
		s    kernels.Shape
		def  string
		want []string
	}{
		{kernels.OpMoEExperts, kernels.Shape{"N": 16, "H": 2048, "I": 1408, "E": 64, "topk": 6}, foldedVariant,
			[]string{"grouped_mma", dynVariant, foldedVariant, foldDynVariant, oneVariant}},
		{kernels.OpGroupGemm, kernels.Shape{"M": 96, "N": 2816, "K": 2048, "E": 64}, dynVariant, []string{"grouped_mma", dynVariant}},
		{kernels.OpMoEExperts, kernels.Shape{"N": 600, "H": 2048, "I": 1408, "E": 64, "topk": 6}, "grouped_mma", []string{"grouped_mma"}},
		{kernels.OpGroupGemm, kernels.Shape{"M": 3000, "N": 2816, "K": 2048, "E": 64}, "grouped_mma", []string{"grouped_mma"}},
	} {
		var names []string
		for _, v := range variants(c.op, c.s, h200) {
			if v.Valid() {
				names = append(names, v.Name)
			}
		}
		if !slices.Equal(names, c.want) {
			t.Errorf("%s %s: variants %v, want %v", c.op, c.s, names, c.want)
		}
		key := o.TuningKey(c.op, c.s)
		if got := o.VariantFor(c.op, key); got != c.def {
			t.Errorf("%s at %s runs %q untuned, want %q", c.op, key, got, c.def)
		}
		dyn := key == "tiling="+dynTiling
		if err := o.UseVariant(c.op, key, dynVariant); (err == nil) != dyn {
			t.Errorf("%s at %s: UseVariant %s: %v", c.op, key, dynVariant, err)
		}
		if !dyn {
			continue
		}
		if got := o.VariantFor(c.op, key); got != dynVariant {
			t.Errorf("%s at %s runs %q with %s chosen", c.op, key, got, dynVariant)
		}
		if err := o.UseVariant(c.op, key, "grouped_mma"); err != nil || o.VariantFor(c.op, key) != "grouped_mma" {
			t.Errorf("%s at %s: grouped_mma: %v, now %q", c.op, key, err, o.VariantFor(c.op, key))
		}
	}
	if o.dynTakes(dynConfig()) {
		t.Errorf("the persistent grid taken without its counters")
	}
	o.dynCounters = &kernels.Tensor{}
	for _, c := range gemmConfigs {
		if got := o.dynTakes(c); got != (c.Name == dynTiling) {
			t.Errorf("tiling %s: dynTakes %v", c.Name, got)
		}
	}
}

// TestMoEFoldDynVariants checks, without a GPU, which path moe_experts
// runs at decode's tiling by token count (foldPath): the default
// (foldedVariant) folds a block a tile up to foldTokens, on the persistent
// grid up to foldDynTokens, and runs the four launches past it;
// foldDynVariant chosen folds on the persistent grid up to foldMax
// choices; dynVariant and grouped_mma never fold. None folds without the
// counters, past foldMax choices or past foldCounters n-tiles, and the
// persistent fold needs the persistent grid's counters too. foldDynVariant
// is offered, and can be chosen, at decode's tiling only.
func TestMoEFoldDynVariants(t *testing.T) {
	o := &ops{}
	c := configNamed(dynTiling)
	const k, hidden = 6, 2048
	type path struct{ fold, dyn bool }
	grid, persistent, four := path{true, false}, path{true, true}, path{false, false}
	check := func(variant string, tokens, choices, hidden int, want path) {
		t.Helper()
		if fold, dyn := o.foldPath(variant, c, tokens, choices, hidden); (path{fold, dyn}) != want {
			t.Errorf("%s, %d tokens, %d choices, hidden %d: fold %v dyn %v, want %+v", variant, tokens, choices, hidden, fold, dyn, want)
		}
	}
	check(foldedVariant, 4, 4*k, hidden, four) // no counters allocated
	o.moeCounters = &kernels.Tensor{}
	check(foldedVariant, 4, 4*k, hidden, grid)
	check(foldedVariant, 12, 12*k, hidden, four) // no persistent grid
	check(foldDynVariant, 4, 4*k, hidden, four)
	o.dynCounters = &kernels.Tensor{}
	for tokens := 1; tokens <= foldMax/k+2; tokens++ {
		choices := tokens * k
		def, chosen := four, four
		switch {
		case tokens <= foldTokens:
			def, chosen = grid, persistent
		case tokens <= foldDynTokens:
			def, chosen = persistent, persistent
		case choices <= foldMax:
			chosen = persistent
		}
		check(foldedVariant, tokens, choices, hidden, def)
		check(foldDynVariant, tokens, choices, hidden, chosen)
		check(oneVariant, tokens, choices, hidden, chosen)
		check(dynVariant, tokens, choices, hidden, four)
		check("grouped_mma", tokens, choices, hidden, four)
	}
	check(foldDynVariant, 1, 6, foldCounters*c.BN+1, four)
	check(foldedVariant, 12, 12*k, foldCounters*c.BN+1, four)
	check(foldDynVariant, 12, 12*k, foldCounters*c.BN, persistent)
	check(oneVariant, 12, 12*k, foldCounters*c.BN+1, four)
	// One launch where the default or oneVariant folds on the persistent
	// grid, two where foldDynVariant does, none off it.
	for _, c := range []struct {
		variant string
		dyn     bool
		want    bool
	}{{foldedVariant, true, true}, {oneVariant, true, true}, {foldDynVariant, true, false}, {foldedVariant, false, false}} {
		if got := oneRuns(c.variant, c.dyn); got != c.want {
			t.Errorf("oneRuns(%s, dyn %v) = %v, want %v", c.variant, c.dyn, got, c.want)
		}
	}
	if foldTokens >= foldDynTokens || foldDynTokens*k > foldMax {
		t.Errorf("foldTokens %d, foldDynTokens %d: the persistent fold takes no count of top-%d past the grid's fold within %d choices",
			foldTokens, foldDynTokens, k, foldMax)
	}

	h200 := kernels.Targets["sm_90a"]
	for _, s := range []kernels.Shape{{"N": 1, "H": 2048, "I": 1408, "E": 64, "topk": 6}, {"N": 16, "H": 2048, "I": 1408, "E": 64, "topk": 6},
		{"N": 600, "H": 2048, "I": 1408, "E": 64, "topk": 6}} {
		key := o.TuningKey(kernels.OpMoEExperts, s)
		decode := key == "tiling="+dynTiling
		for _, name := range []string{foldDynVariant, oneVariant} {
			offered := slices.ContainsFunc(variants(kernels.OpMoEExperts, s, h200), func(v kernels.Variant) bool {
				return v.Name == name && v.Valid()
			})
			if offered != decode {
				t.Errorf("%s (%s): %s offered %v", s, key, name, offered)
			}
			if err := o.UseVariant(kernels.OpMoEExperts, key, name); (err == nil) != decode {
				t.Errorf("%s (%s): UseVariant %s: %v", s, key, name, err)
			} else if decode && o.VariantFor(kernels.OpMoEExperts, key) != name {
				t.Errorf("%s (%s): runs %q with %s chosen", s, key, o.VariantFor(kernels.OpMoEExperts, key), name)
			}
		}
	}
	for _, op := range []kernels.Op{kernels.OpGroupGemm, kernels.OpMoERouted} {
		for _, name := range []string{foldDynVariant, oneVariant} {
			if err := o.UseVariant(op, "tiling="+dynTiling, name); err == nil {
				t.Errorf("%s accepted %s", op, name)
			}
		}
	}
}

// TestMoEDynExact holds the persistent grids of decode's tiling
// (dynVariant: moe_gate_up and group_gemm taking their tiles from a
// counter) against a block a tile (grouped_mma) in moe_experts' four
// launches, bit for bit, at DeepSeek-V2-Lite's dims (hidden 2048,
// moe_intermediate 1408, top-6 of 64 experts) and 9, 16 and 40 tokens
// (past the fold, at the same tiling), routed three ways: every token to
// the same 6 experts (a decode of one prompt's copies), each token to 6
// of its own (of distinct prompts), and expert 0 in every token's choices
// (several m-tiles of one expert at 40). The persistent grid runs twice in
// a row, then captured in a graph replayed twice, then once as the default
// (the folded variant: at 9 and 16 tokens folded on the persistent grid,
// at 40 past foldDynTokens its four launches). Before every run the output and
// the GEMMs' intermediates (act, y) are NaN, so that a tile no block
// computes shows; after it every counter must be zero again, so that a
// launch that leaves one behind shows (in a replay too, as a run with no
// tiles).
func TestMoEDynExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(31))
	random := normalOn(t, dev, rng)
	const hidden, inter, experts, k = 2048, 1408, 64, 6
	gateUp := random(kernels.BF16, 1/math.Sqrt(hidden), experts, 2*inter, hidden)
	down := random(kernels.BF16, 1/math.Sqrt(inter), experts, hidden, inter)
	defer dev.Free(gateUp)
	defer dev.Free(down)
	key := "tiling=" + dynTiling
	for _, n := range []int{9, 16, 40} {
		for _, routing := range []string{"shared", "distinct", "hot"} {
			name := fmt.Sprintf("n=%d %s", n, routing)
			choices := n * k
			c := configFor(choices, experts)
			if c.Name != dynTiling {
				t.Fatalf("%s: tiling %s, not %s", name, c.Name, dynTiling)
			}
			idx, weight := routesOn(t, dev, rng, routing, n, k, experts)
			x := random(kernels.BF16, 1, n, hidden)
			out := dev.Alloc(kernels.BF16, n, hidden)
			rows := mTiles(choices, experts, c.BM) * c.BM
			poison := func() {
				dev.MemsetD8(dev.Ptr(out), 0xff, n*hidden*2)
				for _, s := range []struct {
					key  string
					cols int
				}{{scrMoEAct, inter}, {scrMoEY, hidden}} {
					dev.MemsetD8(o.Scratch(s.key, kernels.BF16, rows, s.cols).P, 0xff, rows*s.cols*2)
				}
			}
			call := func() { o.MoEExperts(out, x, idx, weight, gateUp, down) }
			use := func(v string) {
				if err := o.UseVariant(kernels.OpMoEExperts, key, v); err != nil {
					t.Fatal(err)
				}
			}
			use("grouped_mma")
			poison()
			call()
			want := read(t, dev, out)
			if i := slices.IndexFunc(want, func(v float32) bool { return math.IsNaN(float64(v)) }); i >= 0 {
				t.Fatalf("%s: grouped_mma left output %d unwritten", name, i)
			}
			check := func(what string) {
				if bad, at := bitsDiffer(want, read(t, dev, out)); bad > 0 {
					got := read(t, dev, out)
					t.Errorf("%s, %s: %d of %d outputs differ from grouped_mma's, first at %d: %g against %g",
						name, what, bad, len(want), at, got[at], want[at])
				}
				checkCounters(t, o, name+", "+what)
			}
			use(dynVariant)
			for rep := range 2 {
				poison()
				call()
				check(fmt.Sprintf("run %d", rep))
			}
			poison()
			replayTwice(t, dev, name, call, poison, check)
			use(foldedVariant)
			poison()
			call()
			check("default variant")
			use("grouped_mma")
			msOld := msPerCall(t, dev, call)
			use(dynVariant)
			msDyn := msPerCall(t, dev, call)
			t.Logf("%s: %s %.2f µs, grouped_mma %.2f µs (moe_experts' four launches, alone, back to back)", name, dynVariant,
				msDyn*1e3, msOld*1e3)
			for _, a := range []*kernels.Tensor{x, idx, weight, out} {
				dev.Free(a)
			}
		}
	}
}

// TestMoEFoldDynExact holds the folded path on the persistent grid
// (foldDynVariant: moe_gate_up_fold_dyn ranking the choices in every
// block, then both GEMMs taking tickets, the last tile of each down n-tile
// combining it) against moe_experts' four launches on the persistent grid
// (dynVariant), bit for bit, at DeepSeek-V2-Lite's expert dims (hidden
// 2048, moe_intermediate 1408, top-6 of 64) and at a small shape of no
// whole n-tile (hidden 520, intermediate 264, top-6 of 8), at 9, 12 and 16
// tokens (foldTokens to foldDynTokens) routed as moeRouting's shared,
// distinct and hot. Each case runs once as the default (foldedVariant,
// which must fold on the persistent grid there: moe_one); then in two
// launches (foldDynVariant) and in one (oneVariant) three times back to
// back with nothing between (the kernels overlap their neighbours), into
// three outputs, the second on another routing, so that tables, tickets,
// n-tile or m-tile counts one launch leaves behind show in the next; then
// captured in a graph replayed twice. Outputs and the GEMMs'
// intermediates are NaN before each run, and every counter must be zero
// after it. It logs the median µs of the paths alone (CUDA events, each
// call queued back to back), and of the fold a block a tile (foldedVariant
// with foldTokens raised) for reference.
func TestMoEFoldDynExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(43))
	random := normalOn(t, dev, rng)
	const k = 6
	key := "tiling=" + dynTiling
	use := func(v string) {
		t.Helper()
		if err := o.UseVariant(kernels.OpMoEExperts, key, v); err != nil {
			t.Fatal(err)
		}
	}
	defaultFold := foldTokens
	defer func() { foldTokens = defaultFold }()
	for _, d := range []struct{ hidden, inter, experts int }{{2048, 1408, 64}, {520, 264, 8}} {
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(d.hidden)), d.experts, 2*d.inter, d.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(d.inter)), d.experts, d.hidden, d.inter)
		for _, n := range []int{defaultFold + 1, 12, foldDynTokens} {
			for _, routing := range []string{"shared", "distinct", "hot"} {
				name := fmt.Sprintf("H=%d I=%d E=%d n=%d %s", d.hidden, d.inter, d.experts, n, routing)
				choices := n * k
				c := configFor(choices, d.experts)
				if c.Name != dynTiling {
					t.Fatalf("%s: tiling %s, not %s", name, c.Name, dynTiling)
				}
				if fold, dyn := o.foldPath(foldedVariant, c, n, choices, d.hidden); !fold || !dyn {
					t.Fatalf("%s: the default folds %v on the persistent grid %v, want both", name, fold, dyn)
				}
				x := random(kernels.BF16, 1, n, d.hidden)
				routed := func(routing string) (*kernels.Tensor, *kernels.Tensor) {
					return routesOn(t, dev, rng, routing, n, k, d.experts)
				}
				idx, weight := routed(routing)
				idx2, weight2 := routed("distinct")
				outs := []*kernels.Tensor{dev.Alloc(kernels.BF16, n, d.hidden), dev.Alloc(kernels.BF16, n, d.hidden),
					dev.Alloc(kernels.BF16, n, d.hidden)}
				rows := mTiles(choices, d.experts, c.BM) * c.BM
				poison := func() {
					for _, out := range outs {
						dev.MemsetD8(dev.Ptr(out), 0xff, n*d.hidden*2)
					}
					for _, s := range []struct {
						key  string
						cols int
					}{{scrMoEAct, d.inter}, {scrMoEY, d.hidden}} {
						dev.MemsetD8(o.Scratch(s.key, kernels.BF16, rows, s.cols).P, 0xff, rows*s.cols*2)
					}
				}
				call := func(out, idx, weight *kernels.Tensor) func() {
					return func() { o.MoEExperts(out, x, idx, weight, gateUp, down) }
				}
				first, second := call(outs[0], idx, weight), call(outs[1], idx2, weight2)

				use(dynVariant)
				poison()
				first()
				second()
				want, want2 := read(t, dev, outs[0]), read(t, dev, outs[1])
				for _, w := range [][]float32{want, want2} {
					if i := slices.IndexFunc(w, func(v float32) bool { return math.IsNaN(float64(v)) }); i >= 0 {
						t.Fatalf("%s: %s left output %d unwritten", name, dynVariant, i)
					}
				}
				check := func(what string, out *kernels.Tensor, want []float32) {
					t.Helper()
					got := read(t, dev, out)
					if bad, at := bitsDiffer(want, got); bad > 0 {
						t.Errorf("%s, %s: %d of %d outputs differ from %s's, first at %d: %g against %g", name, what, bad,
							len(want), dynVariant, at, got[at], want[at])
					}
				}

				use(foldedVariant)
				poison()
				first()
				check("the default variant", outs[0], want)
				checkCounters(t, o, name+", the default variant")

				for _, v := range []string{foldDynVariant, oneVariant} {
					use(v)
					poison()
					first()
					second()
					call(outs[2], idx, weight)()
					for i, w := range [][]float32{want, want2, want} {
						check(fmt.Sprintf("%s, launch %d of 3 back to back", v, i+1), outs[i], w)
					}
					checkCounters(t, o, name+", "+v+", three launches back to back")

					poison()
					if err := dev.BeginCapture(); err != nil {
						t.Fatal(err)
					}
					first()
					g, err := dev.EndCapture()
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					for rep := range 2 {
						poison()
						if err := g.Replay(); err != nil {
							t.Fatal(err)
						}
						check(fmt.Sprintf("%s, graph replay %d", v, rep), outs[0], want)
						checkCounters(t, o, fmt.Sprintf("%s, %s, graph replay %d", name, v, rep))
					}
					g.Close()
				}

				use(dynVariant)
				usFour := medianUs(t, dev, first)
				use(foldDynVariant)
				usTwo := medianUs(t, dev, first)
				use(oneVariant)
				usOne := medianUs(t, dev, first)
				use(foldedVariant)
				foldTokens = foldMax // the fold a block a tile, at this count too
				usGrid := medianUs(t, dev, first)
				foldTokens = defaultFold
				t.Logf("%s: %s %.2f µs, %s %.2f µs, %s %.2f µs (four launches); folded a block a tile %.2f µs (median, alone, back to back)",
					name, oneVariant, usOne, foldDynVariant, usTwo, dynVariant, usFour, usGrid)
				for _, a := range append([]*kernels.Tensor{x, idx, weight, idx2, weight2}, outs...) {
					dev.Free(a)
				}
			}
		}
		dev.Free(gateUp)
		dev.Free(down)
	}
}

// TestGroupGemmDynExact holds the group_gemm op's persistent grid
// (dynVariant, its default at decode's tiling) against a block a tile
// (grouped_mma), bit for bit, on groups moe_align did not pad: sizes of no
// whole m-tile, empty groups, and one group of several m-tiles; twice in a
// row, then in a graph replayed twice, the output NaN before each run and
// the counters zero after it.
func TestGroupGemmDynExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(37))
	random := normalOn(t, dev, rng)
	for _, c := range []struct{ m, n, k, groups int }{{200, 2048, 1408, 64}, {96, 520, 264, 64}, {40, 2816, 2048, 8}} {
		name := fmt.Sprintf("M=%d N=%d K=%d E=%d", c.m, c.n, c.k, c.groups)
		if cfg := configFor(c.m, c.groups); cfg.Name != dynTiling {
			t.Fatalf("%s: tiling %s, not %s", name, cfg.Name, dynTiling)
		}
		// A third of the rows to group 1, the rest spread at random (a
		// quarter of the groups left empty).
		size := make([]int, c.groups)
		size[1] = c.m / 3
		for r := size[1]; r < c.m; r++ {
			g := rng.Intn(c.groups)
			for g%4 == 3 {
				g = rng.Intn(c.groups)
			}
			size[g]++
		}
		first := make([]int, c.groups+1)
		for g := range c.groups {
			first[g+1] = first[g] + size[g]
		}
		x := random(kernels.BF16, 1, c.m, c.k)
		w := random(kernels.BF16, 1/math.Sqrt(float64(c.k)), c.groups, c.n, c.k)
		f := intsOn(t, dev, first)
		out := dev.Alloc(kernels.BF16, c.m, c.n)
		key := o.TuningKey(kernels.OpGroupGemm, kernels.Shape{"M": c.m, "N": c.n, "K": c.k, "E": c.groups})
		run := func(v string) {
			if err := o.UseVariant(kernels.OpGroupGemm, key, v); err != nil {
				t.Fatal(err)
			}
			dev.MemsetD8(dev.Ptr(out), 0xff, c.m*c.n*2)
			o.GroupGemm(out, x, w, f)
		}
		run("grouped_mma")
		want := read(t, dev, out)
		if i := slices.IndexFunc(want, func(v float32) bool { return math.IsNaN(float64(v)) }); i >= 0 {
			t.Fatalf("%s: grouped_mma left output %d unwritten", name, i)
		}
		check := func(what string) {
			got := read(t, dev, out)
			if bad, at := bitsDiffer(want, got); bad > 0 {
				t.Errorf("%s, %s: %d of %d outputs differ from grouped_mma's, first at %d: %g against %g",
					name, what, bad, len(want), at, got[at], want[at])
			}
			checkCounters(t, o, name+", "+what)
		}
		for rep := range 2 {
			run(dynVariant)
			check(fmt.Sprintf("run %d", rep))
		}
		replayTwice(t, dev, name, func() { o.GroupGemm(out, x, w, f) },
			func() { dev.MemsetD8(dev.Ptr(out), 0xff, c.m*c.n*2) }, check)
		for _, a := range []*kernels.Tensor{x, w, f, out} {
			dev.Free(a)
		}
	}
}

// TestMoEAlignStable launches moe_align_count and moe_align alone (align)
// and holds their first, sorted and slot, exactly, against
// alignReference's stable order (expert by expert, each expert's choices
// in ascending index, its rows padded to whole m-tiles with -1). Cases: 6
// choices (one token: one warp chunk, a partial step); 97 (four chunks of
// a step, the last of one choice); 12,288 (2,048 tokens of top-6, idx
// pitched past K); 66,246 (the 11,041-token prefill of top-6: the last
// chunk shorter, a partial step at its end);
// 32,768 of 256 experts (MAX_GROUPS); 6,000 choices all of one expert;
// every token on 6 of the first 10 of 64 experts (54 get none). sorted and slot
// start as 0x7f7f7f7f, so a row no thread writes shows. It logs each
// case's median µs (alone, back to back).
func TestMoEAlignStable(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(43))
	for _, c := range []struct {
		n, k, experts, bm int
		routing           string // moeRouting's "distinct"; "one": every choice expert 3; "few": 6 of the first 10
		pad               int    // idx's columns past K
	}{
		{1, 6, 64, 128, "distinct", 0}, {97, 1, 16, 64, "distinct", 0}, {2048, 6, 64, 128, "distinct", 2},
		{11041, 6, 64, 128, "distinct", 0}, {4096, 8, 256, 128, "distinct", 0}, {1000, 6, 16, 64, "one", 0},
		{2048, 6, 64, 64, "few", 0},
	} {
		choices, pitch := c.n*c.k, c.k+c.pad
		name := fmt.Sprintf("N=%d K=%d E=%d BM=%d %s pitch %d", c.n, c.k, c.experts, c.bm, c.routing, pitch)
		var ids []int
		switch c.routing {
		case "one":
			ids = slices.Repeat([]int{3}, choices)
		case "few":
			for range c.n {
				ids = append(ids, rng.Perm(10)[:c.k]...)
			}
		default:
			ids, _ = moeRouting(rng, c.routing, c.n, c.k, c.experts)
		}
		pitched := make([]int, c.n*pitch)
		for i := range pitched {
			pitched[i] = c.experts - 1 // the columns past K: a read of them shows in the counts
		}
		for i, e := range ids {
			pitched[i/c.k*pitch+i%c.k] = e
		}
		idx := intsOn(t, dev, pitched)
		rows := mTiles(choices, c.experts, c.bm) * c.bm
		first, sorted, slot := dev.Alloc(kernels.I32, c.experts+1), dev.Alloc(kernels.I32, rows), dev.Alloc(kernels.I32, choices)
		dev.MemsetD8(dev.Ptr(sorted), 0x7f, rows*4)
		dev.MemsetD8(dev.Ptr(slot), 0x7f, choices*4)
		align := func() {
			o.align(o.Mat(first), o.Mat(sorted), o.Mat(slot), dev.Ptr(idx), pitch, c.n, c.k, c.experts, c.bm)
		}
		align()
		wantFirst, wantSorted, wantSlot := alignReference(ids, c.experts, c.bm)
		for _, out := range []struct {
			what string
			buf  *kernels.Tensor
			want []int
		}{{"first", first, wantFirst}, {"sorted", sorted, wantSorted}, {"slot", slot, wantSlot}} {
			got, err := dev.ReadI32(out.buf)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got = got[:len(out.want)] // sorted past first[E] is the bound's, unwritten
			bad, at := 0, -1
			for i, v := range out.want {
				if int(got[i]) != v {
					if bad == 0 {
						at = i
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%s: %d of %d entries of %s differ from the stable order's, first at %d: %d, want %d",
					name, bad, len(out.want), out.what, at, got[at], out.want[at])
			}
		}
		t.Logf("%s: %d choices, %d rows, %.2f µs (median, alone, back to back)", name, choices, wantFirst[c.experts],
			medianUs(t, dev, align))
		for _, a := range []*kernels.Tensor{idx, first, sorted, slot} {
			dev.Free(a)
		}
	}
}

// alignReference is moe_align's output for the choices ids of experts, in
// the stable order: first [E+1], each expert's first row, its count rounded
// up to whole m-tiles of bm rows; sorted [first[E]], each row's choice (an
// expert's in ascending index) or -1 for padding; slot, each choice's row.
func alignReference(ids []int, experts, bm int) (first, sorted, slot []int) {
	count := make([]int, experts)
	for _, e := range ids {
		count[e]++
	}
	first = make([]int, experts+1)
	for e, n := range count {
		first[e+1] = first[e] + (n+bm-1)/bm*bm
	}
	sorted = slices.Repeat([]int{-1}, first[experts])
	slot = make([]int, len(ids))
	next := slices.Clone(first[:experts])
	for i, e := range ids {
		slot[i] = next[e]
		sorted[next[e]] = i
		next[e]++
	}
	return first, sorted, slot
}

// checkCounters fails t unless every counter of the persistent grids, of
// the folded path's n-tiles and of moe_one's m-tiles is zero, as each
// launch must leave them.
func checkCounters(t *testing.T, o *ops, what string) {
	t.Helper()
	for _, c := range []struct {
		name string
		buf  *kernels.Tensor
	}{{"persistent grid", o.dynCounters}, {"folded n-tile", o.moeCounters}, {"one-launch m-tile", o.oneDone}} {
		if c.buf == nil {
			continue
		}
		v, err := o.D.ReadI32(c.buf)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if i := slices.IndexFunc(v, func(n int32) bool { return n != 0 }); i >= 0 {
			t.Errorf("%s: %s counter %d is %d after the launch, want 0", what, c.name, i, v[i])
		}
	}
}

// routesOn is moeRouting's routes of n tokens put on dev: idx i32 [n, k]
// and weight f32 [n, k].
func routesOn(t *testing.T, dev kernels.Device, rng *rand.Rand, routing string, n, k, experts int) (idx, weight *kernels.Tensor) {
	t.Helper()
	ids, ws := moeRouting(rng, routing, n, k, experts)
	idx = intsOn(t, dev, ids)
	idx.Shape, idx.Pitch = []int{n, k}, k
	return idx, tensorOn(t, dev, kernels.F32, ws, n, k)
}

// moeRouting is n tokens' choices of k of experts and their weights,
// routed as routing says: "shared", every token to the same experts (a
// decode of one prompt's copies, W4); "distinct", each token to its own
// (of distinct prompts, W5); "hot", expert 0 among every token's choices,
// at a random place, the others its own.
func moeRouting(rng *rand.Rand, routing string, n, k, experts int) ([]int, []float32) {
	ids := make([]int, n*k)
	ws := make([]float32, n*k)
	shared := rng.Perm(experts)
	for tok := range n {
		pick := shared
		switch routing {
		case "distinct":
			pick = rng.Perm(experts)
		case "hot":
			pick = append([]int{0}, rng.Perm(experts - 1)[:k-1]...)
			for j := 1; j < k; j++ {
				pick[j]++
			}
			rng.Shuffle(k, func(a, b int) { pick[a], pick[b] = pick[b], pick[a] })
		}
		for j := range k {
			ids[tok*k+j] = pick[j]
			ws[tok*k+j] = float32(rng.Float64())
		}
	}
	return ids, ws
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
		{kernels.Shape{"N": 1, "H": 2048, "I": 1408, "E": 64, "topk": 6}, []string{routedUnfused, routedVariant, splitVariant}},
		{kernels.Shape{"N": 1, "H": 2048, "I": 1400, "E": 64, "topk": 6}, []string{routedUnfused, routedVariant}}, // no whole items
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
// (foldTokens: the fold a block a tile) and at 9 and 16 (foldDynTokens:
// on the persistent grid, moe_gate_up_route_dyn), routeFoldTokens raised
// to foldDynTokens, at V2-Lite's expert dims and at dims of no tile. Past
// foldDynTokens, and with the variant unfused chosen, the call must
// decline (the Dispatch then runs the parts). Outputs start as NaN (idx as
// -1), so that one left unwritten shows; each chain runs twice, so that a
// counter the down kernel leaves behind shows in the second, and every
// counter must be zero after each.
func TestMoERoutedExact(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	defer func(n, s int) { routeFoldTokens, routeSplitTokens = n, s }(routeFoldTokens, routeSplitTokens)
	routeFoldTokens = foldDynTokens // route in the gate/up blocks every case the fold takes, not only the default's
	routeSplitTokens = 0            // and one token too (moe_routed_split has TestMoERoutedSplit)
	o := newSet(t, dev)
	rng := rand.New(rand.NewSource(29))
	lite, limited := liteRouting, limitedRouting
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
		{"v2-lite, persistent fold", 9, 512, 256, lite, false}, {"v2-lite, persistent fold", 16, 2048, 1408, lite, false},
		{"group-limited, persistent fold", 12, 520, 264, limited, false}, {"v2-lite, past the fold", 17, 512, 256, lite, false},
	} {
		name := fmt.Sprintf("%s n=%d H=%d I=%d", c.name, c.n, c.hidden, c.inter)
		k := c.r.TopK
		p := newRoutedProblem(t, dev, rng, experts, c.n, c.hidden, c.inter, c.ties)
		parts := func() { p.parts(o, &c.r) }
		whole := func() (kernels.Unsupported, bool) { return p.whole(o, &c.r) }
		folds := c.n <= foldDynTokens
		p.check(t, o, name, &c.r, folds)
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
		p.free()
	}
}

// liteRouting is DeepSeek-V2-Lite's router (greedy top 6); limitedRouting
// a group-limited one with normalised, scaled weights.
var (
	liteRouting    = kernels.Routing{Method: kernels.RouteGreedy, TopK: 6, Groups: 1, TopKGroups: 1, Scale: 1}
	limitedRouting = kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, NormTopK: true, Scale: 2.5}
)

// routedProblem is a moe_routed call's operands on a device: logits of n
// tokens over the experts (random, or of few values with ties), x, the experts' weights, and the outputs.
type routedProblem struct {
	dev                                       *cuda.Device
	n, hidden, experts                        int
	logits, x, gateUp, down, out, idx, weight *kernels.Tensor
}

func newRoutedProblem(t *testing.T, dev *cuda.Device, rng *rand.Rand, experts, n, hidden, inter int, ties bool) *routedProblem {
	t.Helper()
	vals := make([]float32, n*experts)
	for i := range vals {
		if ties {
			vals[i] = float32(rng.Intn(4)) * 0.5
		} else {
			vals[i] = float32(rng.NormFloat64() * 2)
		}
	}
	random := normalOn(t, dev, rng)
	return &routedProblem{dev: dev, n: n, hidden: hidden, experts: experts,
		logits: tensorOn(t, dev, kernels.F32, vals, n, experts),
		x:      random(kernels.BF16, 1, n, hidden),
		gateUp: random(kernels.BF16, 1/math.Sqrt(float64(hidden)), experts, 2*inter, hidden),
		down:   random(kernels.BF16, 1/math.Sqrt(float64(inter)), experts, hidden, inter)}
}

// parts runs moe_route then moe_experts; whole runs moe_routed, and says
// whether the set declined it.
func (p *routedProblem) parts(o *ops, r *kernels.Routing) {
	o.MoERoute(p.idx, p.weight, p.logits, r)
	o.MoEExperts(p.out, p.x, p.idx, p.weight, p.gateUp, p.down)
}

func (p *routedProblem) whole(o *ops, r *kernels.Routing) (kernels.Unsupported, bool) {
	return kernels.Declined(func() { o.MoERouted(p.out, p.idx, p.weight, p.x, p.logits, p.gateUp, p.down, r) })
}

// check allocates the outputs, runs the parts, then the whole twice back to
// back (runs: the set must take it, else decline it), each time with every
// output poisoned first, and holds the whole's idx, weight and out to the
// parts' bit for bit and the counters to zero after it.
func (p *routedProblem) check(t *testing.T, o *ops, name string, r *kernels.Routing, runs bool) {
	t.Helper()
	dev, k := p.dev, r.TopK
	p.out, p.idx, p.weight = dev.Alloc(kernels.BF16, p.n, p.hidden), dev.Alloc(kernels.I32, p.n, k), dev.Alloc(kernels.F32, p.n, k)
	poison := func() {
		dev.MemsetD8(dev.Ptr(p.out), 0xff, p.n*p.hidden*2)
		dev.MemsetD8(dev.Ptr(p.idx), 0xff, p.n*k*4)
		dev.MemsetD8(dev.Ptr(p.weight), 0xff, p.n*k*4)
	}
	results := func() (out, weight []float32, idx []int32) {
		ids, err := dev.ReadI32(p.idx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return read(t, dev, p.out), read(t, dev, p.weight), ids
	}
	poison()
	p.parts(o, r)
	wantOut, wantW, wantIdx := results()
	for rep := range 2 {
		poison()
		if u, declined := p.whole(o, r); declined != !runs {
			t.Fatalf("%s: declined %v (%v), want %v", name, declined, u, !runs)
		} else if declined {
			return
		}
		gotOut, gotW, gotIdx := results()
		if !slices.Equal(gotIdx, wantIdx) {
			t.Errorf("%s, run %d: experts %v, moe_route's %v", name, rep, gotIdx, wantIdx)
		}
		for _, v := range []struct {
			what      string
			got, want []float32
		}{{"weight", gotW, wantW}, {"out", gotOut, wantOut}} {
			if bad, at := bitsDiffer(v.got, v.want); bad > 0 {
				t.Errorf("%s, run %d: %d of %d %s values differ from moe_route then moe_experts', first at %d: %g against %g",
					name, rep, bad, len(v.want), v.what, at, v.got[at], v.want[at])
			}
		}
		checkCounters(t, o, fmt.Sprintf("%s, run %d", name, rep))
	}
}

func (p *routedProblem) free() {
	for _, a := range []*kernels.Tensor{p.logits, p.x, p.gateUp, p.down, p.out, p.idx, p.weight} {
		if a != nil {
			p.dev.Free(a)
		}
	}
}

// m16Alternatives are tilings of decode's grouped GEMM other than
// gemmConfigs' m16 that check accepts (other k-tiles and ring depths): the
// tests compile them (TestGemmConfigsCompile) and run them against the
// default (TestMoETilingsExact) in its place.
var m16Alternatives = []gemmConfig{
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 128, Stages: 3},
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 64, Stages: 6},
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 64, Stages: 4},
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 64, Stages: 2},
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 256, Stages: 2},
	{Name: "m16", BM: 16, BN: 32, WarpsM: 1, WarpsN: 2, BK: 128, Stages: 4},
	{Name: "m16", BM: 16, BN: 32, WarpsM: 1, WarpsN: 2, BK: 256, Stages: 3},
}

// m16Refused are tilings check refuses, each with what its error must say;
// the kernels' static_asserts refuse them too (TestGemmConfigsCompile).
var m16Refused = []struct {
	c   gemmConfig
	why string
}{
	{gemmConfig{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 32, Stages: 4}, "multiple of 64"},
	{gemmConfig{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 128, Stages: 1}, "at least 2"},
	{gemmConfig{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 8, BK: 128, Stages: 4}, "pairs of n8"},
	{gemmConfig{Name: "m16", BM: 16, BN: 64, WarpsM: 2, WarpsN: 2, BK: 128, Stages: 4}, "m16 fragments"},
	{gemmConfig{Name: "m16", BM: 16, BN: 48, WarpsM: 1, WarpsN: 3, BK: 128, Stages: 4}, "do not divide"},
}

// withTiling puts c in gemmConfigs in place of the tiling of its name
// until t ends: the launchers size their grids and shared memory by it,
// and New compiles the kernels in it.
func withTiling(t *testing.T, c gemmConfig) {
	t.Helper()
	saved := gemmConfigs
	i := slices.IndexFunc(saved, func(g gemmConfig) bool { return g.Name == c.Name })
	if i < 0 {
		t.Fatalf("no tiling %s", c.Name)
	}
	gemmConfigs = slices.Clone(saved)
	gemmConfigs[i] = c
	t.Cleanup(func() { gemmConfigs = saved })
}

// TestGemmConfigCheck checks, without a GPU, the host's side of other
// tilings of decode's grouped GEMM: check accepts the alternatives and
// refuses, saying why, what the kernels cannot run, and New refuses such a
// table before it compiles anything; shared is the ring of Stages × (BM +
// BN) rows of BK bf16; and the moe.cu module is compiled with the tiling's
// own instances (the instance header made from the table, whatever the
// checked-in file holds: with that file's BK 128 and 4 stages, the other
// tilings were launched with less shared memory than their ring took).
func TestGemmConfigCheck(t *testing.T) {
	for i, want := range []int{61440, 61440, 40960, 20480, 81920} {
		c := m16Alternatives[i]
		if err := c.check(); err != nil {
			t.Error(err)
		}
		if c.shared() != want {
			t.Errorf("%s: shared %d, want %d", c.params(), c.shared(), want)
		}
	}
	if c := configNamed("m16"); c.shared() != 81920 {
		t.Errorf("%s: shared %d, want 81920", c.params(), c.shared())
	}
	for _, r := range m16Refused {
		err := r.c.check()
		if err == nil || !strings.Contains(err.Error(), r.why) {
			t.Errorf("%+v: check says %v, want %q", r.c, err, r.why)
		}
	}
	t.Run("New refuses", func(t *testing.T) {
		withTiling(t, m16Refused[0].c)
		if _, err := New(nil); err == nil || !strings.Contains(err.Error(), m16Refused[0].why) {
			t.Errorf("New with %+v: %v", m16Refused[0].c, err)
		}
	})
	for _, c := range append([]gemmConfig{configNamed("m16")}, m16Alternatives...) {
		t.Run(fmt.Sprintf("BK%d_S%d", c.BK, c.Stages), func(t *testing.T) {
			withTiling(t, c)
			p, err := cudaset.Source(module("moe.cu", moeFuncs()))
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(p.Headers, func(h cuda.Header) bool { return h.Name == "instances.cuh" })
			if i < 0 {
				t.Fatal("moe.cu compiles no instances.cuh")
			}
			args := func(c gemmConfig) string {
				return fmt.Sprintf(", %d, %d, %d, %d, %d, %d)", c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages)
			}
			d := dynConfig() // c's tiling at dynStages
			if d.BM != c.BM || d.BN != c.BN || d.BK != c.BK || d.Stages != dynStages {
				t.Errorf("the persistent grid's tiling %+v, want %+v at %d stages", d, c, dynStages)
			}
			for _, k := range []struct {
				names []string
				c     gemmConfig
			}{{[]string{c.gemmKernel(), c.gateUpKernel()}, c}, {[]string{c.dynGemmKernel(), c.dynGateUpKernel()}, d},
				{[]string{c.foldGateUpKernel(), c.foldGemmKernel(), c.routeGateUpKernel()}, c},
				{[]string{c.foldDynGateUpKernel(), c.foldDynGemmKernel(), c.routeDynGateUpKernel()}, d}} {
				if line := "X(" + strings.Join(k.names, ", ") + args(k.c); !strings.Contains(p.Headers[i].Src, line) {
					t.Errorf("moe.cu compiles an instances.cuh without %s", line)
				}
			}
		})
	}
}

// TestGemmConfigsCompile compiles moe.cu with NVRTC (at $FUSELM_NVRTC, for
// $FUSELM_NVRTC_ARCH, sm_90a when unset), without a GPU, in the default
// tilings and with each of m16Alternatives in place of m16, each time with
// a probe that holds every tiling's GemmRing::BYTES (the ring the kernel
// indexes) to gemmConfig.shared (what the block is launched with); and
// each tiling of m16Refused must fail the kernels' static_asserts, as
// check refuses it. Skipped when FUSELM_NVRTC is unset.
func TestGemmConfigsCompile(t *testing.T) {
	comp := nvrtcCompiler(t, "moe.cu's tilings")
	compile := func() error {
		m := module("moe.cu", moeFuncs())
		p, err := cudaset.Source(m)
		if err != nil {
			return err
		}
		var probe strings.Builder
		probe.WriteString("\n// TestGemmConfigsCompile's probe: the ring each tiling indexes is what moe.go launches it with.\n")
		for _, c := range gemmConfigs {
			fmt.Fprintf(&probe, "static_assert(GemmRing<%d, %d, %d, %d>::BYTES == %d, \"tiling %s: GemmRing is not gemmConfig.shared\");\n",
				c.BM, c.BN, c.BK, c.Stages, c.shared(), c.Name)
		}
		p.Src += probe.String()
		_, _, err = comp.Compile(p, m.Opts...)
		return err
	}
	for _, c := range append([]gemmConfig{configNamed("m16")}, m16Alternatives...) {
		t.Run(fmt.Sprintf("BK%d_S%d", c.BK, c.Stages), func(t *testing.T) {
			withTiling(t, c)
			if err := compile(); err != nil {
				t.Error(err)
			}
		})
	}
	for _, r := range m16Refused {
		t.Run(fmt.Sprintf("refused %dx%dx%d_w%dx%d_S%d", r.c.BM, r.c.BN, r.c.BK, r.c.WarpsM, r.c.WarpsN, r.c.Stages), func(t *testing.T) {
			withTiling(t, r.c)
			if err := compile(); err == nil || !strings.Contains(err.Error(), "static assertion") {
				t.Errorf("%+v (check: %v) compiled: %v", r.c, r.c.check(), err)
			}
		})
	}
}

// TestMoETilingsExact runs every kernel of decode's tiling compiled in each
// of m16Alternatives against the same kernels in gemmConfigs' m16, bit for
// bit: the products sum their k16 steps in the same order whatever the
// k-tile and the ring. moe_experts folded (every case up to foldMax
// choices), in four launches (grouped_mma), on the persistent grid
// (dynVariant) and folded on it (foldDynVariant), at DeepSeek-V2-Lite's expert dims (1, 5 and 16 tokens) and
// at dims of no tile (K past a whole k-tile); moe_routed at one token;
// group_gemm a block a tile and persistent, on groups of no whole m-tile.
// Each alternative is a set of its own, built by New with the tiling in
// gemmConfigs (withTiling: the kernels compile in it and the launchers
// size their shared memory by it). Outputs start as NaN, and the
// persistent grids' counters must be zero after each run.
func TestMoETilingsExact(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	rng := rand.New(rand.NewSource(41))
	random := normalOn(t, dev, rng)
	defer func(n int) { foldTokens = n }(foldTokens)
	foldTokens = foldMax // fold every case the kernels take
	key := "tiling=" + foldTiling
	type problem struct {
		n, hidden, inter, experts, k      int
		x, gateUp, down, idx, weight, out *kernels.Tensor
	}
	var problems []problem
	for _, c := range []struct{ n, hidden, inter, experts int }{
		{1, 2048, 1408, 64}, {5, 2048, 1408, 64}, {16, 2048, 1408, 64}, {21, 520, 264, 8}, {3, 1000, 96, 64},
	} {
		const k = 6
		p := problem{n: c.n, hidden: c.hidden, inter: c.inter, experts: c.experts, k: k}
		if cfg := configFor(c.n*k, c.experts); cfg.Name != foldTiling {
			t.Fatalf("n=%d E=%d: tiling %s, not %s", c.n, c.experts, cfg.Name, foldTiling)
		}
		p.x = random(kernels.BF16, 1, c.n, c.hidden)
		p.gateUp = random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), c.experts, 2*c.inter, c.hidden)
		p.down = random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), c.experts, c.hidden, c.inter)
		ids := make([]int, c.n*k)
		ws := make([]float32, c.n*k)
		for tok := range c.n {
			pick := rng.Perm(c.experts)
			for j := range k {
				ids[tok*k+j] = pick[j]
				ws[tok*k+j] = float32(rng.Float64())
			}
		}
		p.idx = intsOn(t, dev, ids)
		p.idx.Shape, p.idx.Pitch = []int{c.n, k}, k
		p.weight = tensorOn(t, dev, kernels.F32, ws, c.n, k)
		p.out = dev.Alloc(kernels.BF16, c.n, c.hidden)
		problems = append(problems, p)
	}
	const routedHidden, routedInter, routedExperts = 2048, 1408, 64
	lite := liteRouting
	logitVals := make([]float32, routedExperts)
	for i := range logitVals {
		logitVals[i] = float32(rng.NormFloat64() * 2)
	}
	logits := tensorOn(t, dev, kernels.F32, logitVals, 1, routedExperts)
	rIdx, rWeight := dev.Alloc(kernels.I32, 1, lite.TopK), dev.Alloc(kernels.F32, 1, lite.TopK)
	const gm, gn, gk, groups = 96, 520, 264, 64
	first := make([]int, groups+1)
	for r := 0; r < gm; r++ {
		first[1+rng.Intn(groups)]++
	}
	for g := range groups {
		first[g+1] += first[g]
	}
	gx := random(kernels.BF16, 1, gm, gk)
	gw := random(kernels.BF16, 1/math.Sqrt(gk), groups, gn, gk)
	gFirst := intsOn(t, dev, first)
	gOut := dev.Alloc(kernels.BF16, gm, gn)
	defer func() {
		for _, p := range problems {
			for _, a := range []*kernels.Tensor{p.x, p.gateUp, p.down, p.idx, p.weight, p.out} {
				dev.Free(a)
			}
		}
		for _, a := range []*kernels.Tensor{logits, rIdx, rWeight, gx, gw, gFirst, gOut} {
			dev.Free(a)
		}
	}()

	// outputs runs every case on a set built in the current gemmConfigs,
	// by name.
	outputs := func(t *testing.T) map[string][]float32 {
		o := newSet(t, dev)
		got := map[string][]float32{}
		result := func(name string, out *kernels.Tensor) {
			got[name] = read(t, dev, out)
			if o.dynCounters != nil {
				checkCounters(t, o, name)
			}
		}
		poison := func(x *kernels.Tensor) { dev.MemsetD8(dev.Ptr(x), 0xff, x.Numel()*x.DType.Size()) }
		for _, p := range problems {
			for _, v := range []string{foldedVariant, "grouped_mma", dynVariant, foldDynVariant} {
				if err := o.UseVariant(kernels.OpMoEExperts, key, v); err != nil {
					t.Fatal(err)
				}
				poison(p.out)
				o.MoEExperts(p.out, p.x, p.idx, p.weight, p.gateUp, p.down)
				result(fmt.Sprintf("moe_experts %s n=%d H=%d I=%d E=%d", v, p.n, p.hidden, p.inter, p.experts), p.out)
			}
		}
		if err := o.UseVariant(kernels.OpMoEExperts, key, foldedVariant); err != nil { // moe_routed runs where moe_experts folds
			t.Fatal(err)
		}
		p := problems[0]
		poison(p.out)
		if u, declined := kernels.Declined(func() { o.MoERouted(p.out, rIdx, rWeight, p.x, logits, p.gateUp, p.down, &lite) }); declined {
			t.Fatalf("moe_routed declined one token: %v", u)
		}
		result("moe_routed n=1", p.out)
		gkey := o.TuningKey(kernels.OpGroupGemm, kernels.Shape{"M": gm, "N": gn, "K": gk, "E": groups})
		for _, v := range []string{"grouped_mma", dynVariant} {
			if err := o.UseVariant(kernels.OpGroupGemm, gkey, v); err != nil {
				t.Fatal(err)
			}
			poison(gOut)
			o.GroupGemm(gOut, gx, gw, gFirst)
			result("group_gemm "+v, gOut)
		}
		return got
	}
	want := outputs(t)
	for name, v := range want {
		if i := slices.IndexFunc(v, func(f float32) bool { return math.IsNaN(float64(f)) }); i >= 0 {
			t.Fatalf("%s in the default tiling left output %d unwritten", name, i)
		}
	}
	for _, c := range m16Alternatives {
		t.Run(fmt.Sprintf("BK%d_S%d", c.BK, c.Stages), func(t *testing.T) {
			withTiling(t, c)
			got := outputs(t)
			for _, name := range slices.Sorted(maps.Keys(want)) {
				if bad, at := bitsDiffer(want[name], got[name]); bad > 0 {
					t.Errorf("%s: %d of %d outputs differ from the default tiling's, first at %d: %g against %g", name, bad,
						len(want[name]), at, got[name][at], want[name][at])
				}
			}
		})
	}
}

// TestPlanSplit holds moe_routed_split's plan to what the kernel takes:
// DeepSeek-V2-Lite's token on an H200 is 132 items of 64 columns, a block
// each on its 132 SMs, stages of 16 whole rows in three slots beside x and
// the activations;
// shapes of no whole item, too wide, with too many experts or choices, or
// no room for two slots, are refused with a reason.
func TestPlanSplit(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	p, err := planSplit(2048, 1408, 6, 64, h200.SMs, h200.SharedPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	if p.items != 132 || p.blocks != 132 || p.stages < 2 || p.stages > msMaxStages || p.shared > h200.SharedPerBlock ||
		p.stages != 3 || p.shared != msHead+2*(2048+1408)+3*msRows*2048*2 {
		t.Errorf("V2-Lite on an H200: %v", p)
	}
	if p, err := planSplit(2048, 1536, 6, 160, 132, h200.SharedPerBlock); err != nil || p.items != 144 || p.blocks != 132 {
		t.Errorf("144 items: %v, %v (want 132 blocks)", p, err)
	}
	for _, c := range []struct {
		h, i, k, e, sms, shared int
	}{
		{2048, 1400, 6, 64, 132, h200.SharedPerBlock},  // no whole items
		{2000, 1408, 6, 64, 132, h200.SharedPerBlock},  // x of no whole 64-k chunks
		{16384, 1408, 6, 64, 132, h200.SharedPerBlock}, // x past its share of shared memory
		{2048, 8192, 6, 64, 132, h200.SharedPerBlock},  // the activations past theirs
		{2048, 1408, 33, 64, 132, h200.SharedPerBlock}, // top-k past a warp
		{2048, 1408, 6, 300, 132, h200.SharedPerBlock}, // experts past the router
		{2048, 1408, 6, 64, 132, 100 << 10},            // one slot
		{5120, 1536, 6, 160, 132, h200.SharedPerBlock}, // DeepSeek-V2's rows: one slot
	} {
		if p, err := planSplit(c.h, c.i, c.k, c.e, c.sms, c.shared); err == nil {
			t.Errorf("%+v: planned %v, want a refusal", c, p)
		}
	}
}

func TestMoESplitCompiles(t *testing.T) { nvrtcReport(t, msModule()) }

// TestMoERoutedSplit holds moe_routed_split (moe_routed's one-launch
// variant at one token) against moe_route then moe_experts on the same set:
// the routes (idx, weight) bit for bit, the output within the rounding of
// f32 sums in another order (each expert's output rounded to bf16 once, as
// theirs: where a sum falls on the other side of a rounding the expert's
// output moves by an ulp, so the bound is a few ulps of the output's scale,
// and the mean error a small fraction of one), at DeepSeek-V2-Lite's dims
// (132 items, a block each on an H200), group-limited routes, exact ties,
// more items than SMs (blocks taking two) and the smallest shapes it
// takes. Outputs start as NaN; each case runs twice, so that a grid count
// left behind shows in the second (and it must be zero after each), and no
// wait may have given up. At two tokens the call declines (the Dispatch
// runs the parts).
func TestMoERoutedSplit(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	o := newSet(t, dev)
	if err := o.ms.ready(); err != nil {
		t.Skipf("moe_routed_split cannot run here: %v", err)
	}
	rng := rand.New(rand.NewSource(31))
	random := normalOn(t, dev, rng)
	lite, limited := liteRouting, limitedRouting
	for _, c := range []struct {
		name                   string
		n, hidden, inter, nexp int
		r                      kernels.Routing
		ties                   bool
	}{
		{"v2-lite", 1, 2048, 1408, 64, lite, false}, {"group-limited", 1, 1024, 512, 64, limited, false},
		{"ties", 1, 512, 256, 64, lite, true}, {"more items than SMs", 1, 2048, 1536, 16, lite, false},
		{"smallest", 1, 128, 64, 64, lite, false}, {"two tokens: folded", 2, 2048, 1408, 64, lite, false},
	} {
		name := fmt.Sprintf("%s n=%d H=%d I=%d E=%d", c.name, c.n, c.hidden, c.inter, c.nexp)
		k := c.r.TopK
		vals := make([]float32, c.n*c.nexp)
		for i := range vals {
			if c.ties {
				vals[i] = float32(rng.Intn(4)) * 0.5
			} else {
				vals[i] = float32(rng.NormFloat64() * 2)
			}
		}
		logits := tensorOn(t, dev, kernels.F32, vals, c.n, c.nexp)
		x := random(kernels.BF16, 1, c.n, c.hidden)
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), c.nexp, 2*c.inter, c.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), c.nexp, c.hidden, c.inter)
		out, idx, weight := dev.Alloc(kernels.BF16, c.n, c.hidden), dev.Alloc(kernels.I32, c.n, k), dev.Alloc(kernels.F32, c.n, k)
		poison := func() {
			dev.MemsetD8(dev.Ptr(out), 0xff, c.n*c.hidden*2)
			dev.MemsetD8(dev.Ptr(idx), 0xff, c.n*k*4)
			dev.MemsetD8(dev.Ptr(weight), 0xff, c.n*k*4)
		}
		results := func() (outs, weights []float32, ids []int32) {
			ids, err := dev.ReadI32(idx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return read(t, dev, out), read(t, dev, weight), ids
		}
		poison()
		o.MoERoute(idx, weight, logits, &c.r)
		o.MoEExperts(out, x, idx, weight, gateUp, down)
		wantOut, wantW, wantIdx := results()
		whole := func() { o.MoERouted(out, idx, weight, x, logits, gateUp, down, &c.r) }
		for rep := range 2 {
			poison()
			if u, declined := kernels.Declined(whole); declined != (c.n > 1) {
				t.Fatalf("%s: declined %v (%v), want %v", name, declined, u, c.n > 1)
			} else if declined {
				break
			}
			if err := o.moeSplitWaits(); err != nil {
				t.Fatalf("%s, run %d: %v", name, rep, err)
			}
			gotOut, gotW, gotIdx := results()
			if !slices.Equal(gotIdx, wantIdx) {
				t.Errorf("%s, run %d: experts %v, moe_route's %v", name, rep, gotIdx, wantIdx)
			}
			if bad, at := bitsDiffer(gotW, wantW); bad > 0 {
				t.Errorf("%s, run %d: %d weights differ from moe_route's, first at %d: %g against %g", name, rep, bad, at, gotW[at], wantW[at])
			}

			var scale, worst, sum float64
			for _, v := range wantOut {
				scale += math.Abs(float64(v))
			}
			scale /= float64(len(wantOut))
			differ, at := 0, -1
			for i := range wantOut {
				d := math.Abs(float64(gotOut[i]) - float64(wantOut[i]))
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				if d > 0 {
					differ++
				}
				if d > worst || at < 0 {
					worst, at = d, i
				}
				sum += d
			}
			// bf16's ulp at the output's scale is 2^-7 of it (to 2^-8):
			// a few of them at most anywhere, a small fraction on average.
			if worst > scale/16 || sum/float64(len(wantOut)) > scale/512 {
				t.Errorf("%s, run %d: off the parts by up to %g (at %d: %g against %g), %g on average, %d of %d differ; mean |out| %g",
					name, rep, worst, at, gotOut[at], wantOut[at], sum/float64(len(wantOut)), differ, len(wantOut), scale)
			} else if rep == 0 {
				t.Logf("%s: %d of %d values differ from the parts', by up to %g (mean |out| %g)", name, differ, len(wantOut), worst, scale)
			}
			cs, err := dev.ReadI32(o.ms.counters)
			if err != nil {
				t.Fatal(err)
			}
			if cs[0] != 0 || cs[1] != 0 {
				t.Errorf("%s, run %d: the grid count is %v after the launch, want zeros", name, rep, cs)
			}
		}
		if c.n == 1 {
			key := o.TuningKey(kernels.OpMoERouted, kernels.Shape{"N": 1, "topk": k, "E": c.nexp})
			msSplit := msPerCall(t, dev, whole)
			if err := o.UseVariant(kernels.OpMoERouted, key, routedVariant); err != nil {
				t.Fatal(err)
			}
			msFolded := msPerCall(t, dev, whole)
			if err := o.UseVariant(kernels.OpMoERouted, key, splitVariant); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: moe_routed_split %.2f µs, route_folded's two launches %.2f µs (alone, back to back)", name, msSplit*1e3, msFolded*1e3)
		}
		for _, a := range []*kernels.Tensor{logits, x, gateUp, down, out, idx, weight} {
			dev.Free(a)
		}
	}
}

// TestMoESplitTimeline logs block 0's timeline of moe_routed_split (the
// GPU's global timer at its start, grid wait, routes, first copies, before
// and after each stage's wait, around the wait for its choice's
// activations, and at its end), at DeepSeek-V2-Lite's dims and at the
// smallest it takes, to see where a launch's time goes; and holds the
// probe to what it must record: every mark of the block's stages set (8
// gate/up stages and the down stages of its rows), in kernel order.
func TestMoESplitTimeline(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	o := newSet(t, dev)
	if err := o.ms.ready(); err != nil {
		t.Skipf("moe_routed_split cannot run here: %v", err)
	}
	rng := rand.New(rand.NewSource(37))
	random := normalOn(t, dev, rng)
	lite := liteRouting
	trace := dev.Alloc(kernels.I32, 2*msTrace) // i64 marks, read as pairs
	defer dev.Free(trace)
	defer func() { o.ms.trace = 0 }()
	for _, c := range []struct{ hidden, inter int }{{2048, 1408}, {128, 64}} {
		const experts = 64
		vals := make([]float32, experts)
		for i := range vals {
			vals[i] = float32(rng.NormFloat64() * 2)
		}
		logits := tensorOn(t, dev, kernels.F32, vals, 1, experts)
		x := random(kernels.BF16, 1, 1, c.hidden)
		gateUp := random(kernels.BF16, 1/math.Sqrt(float64(c.hidden)), experts, 2*c.inter, c.hidden)
		down := random(kernels.BF16, 1/math.Sqrt(float64(c.inter)), experts, c.hidden, c.inter)
		out, idx, weight := dev.Alloc(kernels.BF16, 1, c.hidden), dev.Alloc(kernels.I32, 1, 6), dev.Alloc(kernels.F32, 1, 6)
		for rep := range 3 {
			dev.MemsetD8(dev.Ptr(trace), 0, msTrace*8)
			o.ms.trace = dev.Ptr(trace)
			o.MoERouted(out, idx, weight, x, logits, gateUp, down, &lite)
			o.ms.trace = 0
			if err := o.moeSplitWaits(); err != nil {
				t.Fatal(err)
			}
			w, err := dev.ReadI32(trace)
			if err != nil {
				t.Fatal(err)
			}
			marks := make([]int64, msTrace)
			for i := range marks {
				marks[i] = int64(uint32(w[2*i])) | int64(w[2*i+1])<<32
			}
			var line []string
			for i, m := range marks {
				if m != 0 {
					line = append(line, fmt.Sprintf("%d:%.2f", i, float64(m-marks[0])/1e3))
				}
			}
			// Block 0 is item (0, 0): 8 gate/up stages, then the down
			// stages of its H/S rows, 16 a stage.
			stagesA, rows := msCols/(msRows/2), c.hidden/(c.inter/msCols)
			total := stagesA + (rows+msRows-1)/msRows
			order := []int{0, 1, 2, 3}
			for q := range total {
				if q == stagesA {
					order = append(order, msTrace-4, msTrace-3, msTrace-2)
				}
				order = append(order, 4+2*q, 5+2*q)
			}
			order = append(order, msTrace-1)
			for i, at := range order {
				if marks[at] == 0 || i > 0 && marks[at] < marks[order[i-1]] {
					t.Errorf("H=%d I=%d run %d: mark %d is %d after mark %d at %d: not set, or out of the kernel's order",
						c.hidden, c.inter, rep, at, marks[at], order[max(i-1, 0)], marks[order[max(i-1, 0)]])
					break
				}
			}
			t.Logf("H=%d I=%d run %d, µs from block 0's start: %s", c.hidden, c.inter, rep, strings.Join(line, " "))
		}
		for _, a := range []*kernels.Tensor{logits, x, gateUp, down, out, idx, weight} {
			dev.Free(a)
		}
	}
}

// TestMoECompiles compiles moe.cu (the grouped GEMMs, the folded path and
// the persistent-grid kernels) by NVRTC without a GPU, where its library is
// found: no spills, every kernel there.
func TestMoECompiles(t *testing.T) { nvrtcReport(t, module("moe.cu", moeFuncs())) }
