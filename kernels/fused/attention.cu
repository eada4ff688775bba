// Flash attention on tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate) for prefill, and flash-decoding for decode, over the KV cache
// [B, KVH, maxSeq, D] bf16. Scores never leave registers: each warp keeps
// 16 query rows per m-tile, their running max m and sum l, and the f32
// output O; a new key tile rescales O by exp2(m_old - m_new). Softmax runs
// in base 2 with scale·log2(e) folded into the scores. As SDPA's fused
// kernels on bf16, the numerators p = exp2(s - m) are rounded to bf16 for
// P·V and summed unrounded in f32; O / l is rounded once at the end.
//
// Shared memory tiles hold rows of D bf16 as 16-byte chunks; chunk c of row
// r sits at slot c ^ (r & 7) of a row of ROWC slots (D/8 rounded up to 8),
// so that the 8 rows one ldmatrix phase reads fall in 8 different banks.
// Keys past the valid range are zero-filled by cp.async and masked to -inf,
// so a cache position nobody wrote (NaN) never reaches a result. The
// softmax helpers (softmax_tile, p_frag) are flash.cuh's.

#include "flash_decode.cuh"
#include "instances.cuh"

// CacheKV is flash_prefill's source of keys and values for one block: the
// kv head's rows of the caches [B, kvh, maxSeq, D], each D wide.
template <int D> struct CacheKV {
	const bf16 *k, *v; // the kv head's position 0
	// loadK and loadV copy rows [k0, k0+BN) of the keys or values into a
	// shared tile (Tile<D>), zeroing rows at or past k0+valid.
	__device__ void loadK(unsigned dst, int k0, int valid, int tid, int nthreads) const {
		Tile<D>::template load<BN>(dst, k + (long long)k0 * D, D, valid, tid, nthreads);
	}
	__device__ void loadV(unsigned dst, int k0, int valid, int tid, int nthreads) const {
		Tile<D>::template load<BN>(dst, v + (long long)k0 * D, D, valid, tid, nthreads);
	}
};

// flash_prefill_d<D>_w<W>_m<MT> is flash_prefill of GQA over the KV cache
// for every row of the batch at once (row blockIdx.z, query head blockIdx.y
// over kv head h / (heads/kvh)).
//   kc, vc bf16 [B, kvh, maxSeq, D]; the rest as flash_prefill's.
// Launch: grid (ceil(max new tokens / BM), heads, B), W·32 threads, shared
// (BM + 4·BN)·Tile<D>::ROW_BYTES bytes.
#define FLASH_PREFILL(NAME, D, W, MT)                                                                             \
	extern "C" __global__ void __launch_bounds__(W * 32) NAME(                                                   \
	    bf16* out, int op, const bf16* q, int qp, const bf16* kc, const bf16* vc, const int* start,             \
	    const int* past, int heads, int kvh, int maxSeq, float scale_log2, int causal) {                         \
		const int b = blockIdx.z;                                                                                \
		const long long base = ((long long)b * kvh + blockIdx.y / (heads / kvh)) * maxSeq * D;                  \
		const CacheKV<D> kv{kc + base, vc + base};                                                               \
		flash_prefill<D, D, W, MT>(out, op, q, qp, kv, start, past, b, scale_log2, causal);                      \
	}
FLASH_PREFILL_INSTANCES(FLASH_PREFILL)


#define FLASH_DECODE_KEYS(NAME, D)                                                                               \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) NAME(                                          \
	    bf16* out, int op, float* part, float* stats, const bf16* q, int qp, const bf16* kn, int kp,            \
	    const bf16* vn, int vp, bf16* kc, bf16* vc, const int* past, int heads, int kvh, int maxSeq, int chunk, \
	    float scale_log2, int* counters) {                                                                      \
		flash_decode_keys<D>(out, op, part, stats, q, qp, kn, kp, vn, vp, kc, vc, past, heads, kvh, maxSeq, chunk, \
		                     scale_log2, counters);                                                             \
	}
FLASH_DECODE_KEYS_INSTANCES(FLASH_DECODE_KEYS)

// flash_decode_rope_d<D> is flash_decode_keys with the layer's rotary
// embedding folded in (the op rope_attn_decode): q and kn are the qkv
// projection's unrotated heads, rotated as rope_half rotates all D dims of
// each at position pos[b] (row b's one new token) before they are used or
// cached; q and kn stay unrotated.
//   pos i32 [B]; cosT, sinT f32 [maxPos, cspitch], cspitch ≥ D/2; the rest
//   as flash_decode_keys's. A position outside [0, maxPos) traps.
// Launch: as flash_decode_keys.
#define FLASH_DECODE_ROPE(NAME, D)                                                                               \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) NAME(                                          \
	    bf16* out, int op, float* part, float* stats, const bf16* q, int qp, const bf16* kn, int kp,            \
	    const bf16* vn, int vp, bf16* kc, bf16* vc, const int* past, int heads, int kvh, int maxSeq, int chunk, \
	    float scale_log2, int* counters, const int* pos, const float* cosT, const float* sinT, int cspitch,      \
	    int maxPos) {                                                                                           \
		flash_decode_keys<D, true>(out, op, part, stats, q, qp, kn, kp, vn, vp, kc, vc, past, heads, kvh, maxSeq,  \
		                           chunk, scale_log2, counters,                                                 \
		                           HalfRope<D>::at(pos, blockIdx.z, cosT, sinT, cspitch, maxPos));              \
	}
