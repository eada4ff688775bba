// flash_decode.cuh: flash-decoding's block (flash_decode_keys) and the
// merge of its splits by the last to finish (merge_last), which
// attention.cu's kernels and attention_cluster.cu's (sm_90a: the splits of
// a cluster merged through its shared memory) instantiate.

#pragma once

#include "attention.cuh"

// cluster_merge (attention_cluster.cu, sm_90a) is the epilogue of
// flash_decode_keys<D, ROPE, CL> with CL > 0: declared here, defined only
// where a cluster kernel is built (the other instances never call it).
template <int D, int CL>
__device__ void cluster_merge(bf16* out, long long out0, const float* po, const float* ms, const float* ls, int group,
                              int splits);

#define MERGE_DIMS 128 // attn_merge: dims of a block
#define MERGE_WARPS 8  // attn_merge: warps of a block, each every MERGE_WARPS-th split
#define MERGE_EARLY 2  // attn_merge: splits a warp loads before the max (attention.cu)

// merge_last ends a split block of flash_decode_keys that has written its
// part and stats: the block counts itself on counter, the (row, kv head)'s,
// and the last of its splits to count merges the group's rows there, so
// that no attn_merge launch follows (a hop of the step's chain fewer, and
// the kernel after it launches while this one runs). The arithmetic is
// attn_merge's, order included (each of its MERGE_WARPS warps' sums over
// every MERGE_WARPS-th split, then the warps' in order), so out is
// attn_merge's bit for bit; the loads are not in its order but all at
// once: the stats of every (row, split) into shared memory, each one's
// weight from there, then each thread's parts MERGE_WARPS splits at a time.
// The last block puts the counter back to 0 for the next launch.
//   out0: the group's first output element in out; sw: shared memory free
//   for 3·group·splits floats; the rest as flash_decode_keys's.
__device__ __forceinline__ void merge_last(bf16* out, const float* part, const float* stats, int* counter,
                                           long long rowHead, long long out0, int group, int splits, int D,
                                           float* sw) {
	__shared__ int last;
	__threadfence(); // this block's part and stats before its count
	__syncthreads();
	if (threadIdx.x == 0) {
		last = atomicAdd(counter, 1) == splits - 1;
		if (last) *counter = 0; // every split has counted
	}
	__syncthreads();
	if (!last) return;
	__threadfence(); // the other blocks' part and stats, read from L2 (ld.cg)
	const int n = group * splits;
	float2* ml = reinterpret_cast<float2*>(sw); // each (row, split)'s (scaled max, sum)
	float* wt = sw + 2 * n;                     // and its weight 2^(max − the row's max)
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		ml[i] = __ldcg(reinterpret_cast<const float2*>(stats + (rowHead * splits + i) * 2));
	__syncthreads();
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		const float2* row = ml + i / splits * splits;
		float M = NEG_INF;
		for (int s = 0; s < splits; s++)
			if (row[s].y > 0.0f) M = fmaxf(M, row[s].x);
		wt[i] = ml[i].y > 0.0f ? exp2f(ml[i].x - M) : 0.0f;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < group * (D / 4); i += blockDim.x) {
		const int r = i / (D / 4), d = 4 * (i - r * (D / 4));
		const float* pp = part + (rowHead + r) * splits * D + d;
		float4 acc[MERGE_WARPS];
		float Lw[MERGE_WARPS];
#pragma unroll
		for (int w = 0; w < MERGE_WARPS; w++) {
			acc[w] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			Lw[w] = 0.0f;
		}
		for (int s0 = 0; s0 < splits; s0 += MERGE_WARPS) {
			float4 p[MERGE_WARPS];
#pragma unroll
			for (int w = 0; w < MERGE_WARPS; w++)
				p[w] = s0 + w < splits ? __ldcg(reinterpret_cast<const float4*>(pp + (long long)(s0 + w) * D))
				                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
			for (int w = 0; w < MERGE_WARPS; w++) {
				const int s = s0 + w;
				if (s >= splits) break;
				const float l = ml[r * splits + s].y;
				if (l <= 0.0f) continue; // a split with no keys
				const float f = wt[r * splits + s];
				Lw[w] += l * f;
				acc[w].x += p[w].x * f;
				acc[w].y += p[w].y * f;
				acc[w].z += p[w].z * f;
				acc[w].w += p[w].w * f;
			}
		}
		float4 sum = acc[0];
		float L = Lw[0];
#pragma unroll
		for (int w = 1; w < MERGE_WARPS; w++) {
			sum.x += acc[w].x;
			sum.y += acc[w].y;
			sum.z += acc[w].z;
			sum.w += acc[w].w;
			L += Lw[w];
		}
		bf16* o = out + out0 + r * D + d;
		o[0] = __float2bfloat16_rn(sum.x / L);
		o[1] = __float2bfloat16_rn(sum.y / L);
		o[2] = __float2bfloat16_rn(sum.z / L);
		o[3] = __float2bfloat16_rn(sum.w / L);
	}
}

