package fused

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// Scratch buffers of the MLA ops (cudaset.Kit.Scratch), by what they hold.
const (
	scrMLAKV    = "mla.kv"    // mla_prefill: the decompressed keys and values, bf16 [keys, heads·(Dn+Dv)]
	scrMLAQLat  = "mla.qlat"  // mla_decode: q_lat = W_UKᵀ·q_nope, bf16 [B, heads·R]
	scrMLAOLat  = "mla.olat"  // mla_decode: o_lat, bf16 [B, heads·R]
	scrMLAPart  = "mla.part"  // mla_decode: each split's unnormalised o_lat, f32 [B·heads·splits, R]
	scrMLAStats = "mla.stats" // mla_decode: each split's (max, sum), f32 [B·heads·splits, 2]
)

// mlaHeads are the head dims mla_prefill is instantiated for: q·k over
// Nope+Rope, values of V (MLA_PREFILL in mla.cu).
type mlaHeads struct{ Nope, Rope, V int }

// mlaLatent are the latent dims mla_decode is instantiated for: the rank R
// and the rotated keys after it (MLA_DECODE in mla.cu).
type mlaLatent struct{ Rank, Rope int }

var (
	// DeepSeek-V2, V2-Lite and V3 first; the others are the kernel tests'.
	mlaPrefillDims = []mlaHeads{{128, 64, 128}, {16, 16, 16}, {32, 16, 32}}
	mlaDecodeDims  = []mlaLatent{{512, 64}, {256, 32}, {96, 16}, {32, 16}}
)

const (
	// maxMLAHeads is the most query heads mla_decode takes: the 16 rows of
	// one mma m-tile, all heads of a row in one block.
	maxMLAHeads = 16
	// mlaStages is MLA_STAGES, the key tiles mla_decode has in flight.
	mlaStages = 2
	// mlaRedBytes is MLA_RED_BYTES: mla_decode's partial scores, one f32
	// pair per lane, row half, n-tile and warp.
	mlaRedBytes = decodeWarps * (keyTile / 8) * 2 * 32 * 8
	// mlaDecodeVariant is mla_decode's first variant, the default (the
	// other is mla_keys.go's mlaKeysVariant).
	mlaDecodeVariant = "latent_split"
)

// mlaPrefillConfig is the tiling mla_prefill runs unless a tuning choice
// names another (a variable, so that tests can run the others). w4_m1 was
// chosen first for keeping Q in registers without spills (225 registers at
// 192/128) where the m2 tilings spill; in infer bench mla_prefill
// (bench/RESULTS.md, MLA prefill), w8_m2 is the fastest from 2K tokens on
// in spite of its spills (1.3× w4_m1 at W3's 11,041 tokens, 1.4× at B=4
// N=8K) and within 4% at 1K.
var mlaPrefillConfig = flashConfig{8, 2}

// mlaPrefillBudget is the most bytes of decompressed keys and values one
// launch of mla_prefill covers: rows past it go to the next launch (a
// variable, so that tests can force several).
var mlaPrefillBudget int64 = 1 << 30

func mlaPrefillKernel(d mlaHeads, c flashConfig) string {
	return fmt.Sprintf("mla_prefill_n%d_r%d_v%d_%s", d.Nope, d.Rope, d.V, c)
}

func mlaDecodeKernel(d mlaLatent) string { return fmt.Sprintf("mla_decode_r%d_p%d", d.Rank, d.Rope) }

// mlaPrefillShared and mlaDecodeShared are the kernels' dynamic shared
// memory (see mla.cu).
func mlaPrefillShared(d mlaHeads, c flashConfig) int {
	qk := rowBytes(d.Nope + d.Rope)
	return c.rows()*qk + 2*keyTile*(qk+rowBytes(d.V))
}

func mlaDecodeShared(d mlaLatent) int {
	row := rowBytes(d.Rank + d.Rope)
	n := (16 + mlaStages*keyTile) * row
	if 16*row < mlaRedBytes {
		n += mlaRedBytes
	}
	return n
}

// mlaKernel is an MLA kernel and its dynamic shared memory.
type mlaKernel struct {
	name   string
	shared int
}

