// Flash attention for Hopper (sm_90a only: wgmma, setmaxnreg and the copy
// engine's tensor copies), the "wgmma" variant of attn_prefill. Same
// problem, layouts and rounding as flash_prefill (attention.cu): base-2
// online softmax with scale·log2(e) folded into one FFMA per score, p
// rounded to bf16 for P·V and summed unrounded in f32, O / l rounded to
// bf16 once (softmax_tile and p_frag of flash.cuh, on the same fragments).
// Each instance also comes in f16 (flash_hopper_f16_*, for the kernel
// benchmarks' fp16 rows): the same kernel on f16 operands, wgmma's f16 form,
// p and O / l rounded to f16.
//
// The grid is persistent: a block takes items of HOP_BM = 128 queries of
// one row and head one after the other (HopGrid, below), as three
// warpgroups of 128 threads:
//   - warpgroup 0, the producer, gives its registers back (setmaxnreg down
//     to HOP_PRODUCER_REGS); one thread issues the tensor copies: each
//     item's Q tile into one of QBUF buffers, then its K and V tiles of BN
//     = 128 keys into a ring of KST K stages and one of VST V stages, K one
//     tile ahead of V. Every buffer has an mbarrier the copy engine
//     completes with the bytes it wrote (qfull, kfull, vfull) and one the
//     consumers arrive on when they no longer read it (qfree, kfree,
//     vfree): a K tile is free once its Q·Kᵀ is done, half a step before
//     its V tile, and with two Q buffers an item's Q copies while the last
//     item runs. The rings run on across items, so the next item's first
//     tiles are in flight while the consumers finish the last one.
//   - warpgroups 1 and 2, the consumers (setmaxnreg up to
//     HOP_CONSUMER_REGS), own 64 query rows each: S = Q·Kᵀ by wgmma
//     m64n128k16 with Q and K from shared memory, the softmax in registers,
//     O += P·V by wgmma m64nDk16 with P from registers (the S accumulator
//     repacked to bf16 A fragments) and V from shared memory read N-major.
//     Within a warpgroup the next tile's Q·Kᵀ is issued right before this
//     tile's P·V. The two consumer warpgroups issue their wgmmas in turns
//     (named barriers, FA3's ping-pong), so that one's softmax runs while
//     the other's GEMMs do. (ptxas places the wait for P·V before the
//     softmax; holding it below ran slower: bench/RESULTS.md.)
//     Each warpgroup writes O / l into its rows of the item's Q tile, which
//     no wgmma reads by then, and one thread stores them by tensor copies,
//     which run on while the next item starts; that Q buffer is released
//     once they have read it.
// Shared tiles are rows of 64 bf16 or f16 (128 bytes) written by the copy engine
// with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)), a
// D-wide tile being D/64 such boxes one after the other; every box starts
// on 1024 bytes, so the wgmma descriptors' swizzle matches the copy's.
//
// Causal tiles wholly above a warpgroup's diagonal are not computed, only
// the ones crossing it are masked. Keys past the row's end (cache positions
// nobody wrote, NaN in the tests) are masked to -inf in S and their V rows
// zeroed in shared memory before P·V, since 0·NaN would reach O.
//
// A wait that lasts HOP_WAIT_CYCLES records what it waited for in status
// (code, block, thread, tile, parity) and the kernel winds down instead of
// hanging; later waits of every block see the record and give up at once.

#include "hop_attention.cuh"
#include "instances.cuh"

// The machinery (mbarriers, tensor copies, wgmma) is hopper.cuh's, the
// kernel body hop_attention is hop_attention.cuh's, shared with
// mla_hopper.cu.

#define HOP_BN 128 // keys of a K or V tile

// HopCache is flash_hopper's source of tiles: Q from a 2-D map over q, K
// and V from 3-D maps over the caches, each D/64 boxes.
template <int D> struct HopCache {
	const TmaMap *qmap, *kmap, *vmap;
	int qcol, qrow, bh; // Q's first column and row; the (row, kv head) of the caches' maps
	__device__ void load_q(unsigned dst, unsigned bar) const {
#pragma unroll
		for (int c = 0; c < D / HOP_BOX; c++) tma_load_2d(dst + c * HOP_BM * HOP_ROW_BYTES, qmap, bar, qcol + c * HOP_BOX, qrow);
	}
	__device__ void load_k(unsigned dst, unsigned bar, int j) const {
#pragma unroll
		for (int c = 0; c < D / HOP_BOX; c++) tma_load_3d(dst + c * HOP_BN * HOP_ROW_BYTES, kmap, bar, c * HOP_BOX, j * HOP_BN, bh);
	}
	__device__ void load_v(unsigned dst, unsigned bar, int j) const {
#pragma unroll
		for (int c = 0; c < D / HOP_BOX; c++) tma_load_3d(dst + c * HOP_BN * HOP_ROW_BYTES, vmap, bar, c * HOP_BOX, j * HOP_BN, bh);
	}
};