// flash_decode_keys is flash-decoding: one block per split of one row's
// cache for one kv head, its query heads (a group of at most 16, the rows of
// one m-tile) and the row's single new token, over keys [split·chunk,
// (split+1)·chunk) ∩ [0, past[b]+1). Key tiles of BN come through cp.async,
// DEC_STAGES in flight. Each warp scores only its own 16 keys of every tile
// and multiplies them by all of V's dims; the warps share one running max,
// exchanged through shared memory once per tile, so p is rounded as a
// single-block softmax rounds it and the warps' outputs merge by a plain
// sum. A block writes the final output itself when it is the only split
// (splits == 1); otherwise it writes its unnormalised output and (max, sum)
// to part and stats, and the splits are merged by their log-sum-exp: by
// the last of them to finish (merge_last) where counters is given, else by
// attn_merge, a second launch of one block per row and head. With CL > 0
// (attention_cluster.cu: the CL splits one cluster) the output, max and sum
// stay in the block's shared memory and cluster_merge merges them. The first
// tiles' cached rows are queued before the grid_wait (DecodeSplit's
// EARLY); the new token's key and value are read from kn, vn after it and
// appended to the cache by the block whose split holds them, so no other
// kernel runs first. (An earlier variant,
// every warp scoring the whole tile and the last block merging, reached
// 63–76% of the copy rate against this one's 81–96%: bench/RESULTS.md.)
//   out bf16 [B, heads·D], pitch op; part f32 [B·heads, splits, D];
//   stats f32 [B·heads, splits, 2]; q bf16 [B, heads·D] (rotated), pitch qp;
//   kn, vn bf16 [B, kvh·D], pitches kp, vp; kc, vc bf16 [B, kvh, maxSeq, D];
//   past i32 [B]: tokens cached before the new one (read before the
//   grid_wait: a step's inputs are written before its first kernel);
//   counters i32 [B·kvh], zero, or null (attn_merge merges). A length past
//   maxSeq traps.
// With ROPE (flash_decode_rope) q and kn are unrotated and rope rotates
// them as they are loaded (DecodeSplit), to the bits the rope kernel would
// have written; the split, the order of every sum and the rounding are the
// same, so out, part, stats and the cache are the ones rope then
// flash_decode_keys write.
// Launch: grid (splits, kvh, B), DEC_WARPS·32 threads, shared: the stages
// a split's tiles use, (16 + 2·min(DEC_STAGES, chunk / BN)·BN)·
// Tile<D>::ROW_BYTES bytes, and at least the epilogue's sums (16 query
// rows, then DEC_WARPS·16 f32 sums and DEC_WARPS·16 rows of D f32 outputs):
// decodeSharedFor.
template <int D, bool ROPE = false, int CL = 0>
__device__ void flash_decode_keys(bf16* out, int op, float* part, float* stats, const bf16* q, int qp, const bf16* kn,
                                  int kp, const bf16* vn, int vp, bf16* kc, bf16* vc, const int* past, int heads,
                                  int kvh, int maxSeq, int chunk, float scale_log2, int* counters,
                                  HalfRope<D> rope = {}) {
	constexpr int KS = D / 16, NO = D / 8, THREADS = DEC_WARPS * 32;
	typedef Tile<D> T;
	extern __shared__ __align__(128) unsigned char smem[];
	__shared__ float tileMax[DEC_WARPS][16];
	const DecodeSplit<D, DEC_STAGES, false, ROPE, true> sp(smem, kn, kp, vn, vp, kc, vc, past, heads, kvh, maxSeq, chunk,
	                                                       rope);
	const int b = sp.b, g = sp.g, split = blockIdx.x, splits = gridDim.x, group = sp.group;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const long long rowHead = sp.rowHead;
	const int nkeys = sp.nkeys, ntiles = sp.ntiles;
	const unsigned sQ = sp.sQ;
	// The cached rows of the first tiles under the kernel before; the new
	// token and the queries (its output) after the wait.
	sp.prime(true);
	grid_wait();
	grid_release();
	sp.append();
	sp.newRows();
	sp.queries(q, qp);
	cp_commit();

	unsigned qa[KS][4];
	float o[NO][4];
	RowState st[2] = {{NEG_INF, 0.0f}, {NEG_INF, 0.0f}};
#pragma unroll
	for (int d = 0; d < NO; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
	const int kw = warp * 16; // the warp's keys in a tile

	for (int j = 0; j < ntiles; j++) {
		sp.next(j);
		if (j == 0) {
#pragma unroll
			for (int ks = 0; ks < KS; ks++) ldsm_x4(qa[ks], T::at(sQ, lane & 15, ks * 2 + (lane >> 4)));
		}
		const unsigned kT = sp.sK(j % DEC_STAGES), vT = sp.sV(j % DEC_STAGES);
		float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			unsigned kb[4];
			ldsm_x4(kb, T::at(kT, kw + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
			mma16816(s[0], qa[ks], kb[0], kb[1]);
			mma16816(s[1], qa[ks], kb[2], kb[3]);
		}
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				if (j * BN + kw + nt * 8 + 2 * (lane & 3) + (e & 1) >= nkeys) s[nt][e] = NEG_INF;
		// The tile's max of every row, over all warps' keys.
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const float mx = quad_max(fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1])));
			if ((lane & 3) == 0) tileMax[warp][(lane >> 2) + i * 8] = mx;
		}
		__syncthreads();
		float alpha[2];
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = (lane >> 2) + i * 8;
			float mx = tileMax[0][r];