// mlaKernels are the MLA kernels compiled.
func mlaKernels() []mlaKernel {
	var ks []mlaKernel
	for _, d := range mlaPrefillDims {
		for _, c := range flashConfigs {
			ks = append(ks, mlaKernel{mlaPrefillKernel(d, c), mlaPrefillShared(d, c)})
		}
	}
	for _, d := range mlaDecodeDims {
		ks = append(ks, mlaKernel{mlaDecodeKernel(d), mlaDecodeShared(d)})
		for _, s := range mlaKeysStageCounts {
			ks = append(ks, mlaKernel{mlaKeysKernel(d, s), mlaKeysShared(d, s)})
		}
	}
	return ks
}

// prepareMLA gives each MLA kernel its shared memory where the device
// allows it, and notes the ones it does not (o.noRoom): those ops are
// refused at launch, with the reason, and run with mla=naive, while the
// rest of the set works.
func (o *ops) prepareMLA() error {
	o.noRoom = map[string]string{}
	for _, k := range mlaKernels() {
		var room cudaset.NoRoom
		switch err := o.FitShared(k.name, k.shared); {
		case errors.As(err, &room):
			o.noRoom[k.name] = k.name + " " + room.Error()
		case err != nil:
			return fmt.Errorf("fused: %s: %w", k.name, err)
		}
	}
	return nil
}

// checkMLA is the ops' contract plus what the kernels need: bf16
// kv_b_proj (cuBLAS multiplies by it) and rows that allow 16-byte loads.
func (o *ops) checkMLA(op kernels.Op, a *kernels.MLAArgs, prefill bool) {
	a.Check(op, o.D.ActDType(), prefill)
	o.Need(cudaset.IsBF16(a.WKVB), op, "kv_b_proj %v: the fused kernels take bf16 (mla=naive runs any)", a.WKVB)
	for _, t := range []*kernels.Tensor{a.Q, a.KV, a.Cache} {
		o.Need(t.Pitch%cudaset.VecWidth == 0 && o.D.Ptr(t)%16 == 0, op, "%v does not start its rows on 16-byte boundaries", t)
	}
	o.Need(a.Out.Pitch%2 == 0 && o.D.Ptr(a.Out)%4 == 0, op, "out %v does not start its rows on 4-byte boundaries", a.Out)
}

// mlaDecodeVariant checks a call of mla_decode's work for op (mla_decode
// or mla_decode_rope), declining what no variant takes, and is the
// variant that runs it.
func (o *ops) mlaDecodeVariant(op kernels.Op, a *kernels.MLAArgs) string {
	o.checkMLA(op, a, false)
	d := mlaLatent{a.Rank, a.RopeDim}
	o.Need(slices.Contains(mlaDecodeDims, d), op, "latents of rank %d, rope %d: the fused kernels take %v (mla=naive runs any)",
		d.Rank, d.Rope, mlaDecodeDims)
	o.Need(a.Heads <= maxMLAHeads, op, "%d heads: mla_decode takes at most %d, one m-tile (mla=naive runs any)", a.Heads, maxMLAHeads)
	o.Need(a.NopeDim%cudaset.VecWidth == 0, op, "nope dim %d: mla_decode reads q_pe in 16-byte pieces, so it must be a multiple of %d",
		a.NopeDim, cudaset.VecWidth)
	return o.variantFor(kernels.OpMLADecode, mlaDecodeKey(a.Batch.Rows))
}

// needRoom refuses kernel when the device's shared memory cannot hold it.
func (o *ops) needRoom(op kernels.Op, kernel string) {
	why, tooBig := o.noRoom[kernel]
	o.Need(!tooBig, op, "%s (mla=naive runs it)", why)
}