// HopGrid is flash_hopper's schedule: a persistent grid of G blocks (one
// per multiprocessor) over units of two items, an item being HOP_BM
// queries of one (row, head). Unit u of a (row, head) with qtiles q-tiles
// pairs q-tile qtiles-1-u with q-tile u (and the middle one, for an odd
// count, with none): under a causal mask the pair reads as many keys
// whatever u, qtiles + 1 tiles, so equal units dealt round-robin (block c
// takes units c, c+G, c+2G, ...; each unit's longer item first) balance
// the blocks without a queue. Units run (row, head) by (row, head), so the
// G running at once share the keys and values of about G·2/qtiles heads in
// L2 (17 MB at D = 128, whatever the length). An item whose q-tile lies
// past its row's new tokens is empty.
template <int D> struct HopGrid {
	typedef HopCache<D> Src;
	const TmaMap *qmap, *kmap, *vmap;
	const int *start, *past;
	int heads, kvh, rows, qtiles;
	__device__ int units() const { return rows * heads * ((qtiles + 1) / 2); }
	__device__ int items() const { return 2 * ((units() + gridDim.x - 1) / gridDim.x); }
	__device__ bool item(int k, HopWork<Src>& w) const {
		const int id = k / 2 * gridDim.x + blockIdx.x, per = (qtiles + 1) / 2;
		if (id >= units()) return false;
		const int bh = id / per, u = id % per, b = bh / heads, h = bh % heads;
		const int qt = k % 2 ? u : qtiles - 1 - u;
		if (k % 2 && qt == qtiles - 1 - u) return false; // the middle q-tile: a unit of one
		const int t0 = start[b], n = start[b + 1] - t0, q0 = qt * HOP_BM;
		if (q0 >= n) return false;
		w = {Src{qmap, kmap, vmap, h * D, t0 + q0, b * kvh + h / (heads / kvh)}, t0, n, past[b], q0, h};
		return true;
	}
};

// flash_hopper: see the top of this file. E is the element type of q, the
// caches and out: bf16, or half_bits (f16).
//   qmap: q E [T, heads·D] (rotated; pitch qp), 2-D, box {64, HOP_BM};
//   kmap, vmap: the caches E [B·kvh, maxSeq, D], 3-D, box {64, HOP_BN, 1};
//   all three with the 128-byte swizzle, out-of-bounds elements zero (the
//   maps move 2-byte elements as they are: one map serves either type).
//   out E [T, heads·D], pitch op; omap a 2-D map over out (box {64, 64},
//   the 128-byte swizzle), used when ostore is 1 (else out is written
//   directly; the host makes no map where out's rows are not on 16-byte
//   boundaries); start i32 [B+1], past i32 [B]: token
//   t0+i of row b (t0 = start[b]) sits at position past[b]+i and sees keys
//   0..past[b]+i (all past[b]+n keys when causal is 0) of kv head
//   h / (heads/kvh). rows: B; qtiles: ceil(the most new tokens of a row /
//   HOP_BM). status i32 [8], zero: see the top of this file.
// Launch: a grid of at most one block per multiprocessor (HopGrid hands out
// the items), HOP_THREADS threads, HopLayout<D, D, HOP_BN, KST, VST,
// QBUF>::SMEM bytes of dynamic shared memory.
template <typename E, int D, int KST, int VST, int QBUF>
__device__ __forceinline__ void flash_hopper(const TmaMap* qmap, const TmaMap* kmap, const TmaMap* vmap, const TmaMap* omap,
                                             E* out, int op, const int* start, const int* past, int heads, int kvh, int rows,
                                             int qtiles, float scale_log2, int causal, int* status) {
	const HopGrid<D> grid{qmap, kmap, vmap, start, past, heads, kvh, rows, qtiles};
	hop_attention<D, D, HOP_BN, KST, VST, QBUF>(grid, out, op, omap, scale_log2, causal, status);
}

// FLASH_HOPPER instantiates head dim D with rings of KST K tiles and VST V
// tiles and QBUF Q tiles, in both types: flash_hopper_d<D>_k<KST>v<VST>q<QBUF>
// (bf16) and flash_hopper_f16_d<D>_k<KST>v<VST>q<QBUF>.
#define FLASH_HOPPER(NAME, E, D, KST, VST, QBUF)                                                                   \
	extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1)                                                   \
	    NAME(const __grid_constant__ TmaMap qmap, const __grid_constant__ TmaMap kmap, const __grid_constant__ TmaMap vmap, \
	         const __grid_constant__ TmaMap omap, int ostore, E* out, int op, const int* start, const int* past,     \
	         int heads, int kvh, int rows, int qtiles, float scale_log2, int causal, int* status) {                  \
		flash_hopper<E, D, KST, VST, QBUF>(&qmap, &kmap, &vmap, ostore ? &omap : nullptr, out, op, start, past, heads, kvh, \
		                                   rows, qtiles, scale_log2, causal, status);                               \
	}
FLASH_HOPPER_INSTANCES(FLASH_HOPPER)