FLASH_DECODE_ROPE_INSTANCES(FLASH_DECODE_ROPE)

// attn_merge combines the splits of a flash-decoding kernel (flash_decode_keys,
// mla_decode) by their log-sum-exp: out[b, h·D + d] = Σ_s part[s, d]·2^(M_s - M)
// / Σ_s L_s·2^(M_s - M) over the splits with L_s > 0, rounded to bf16.
// A block takes MERGE_DIMS dims of one (row, head): each thread 4
// consecutive dims (16-byte loads), its warp every MERGE_WARPS-th split, so
// that the loads of the splits are in flight together; the warps' partial
// sums then meet in shared memory, added in warp order. A warp's first
// MERGE_EARLY splits (their stats and parts) are loaded with the stats the
// max is taken from, so that up to MERGE_EARLY·MERGE_WARPS splits cost one
// round trip to memory after the grid wait rather than two; the arithmetic
// and its order are the same as one loop over them.
//   out bf16 [B, heads·D], pitch op; part f32 [B·heads, splits, D]; stats
//   f32 [B·heads, splits, 2] (scaled max, sum). D a multiple of 4.
// Launch: grid (B·heads, ceil(D / MERGE_DIMS)), MERGE_WARPS·32 threads.
extern "C" __global__ void __launch_bounds__(MERGE_WARPS * 32) attn_merge(bf16* out, int op, const float* part,
                                                                          const float* stats, int heads, int splits, int D) {
	__shared__ float4 acc_s[MERGE_WARPS][MERGE_DIMS / 4];
	__shared__ float l_s[MERGE_WARPS];
	grid_wait();
	grid_release();
	const long long bh = blockIdx.x;
	const float* st = stats + bh * splits * 2;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int d = blockIdx.y * MERGE_DIMS + 4 * lane;
	float2 early[MERGE_EARLY];
	float4 earlyP[MERGE_EARLY];
#pragma unroll
	for (int i = 0; i < MERGE_EARLY; i++) {
		const int s = warp + i * MERGE_WARPS;
		early[i] = make_float2(NEG_INF, 0.0f);
		earlyP[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (s >= splits) continue;
		early[i] = *reinterpret_cast<const float2*>(st + 2 * s);
		if (d < D) earlyP[i] = *reinterpret_cast<const float4*>(part + (bh * splits + s) * D + d);
	}
	float M = NEG_INF;
	for (int s = lane; s < splits; s += 32)
		if (st[2 * s + 1] > 0.0f) M = fmaxf(M, st[2 * s]);
	M = warp_reduce<MaxOp>(M);
	float L = 0.0f;
	float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	// add is split s's share: its (scaled max, sum) ml and its part's dims p.
	const auto add = [&](float2 ml, float4 p) {
		if (ml.y <= 0.0f) return; // a split with no keys (or none: past the splits)
		const float f = exp2f(ml.x - M);
		L += ml.y * f;
		if (d < D) {
			acc.x += p.x * f;
			acc.y += p.y * f;
			acc.z += p.z * f;
			acc.w += p.w * f;
		}
	};
#pragma unroll
	for (int i = 0; i < MERGE_EARLY; i++) add(early[i], earlyP[i]);
	for (int s = warp + MERGE_EARLY * MERGE_WARPS; s < splits; s += MERGE_WARPS) {
		const float2 ml = *reinterpret_cast<const float2*>(st + 2 * s);
		if (ml.y <= 0.0f) continue;
		add(ml, d < D ? *reinterpret_cast<const float4*>(part + (bh * splits + s) * D + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
	}
	acc_s[warp][lane] = acc;
	if (lane == 0) l_s[warp] = L;
	__syncthreads();
	if (warp != 0 || d >= D) return;
	float4 sum = acc_s[0][lane];
	L = l_s[0];
#pragma unroll
	for (int w = 1; w < MERGE_WARPS; w++) {
		const float4 p = acc_s[w][lane];
		sum.x += p.x;
		sum.y += p.y;
		sum.z += p.z;
		sum.w += p.w;
		L += l_s[w];
	}
	const int b = (int)(bh / heads), h = (int)(bh - (long long)b * heads);
	bf16* o = out + (long long)b * op + h * D + d;
	o[0] = __float2bfloat16_rn(sum.x / L);
	o[1] = __float2bfloat16_rn(sum.y / L);
	o[2] = __float2bfloat16_rn(sum.z / L);
	o[3] = __float2bfloat16_rn(sum.w / L);
}
