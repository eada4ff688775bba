package fused

import (
	"fmt"
	"slices"
)

// The "keys" variant of mla_decode (mla_keys.cu): warps score their own keys
// of 32-key tiles, one shared max per tile, stages counted so that two
// blocks fit an SM. Opt-in until measured: mlaDecodeDefault names the
// variant MLADecode runs when no tuning choice names one.
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

// mlaDecodeDefault is the variant MLADecode runs unless a tuning choice
// names another (a variable, so that tests can run the other).
var mlaDecodeDefault = mlaDecodeVariant

// mlaKeysStageCounts are the stage counts mla_decode_keys is instantiated
// for (MLA_DECODE_KEYS_STAGES).
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

// mlaDecodeFor is the variant mla_decode runs: a tuning choice, else
// mlaDecodeDefault.
func (o *ops) mlaDecodeFor() string {
	if o.mlaDecode != "" {
		return o.mlaDecode
	}
	return mlaDecodeDefault
}

// useMLADecode records a tuning choice of mla_decode's variant (one for all
// shapes: the tuning key is empty).
func (o *ops) useMLADecode(name string) error {
	if name != mlaDecodeVariant && name != mlaKeysVariant {
		return fmt.Errorf("fused has no mla_decode variant %q (it has %q and %q)", name, mlaDecodeVariant, mlaKeysVariant)
	}
	o.mlaDecode = name
	return nil
}
