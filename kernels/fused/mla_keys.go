package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The "keys" variant of mla_decode (mla_keys.cu): warps score their own keys
// of 32-key tiles, one shared max per tile, stages counted so that two
// blocks fit an SM. MLADecode runs it for batches of mlaKeysMinRows rows or
// more unless a tuning choice names another variant.
const (
	// mlaKeysVariant is mla_decode_keys's name as a variant of mla_decode.
	mlaKeysVariant = "keys"
	// mlkTile is MLK_BN, the keys of one tile: 8 a warp.
	mlkTile = 32
	// mlkExtra is MLK_EXTRA: the p tile (16 rows of MLK_PP = 40 bf16) and
	// the warps' maxima of every row (f32).
	mlkExtra = 16*40*2 + decodeWarps*16*4
	// blockReserve is the shared memory the driver keeps for each block
	// resident on an SM (sm_80 and later), on top of what the block asks.
	blockReserve = 1024
	// mlkBlocksPerSM is the blocks per SM the keys variant's stage count
	// aims at (its __launch_bounds__ minimum).
	mlkBlocksPerSM = 2
)

// mlaKeysMinRows is the batch from which mla_decode runs keys by default:
// in infer bench mla_decode (bench/RESULTS.md, decode attention) keys took
// 27 / 53 / 130 µs at batch 16 and 1K / 4K / 16K keys against latent_split's
// 31 / 65 / 191, while at batch 1 the two were even from 4K keys.
const mlaKeysMinRows = 8

// mlaDecodeDefault, when set, is the variant MLADecode runs at every batch
// that no tuning choice covers (tests set it to run one variant
// everywhere); unset, the batch decides (mlaKeysMinRows).
var mlaDecodeDefault = ""

// mlaDecodeKey is mla_decode's tuning key for a batch of rows: the two
// sides of mlaKeysMinRows.
func mlaDecodeKey(rows int) string {
	if rows >= mlaKeysMinRows {
		return fmt.Sprintf("B>=%d", mlaKeysMinRows)
	}
	return fmt.Sprintf("B<%d", mlaKeysMinRows)
}

// mlaKeysOpts are extra NVRTC options of mla_keys.cu's module, empty but
// in tests: TestMLAKeysProbe sets -DMLF_PROBE=1 before New to build the
// timestamp probe (mla_probe.cuh).
var mlaKeysOpts []string

// mlaKeysModule is mla_keys.cu's NVRTC module.
func mlaKeysModule() cudaset.Module {
	m := module("mla_keys.cu", cudaset.Names(mlaKeysInstances()))
	m.Opts = slices.Clone(mlaKeysOpts)
	return m
}

// mlaKeysStageCounts are the stage counts mla_decode_keys is instantiated
// for (MLA_DECODE_KEYS in mla_keys.cu).
var mlaKeysStageCounts = []int{2, 3, 4}

func mlaKeysKernel(d mlaLatent, stages int) string {
	return fmt.Sprintf("mla_decode_keys_r%d_p%d_s%d", d.Rank, d.Rope, stages)
}

// mlaKeysShared is mla_decode_keys's dynamic shared memory with stages
// tiles in flight.
func mlaKeysShared(d mlaLatent, stages int) int {
	return (16+stages*mlkTile)*rowBytes(d.Rank+d.Rope) + mlkExtra
}

// mlaKeysStages is the stage count mla_decode_keys runs with on a device of
// perSM bytes of shared memory per SM: the most for which two blocks fit
// an SM (each with the driver's reservation), else the fewest (then one
// block an SM).
func mlaKeysStages(d mlaLatent, perSM int) int {
	for _, s := range slices.Backward(mlaKeysStageCounts) {
		if mlkBlocksPerSM*(mlaKeysShared(d, s)+blockReserve) <= perSM {
			return s
		}
	}
	return mlaKeysStageCounts[0]
}

// mlaKeysLaunch is mla_decode_keys's instance for d on this device, its
// shared memory, and the wave of its blocks (the splits fill one).
func (o *ops) mlaKeysLaunch(d mlaLatent) (kernel string, shared, wave int) {
	perSM := o.D.Props().MaxSharedPerSM
	stages := mlaKeysStages(d, perSM)
	kernel, shared = mlaKeysKernel(d, stages), mlaKeysShared(d, stages)
	return kernel, shared, blocksPerSM(shared, perSM) * o.SMs
}

