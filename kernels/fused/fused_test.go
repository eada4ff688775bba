package fused

import (
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestFlashConfigs runs the shared harness once per flash_prefill tiling
// (the kernel-set test runs the default one only).
func TestFlashConfigs(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := prefillConfig
	defer func() { prefillConfig = saved }()
	for _, c := range flashConfigs {
		t.Run(c.String(), func(t *testing.T) {
			prefillConfig = c
			kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances())
		})
	}
}

// TestDecodeVariants runs the shared harness once per decode variant (the
// kernel-set test runs the default one only), decode graph included.
func TestDecodeVariants(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := decodeVariant
	defer func() { decodeVariant = saved }()
	for _, v := range decodeVariants {
		t.Run(v, func(t *testing.T) {
			decodeVariant = v
			kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances())
			kerneltest.RunDecodeGraph(t, dev, "fused")
		})
	}
}

// TestDecodeSplits checks how flash-decoding cuts caches: whole key tiles,
// every position covered, about one wave of blocks.
func TestDecodeSplits(t *testing.T) {
	const wave = 2 * 132 // an H200: 132 SMs of 228 KiB, two flash_decode blocks each
	for _, c := range []struct{ pairs, maxSeq, wantSplits int }{
		{64, 10866, 4},  // W1: 16 rows × 4 kv heads, about 264 blocks
		{4, 32768, 64},  // batch 1 at 32K
		{64, 178, 3},    // short caches: at most one split per tile
		{1, 1, 1},       //
		{2000, 4096, 1}, // more pairs than a wave
		{4, 100000, 66}, //
	} {
		splits, chunk := decodeSplits(c.pairs, c.maxSeq, wave)
		if chunk%keyTile != 0 || splits*chunk < c.maxSeq || (splits-1)*chunk >= c.maxSeq || splits != c.wantSplits {
			t.Errorf("%d pairs, %d keys: %d splits of %d keys, want %d splits of whole tiles covering them",
				c.pairs, c.maxSeq, splits, chunk, c.wantSplits)
		}
	}
}

// TestVariants checks the tilings fused offers, valid or not and why, and
// that a tuning choice changes the tiling AttentionPrefill launches.
func TestVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	valid := func(vs []kernels.Variant) (names []string) {
		for _, v := range vs {
			if v.Valid() {
				names = append(names, v.Name)
			}
		}
		return names
	}
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, h200)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2", "w8_m2"}) {
		t.Errorf("D=128 on sm_90a: valid tilings %v", got)
	}
	for _, v := range variants(kernels.OpAttnPrefill, kernels.Shape{"D": 48}, h200) {
		if !strings.Contains(v.Why, "head dim 48") {
			t.Errorf("D=48: %+v, want refused for its head dim", v)
		}
	}
	small := h200
	small.SharedPerBlock = 96 << 10
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, small)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2"}) {
		t.Errorf("D=128 with 96 KiB a block: valid tilings %v (w8_m2 needs 128 KiB)", got)
	}
	if vs := variants(kernels.OpAttnDecode, kernels.Shape{"D": 128, "H": 64, "KVH": 2}, h200); len(vs) != 2 || vs[0].Valid() || vs[1].Valid() {
		t.Errorf("decode with 32 query heads per kv head: %+v, want both variants refused", vs)
	}
	if got := valid(variants(kernels.OpAttnDecode, kernels.Shape{"D": 128, "H": 28, "KVH": 4}, h200)); !slices.Equal(got, []string{"dims", "keys"}) {
		t.Errorf("decode of Qwen2-7B's heads: valid variants %v", got)
	}
	if vs := variants(kernels.OpRoPE, nil, kernels.Target{Arch: "sm_75"}); len(vs) != 1 || !strings.Contains(vs[0].Why, "sm_80") {
		t.Errorf("rope on sm_75: %+v, want refused for the architecture", vs)
	}

	o := &ops{prefill: map[string]flashConfig{}, decode: map[string]string{}}
	key := o.TuningKey(kernels.OpAttnPrefill, kernels.Shape{"D": 128, "N": 4096})
	if key != "D=128" || o.VariantFor(kernels.OpAttnPrefill, key) != prefillConfig.String() {
		t.Fatalf("key %q, variant %q before tuning", key, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, "w8_m2"); err != nil || o.prefillFor(key) != (flashConfig{8, 2}) {
		t.Errorf("UseVariant w8_m2: %v, now %v", err, o.prefillFor(key))
	}
	if o.prefillFor("D=64") != prefillConfig {
		t.Errorf("a choice for D=128 changed D=64's tiling")
	}
	for _, bad := range []struct {
		op        kernels.Op
		key, name string
	}{{kernels.OpAttnPrefill, "D=128", "w3_m7"}, {kernels.OpAttnPrefill, "D=48", "w4_m1"}, {kernels.OpRoPE, "", "w4_m1"}} {
		if err := o.UseVariant(bad.op, bad.key, bad.name); err == nil {
			t.Errorf("UseVariant(%s, %q, %q) accepted", bad.op, bad.key, bad.name)
		}
	}
	if err := o.UseVariant(kernels.OpRoPE, "", "token_per_block"); err != nil {
		t.Errorf("rope's one variant refused: %v", err)
	}
	dkey := o.TuningKey(kernels.OpAttnDecode, kernels.Shape{"D": 128, "ctx": 4096})
	if o.VariantFor(kernels.OpAttnDecode, dkey) != decodeVariant {
		t.Errorf("decode before tuning: %q", o.VariantFor(kernels.OpAttnDecode, dkey))
	}
	if err := o.UseVariant(kernels.OpAttnDecode, dkey, "keys"); err != nil || o.decodeFor(dkey) != "keys" {
		t.Errorf("UseVariant keys: %v, now %q", err, o.decodeFor(dkey))
	}
	if err := o.UseVariant(kernels.OpAttnDecode, dkey, "w4_m2"); err == nil {
		t.Errorf("a prefill tiling accepted as a decode variant")
	}
}

