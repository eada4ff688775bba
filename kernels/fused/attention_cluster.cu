// attention_cluster.cu (sm_90a: thread-block clusters): flash_decode_rope
// with the splits of a (row, kv head) in one cluster of CL blocks (2 to
// DC_MAX_CLUSTER, an instance each),
// which merge their outputs through distributed shared memory: no
// attn_merge launch after it, and no round trip through global memory (a
// fence, a count, the parts read back) as merge_last's. Taken where the
// splits are 2 to DC_MAX_CLUSTER (decode's splits at short caches and at
// 16 rows, decodeSplits).
//
// Each block keeps its split's unnormalised output (f32, the group's rows),
// its rows' scaled max and sum in its shared memory (flash_decode_keys'
// epilogue with CL); after a cluster barrier, block k merges the k-th of CL
// slices of the dims (⌈D/CL⌉ each, the last shorter) of every row of the
// group from the CL blocks, with
// attn_merge's arithmetic and order (attention.cu), so out is attn_merge's
// bit for bit; a second barrier keeps every block until the others have
// read it.

#include "hopper.cuh"
#include "flash_decode.cuh"
#include "instances.cuh"

#define DC_MAX_CLUSTER 4 // the most blocks of a cluster: the splits a (row, kv head) has

// cluster_merge: po [DEC_WARPS·16, D] f32, the split's output in rows
// 0..group-1 of it; ms, ls [16]: its rows' max (scaled) and sum; out0 the
// group's first output element. A launch whose splits are not CL traps.
template <int D, int CL>
__device__ void cluster_merge(bf16* out, long long out0, const float* po, const float* ms, const float* ls, int group,
                              int splits) {
	static_assert(CL <= MERGE_WARPS, "a split a warp of attn_merge");
	constexpr int SL = (D + CL - 1) / CL; // dims a block merges (the last block fewer)
	if (splits != CL) __trap();
	cluster_sync(); // every split's output, max and sum are in its block's shared memory
	const unsigned rank = cluster_rank(), aPo = smem_addr(po), aMs = smem_addr(ms), aLs = smem_addr(ls);
	const int d0 = rank * SL, dims = min(SL, D - d0);
	for (int i = threadIdx.x; i < group * dims; i += blockDim.x) {
		const int r = i / dims, d = d0 + (i - r * dims);
		float m[CL], l[CL], p[CL]; // every load in flight at once
#pragma unroll
		for (int s = 0; s < CL; s++) {
			m[s] = ld_cluster_f32(cluster_at(aMs + 4 * r, s));
			l[s] = ld_cluster_f32(cluster_at(aLs + 4 * r, s));
			p[s] = ld_cluster_f32(cluster_at(aPo + 4 * (r * D + d), s));
		}
		// attn_merge: the max over the splits that saw keys, then its warp
		// w's sums over splits w, w + MERGE_WARPS, ... (here split w alone),
		// then the warps' sums in order.
		float M = NEG_INF;
#pragma unroll
		for (int s = 0; s < CL; s++)
			if (l[s] > 0.0f) M = fmaxf(M, m[s]);
		float sum = 0.0f, L = 0.0f;
#pragma unroll
		for (int w = 0; w < MERGE_WARPS; w++) {
			float acc = 0.0f, Lw = 0.0f;
			if (w < CL && l[w] > 0.0f) {
				const float f = exp2f(m[w] - M);
				Lw += l[w] * f;
				acc += p[w] * f;
			}
			if (w == 0) {
				sum = acc;
				L = Lw;
			} else {
				sum += acc;
				L += Lw;
			}
		}
		out[out0 + r * D + d] = __float2bfloat16_rn(sum / L);
	}
	cluster_sync(); // no block leaves while another reads its shared memory
}

// flash_decode_rope_c<CL>_d<D>: flash_decode_rope (attention.cu) with its
// CL splits a cluster; its arguments are flash_decode_rope's (part, stats
// and counters unused).
// Launch: grid (CL, kvh, B), DEC_WARPS·32 threads, shared as
// flash_decode_rope's.
#define FLASH_DECODE_ROPE_CLUSTER(NAME, CL, D)                                                                   \
	extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(DEC_WARPS * 32) NAME(                \
	    bf16* out, int op, float* part, float* stats, const bf16* q, int qp, const bf16* kn, int kp,            \
	    const bf16* vn, int vp, bf16* kc, bf16* vc, const int* past, int heads, int kvh, int maxSeq, int chunk, \
	    float scale_log2, int* counters, const int* pos, const float* cosT, const float* sinT, int cspitch,      \
	    int maxPos) {                                                                                           \
		static_assert(CL >= 2 && CL <= DC_MAX_CLUSTER, "a cluster of 2 to DC_MAX_CLUSTER splits");               \
		flash_decode_keys<D, true, CL>(out, op, part, stats, q, qp, kn, kp, vn, vp, kc, vc, past, heads, kvh,      \
		                               maxSeq, chunk, scale_log2, nullptr,                                      \
		                               HalfRope<D>::at(pos, blockIdx.z, cosT, sinT, cspitch, maxPos));          \
	}
FLASH_DECODE_ROPE_CLUSTER_INSTANCES(FLASH_DECODE_ROPE_CLUSTER)
