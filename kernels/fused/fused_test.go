package fused

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestFlashConfigs runs the shared harness's attn_prefill cases once per
// flash_prefill tiling (the kernel-set test runs the default one only).
func TestFlashConfigs(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := prefillConfig
	defer func() { prefillConfig = saved }()
	for _, c := range flashConfigs {
		t.Run(c.String(), func(t *testing.T) {
			prefillConfig = c
			kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpAttnPrefill)
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
	// mla_decode keys's 32-key tiles: W4's 16 rows in a capacity of 186
	// keys make 6 splits of a tile; long caches split as at 64.
	for _, c := range []struct{ rows, maxSeq, wantSplits, wantChunk int }{
		{16, 186, 6, mlkTile}, {16, 4096, 16, 256}, {1, 11142, 175, 64}, {8, 1024, 32, mlkTile},
	} {
		splits, chunk := decodeSplitsAt(c.rows, c.maxSeq, wave, mlkTile)
		if splits != c.wantSplits || chunk != c.wantChunk || (splits-1)*chunk >= c.maxSeq || splits*chunk < c.maxSeq {
			t.Errorf("mla keys, %d rows, %d keys: %d splits of %d keys, want %d of %d", c.rows, c.maxSeq, splits, chunk, c.wantSplits, c.wantChunk)
		}
	}
	// A split's block takes the stages its tiles use, never less than its
	// epilogue's sums (the queries, each warp's sums and 16 f32 rows of
	// outputs) nor more than the kernel's full stages.
	for _, d := range headDims {
		full, epilogue := decodeShared(d), 16*rowBytes(d)+decodeWarps*16*4+decodeWarps*16*d*4
		for _, chunk := range []int{keyTile, 2 * keyTile, 3 * keyTile, 64 * keyTile} {
			got := decodeSharedFor(d, chunk)
			stages := min(decodeStages, chunk/keyTile)
			if got < epilogue || got < (16+2*stages*keyTile)*rowBytes(d) || got > full {
				t.Errorf("D=%d, splits of %d keys: %d bytes of shared memory, want the %d stages' and at least %d, at most %d",
					d, chunk, got, stages, epilogue, full)
			}
		}
		if decodeSharedFor(d, decodeStages*keyTile) != full {
			t.Errorf("D=%d: splits of %d tiles take %d bytes, want the kernel's %d", d, decodeStages, decodeSharedFor(d, decodeStages*keyTile), full)
		}
	}
}

// sourceText is the set's source file name.
func sourceText(t *testing.T, name string) string {
	t.Helper()
	b, err := sources.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSourceConstants holds the Go side's launch constants to the defines of
// the .cu sources they mirror.
func TestSourceConstants(t *testing.T) {
	for _, c := range []struct {
		file, define string
		value        int
	}{
		{"attention.cuh", "BN", keyTile},
		{"attention.cuh", "DEC_WARPS", decodeWarps},
		{"attention.cuh", "DEC_STAGES", decodeStages},
		{"flash_decode.cuh", "MERGE_DIMS", mergeDims},
		{"flash_decode.cuh", "MERGE_WARPS", mergeWarps},
		{"attention_cluster.cu", "DC_MAX_CLUSTER", decodeMaxCluster},
		{"hop_gemm.cuh", "HG_BK", lwK},
		{"hop_gemm.cuh", "HG_CONSUMERS", lwConsumers},
		{"linear_wgmma.cu", "LW_PRODUCER_REGS", lwProducerRegs},
		{"linear_wgmma.cu", "LW_CONSUMER_REGS", lwConsumerRegs},
		{"linear_wgmma.cu", "LW_OUT_BUFS", lwOutBufs},
		{"group_wgmma.cu", "GW_OUT_BUFS", gwOutBufs},
		{"moe.cu", "ALIGN_THREADS", alignThreads},
		{"moe.cu", "ALIGN_BLOCKS", alignBlocks},
		{"hop_gemm.cuh", "HG_BOX", hopperBox},
		{"moe_split.cu", "MS_ROWS", msRows},
		{"moe_split.cu", "MS_COLS", msCols},
		{"moe_split.cu", "MS_MAX_STAGES", msMaxStages},
		{"moe_split.cu", "MS_MAX_K", msMaxK},
		{"moe_split.cu", "MS_MAX_H", msMaxH},
		{"moe_split.cu", "MS_MAX_I", msMaxI},
		{"moe_split.cu", "MS_MAX_S", msMaxS},
		{"moe_split.cu", "MS_HEAD", msHead},
	} {
		if want := fmt.Sprintf("#define %s %d", c.define, c.value); !strings.Contains(sourceText(t, c.file), want) {
			t.Errorf("%s has no %q", c.file, want)
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
	if vs := variants(kernels.OpAttnDecode, kernels.Shape{"D": 128, "H": 64, "KVH": 2}, h200); len(vs) != 1 || vs[0].Valid() {
		t.Errorf("decode with 32 query heads per kv head: %+v, want it refused", vs)
	}
	if got := valid(variants(kernels.OpAttnDecode, kernels.Shape{"D": 128, "H": 28, "KVH": 4}, h200)); !slices.Equal(got, []string{"keys"}) {
		t.Errorf("decode of Qwen2-7B's heads: valid variants %v", got)
	}
	if vs := variants(kernels.OpRoPE, nil, kernels.Target{Arch: "sm_75"}); len(vs) != 1 || !strings.Contains(vs[0].Why, "sm_80") {
		t.Errorf("rope on sm_75: %+v, want refused for the architecture", vs)
	}

	o := &ops{}
	key := o.TuningKey(kernels.OpAttnPrefill, kernels.Shape{"D": 128, "N": 4096})
	if key != "D=128" || o.VariantFor(kernels.OpAttnPrefill, key) != prefillConfig.String() {
		t.Fatalf("key %q, variant %q before tuning", key, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, "w8_m2"); err != nil || o.VariantFor(kernels.OpAttnPrefill, key) != "w8_m2" {
		t.Errorf("UseVariant w8_m2: %v, now %v", err, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if o.VariantFor(kernels.OpAttnPrefill, "D=64") != prefillConfig.String() {
		t.Errorf("a choice for D=128 changed D=64's tiling")
	}
	o.hopper = &hopperKit{err: fmt.Errorf("no Hopper here")}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, hopperVariant); err == nil || !strings.Contains(err.Error(), "no Hopper here") {
		t.Errorf("UseVariant wgmma without flash_hopper: %v, want its error", err)
	}
	bf128 := hopperHead{kernels.BF16, 128}
	o.hopper = &hopperKit{configs: map[hopperHead]hopperConfig{bf128: {bf128, 2, 2, 2}}}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, hopperVariant); err != nil || o.VariantFor(kernels.OpAttnPrefill, key) != hopperVariant {
		t.Errorf("UseVariant wgmma: %v, now %q", err, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if o.VariantFor(kernels.OpAttnPrefill, "D=64") == hopperVariant {
		t.Errorf("D=64 runs flash_hopper untuned")
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
	if err := o.UseVariant(kernels.OpAttnDecode, dkey, "keys"); err != nil {
		t.Errorf("UseVariant keys: %v", err)
	}
	if err := o.UseVariant(kernels.OpAttnDecode, dkey, "w4_m2"); err == nil {
		t.Errorf("a prefill tiling accepted as a decode variant")
	}
}

// TestVariantTable: an op has a tuning (a key and a default rule) exactly
// when the table gives it several variants, every name an op's rule picks
// untuned is one of its table's, and no op names a variant twice.
func TestVariantTable(t *testing.T) {
	o := &ops{}
	for _, op := range kernels.AllOps {
		names := namesOf(op)
		if _, tuned := tunings[op]; tuned != (len(names) > 1) {
			t.Errorf("%s: variants %v, a tuning: %v", op, names, tuned)
		}
		if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
			t.Errorf("%s names a variant twice: %v", op, names)
		}
	}
	for _, c := range []struct {
		op kernels.Op
		s  kernels.Shape
	}{
		{kernels.OpAttnPrefill, kernels.Shape{"D": 128}}, {kernels.OpMLAPrefill, kernels.Shape{"Dn": 128, "Dr": 64, "Dv": 128}},
		{kernels.OpMLADecode, kernels.Shape{"B": 1}}, {kernels.OpMLADecode, kernels.Shape{"B": 16}},
		{kernels.OpLinear, kernels.Shape{"M": 1, "N": 37888, "K": 3584}}, {kernels.OpLinear, kernels.Shape{"M": 64, "N": 4608, "K": 3584}},
		{kernels.OpGroupGemm, kernels.Shape{"M": 11041 * 6, "E": 160}}, {kernels.OpMoEExperts, kernels.Shape{"N": 11041, "topk": 6, "E": 160}},
		{kernels.OpMoEExperts, kernels.Shape{"N": 1, "topk": 6, "E": 160}},
	} {
		key := o.TuningKey(c.op, c.s)
		if v := o.VariantFor(c.op, key); !slices.Contains(namesOf(c.op), v) {
			t.Errorf("%s %s runs %q untuned, not one of %v", c.op, key, v, namesOf(c.op))
		}
	}
}

// TestVariantsF16 checks attn_prefill's f16 problems (kbench's dt=f16
// rows): only flash_hopper takes them, each tiling says why it does not,
// and their tuning key is apart from bf16's, so that a choice for one
// never runs the other.
func TestVariantsF16(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	f16 := func(d int) kernels.Shape { return kernels.Shape{"D": d, kernels.ShapeDType: int(kernels.F16)} }
	vs := variants(kernels.OpAttnPrefill, f16(128), h200)
	if len(vs) != 5 || vs[4].Name != hopperVariant || !vs[4].Valid() || !strings.Contains(vs[4].Params, "dtype=f16") {
		t.Fatalf("D=128 f16 on sm_90a: %+v, want the 4 tilings and a valid wgmma", vs)
	}
	for _, v := range vs[:4] {
		if v.Valid() || !strings.Contains(v.Why, "f16 operands: flash_prefill's mma.sync tiles take bf16 only") {
			t.Errorf("tiling %s with f16: %+v, want it refused for the type", v.Name, v)
		}
	}
	if vs := variants(kernels.OpAttnPrefill, f16(64), h200); len(vs) != 5 || !vs[4].Valid() || !strings.Contains(vs[4].Params, "stages=4") {
		t.Errorf("D=64 f16 on sm_90a: %+v, want wgmma with 4 stages", vs)
	}
	if vs := variants(kernels.OpAttnPrefill, f16(96), h200); len(vs) != 5 || !strings.Contains(vs[4].Why, "head dim 96") {
		t.Errorf("D=96 f16 on sm_90a: %+v, want wgmma refused for its head dim", vs)
	}
	for _, v := range variants(kernels.OpAttnPrefill, f16(128), kernels.Targets["sm_80"]) {
		if v.Valid() {
			t.Errorf("D=128 f16 on sm_80: %+v valid, want nothing (no flash_hopper)", v)
		}
	}
	f32 := kernels.Shape{"D": 128, kernels.ShapeDType: int(kernels.F32)}
	if vs := variants(kernels.OpAttnPrefill, f32, h200); vs[4].Valid() || !strings.Contains(vs[4].Why, "f32 operands") {
		t.Errorf("D=128 f32: %+v, want wgmma refused for the type", vs[4])
	}

	o := &ops{}
	key := o.TuningKey(kernels.OpAttnPrefill, f16(128))
	if key != "D=128,dt=f16" || o.TuningKey(kernels.OpAttnPrefill, kernels.Shape{"D": 128}) != "D=128" {
		t.Fatalf("tuning keys %q and %q", key, o.TuningKey(kernels.OpAttnPrefill, kernels.Shape{"D": 128}))
	}
	bf128, f128 := hopperHead{kernels.BF16, 128}, hopperHead{kernels.F16, 128}
	o.hopper = &hopperKit{configs: map[hopperHead]hopperConfig{bf128: {bf128, 2, 2, 2}}}
	if v := o.VariantFor(kernels.OpAttnPrefill, key); v != "" {
		t.Errorf("f16 without an f16 instance runs %q, want none of fused's", v)
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, hopperVariant); err == nil || !strings.Contains(err.Error(), "f16, head dim 128") {
		t.Errorf("UseVariant wgmma for f16 with bf16 instances only: %v", err)
	}
	o.hopper.configs[f128] = hopperConfig{f128, 2, 2, 2}
	if v := o.VariantFor(kernels.OpAttnPrefill, key); v != hopperVariant {
		t.Errorf("f16 with its instance runs %q", v)
	}
	if c, err := o.hopper.config(kernels.F16, 128); err != nil || c.kernel() != "flash_hopper_f16_d128_k2v2q2" {
		t.Errorf("f16 D=128 runs %v, %v", c, err)
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, "w4_m2"); err == nil || !strings.Contains(err.Error(), "bf16 only") {
		t.Errorf("a tiling chosen for f16: %v", err)
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, "D=128", "w8_m2"); err != nil || o.VariantFor(kernels.OpAttnPrefill, key) != hopperVariant {
		t.Errorf("a bf16 choice moved f16: %v, f16 runs %q", err, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, "dt=f16,D=128", hopperVariant); err != nil || o.choice[choiceKey{kernels.OpAttnPrefill, key}] != hopperVariant {
		t.Errorf("a key in another order: %v, choices %v", err, o.choice)
	}
	for _, bad := range []string{"D=128,dt=f32", "D=128,N=4", "dt=f16", "D=128,dt=q8"} {
		if err := o.UseVariant(kernels.OpAttnPrefill, bad, hopperVariant); err == nil {
			t.Errorf("tuning key %q accepted", bad)
		}
	}
}

// TestGemmTiling checks the grouped GEMM's host side: the grid's bound on
// m-tiles holds for any split of the rows into groups (else a graph would
// leave tiles undone), every tiling passes check (the kernel's
// static_asserts), and the tiling follows the rows per group.
func TestGemmTiling(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		groups := 1 + rng.IntN(80)
		sizes := make([]int, groups)
		rows := 0
		for g := range sizes {
			if rng.IntN(3) > 0 {
				sizes[g] = rng.IntN([]int{3, 40, 700}[rng.IntN(3)])
			}
			rows += sizes[g]
		}
		for _, c := range gemmConfigs {
			need := 0
			for _, n := range sizes {
				need += (n + c.BM - 1) / c.BM
			}
			if got := mTiles(rows, groups, c.BM); got < need {
				t.Fatalf("%s: groups %v take %d m-tiles, the bound says %d", c.Name, sizes, need, got)
			}
		}
	}
	if err := checkGemmConfigs(); err != nil {
		t.Error(err)
	}
	for _, c := range gemmConfigs {
		if c.shared() > kernels.Targets["sm_80"].SharedPerBlock {
			t.Errorf("%s: %d bytes of shared memory, more than an A100 block gets", c.Name, c.shared())
		}
	}
	for _, c := range []struct {
		rows, groups int
		want         string
	}{{6, 64, "m16"}, {96, 64, "m16"}, {1800, 64, "m64"}, {66246, 64, "m128"}, {300, 4, "m128"}, {0, 3, "m16"}} {
		if got := configFor(c.rows, c.groups).Name; got != c.want {
			t.Errorf("%d rows in %d groups: tiling %s, want %s", c.rows, c.groups, got, c.want)
		}
	}
	if vs := variants(kernels.OpMoEExperts, kernels.Shape{"N": 11041, "topk": 6, "E": 64}, kernels.Targets["sm_90a"]); len(vs) != 2 ||
		!vs[0].Valid() || vs[0].Name != "cublas_per_expert" || !vs[1].Valid() || vs[1].Name != wgmmaVariant {
		t.Errorf("moe_experts at W3's prefill: %+v", vs)
	}
}

// TestLinearPlan checks how linear_skinny covers the decode projections of
// Qwen2-7B and DeepSeek-V2-Lite on an H200 (132 SMs, two blocks each):
// every feature and every k covered, splits of whole stages, split columns
// fewer than the SMs (one counter each), and about an SM's worth of blocks
// or more.
func TestLinearPlan(t *testing.T) {
	const sms, perSM = 132, 2
	for _, c := range []struct {
		n, k           int
		full, splits   int
		wantMinBlocks  int
		wantSplitColsN int
	}{
		{4608, 3584, 0, 4, 132, 36},      // qkv
		{3584, 3584, 0, 5, 132, 28},      // o
		{37888, 3584, 264, 5, 264, 32},   // gate_up: a wave of whole columns, the 32 left split
		{3584, 18944, 0, 5, 132, 28},     // down
		{152064, 3584, 1188, 1, 1188, 0}, // lm_head: whole columns in waves
		{576, 2048, 0, 8, 40, 5},         // kv_a: as deep as splits go (256 k)
		{64, 2048, 0, 8, 8, 1},           // router
		{21888, 2048, 171, 1, 171, 0},    // dense mlp up: more columns than SMs
		{102400, 2048, 792, 8, 792, 8},   // DeepSeek lm_head: 3 waves, 8 columns split
		{300, 200, 3, 1, 3, 0},           // too short to split
	} {
		p := planLinear(c.n, c.k, sms, perSM)
		if p.columns*linFeatures < c.n || (p.columns-1)*linFeatures >= c.n {
			t.Errorf("N=%d: %d columns of %d", c.n, p.columns, linFeatures)
		}
		if p.full != c.full || p.splits != c.splits || p.blocks() < c.wantMinBlocks || p.columns-p.full != c.wantSplitColsN {
			t.Errorf("N=%d K=%d: %+v (%d blocks), want full %d, splits %d, ≥ %d blocks, %d split columns", c.n, c.k, p,
				p.blocks(), c.full, c.splits, c.wantMinBlocks, c.wantSplitColsN)
		}
		if p.full < p.columns {
			if p.chunk%linStage != 0 || p.chunk < linMinSplitK || p.splits*p.chunk < c.k || (p.splits-1)*p.chunk >= c.k ||
				p.columns-p.full >= sms {
				t.Errorf("N=%d K=%d: splits %d of %d k", c.n, c.k, p.splits, p.chunk)
			}
		}
	}
}

// TestLinearSkinny runs the shared harness's linear cases and the decode
// graph with linear_skinny the default of every problem of up to 16 rows (the
// shared kernel-set test's small linears would otherwise run cuBLAS).
func TestLinearSkinny(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := linSkinnyBytes
	defer func() { linSkinnyBytes = saved }()
	linSkinnyBytes = 0
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpLinear)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// TestLinearVariants: by default skinny for up to 16 rows of a big weight
// stream, cuBLAS for smaller matrices and more rows; either by choice;
// keys and names checked.
func TestLinearVariants(t *testing.T) {
	o := &ops{}
	gateUp := o.TuningKey(kernels.OpLinear, kernels.Shape{"M": 16, "N": 37888, "K": 3584})
	if gateUp != "M=16,N=37888,K=3584" || o.VariantFor(kernels.OpLinear, gateUp) != linSkinny {
		t.Fatalf("key %q runs %q", gateUp, o.VariantFor(kernels.OpLinear, gateUp))
	}
	key := o.TuningKey(kernels.OpLinear, kernels.Shape{"M": 16, "N": 4608, "K": 3584})
	if o.VariantFor(kernels.OpLinear, key) != linCuBLAS {
		t.Errorf("%s (32 MiB of weights) runs %q by default", key, o.VariantFor(kernels.OpLinear, key))
	}
	if err := o.UseVariant(kernels.OpLinear, key, linSkinny); err != nil || o.VariantFor(kernels.OpLinear, key) != linSkinny {
		t.Errorf("choosing skinny: %v", err)
	}
	if err := o.UseVariant(kernels.OpLinear, gateUp, linCuBLAS); err != nil || o.VariantFor(kernels.OpLinear, gateUp) != linCuBLAS {
		t.Errorf("choosing cublas: %v", err)
	}
	big := linearKey{17, 4608, 3584}.String()
	if o.VariantFor(kernels.OpLinear, big) != linCuBLAS {
		t.Errorf("17 rows run %q", o.VariantFor(kernels.OpLinear, big))
	}
	for _, c := range []struct{ key, name, want string }{
		{big, linSkinny, "at most 16 rows"},
		{key, "gemv", "no linear variant"},
		{"D=128", linSkinny, "is not M="},
	} {
		if err := o.UseVariant(kernels.OpLinear, c.key, c.name); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v, want %q", c.key, c.name, err, c.want)
		}
	}
	info, _ := kernels.Set("fused")
	vs := info.VariantsOf(kernels.OpLinear, kernels.Shape{"M": 1, "N": 100, "K": 60}, kernels.Targets["sm_90a"])
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
		if v.Valid() != (v.Name == linCuBLAS) || !v.Valid() && !strings.Contains(v.Why, "K=60") {
			t.Errorf("K=60: %s valid=%v (%s); want cublas alone valid, every other variant refused for K", v.Name, v.Valid(), v.Why)
		}
	}
	if want := "[skinny stream swap cublas wgmma wgmma_n128 wgmma_mc2 wgmma_n128_mc2 wgmma_hold wgmma_hold_mc2]"; fmt.Sprint(names) != want {
		t.Errorf("linear's variants on sm_90a: %v, want %s", names, want)
	}
}

// TestMLAPrefillConfigs runs the shared harness's mla_prefill cases once per
// mla_prefill tiling, and once with a budget so small that every row of a
// batch gets a launch of its own (the kernel-set test runs the default, all
// rows in one).
func TestMLAPrefillConfigs(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved, savedBudget := mlaPrefillConfig, mlaPrefillBudget
	defer func() { mlaPrefillConfig, mlaPrefillBudget = saved, savedBudget }()
	for _, c := range flashConfigs {
		t.Run(c.String(), func(t *testing.T) {
			mlaPrefillConfig = c
			kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLAPrefill)
		})
	}
	mlaPrefillConfig, mlaPrefillBudget = saved, 1
	t.Run("a launch per row", func(t *testing.T) {
		kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLAPrefill)
	})
}

// TestMLAPadded holds MLAPrefill's rule for decompressing rows of distinct
// lengths as one GEMM padded to the longest: 16 prompts of 121 to 136
// tokens (W5's range) pad, a long prompt beside a short one does not, nor
// anything that pads by more than a quarter.
func TestMLAPadded(t *testing.T) {
	w5 := []int{121, 136, 128, 130, 125, 133, 127, 122, 131, 129, 126, 134, 124, 132, 123, 135}
	keys, kmax := 0, 0
	for _, k := range w5 {
		keys, kmax = keys+k, max(kmax, k)
	}
	for _, c := range []struct {
		rows, kmax, keys int
		want             bool
	}{
		{len(w5), kmax, keys, true},
		{2, 11042, 11042 + 130, false},
		{4, 100, 320, true},  // 400 positions for 320: a quarter more
		{4, 100, 319, false}, // just past it
		{3, 47, 137, true},   // the kernel tests' case after a past
	} {
		if got := mlaPadded(c.rows, c.kmax, c.keys); got != c.want {
			t.Errorf("mlaPadded(%d rows, longest %d, %d positions) = %v, want %v", c.rows, c.kmax, c.keys, got, c.want)
		}
	}
}

// TestMLAVariants checks what fused offers for MLA: DeepSeek-V2-Lite's
// shapes on an H200, refusals for heads or dims the kernels do not take,
// and a tuning choice of mla_prefill's tiling.
func TestMLAVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	lite := kernels.Shape{"B": 16, "H": 16, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	if vs := variants(kernels.OpMLADecode, lite, h200); len(vs) != 4 || !vs[0].Valid() || vs[0].Name != mlaDecodeVariant {
		t.Errorf("mla_decode of V2-Lite on sm_90a: %+v", vs)
	}
	if shared := mlaDecodeShared(mlaLatent{512, 64}); shared > h200.SharedPerBlock {
		t.Errorf("mla_decode needs %d bytes of shared memory, an H200 block gets %d", shared, h200.SharedPerBlock)
	}
	wide := kernels.Shape{"B": 1, "H": 128, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512} // DeepSeek-V2's 128 heads
	if vs := variants(kernels.OpMLADecode, wide, h200); len(vs) != 4 || vs[0].Valid() || !strings.Contains(vs[0].Why, "128 heads") {
		t.Errorf("mla_decode of 128 heads: %+v, want refused for its heads", vs)
	}
	prefill := kernels.Shape{"B": 1, "H": 16, "N": 11041, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	if got := valid(variants(kernels.OpMLAPrefill, prefill, h200)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2", "w8_m2", mlaHopperVariant}) {
		t.Errorf("mla_prefill of V2-Lite on sm_90a: valid variants %v", got)
	}
	odd := kernels.Shape{"B": 1, "H": 2, "N": 6, "Dn": 16, "Dr": 8, "Dv": 16, "R": 32}
	for _, v := range variants(kernels.OpMLAPrefill, odd, h200) {
		if !strings.Contains(v.Why, "rope 8") {
			t.Errorf("mla_prefill with rope 8: %+v, want refused for its dims", v)
		}
	}

	o := &ops{}
	key := o.TuningKey(kernels.OpMLAPrefill, prefill)
	if key != "Dn=128,Dr=64,Dv=128" || o.VariantFor(kernels.OpMLAPrefill, key) != mlaPrefillConfig.String() {
		t.Fatalf("key %q, variant %q before tuning", key, o.VariantFor(kernels.OpMLAPrefill, key))
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, key, "w8_m1"); err != nil || o.VariantFor(kernels.OpMLAPrefill, key) != "w8_m1" {
		t.Errorf("UseVariant w8_m1: %v, now %v", err, o.VariantFor(kernels.OpMLAPrefill, key))
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

// TestMLAKeysVariant checks mla_decode's "keys" variant on the host: its
// listing beside latent_split, its stage count (two blocks an SM on an H200
// and on an A100 where they fit), the tuning choice and the default.
func TestMLAKeysVariant(t *testing.T) {
	h200, a100 := kernels.Targets["sm_90a"], kernels.Targets["sm_80"]
	lite := kernels.Shape{"B": 16, "H": 16, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	vs := variants(kernels.OpMLADecode, lite, h200)
	if len(vs) != 4 || vs[0].Name != mlaDecodeVariant || vs[1].Name != mlaKeysVariant || vs[2].Name != mlaFlatVariant ||
		vs[3].Name != mlaKeysOwnVariant || !vs[0].Valid() || !vs[1].Valid() || !vs[2].Valid() || !vs[3].Valid() {
		t.Fatalf("mla_decode of V2-Lite on sm_90a: %+v", vs)
	}
	if vs := variants(kernels.OpMLADecode, lite, a100); len(vs) != 2 {
		t.Errorf("mla_decode of V2-Lite on sm_80: %+v, want no flat or keys_own variant (flat's module is sm_90's)", vs)
	}
	// flat: one block an SM with as many stages as fit, so that a split's
	// tiles are all queued before the grid's wait.
	if s := mlaFlatStages(mlaLatent{512, 64}, h200.SharedPerSM); s != 4 || !strings.Contains(vs[2].Params, "stages=4") ||
		!strings.Contains(vs[2].Params, "blocks_per_sm=1") || mlaFlatShared(mlaLatent{512, 64}, s) > h200.SharedPerBlock {
		t.Errorf("flat on sm_90a: %d stages, %s; want 4 stages, one block an SM", s, vs[2].Params)
	}
	if !strings.Contains(vs[1].Params, "blocks_per_sm=2") || !strings.Contains(vs[1].Params, "key_tile=32") {
		t.Errorf("keys on sm_90a: %s, want two blocks an SM of 32-key tiles", vs[1].Params)
	}
	for _, c := range []struct {
		d           mlaLatent
		target      kernels.Target
		stages, per int
	}{
		{mlaLatent{512, 64}, h200, 2, 2}, // 2·(92,160+1,024) of 233,472
		{mlaLatent{512, 64}, a100, 2, 1}, // two of 2 stages need 186 KB of 164
		{mlaLatent{256, 32}, h200, 4, 2},
		{mlaLatent{32, 16}, a100, 4, 8},
	} {
		s := mlaKeysStages(c.d, c.target.SharedPerSM)
		shared := mlaKeysShared(c.d, s)
		if s != c.stages || blocksPerSM(shared, c.target.SharedPerSM) != c.per || shared > c.target.SharedPerBlock {
			t.Errorf("%v on %s: %d stages, %d bytes, %d blocks an SM; want %d stages, %d blocks", c.d, c.target.Arch, s, shared,
				blocksPerSM(shared, c.target.SharedPerSM), c.stages, c.per)
		}
	}
	wide := kernels.Shape{"B": 1, "H": 128, "ctx": 4096, "Dn": 128, "Dr": 64, "Dv": 128, "R": 512}
	for _, v := range variants(kernels.OpMLADecode, wide, h200) {
		if v.Valid() || !strings.Contains(v.Why, "128 heads") {
			t.Errorf("mla_decode of 128 heads: %+v, want refused for its heads", v)
		}
	}

	o := &ops{}
	key := o.TuningKey(kernels.OpMLADecode, lite)
	one := o.TuningKey(kernels.OpMLADecode, kernels.Shape{"B": 1})
	if key != "B>=8" || one != "B<8" {
		t.Errorf("tuning keys %q (batch 16) and %q (batch 1)", key, one)
	}
	if got := o.VariantFor(kernels.OpMLADecode, key); got != mlaKeysVariant {
		t.Errorf("mla_decode runs %q by default at batch 16, want %q", got, mlaKeysVariant)
	}
	if got := o.VariantFor(kernels.OpMLADecode, one); got != mlaDecodeVariant {
		t.Errorf("mla_decode runs %q by default at batch 1 where flat is not built, want %q", got, mlaDecodeVariant)
	}
	withFlat := &ops{mlaFlat: &mlaFlatKit{}}
	if got := withFlat.VariantFor(kernels.OpMLADecode, one); got != mlaFlatVariant {
		t.Errorf("mla_decode runs %q by default at batch 1 where flat is built, want %q", got, mlaFlatVariant)
	}
	if got := withFlat.VariantFor(kernels.OpMLADecode, key); got != mlaKeysVariant {
		t.Errorf("mla_decode runs %q by default at batch 16 where flat is built, want %q", got, mlaKeysVariant)
	}
	if err := o.UseVariant(kernels.OpMLADecode, one, mlaFlatVariant); err == nil {
		t.Errorf("flat chosen where it is not built")
	}
	wideNope := kernels.Shape{"B": 1, "H": 16, "ctx": 4096, "Dn": 512, "Dr": 64, "Dv": 128, "R": 512}
	if vs := variants(kernels.OpMLADecode, wideNope, h200); vs[2].Valid() || !strings.Contains(vs[2].Why, "nope dim 512") {
		t.Errorf("flat with 512 nope dims: %+v, want refused", vs[2])
	}
	if err := o.UseVariant(kernels.OpMLADecode, "", mlaDecodeVariant); err != nil || o.VariantFor(kernels.OpMLADecode, key) != mlaDecodeVariant {
		t.Errorf("choosing latent_split for every batch: %v, now %q at batch 16", err, o.VariantFor(kernels.OpMLADecode, key))
	}
	if err := o.UseVariant(kernels.OpMLADecode, "B=3", mlaKeysVariant); err == nil {
		t.Errorf("a tuning key that is no side of %d rows was accepted", mlaKeysMinRows)
	}
	if err := o.UseVariant(kernels.OpMLADecode, key, mlaKeysVariant); err != nil || o.VariantFor(kernels.OpMLADecode, key) != mlaKeysVariant {
		t.Errorf("choosing keys: %v, now %q", err, o.VariantFor(kernels.OpMLADecode, key))
	}
	if err := o.UseVariant(kernels.OpMLADecode, key, "dims"); err == nil || o.VariantFor(kernels.OpMLADecode, key) != mlaKeysVariant {
		t.Errorf("an unknown variant: %v, now %q", err, o.VariantFor(kernels.OpMLADecode, key))
	}
	info, _ := kernels.Set("fused")
	if vs := info.VariantsOf(kernels.OpMLADecode, lite, h200); len(vs) != 4 {
		t.Errorf("the registry lists %d mla_decode variants: %+v", len(vs), vs)
	}
}

// TestMLADecodeFlat runs the shared harness's mla_decode cases and the
// decode graph with mla_decode's flat variant the default at every batch;
// on sm_90a it must be built (a fallback would test another variant).
func TestMLADecodeFlat(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	if dev.Props().Arch != hopperArch {
		t.Skipf("mla_decode's flat variant runs on %s only; this device targets %s", hopperArch, dev.Props().Arch)
	}
	o, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.(*ops).mlaFlat.ready(); err != nil {
		t.Fatalf("flat is not built on this %s device: %v", hopperArch, err)
	}
	t.Logf("clusters of %d blocks at once: %v", mlfCluster, o.(*ops).mlaFlat.clusters)
	saved := mlaDecodeDefault
	defer func() { mlaDecodeDefault = saved }()
	mlaDecodeDefault = mlaFlatVariant
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLADecode)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// TestMLADecodeKeys runs the shared harness's mla_decode cases and the decode
// graph with mla_decode's keys variant the default (the stage count the
// device's shared memory gives, mlaKeysStages: 2 at V2-Lite's 576 dims on an
// H200, 4 at the tests' small ones).
func TestMLADecodeKeys(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := mlaDecodeDefault
	defer func() { mlaDecodeDefault = saved }()
	mlaDecodeDefault = mlaKeysVariant
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLADecode)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}