// MLAPrefill appends the new latents to the cache (kv_append), decompresses
// every position of the rows with kv_b_proj (one strided-batched GEMM for
// rows of as many positions, as a batch of one prompt repeated has, or of
// lengths close enough to pad each to the longest, mlaPadded; else a GEMM
// per row), into per-position [heads, Dn+Dv] rows:
// k_nope then v of each head, as HF expands them), then runs mla_prefill,
// flash attention with keys (k_nope, the shared k_pe from the cache) and
// values v, over the rows at once, as
// many rows per launch as mlaPrefillBudget holds; or mla_hopper instead of
// mla_prefill (mla_hopper.go) where variantFor names it (mlaPrefillPick).
func (o *ops) MLAPrefill(a *kernels.MLAArgs) {
	op := kernels.OpMLAPrefill
	o.checkMLA(op, a, true)
	d := mlaHeads{a.NopeDim, a.RopeDim, a.VDim}
	o.Need(slices.Contains(mlaPrefillDims, d), op, "heads of nope %d, rope %d, v %d: the fused kernels take %v (mla=naive runs any)",
		d.Nope, d.Rope, d.V, mlaPrefillDims)
	name := o.variantFor(op, mlaHeadsKey(d))
	hopper := name == mlaHopperVariant // mla_hopper (mla_hopper.go)
	c, _ := flashConfigNamed(name)
	kernel := mlaPrefillKernel(d, c)
	var hc mlaHopperConfig
	if hopper {
		hc, _ = o.mlaHopper.config(d) // variantFor names it only where there is one
	} else {
		o.needRoom(op, kernel)
	}
	b := a.Batch
	o.AppendKV(a.Cache, nil, a.KV, nil, b, 1, a.Rank+a.RopeDim)

	perPos := a.Heads * (a.NopeDim + a.VDim)
	cache, w := o.Mat(a.Cache), o.Mat(a.WKVB)
	// keysOf is the positions of row r decompressed: none when it has no
	// new tokens (mla.cu's mla_prefill counts the same).
	keysOf := func(r int) int {
		if n := b.Start[r+1] - b.Start[r]; n > 0 {
			return b.Past[r] + n
		}
		return 0
	}
	// fits is whether positions decompressed positions stay within the
	// budget.
	fits := func(positions int) bool {
		return int64(positions)*int64(perPos)*int64(kernels.BF16.Size()) <= mlaPrefillBudget
	}
	for r0 := 0; r0 < b.Rows; {
		r1, keys, longest, kmax := r0, 0, 0, 0
		for ; r1 < b.Rows; r1++ {
			k := keysOf(r1)
			if r1 > r0 && !fits(keys+k) {
				break
			}
			keys += k
			longest = max(longest, b.Start[r1+1]-b.Start[r1])
			kmax = max(kmax, k)
		}
		if keys > 0 {
			// Rows of distinct lengths (fewer positions than as many of the
			// longest) are one strided-batched GEMM too, each padded to the
			// longest (mlaPadded), where that wastes little.
			padded := (r1-r0)*kmax > keys && mlaPadded(r1-r0, kmax, keys) && fits((r1-r0)*kmax)
			kstride, rows := 0, keys
			if padded {
				kstride, rows = kmax, (r1-r0)*kmax
			}
			kv := o.Scratch(scrMLAKV, kernels.BF16, rows, perPos)
			if padded {
				// Row r's keys at (r - r0)·kmax; the positions past a row's
				// own are decompressed from whatever its cache holds there
				// and never count (the kernels mask them).
				o.GemmBatched(true, kmax, perPos, a.Rank, 1, cache.Sub(r0*b.MaxSeq, 0), int64(b.MaxSeq)*int64(cache.Pitch), w, 0,
					0, kv, int64(kmax)*int64(kv.Pitch), r1-r0)
			} else {
				at := 0
				for r := r0; r < r1; {
					k, n := keysOf(r), 1
					for r+n < r1 && keysOf(r+n) == k {
						n++
					}
					if n == 1 {
						o.Gemm(true, k, perPos, a.Rank, 1, cache.Sub(r*b.MaxSeq, 0), w, 0, kv.Sub(at, 0))
					} else {
						// Rows of as many positions each are one strided-batched
						// GEMM: their caches MaxSeq rows apart, their keys packed
						// k apart.
						o.GemmBatched(true, k, perPos, a.Rank, 1, cache.Sub(r*b.MaxSeq, 0), int64(b.MaxSeq)*int64(cache.Pitch), w, 0,
							0, kv.Sub(at, 0), int64(k)*int64(kv.Pitch), n)
					}
					at += n * k
					r += n
				}
			}
			if hopper {
				o.mlaHopperLaunch(hc, a, kv, rows, kstride, r0, r1, longest)
				r0 = r1
				continue
			}
			o.LaunchGrid(kernel,
				cuda.Dim3{X: uint32((longest + c.rows() - 1) / c.rows()), Y: uint32(a.Heads), Z: uint32(r1 - r0)},
				cuda.Dim3{X: uint32(c.Warps * 32)}, mlaPrefillShared(d, c),
				o.D.Ptr(a.Out), int32(a.Out.Pitch), o.D.Ptr(a.Q), int32(a.Q.Pitch), kv.P, int32(kv.Pitch),
				cache.P, int32(a.Rank), o.D.Ptr(b.StartDev), o.D.Ptr(b.PastDev), int32(r0), int32(b.MaxSeq),
				scaleLog2(a.Scale), int32(kstride))
		}
		r0 = r1
	}
}

