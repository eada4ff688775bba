// MLA prefill on Hopper (sm_90a only), the "wgmma" variant of mla_prefill:
// the same problem, layouts and rounding as mla.cu's mla_prefill (keys and
// values decompressed up front by one kv_b_proj GEMM per row, the shared
// k_pe read from the latent cache, causal, p rounded to bf16 for P·V and
// summed in f32), run by hop_attention.cuh's hop_attention: a producer warpgroup
// issuing tensor copies into an mbarrier ring, two consumer warpgroups of
// 64 query rows each doing S = Q·Kᵀ by wgmma over DN+DR = 192 dims (12
// k-steps, Q and K from shared memory) and O += P·V over DV = 128 (P from
// registers, V from shared memory), causal tiles skipped (hopper.cu's top
// comment has the whole design).
//
// What is MLA's own is where the tiles come from, HopMla:
//   - Q: a 2-D map over q [T, heads·(DN+DR)] (q_nope then the rotated q_pe
//     of each head), (DN+DR)/64 boxes of HOP_BM rows;
//   - K: DN/64 boxes of k_nope from a 2-D map over the decompressed buffer
//     kv [keys, heads·(DN+DV)] and DR/64 boxes of k_pe from a 3-D map over
//     the cache's last DR columns [B, maxSeq, DR] (the same k_pe for every
//     head), all into one K tile completing on one barrier;
//   - V: DV/64 boxes from the same map over kv, DN columns further.
// Rows of kv past the row's keys are the next row's, a padded row's
// decompressed positions past its end (kstride, which may be NaN: the
// cache there is uninitialised) or out of the map (zeros); positions of the
// cache past the row's end may be NaN: all are masked out of S by a select,
// and V's rows past the end are zeroed before P·V.
//
// Registers of a consumer thread: S 64×BN f32 (BN/2), O 64×DV f32 (DV/2 =
// 64), P as bf16 A fragments (BN/4): at BN = 128 the 160 of flash_hopper's
// D=128, at BN = 64 112.

#include "hop_attention.cuh"
#include "instances.cuh"

// HopMla is mla_hopper's source of tiles (see the top of this file).
template <int DN, int DR, int DV, int BN> struct HopMla {
	const TmaMap *qmap, *kvmap, *pemap;
	int qcol, qrow;   // the head's q_nope column and the block's first token in q
	int kvcol, kvrow; // the head's k_nope column and the row's position 0 in kv
	int b;            // the row: the cache map's third coordinate
	__device__ void load_q(unsigned dst, unsigned bar) const {
#pragma unroll
		for (int c = 0; c < (DN + DR) / HOP_BOX; c++)
			tma_load_2d(dst + c * HOP_BM * HOP_ROW_BYTES, qmap, bar, qcol + c * HOP_BOX, qrow);
	}
	__device__ void load_k(unsigned dst, unsigned bar, int j) const {
#pragma unroll
		for (int c = 0; c < DN / HOP_BOX; c++)
			tma_load_2d(dst + c * BN * HOP_ROW_BYTES, kvmap, bar, kvcol + c * HOP_BOX, kvrow + j * BN);
#pragma unroll
		for (int c = 0; c < DR / HOP_BOX; c++)
			tma_load_3d(dst + (DN / HOP_BOX + c) * BN * HOP_ROW_BYTES, pemap, bar, c * HOP_BOX, j * BN, b);
	}
	__device__ void load_v(unsigned dst, unsigned bar, int j) const {
#pragma unroll
		for (int c = 0; c < DV / HOP_BOX; c++)
			tma_load_2d(dst + c * BN * HOP_ROW_BYTES, kvmap, bar, kvcol + DN + c * HOP_BOX, kvrow + j * BN);
	}
};

// mla_hopper_n<DN>_r<DR>_v<DV>_k<BN>_s<STAGES> is mla_prefill (causal) of
// rows r0 + blockIdx.z of the batch, query head blockIdx.y, by
// hop_attention with key tiles of BN, STAGES stages of K and as many of V,
// one item a block.
//   qmap: q bf16 [T, heads·(DN+DR)], pitch qp, 2-D, box {64, HOP_BM};
//   kvmap: kv bf16 [keys, heads·(DN+DV)], pitch kvp, 2-D, box {64, BN}: the
//   decompressed positions 0..past[b]+n_b-1 of the rows r0.. one after
//   another (a row with no new tokens takes none), or with kstride > 0 row
//   b's at (b - r0)·kstride, per head k_nope then v;
//   pemap: the cache's k_pe, bf16 [B, maxSeq, DR] (the cache [B, maxSeq,
//   rank+DR] from column rank on, the new latents appended), 3-D, box
//   {64, BN, 1}; all three with the 128-byte swizzle, out-of-bounds
//   elements zero. out bf16 [T, heads·DV], pitch op, and omap over it when
//   ostore is 1, as flash_hopper's (hopper.cu); start, past as
//   flash_prefill's; status i32 [8], zero (hopper.cu).
// Launch: grid (ceil(max new tokens / HOP_BM), heads, rows), HOP_THREADS
// threads, HopLayout<DN+DR, DV, BN, STAGES, STAGES, 1>::SMEM bytes of
// dynamic shared memory.
template <int DN, int DR, int DV, int BN, int STAGES>
__device__ __forceinline__ void mla_hopper(const TmaMap* qmap, const TmaMap* kvmap, const TmaMap* pemap, const TmaMap* omap,
                                           bf16* out, int op, const int* start, const int* past, int r0, float scale_log2, int kstride,
                                           int* status) {
	static_assert(DN % HOP_BOX == 0 && DR % HOP_BOX == 0 && DV % HOP_BOX == 0, "head dims are whole 64-column boxes");
	const int b = r0 + blockIdx.z, h = blockIdx.y;
	const int t0 = start[b], n = start[b + 1] - t0, p0 = past[b];
	const int q0 = (gridDim.x - 1 - blockIdx.x) * HOP_BM; // the latest queries (most keys) first
	if (q0 >= n) return;
	int at = (b - r0) * kstride; // the row's position 0 in kv (mla.go's MLAPrefill counts the same)
	for (int r = r0; kstride == 0 && r < b; r++)
		if (start[r + 1] > start[r]) at += past[r] + start[r + 1] - start[r];
	typedef HopMla<DN, DR, DV, BN> Src;
	const HopOne<Src> one{{Src{qmap, kvmap, pemap, h * (DN + DR), t0 + q0, h * (DN + DV), at, b}, t0, n, p0, q0, h}};
	hop_attention<DN + DR, DV, BN, STAGES, STAGES, 1>(one, out, op, omap, scale_log2, 1, status);
}

#define MLA_HOPPER(NAME, DN, DR, DV, BN, STAGES)                                                                    \
	extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1) NAME(                                                 \
	    const __grid_constant__ TmaMap qmap, const __grid_constant__ TmaMap kvmap, const __grid_constant__ TmaMap pemap, \
	    const __grid_constant__ TmaMap omap, int ostore, bf16* out, int op, const int* start, const int* past, int r0,  \
	    float scale_log2, int kstride, int* status) {                                                                 \
		mla_hopper<DN, DR, DV, BN, STAGES>(&qmap, &kvmap, &pemap, ostore ? &omap : nullptr, out, op, start, past, r0,   \
		                                   scale_log2, kstride, status);                                              \
	}
MLA_HOPPER_INSTANCES(MLA_HOPPER)
