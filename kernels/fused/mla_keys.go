package fused

import (
	"fmt"
	"slices"
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

// blocksPerSM is how many blocks of shared bytes an SM of perSM bytes
// holds, at least one.
func blocksPerSM(shared, perSM int) int { return max(1, perSM/(shared+blockReserve)) }