// mlaPadded is whether MLAPrefill decompresses rows rows of at most kmax
// positions, keys in all, as one strided-batched GEMM of kmax positions a
// row: where the padding adds at most a quarter to the positions (16
// distinct prompts of 121 to 136 tokens: 7%). One GEMM in place of a GEMM
// a row (W5: 13 a layer of 3.5 to 5.5 µs).
func mlaPadded(rows, kmax, keys int) bool {
	return int64(rows)*int64(kmax)*4 <= int64(keys)*5
}

// MLADecode is absorbed MLA, in one of four variants: "flat"
// (mla_flat.cu, mla_flat.go), the default below mlaKeysMinRows rows where
// the device runs it; "keys" (mla_keys.cu), the default from there;
// "latent_split", the default below mlaKeysMinRows where flat cannot run;
// and "keys_own" (mla_keys.go), keys's kernel between flat's mla_qlat and
// mla_out, the default nowhere. Keys and latent_split: q_lat =
// W_UK[h]ᵀ·q_nope for every head (absorb: mla_absorb, or one
// strided-batched GEMM over the heads), then mla_decode, flash-decoding of
// all heads of a row at once over its latent cache in splits that fill one
// wave of the GPU (it appends the new latents itself), attn_merge of the
// splits when there are several, and out = W_UV[h]·o_lat (absorb
// again). Split sizes come from the cache's capacity and the row lengths
// are read on the device, so a graph replays it as the rows grow; every
// buffer's size depends on the batch's rows and capacity only.
func (o *ops) MLADecode(a *kernels.MLAArgs) {
	op := kernels.OpMLADecode
	variant := o.mlaDecodeVariant(op, a)
	d := mlaLatent{a.Rank, a.RopeDim}
	if variant == mlaFlatVariant {
		if a.Batch.Rows > 0 {
			o.mlaFlatDecode(op, a, nil)
		}
		return
	}
	// The variant's kernel, its shared memory and the blocks an SM holds:
	// splits fill one wave of those.
	perSM := o.D.Props().MaxSharedPerSM
	kernel, shared := mlaDecodeKernel(d), mlaDecodeShared(d)
	wave := max(1, perSM/shared) * o.SMs
	if variant == mlaKeysVariant || variant == mlaKeysOwnVariant {
		kernel, shared, wave = o.mlaKeysLaunch(d)
	}
	o.needRoom(op, kernel)
	b := a.Batch
	if b.Rows == 0 {
		return
	}
	if variant == mlaKeysOwnVariant {
		o.mlaKeysOwnDecode(a, kernel, shared, wave)
		return
	}
	h, dn, dr, dv, r := a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank
	q, w := o.Mat(a.Q), o.Mat(a.WKVB)
	perHead := int64((dn + dv) * r) // kv_b_proj's elements of one head

	qlat := o.Scratch(scrMLAQLat, kernels.BF16, b.Rows, h*r)
	o.absorb(false, b.Rows, r, dn, q, int64(dn+dr), w, perHead, qlat, int64(r), h)

	// Splits of whole key tiles of the variant's kernel: keys's are 32 keys,
	// so that a short capacity (W4's 186) makes more splits of fewer tiles
	// (6 of one tile rather than 3 of two: bench/RESULTS.md, Decode).
	tile := keyTile
	if variant == mlaKeysVariant {
		tile = mlkTile
	}
	splits, chunk := decodeSplitsAt(b.Rows, b.MaxSeq, wave, tile)
	olat := o.Scratch(scrMLAOLat, kernels.BF16, b.Rows, h*r)
	part := o.Scratch(scrMLAPart, kernels.F32, b.Rows*h*splits, r)
	stats := o.Scratch(scrMLAStats, kernels.F32, b.Rows*h*splits, 2)
	o.LaunchGrid(kernel, cuda.Dim3{X: uint32(splits), Y: 1, Z: uint32(b.Rows)}, cuda.Dim3{X: decodeWarps * 32}, shared,
		olat.P, part.P, stats.P, qlat.P, q.Sub(0, dn).P, int32(q.Pitch), int32(dn+dr),
		o.D.Ptr(a.KV), int32(a.KV.Pitch), o.D.Ptr(a.Cache), o.D.Ptr(b.PastDev), int32(h), int32(b.MaxSeq),
		int32(chunk), scaleLog2(a.Scale))
	if splits > 1 {
		o.mergeSplits(olat, part, stats, b.Rows, h, splits, r)
	}
	o.absorb(true, b.Rows, dv, r, olat, int64(r), w.Sub(dn, 0), perHead, o.Mat(a.Out), int64(dv), h)
}