#pragma unroll
			for (int w = 1; w < DEC_WARPS; w++) mx = fmaxf(mx, tileMax[w][r]);
			const float m_new = fmaxf(st[i].m, mx);
			const float base = m_new == NEG_INF ? 0.0f : m_new * scale_log2;
			alpha[i] = exp2_ftz(fmaf(st[i].m, scale_log2, -base));
			float sum = 0.0f;
#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
				s[nt][2 * i] = exp2_ftz(fmaf(s[nt][2 * i], scale_log2, -base));
				s[nt][2 * i + 1] = exp2_ftz(fmaf(s[nt][2 * i + 1], scale_log2, -base));
				sum += s[nt][2 * i] + s[nt][2 * i + 1];
			}
			st[i].m = m_new;
			st[i].l = st[i].l * alpha[i] + sum; // this warp's share of the row's sum
		}
		rescale(o, alpha);
		unsigned pa[4];
		p_frag<2>(pa, s, 0);
#pragma unroll
		for (int dp = 0; dp < NO / 2; dp++) {
			unsigned vb[4];
			ldsm_x4_t(vb, T::at(vT, kw + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
			mma16816(o[2 * dp], pa, vb[0], vb[1]);
			mma16816(o[2 * dp + 1], pa, vb[2], vb[3]);
		}
		__syncthreads(); // the stage, and tileMax, are free again
	}
	cp_wait<0>();
	__syncthreads();

	// The warps share the max: their outputs and sums add up.
	float* sl = reinterpret_cast<float*>(smem + 16 * T::ROW_BYTES); // [warp][16] sums, then O [warp][16][D]
	float* so = sl + DEC_WARPS * 16;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = (lane >> 2) + i * 8;
		const float l = quad_sum(st[i].l);
		if ((lane & 3) == 0) sl[warp * 16 + r] = l;
#pragma unroll
		for (int d = 0; d < NO; d++) {
			float* dst = so + (warp * 16 + r) * D + d * 8 + 2 * (lane & 3);
			dst[0] = o[d][2 * i];
			dst[1] = o[d][2 * i + 1];
		}
	}
	__syncthreads();
	for (int i = tid; i < group * D; i += THREADS) {
		const int r = i / D, d = i - r * D;
		float L = 0.0f, acc = 0.0f;
#pragma unroll
		for (int w = 0; w < DEC_WARPS; w++) {
			L += sl[w * 16 + r];
			acc += so[(w * 16 + r) * D + d];
		}
		if (splits == 1) {
			out[(long long)b * op + (g * group + r) * D + d] = __float2bfloat16_rn(acc / L);
			continue;
		}
		if constexpr (CL > 0) { // the split's output stays in shared memory, in the first warp's rows of so
			so[r * D + d] = acc;  // only this thread read so at (·, r, d)
			if (d == 0) tileMax[1][r] = L;
			continue;
		}
		const long long at = (rowHead + r) * splits + split;
		part[at * D + d] = acc;
		if (d == 0) stats[at * 2 + 1] = L;
	}
	// Each row's max, scaled, from a thread that holds it (every warp
	// holds the same).
	if (splits > 1 && warp == 0 && (lane & 3) == 0) {
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = (lane >> 2) + i * 8;
			if (r >= group) continue;
			if constexpr (CL > 0)
				tileMax[0][r] = st[i].m * scale_log2;
			else
				stats[((rowHead + r) * splits + split) * 2] = st[i].m * scale_log2;
		}
	}
	if constexpr (CL > 0) {
		if (splits > 1) cluster_merge<D, CL>(out, (long long)b * op + g * group * D, so, tileMax[0], tileMax[1], group, splits);
		return;
	}
	if (splits > 1 && counters != nullptr)
		merge_last(out, part, stats, counters + (long long)b * kvh + g, rowHead, (long long)b * op + g * group * D, group,
		           splits, D, reinterpret_cast<float*>(smem));
}
