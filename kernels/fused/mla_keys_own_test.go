package fused

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestMLAKeysOwnVariant checks mla_decode's keys_own variant on the host:
// its listing (sm_90a only, keys's stages), its refusals (mla_qlat's nope
// limit; flat's module not built), the default left to keys, and its
// splits (mlaKeysOwnSplits): whole key tiles covering the capacity, one
// wave, between 2 and moMaxPerRow a row.
func TestMLAKeysOwnVariant(t *testing.T) {
	h200, a100 := kernels.Targets["sm_90a"], kernels.Targets["sm_80"]
	lite := kernels.Shape{"B": 16, "H": 16, "ctx": 190, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	vs := variants(kernels.OpMLADecode, lite, h200)
	i := slices.IndexFunc(vs, func(v kernels.Variant) bool { return v.Name == mlaKeysOwnVariant })
	if i < 0 || !vs[i].Valid() || !strings.Contains(vs[i].Params, "stages=2") || !strings.Contains(vs[i].Params, "blocks_per_sm=2") {
		t.Fatalf("mla_decode of V2-Lite on sm_90a: %+v, want keys_own valid with keys's two 2-stage blocks an SM", vs)
	}
	for _, v := range variants(kernels.OpMLADecode, lite, a100) {
		if v.Name == mlaKeysOwnVariant {
			t.Errorf("keys_own offered on sm_80: %+v", v)
		}
	}
	wideNope := kernels.Shape{"B": 16, "H": 16, "ctx": 190, "Dn": 512, "Dr": 64, "Dv": 128, "R": 512}
	if v := variants(kernels.OpMLADecode, wideNope, h200)[i]; v.Valid() || !strings.Contains(v.Why, "nope dim 512") {
		t.Errorf("keys_own with 512 nope dims: %+v, want refused", v)
	}

	o := &ops{}
	key := o.TuningKey(kernels.OpMLADecode, lite)
	if err := o.UseVariant(kernels.OpMLADecode, key, mlaKeysOwnVariant); err == nil || !strings.Contains(err.Error(), "not built") {
		t.Errorf("keys_own chosen where flat's module is not built: %v", err)
	}
	withFlat := &ops{mlaFlat: &mlaFlatKit{}}
	if got := withFlat.VariantFor(kernels.OpMLADecode, key); got != mlaKeysVariant {
		t.Errorf("mla_decode runs %q by default at batch 16, want %q", got, mlaKeysVariant)
	}
	if err := withFlat.UseVariant(kernels.OpMLADecode, key, mlaKeysOwnVariant); err != nil ||
		withFlat.VariantFor(kernels.OpMLADecode, key) != mlaKeysOwnVariant {
		t.Errorf("choosing keys_own: %v, now %q", err, withFlat.VariantFor(kernels.OpMLADecode, key))
	}

	const wave = 2 * 132 // an H200: 132 SMs, two mla_decode_keys blocks each
	for _, c := range []struct{ rows, maxSeq, wantSplits int }{
		{16, 190, 3},     // W4: one split a tile
		{16, 4096, 16},   // one wave
		{8, 1024, 16},    //
		{4, 16501, 65},   // the harness's 16K rows
		{1, 32768, 128},  // one wave would be 264 splits: mla_out merges 128
		{1, 100000, 121}, // at most 128 (chunks of whole tiles)
		{16, 1, 2},       // one tile: a second split, empty
		{8, 64, 2},       //
		{2000, 4096, 2},  // more rows than a wave: the same
	} {
		splits, chunk := mlaKeysOwnSplits(c.rows, c.maxSeq, wave)
		one, _ := decodeSplits(c.rows, c.maxSeq, wave)
		covered := splits*chunk >= c.maxSeq && (one == 1 || (splits-1)*chunk < c.maxSeq)
		if chunk%keyTile != 0 || !covered || splits != c.wantSplits || splits < 2 || splits > moMaxPerRow {
			t.Errorf("%d rows, %d keys: %d splits of %d keys, want %d splits of whole tiles covering them", c.rows, c.maxSeq,
				splits, chunk, c.wantSplits)
		}
	}
}

// TestMLADecodeKeysOwn runs the shared harness's mla_decode cases and the
// decode graph with mla_decode's keys_own variant the default at every
// batch; on sm_90a flat's module, which holds its mla_qlat and mla_out,
// must be built (a fallback would test another variant).
func TestMLADecodeKeysOwn(t *testing.T) {
	dev, _ := openHopperSet(t, "mla_decode "+mlaKeysOwnVariant, func(o *ops) error { return o.mlaFlat.ready() })
	saved := mlaDecodeDefault
	defer func() { mlaDecodeDefault = saved }()
	mlaDecodeDefault = mlaKeysOwnVariant
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLADecode)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// TestMLAKeysOwnContexts runs keys and keys_own on decode steps of V2-Lite's
// dims (16 heads, rank 512, rope 64) at batches 8 and 16 of 1, 130, 190,
// 1,024 and 4,096 keys a row (the capacity the length), and W4's 16 rows of
// 130 to 190 keys in a capacity of 192, each against the cpu set (f32, on
// the values the device holds) within the kernel tests' bf16 tolerance,
// and logs each variant's µs a call and the two variants' difference.
func TestMLAKeysOwnContexts(t *testing.T) {
	dev, o := openHopperSet(t, "mla_decode "+mlaKeysOwnVariant, func(o *ops) error { return o.mlaFlat.ready() })
	tol := kerneltest.DefaultTolerances().BF16
	var cases []mlaHopperCase
	for _, rows := range []int{8, 16} {
		for _, ctx := range []int{1, 130, 190, 1024, 4096} {
			cases = append(cases, mlaHopperCase{lens: slices.Repeat([]int{1}, rows), past: slices.Repeat([]int{ctx - 1}, rows),
				heads: 16, maxSeq: ctx})
		}
	}
	w4 := make([]int, 16)
	for b := range w4 {
		w4[b] = 129 + 4*b
	}
	cases = append(cases, mlaHopperCase{lens: slices.Repeat([]int{1}, 16), past: w4, heads: 16, maxSeq: 192})
	for i, c := range cases {
		rows := len(c.lens)
		desc := fmt.Sprintf("B=%d past=%d..%d max=%d", rows, slices.Min(c.past), slices.Max(c.past), c.maxSeq)
		p := newMLAHopperProblem(t, dev, c, int64(500+i))
		want := mlaDecodeReference(t, dev, p)
		outs := map[string][]float32{}
		for _, name := range []string{mlaKeysVariant, mlaKeysOwnVariant} {
			if err := o.UseVariant(kernels.OpMLADecode, "", name); err != nil {
				t.Fatal(err)
			}
			dev.MemsetD8(dev.Ptr(p.o), 0xff, p.o.Numel()*2) // NaN: an output not written shows
			o.MLADecode(p.args())
			got := read(t, dev, p.o)
			d := kernels.Compare(got, want)
			if d.Unwritten > 0 || d.Overwritten > 0 || !(d.Rel <= tol) {
				t.Errorf("%s, %s: relative error %.3g (tolerance %.3g), largest difference %.3g at %d, %d outputs unwritten",
					desc, name, d.Rel, tol, d.Max, d.MaxAt, d.Unwritten)
			}
			outs[name] = got
		}
		us := map[string]float64{}
		for _, name := range []string{mlaKeysVariant, mlaKeysOwnVariant} {
			if err := o.UseVariant(kernels.OpMLADecode, "", name); err != nil {
				t.Fatal(err)
			}
			us[name] = 1000 * msPerCall(t, dev, func() { o.MLADecode(p.args()) })
		}
		between := kernels.Compare(outs[mlaKeysOwnVariant], outs[mlaKeysVariant])
		splits, _ := mlaKeysOwnSplits(rows, c.maxSeq, mlaKeysOwnWave(o))
		t.Logf("%s: keys %.1f µs, keys_own %.1f µs (%d splits a row); keys_own against keys: relative %.3g, largest %.3g",
			desc, us[mlaKeysVariant], us[mlaKeysOwnVariant], splits, between.Rel, between.Max)
		for _, x := range []*kernels.Tensor{p.q, p.kv, p.wkvb, p.cache, p.o, p.batch.StartDev, p.batch.PastDev} {
			dev.Free(x)
		}
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// mlaKeysOwnWave is the wave of mla_decode_keys blocks MLADecode gives
// keys_own on o's device at V2-Lite's latent dims.
func mlaKeysOwnWave(o *ops) int {
	perSM := o.D.Props().MaxSharedPerSM
	d := mlaLatent{mlaHopperDims.rank, mlaHopperDims.rope}
	return blocksPerSM(mlaKeysShared(d, mlaKeysStages(d, perSM)), perSM) * o.SMs
}

// mlaDecodeReference is the decode step of p (one new token a row) by the
// cpu set on an f32 host device, from the values dev holds (widened).
func mlaDecodeReference(t *testing.T, dev *cuda.Device, p *mlaHopperProblem) []float32 {
	t.Helper()
	host, ref, onHost, hb := hostReference(t, dev, p.batch)
	a := p.args()
	a.Out, a.Q, a.KV, a.Cache, a.WKVB, a.Batch = host.Alloc(kernels.F32, p.o.Shape...), onHost(p.q), onHost(p.kv),
		onHost(p.cache), onHost(p.wkvb), &hb
	ref.MLADecode(a)
	if err := host.Sync(); err != nil {
		t.Fatal(err)
	}
	return read(t, host, a.Out)
}

// mlaKeysFragmentOpt builds mla_keys.cu with every split's part stored
// from the warps' fragments (mla_split_out), the reference of its staged
// stores (mla_split_part_staged).
const mlaKeysFragmentOpt = "-DMLK_FRAGMENT_STORES=1"

// TestMLAKeysStagedExact holds mla_decode_keys's staged part stores to its
// fragment stores bit for bit: two sets on one device, the second built
// with MLK_FRAGMENT_STORES, run MLADecode's keys variant (attn_merge after
// it) on the same inputs at V2-Lite's dims (16 heads, rank 512, rope 64):
// 16 rows at W4's lengths (151 keys of 186), W5's (ragged, the new latent
// in every tile position of the first rows), 1,024 and 4,096 keys, 9 rows
// of 300, and 16 rows of 20 keys (one split: the bf16 path both builds
// share). Their outputs must be the same bits, and not NaN.
func TestMLAKeysStagedExact(t *testing.T) {
	dev, staged := openHopperSet(t, "mla_decode_keys", func(*ops) error { return nil })
	savedOpts, savedDefault := mlaKeysOpts, mlaDecodeDefault
	defer func() { mlaKeysOpts, mlaDecodeDefault = savedOpts, savedDefault }()
	mlaKeysOpts = []string{mlaKeysFragmentOpt}
	set, err := New(dev)
	mlaKeysOpts = savedOpts
	if err != nil {
		t.Fatal(err)
	}
	fragment := set.(*ops)
	mlaDecodeDefault = mlaKeysVariant
	_, _, wave := staged.mlaKeysLaunch(mlaLatent{mlaHopperDims.rank, mlaHopperDims.rope})
	const heads = 16
	cases := []struct {
		name   string
		rows   int
		past   func(b int) int
		maxSeq int
	}{
		{"W4's lengths", 16, func(int) int { return 150 }, 186},
		{"W5's lengths", 16, func(b int) int { return 120 + 3*b }, 186},
		{"new latent in every row of a tile", 16, func(b int) int { return 32 + 2*b }, 96},
		{"1,024 keys", 16, func(b int) int { return 1023 - b }, 1024},
		{"4,096 keys", 16, func(b int) int { return 4095 - 7*b }, 4096},
		{"9 rows", 9, func(b int) int { return 299 - 11*b }, 300},
		{"one split", 16, func(b int) int { return 19 - b }, 20},
	}
	for i, c := range cases {
		lens, past := slices.Repeat([]int{1}, c.rows), make([]int, c.rows)
		for b := range past {
			past[b] = c.past(b)
		}
		prob := newMLAHopperProblem(t, dev, mlaHopperCase{lens: lens, past: past, heads: heads, maxSeq: c.maxSeq}, int64(500+i))
		run := func(o *ops, what string) []float32 {
			dev.MemsetD8(dev.Ptr(prob.o), 0xff, prob.o.Numel()*2) // NaN: an output not written shows
			o.MLADecode(prob.args())
			out, err := dev.ReadF32(prob.o)
			if err != nil {
				t.Fatalf("%s, %s: %v", c.name, what, err)
			}
			return out
		}
		want, got := run(fragment, "fragment stores"), run(staged, "staged stores")
		bad := 0
		for j := range want {
			if math.IsNaN(float64(want[j])) || math.IsNaN(float64(got[j])) {
				t.Fatalf("%s: output %d is NaN (fragment %g, staged %g)", c.name, j, want[j], got[j])
			}
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				if bad < 4 {
					t.Errorf("%s: output %d (row %d) is %g, the fragment build's %g", c.name, j, j/(heads*mlaHopperDims.v), got[j], want[j])
				}
				bad++
			}
		}
		splits, _ := decodeSplitsAt(c.rows, c.maxSeq, wave, mlkTile)
		if bad > 0 {
			t.Errorf("%s (%d splits a row): %d of %d outputs differ", c.name, splits, bad, len(want))
		} else {
			t.Logf("%s (%d splits a row): %d outputs identical", c.name, splits, len(want))
		}
		for _, x := range []*kernels.Tensor{prob.q, prob.kv, prob.wkvb, prob.cache, prob.o, prob.batch.StartDev, prob.batch.PastDev} {
			dev.Free(x)
		}
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
	}
}
