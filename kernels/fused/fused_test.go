package fused

import (
	"fmt"
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
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, h200)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2", "w8_m2", "wgmma"}) {
		t.Errorf("D=128 on sm_90a: valid tilings %v", got)
	}
	if vs := variants(kernels.OpAttnPrefill, kernels.Shape{"D": 96}, h200); len(vs) != 5 || vs[4].Name != "wgmma" || !strings.Contains(vs[4].Why, "head dim 96") {
		t.Errorf("D=96 on sm_90a: %+v, want wgmma refused for its head dim", vs)
	}
	if vs := variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, kernels.Targets["sm_80"]); len(vs) != 4 {
		t.Errorf("D=128 on sm_80: %+v, want the 4 tilings and no wgmma", vs)
	}
	for _, v := range variants(kernels.OpAttnPrefill, kernels.Shape{"D": 48}, h200) {
		if !strings.Contains(v.Why, "head dim 48") {
			t.Errorf("D=48: %+v, want refused for its head dim", v)
		}
	}
	small := h200
	small.SharedPerBlock = 96 << 10
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, small)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2"}) {
		t.Errorf("D=128 with 96 KiB a block: valid tilings %v (w8_m2 needs 128 KiB, wgmma 161)", got)
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
	o.hopper = &hopperKit{err: fmt.Errorf("no Hopper here")}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, hopperVariant); err == nil || !strings.Contains(err.Error(), "no Hopper here") {
		t.Errorf("UseVariant wgmma without flash_hopper: %v, want its error", err)
	}
	o.hopper = &hopperKit{configs: map[int]hopperConfig{128: {128, 3}}}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, hopperVariant); err != nil || o.VariantFor(kernels.OpAttnPrefill, key) != hopperVariant {
		t.Errorf("UseVariant wgmma: %v, now %q", err, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if c, ok := o.hopperFor("D=64", 64); ok {
		t.Errorf("D=64 runs flash_hopper %v untuned", c)
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, "D=64", hopperVariant); err == nil {
		t.Errorf("UseVariant wgmma for D=64 accepted with no D=64 instance")
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, "w8_m2"); err != nil || o.VariantFor(kernels.OpAttnPrefill, key) != "w8_m2" {
		t.Errorf("back to w8_m2: %v, now %q", err, o.VariantFor(kernels.OpAttnPrefill, key))
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