// absorbCuBLAS makes absorb run cuBLAS's strided-batched GEMMs always (the
// tests' reference; false in the product).
var absorbCuBLAS = false

// mlaAbsorbConfig is an instance of mla_absorb (mla.cu's MLA_ABSORB): w's
// rows the output columns (transB) or the reduced dims, the columns a
// block computes, and the warps that split the reduced dims.
type mlaAbsorbConfig struct {
	name         string
	transB       bool
	cols, ksplit int
}

// mlaAbsorbConfigs are the two instances: the q projection's (w's rows the
// reduced dims) and the out projection's.
var mlaAbsorbConfigs = [2]mlaAbsorbConfig{{"mla_absorb_n64", false, 64, 1}, {"mla_absorb_t16", true, 16, 4}}

// mlaAbsorbFor is the instance of w's layout.
func mlaAbsorbFor(transB bool) mlaAbsorbConfig {
	if transB {
		return mlaAbsorbConfigs[1]
	}
	return mlaAbsorbConfigs[0]
}

// mlaAbsorbKernels are mla.cu's mla_absorb kernels.
var mlaAbsorbKernels = cudaset.Names(mlaAbsorbInstances())

// shared is c's dynamic shared memory for k reduced dims (mla.cu: a's 16
// rows and w's tile, each row padded by 8 elements, or the split sums).
func (c mlaAbsorbConfig) shared(k int) int {
	tiles := 16*(k+8)*2 + k*(c.cols+8)*2
	if c.transB {
		tiles = (16 + c.cols) * (k + 8) * 2
	}
	return max(tiles, c.ksplit*16*c.cols*4)
}

// absorb is GemmBatched's problems with alpha 1 and beta 0 (batch problems
// of m rows, n columns and kk reduced dims, sA, sB and sC elements apart):
// MLADecode's two per-head projections (q_lat = W_UK[h]ᵀ·q_nope, out =
// W_UV[h]·o_lat) on mla_absorb where the kernel takes them (at most 16
// rows, kk a multiple of 16 and n of 8, bf16, every pitch and stride a
// multiple of 8 elements, shared memory within 48 KiB), else on cuBLAS.
// mla_absorb is launched to overlap the kernel before it, which cuBLAS's
// strided-batched GEMMs cannot: the projection's weights stream under the
// kernel before it, and the kernel after it (mla_decode, o_proj's linear)
// launches under it (bench/RESULTS.md, Decode).
func (o *ops) absorb(transB bool, m, n, kk int, a cudaset.Mat, sA int64, b cudaset.Mat, sB int64, c cudaset.Mat, sC int64, batch int) {
	if absorbCuBLAS || !absorbTakes(transB, m, n, kk, a, sA, b, sB, c, sC) {
		o.GemmBatched(transB, m, n, kk, 1, a, sA, b, sB, 0, c, sC, batch)
		return
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	ac := mlaAbsorbFor(transB)
	o.absorbRuns++
	o.LaunchGrid(ac.name, cuda.Dim3{X: uint32((n + ac.cols - 1) / ac.cols), Y: uint32(batch)}, cuda.Dim3{X: 128},
		ac.shared(kk), c.P, int32(c.Pitch), sC, a.P, int32(a.Pitch), sA, b.P, int32(b.Pitch), sB,
		int32(m), int32(n), int32(kk))
}

// absorbTakes reports whether mla_absorb takes absorb's problems.
func absorbTakes(transB bool, m, n, kk int, a cudaset.Mat, sA int64, b cudaset.Mat, sB int64, c cudaset.Mat, sC int64) bool {
	for _, x := range []cudaset.Mat{a, b, c} {
		if x.DT != kernels.BF16 || x.P%16 != 0 || x.Pitch%8 != 0 {
			return false
		}
	}
	return m <= 16 && kk%16 == 0 && n%8 == 0 && sA%8 == 0 && sB%8 == 0 && sC%8 == 0 &&
		mlaAbsorbFor(transB).shared(kk) <= 48<<10
}