// blocksPerSM is how many blocks of shared bytes an SM of perSM bytes
// holds, at least one.
func blocksPerSM(shared, perSM int) int { return max(1, perSM/(shared+blockReserve)) }

// The "keys_own" variant of mla_decode: mla_keys.cu's splits between
// mla_flat.cu's mla_qlat and mla_out, three launches of the set's own,
// overlapped, where keys has its two projections (mla_absorb, or cuBLAS's
// batched GEMMs, which take no part in the overlap) and attn_merge. mla_decode_keys's partials are what mla_out
// reads: part f32 [rows·heads·splits, R] unnormalised, stats (max·
// scale_log2, sum) f32 [rows·heads·splits, 2], split p of (row, head) at
// (row·heads + head)·splits + p (mla_split_out), the layout and scale of
// mla_flat's clusters.
const mlaKeysOwnVariant = "keys_own"

// mlaKeysOwnSplits is how keys_own cuts a capacity of maxSeq keys for rows
// rows: decodeSplits' one wave of wave blocks, at most moMaxPerRow splits a
// row (mla_out merges one a thread), and at least two. A single split
// would write its o_lat normalised in bf16 (mla_split_out), not the
// partial mla_out reads; where one split covers the capacity a second one
// starts past it, sees no keys, and writes a sum of 0, which mla_out
// skips.
func mlaKeysOwnSplits(rows, maxSeq, wave int) (splits, chunk int) {
	splits, chunk = decodeSplits(rows, maxSeq, min(wave, moMaxPerRow*rows))
	return max(splits, 2), chunk
}

// mlaKeysOwnDecode is MLADecode's keys_own variant: mla_qlat, the keys
// variant's kernel (with its shared memory, and splits from its wave of
// blocks) writing every split's partial, and mla_out merging them and
// multiplying by W_UV. mla_qlat and mla_out are built with the flat
// variant's module, so keys_own runs where flat's module is built. Split
// sizes come from the cache's capacity, so a graph replays it.
func (o *ops) mlaKeysOwnDecode(a *kernels.MLAArgs, kernel string, shared, wave int) {
	op := kernels.OpMLADecode
	d := mlaLatent{a.Rank, a.RopeDim}
	h, dn, dr, r := a.Heads, a.NopeDim, a.RopeDim, a.Rank
	o.Need(o.mlaFlat.ready() == nil, op, "%s takes mla_qlat and mla_out from the %s variant's module: %v",
		mlaKeysOwnVariant, mlaFlatVariant, o.mlaFlat.ready())
	// mla_qlat's and mla_out's limits (nope dims, rank), as flat checks them.
	o.Need(mlaFlatWhy(d, h, dn) == "", op, "%s (mla=naive runs it)", mlaFlatWhy(d, h, dn))
	b := a.Batch
	q := o.Mat(a.Q)
	splits, chunk := mlaKeysOwnSplits(b.Rows, b.MaxSeq, wave)
	qlat := o.Scratch(scrMLAQLat, kernels.BF16, b.Rows, h*r)
	part := o.Scratch(scrMLAPart, kernels.F32, b.Rows*h*splits, r)
	stats := o.Scratch(scrMLAStats, kernels.F32, b.Rows*h*splits, 2)

	o.mlaQLat(a, qlat)
	var noOLat uintptr // mla_decode_keys writes o_lat only when it is the one split, never here
	o.LaunchGrid(kernel, cuda.Dim3{X: uint32(splits), Y: 1, Z: uint32(b.Rows)}, cuda.Dim3{X: decodeWarps * 32}, shared,
		noOLat, part.P, stats.P, qlat.P, q.Sub(0, dn).P, int32(q.Pitch), int32(dn+dr),
		o.D.Ptr(a.KV), int32(a.KV.Pitch), o.D.Ptr(a.Cache), o.D.Ptr(b.PastDev), int32(h), int32(b.MaxSeq),
		int32(chunk), scaleLog2(a.Scale))
	o.mlaOut(a, part, stats, splits)
}
