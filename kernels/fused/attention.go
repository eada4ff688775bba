package fused

import (
	"fmt"
	"math"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// Scratch buffers (cudaset.Kit.Scratch), by what they hold.
const (
	scrPart  = "attn.part"  // flash_decode: each split's unnormalised output f32 [B·heads·splits, D]
	scrStats = "attn.stats" // flash_decode: each split's (max, sum) f32 [B·heads·splits, 2]
)

// actType is the activations' element type on a CUDA device
// (cuda.Device.ActDType): the type flash_prefill's tilings take, and an
// attention shape's when it names none.
const actType = kernels.BF16

// checkAttn is the ops' contract plus what the kernels need: a head dim
// they are instantiated for, and rows that allow 16-byte loads. A prefill
// may have f16 operands (flash_hopper's f16 instances; AttentionPrefill
// declines them where those cannot run).
func (o *ops) checkAttn(op kernels.Op, a *kernels.AttnArgs, prefill bool) {
	a.Check(op, o.D.ActDType(), prefill, kernels.F16)
	o.Need(slices.Contains(headDims, a.HeadDim), op, "head dim %d: the fused kernels take %v (attn=naive runs any)", a.HeadDim, headDims)
	for _, t := range []*kernels.Tensor{a.Q, a.K, a.V, a.KCache, a.VCache} {
		o.Need(t.Pitch%cudaset.VecWidth == 0 && o.D.Ptr(t)%16 == 0, op, "%v does not start its rows on 16-byte boundaries", t)
	}
	o.Need(a.Out.Pitch%2 == 0 && o.D.Ptr(a.Out)%4 == 0, op, "out %v does not start its rows on 4-byte boundaries", a.Out)
}

// scaleLog2 is the softmax scale for base-2 exponentials.
func scaleLog2(scale float32) float32 { return scale * math.Log2E }

// AttentionPrefill appends the new keys and values to the cache
// (kv_append), then runs flash_prefill over every row's new tokens at once:
// a block per c.rows() queries of one row and head for the tiling c
// variantFor names (prefillPick); or flash_hopper (hopper.go) where it
// names that. f16 operands run flash_hopper only: elsewhere the call is
// declined.
func (o *ops) AttentionPrefill(a *kernels.AttnArgs) {
	op := kernels.OpAttnPrefill
	o.checkAttn(op, a, true)
	dt := a.Q.DType
	key := prefillKey(a.HeadDim, dt)
	name := o.variantFor(op, key)
	if name == "" {
		why := fmt.Sprintf("it is not chosen for %s", key)
		if _, err := o.hopper.config(dt, a.HeadDim); err != nil {
			why = err.Error()
		}
		o.Need(false, op, "%v operands: flash_prefill's tiles take bf16 only, and flash_hopper does not run them here: %s", dt, why)
	}
	b := a.Batch
	o.AppendKV(a.KCache, a.VCache, a.K, a.V, b, a.KVHeads, a.HeadDim) // 2-byte elements moved as they are: bf16 or f16
	longest := 0
	for r := range b.Rows {
		longest = max(longest, b.Start[r+1]-b.Start[r])
	}
	if name == hopperVariant {
		hc, _ := o.hopper.config(dt, a.HeadDim) // variantFor names it only where there is one
		o.hopperPrefill(hc, a, longest, !a.NonCausal)
		return
	}
	c, _ := flashConfigNamed(name)
	o.flashPrefill(c, a, longest, !a.NonCausal)
}

// flashPrefill launches flash_prefill with tiling c for rows of at most
// longest new tokens.
func (o *ops) flashPrefill(c flashConfig, a *kernels.AttnArgs, longest int, causal bool) {
	b := a.Batch
	blocks := (longest + c.rows() - 1) / c.rows()
	if blocks == 0 || b.Rows == 0 {
		return
	}
	causalArg := int32(0)
	if causal {
		causalArg = 1
	}
	o.LaunchGrid(prefillKernel(a.HeadDim, c),
		cuda.Dim3{X: uint32(blocks), Y: uint32(a.Heads), Z: uint32(b.Rows)}, cuda.Dim3{X: uint32(c.Warps * 32)},
		prefillShared(a.HeadDim, c),
		o.D.Ptr(a.Out), int32(a.Out.Pitch), o.D.Ptr(a.Q), int32(a.Q.Pitch), o.D.Ptr(a.KCache), o.D.Ptr(a.VCache),
		o.D.Ptr(b.StartDev), o.D.Ptr(b.PastDev), int32(a.Heads), int32(a.KVHeads), int32(b.MaxSeq),
		scaleLog2(a.Scale), causalArg)
}

// AttentionDecode is flash-decoding: splits of every row's cache, as many
// as fill one wave of the GPU, the new keys and values appended by the
// blocks whose splits hold them (flash_decode_keys), then attn_merge when
// there are several splits. Split sizes come from the cache's capacity and
// the row lengths are read on the device, so a graph replays it as the rows
// grow.
func (o *ops) AttentionDecode(a *kernels.AttnArgs) {
	o.decode(kernels.OpAttnDecode, a, decodeKernel(a.HeadDim))
}

// RoPEAttentionDecode is AttentionDecode with the rotary embedding folded
// into its kernel (flash_decode_rope): every block rotates the group's
// queries as it loads them, and the block whose split holds the new key
// rotates it as it caches it, so the step's chain loses rope's launch. It
// is flash_decode_keys on the bits rope would have written (rope.cuh's
// arithmetic, the same splits), so out and the caches are rope then
// AttentionDecode bit for bit; q and k are left unrotated. It takes
// rotate_half pairs over every dim of a head (Qwen2's rope) and declines
// other rotations, and the shapes flash_decode_keys declines: the Dispatch
// then runs rope and attn_decode.
func (o *ops) RoPEAttentionDecode(a *kernels.AttnArgs, pos *kernels.Tensor, r *kernels.Rope) {
	op := kernels.OpRoPEAttnDecode
	kernels.CheckRoPEAttnDecode(o.D.ActDType(), a, pos, r)
	o.Need(!r.Interleaved && r.Dim == a.HeadDim, op,
		"rope of %d of %d dims, interleaved %v: flash_decode_rope rotates all of a head's dims in rotate_half pairs (rope and attn_decode run it)",
		r.Dim, a.HeadDim, r.Interleaved)
	o.decode(op, a, decodeRopeKernel(a.HeadDim), o.D.Ptr(pos), o.D.Ptr(r.Cos), o.D.Ptr(r.Sin), int32(r.Cos.Pitch),
		int32(r.Cos.Rows()))
}

// decode launches kernel, flash_decode_keys or flash_decode_rope (whose
// arguments after flash_decode_keys's are extra), over op's operands a, and
// where there are several splits merges them: in the kernel (the cluster
// kernel, or merge_last) or by attn_merge after it.
func (o *ops) decode(op kernels.Op, a *kernels.AttnArgs, kernel string, extra ...any) {
	o.checkAttn(op, a, false)
	group := a.Heads / a.KVHeads
	o.Need(group <= maxGroup, op, "%d query heads per kv head: flash_decode_keys takes at most %d", group, maxGroup)
	b := a.Batch
	if b.Rows == 0 {
		return
	}
	wave := max(1, o.D.Props().MaxSharedPerSM/decodeShared(a.HeadDim)) * o.SMs
	splits, chunk := decodeSplits(b.Rows*a.KVHeads, b.MaxSeq, wave)
	rows := b.Rows * a.Heads * splits
	part := o.Scratch(scrPart, kernels.F32, rows, a.HeadDim)
	stats := o.Scratch(scrStats, kernels.F32, rows, 2)
	grid := cuda.Dim3{X: uint32(splits), Y: uint32(a.KVHeads), Z: uint32(b.Rows)}
	block := cuda.Dim3{X: decodeWarps * 32}
	shared := decodeSharedFor(a.HeadDim, chunk)
	// The splits' merge (the fused DESIGN, rope_attn_decode): in a cluster's
	// shared memory where flash_decode_rope has the cluster's splits; by the
	// last split to finish (merge_last) where decodeFoldRows and
	// decodeFoldSplits allow and the block's shared memory holds 3 floats a
	// (query head, split) of its group; else by attn_merge's launch after.
	cluster := kernel == decodeRopeKernel(a.HeadDim) && o.dc.takes(splits)
	if cluster {
		kernel = decodeClusterKernel(splits, a.HeadDim)
	}
	fold := !cluster && splits > 1 && b.Rows <= decodeFoldRows && splits <= decodeFoldSplits && b.Rows*a.KVHeads <= decodeCountersN &&
		3*4*(a.Heads/a.KVHeads)*splits <= shared
	counters := uintptr(0) // null: attn_merge merges the splits
	if fold {
		counters = o.D.Ptr(o.decodeCounters)
	}
	args := append([]any{o.D.Ptr(a.Out), int32(a.Out.Pitch), part.P, stats.P, o.D.Ptr(a.Q), int32(a.Q.Pitch), o.D.Ptr(a.K),
		int32(a.K.Pitch), o.D.Ptr(a.V), int32(a.V.Pitch), o.D.Ptr(a.KCache), o.D.Ptr(a.VCache), o.D.Ptr(b.PastDev),
		int32(a.Heads), int32(a.KVHeads), int32(b.MaxSeq), int32(chunk), scaleLog2(a.Scale), counters}, extra...)
	o.LaunchGrid(kernel, grid, block, shared, args...)
	if splits > 1 && !fold && !cluster {
		o.mergeSplits(o.Mat(a.Out), part, stats, b.Rows, a.Heads, splits, a.HeadDim)
	}
}

// decodeFoldRows is the most rows whose flash_decode splits are merged by
// the last of them to finish (merge_last) rather than by attn_merge's
// launch. Measured on Qwen2-7B at 4 splits (bench/RESULTS.md, before the
// cluster merge took those): at one row the fold won a little (the kernel
// after the attention launches while it runs), at 16 rows it lost (64 last
// blocks each merging 7 heads, where attn_merge spreads them over 448
// blocks). A variable, so that a test can hold the one to the other at any
// count.
var decodeFoldRows = 1

// decodeFoldSplits is the most splits merge_last merges: its parts arrive in
// one batch of loads up to mergeWarps splits, a batch more for every
// mergeWarps past them, where attn_merge's blocks load theirs side by side
// (at 64 splits alone it took about twice the pair's time: bench/RESULTS.md,
// Tried). A variable, as decodeFoldRows.
var decodeFoldSplits = mergeWarps

// decodeCountersN is the (row, kv head) pairs whose splits flash_decode
// counts: past it attn_merge merges them.
const decodeCountersN = 4096

// mergeSplits launches attn_merge: out [rows, heads·d] from the splits'
// unnormalised outputs part [rows·heads·splits, d] and stats (scaled max,
// sum) of a flash-decoding kernel. d is a multiple of 4, as every head dim
// and latent rank the decode kernels are built for is.
func (o *ops) mergeSplits(out, part, stats cudaset.Mat, rows, heads, splits, d int) {
	grid := cuda.Dim3{X: uint32(rows * heads), Y: uint32((d + mergeDims - 1) / mergeDims)}
	o.LaunchGrid("attn_merge", grid, cuda.Dim3{X: mergeWarps * 32}, 0,
		out.P, int32(out.Pitch), part.P, stats.P, int32(heads), int32(splits), int32(d))
}

// decodeSplits is how flash-decoding cuts a capacity of maxSeq keys for
// pairs (row, kv head) pairs: splits per pair so that all blocks make about
// one wave of the GPU, wave blocks (as many per SM as shared memory allows),
// in chunks of whole key tiles.
func decodeSplits(pairs, maxSeq, wave int) (splits, chunk int) {
	return decodeSplitsAt(pairs, maxSeq, wave, keyTile)
}

// decodeSplitsAt is decodeSplits for a kernel whose key tiles are tile
// keys: at a short capacity, at most a split a tile.
func decodeSplitsAt(pairs, maxSeq, wave, tile int) (splits, chunk int) {
	tiles := (maxSeq + tile - 1) / tile
	splits = min(tiles, max(1, (wave+pairs/2)/pairs))
	chunk = (tiles + splits - 1) / splits * tile
	return (maxSeq + chunk - 1) / chunk, chunk
}