// TestMLAPrefillConfigs runs the shared harness once per mla_prefill
// tiling, and once with a budget so small that every row of a batch gets a
// launch of its own (the kernel-set test runs the default, all rows in one).
func TestMLAPrefillConfigs(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved, savedBudget := mlaPrefillConfig, mlaPrefillBudget
	defer func() { mlaPrefillConfig, mlaPrefillBudget = saved, savedBudget }()
	for _, c := range flashConfigs {
		t.Run(c.String(), func(t *testing.T) {
			mlaPrefillConfig = c
			kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances())
		})
	}
	mlaPrefillConfig, mlaPrefillBudget = saved, 1
	t.Run("a launch per row", func(t *testing.T) { kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances()) })
}

// TestMLAVariants checks what fused offers for MLA: DeepSeek-V2-Lite's
// shapes on an H200, refusals for heads or dims the kernels do not take,
// and a tuning choice of mla_prefill's tiling.
func TestMLAVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	lite := kernels.Shape{"B": 16, "H": 16, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	if vs := variants(kernels.OpMLADecode, lite, h200); len(vs) != 1 || !vs[0].Valid() || vs[0].Name != mlaDecodeVariant {
		t.Errorf("mla_decode of V2-Lite on sm_90a: %+v", vs)
	}
	if shared := mlaDecodeShared(mlaLatent{512, 64}); shared > h200.SharedPerBlock {
		t.Errorf("mla_decode needs %d bytes of shared memory, an H200 block gets %d", shared, h200.SharedPerBlock)
	}
	wide := kernels.Shape{"B": 1, "H": 128, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512} // DeepSeek-V2's 128 heads
	if vs := variants(kernels.OpMLADecode, wide, h200); len(vs) != 1 || vs[0].Valid() || !strings.Contains(vs[0].Why, "128 heads") {
		t.Errorf("mla_decode of 128 heads: %+v, want refused for its heads", vs)
	}
	prefill := kernels.Shape{"B": 1, "H": 16, "N": 11041, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	if got := valid(variants(kernels.OpMLAPrefill, prefill, h200)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2", "w8_m2"}) {
		t.Errorf("mla_prefill of V2-Lite on sm_90a: valid tilings %v", got)
	}
	odd := kernels.Shape{"B": 1, "H": 2, "N": 6, "Dn": 16, "Dr": 8, "Dv": 16, "R": 32}
	for _, v := range variants(kernels.OpMLAPrefill, odd, h200) {
		if !strings.Contains(v.Why, "rope 8") {
			t.Errorf("mla_prefill with rope 8: %+v, want refused for its dims", v)
		}
	}

	o := &ops{mlaPrefill: map[string]flashConfig{}}
	key := o.TuningKey(kernels.OpMLAPrefill, prefill)
	if key != "Dn=128,Dr=64,Dv=128" || o.VariantFor(kernels.OpMLAPrefill, key) != mlaPrefillConfig.String() {
		t.Fatalf("key %q, variant %q before tuning", key, o.VariantFor(kernels.OpMLAPrefill, key))
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, key, "w8_m1"); err != nil || o.mlaPrefillFor(key) != (flashConfig{8, 1}) {
		t.Errorf("UseVariant w8_m1: %v, now %v", err, o.mlaPrefillFor(key))
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, "Dn=16,Dr=8,Dv=16", "w4_m1"); err == nil {
		t.Errorf("a tiling accepted for head dims mla_prefill has no kernel for")
	}
	if err := o.UseVariant(kernels.OpMLADecode, "", mlaDecodeVariant); err != nil {
		t.Errorf("mla_decode's one variant refused: %v", err)
	}
}

func valid(vs []kernels.Variant) (names []string) {
	for _, v := range vs {
		if v.Valid() {
			names = append(names, v.Name)
		}
	}
	return names
}
