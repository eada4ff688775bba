// mla_decode_keys: the "keys" variant of absorbed MLA decode (mla.cu's
// mla_decode is the other one, "latent_split"). It uses DecodeSplit's row,
// split and new-latent bookkeeping (attention.cuh) and mla.cuh's P·C and
// split output, and attn_merge (attention.cu) merges its splits.
//
// What changes against mla_decode, and why (kernels/fused/DESIGN.md,
// mla_decode): mla_decode splits Q·Kᵀ of each 64-key tile
// between its 4 warps by dims and sums the partial scores through shared
// memory, 64 KB of reads a tile; its 166 KB of shared memory leave one block
// of 4 warps an SM. Here
//   - key tiles are MLK_BN = 32 positions and each warp scores its own 8 of
//     them over all R+DR dims (one n-tile of the mma; 36 mma at 576 dims),
//     so a warp's scores are whole and nothing partial is exchanged;
//   - the warps share one running max per tile through shared memory (4 ×
//     16 floats), so p = exp2(s·scale − m·scale) is the p a single-block
//     softmax computes and rounds, as flash_decode_keys does for GQA;
//   - p, rounded to bf16, goes to shared memory (16 × 32 bf16) and each warp
//     multiplies all of it by its quarter of the R output dims (P·C), as in
//     mla_decode: the accumulators (16 heads × R f32) do not fit one warp;
//   - the stages are STAGES tiles of 32 positions (36 KB at R+DR = 576),
//     the count chosen on the host so that two blocks fit an SM's shared
//     memory (mla_keys.go), and the next tile's load is issued after the
//     tile's first barrier, which makes a separate end-of-tile barrier
//     unnecessary: three barriers a tile (the tile ready, the max, p).
// The queries (16 × (R+DR) bf16) stay in shared memory and are read again
// by ldmatrix for every tile: at 576 dims they would take 144 registers
// a thread.
//
// Rounding is mla_decode's (see its comment in mla.cu: q_lat rounded to
// bf16, each q·c product in f32, p rounded to bf16 for P·C, sums in f32,
// o_lat rounded once to bf16 before W_UV, or kept f32 through attn_merge
// when split): the one difference is where the running max moves, every 32
// keys instead of every 64, which changes p's rounding no more than a
// different split point of the cache does. A warp's 36 products are
// summed in two chains (even and odd k-steps) added at the end, where
// mla_decode added four warps' partial sums: both are f32 sums of the same
// products in another order.
//
//   olat, part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads,
//   maxSeq, chunk, scale_log2: as mla_decode's (chunk a multiple of
//   MLK_BN).
// Launch: grid (splits, 1, B), DEC_WARPS·32 threads, shared
// (16 + STAGES·MLK_BN)·Tile<R+DR>::ROW_BYTES + MLK_EXTRA bytes.

#include "mla.cuh"
#include "instances.cuh"
#define MLK_BN 32                 // keys per tile: 8 per warp
#define MLK_PP 40                 // bf16 per row of the p tile: 32 and 8 of padding, so ldmatrix meets no bank twice
#define MLK_EXTRA (16 * MLK_PP * 2 + DEC_WARPS * 16 * 4) // the p tile, then the warps' tile maxima (and, at the end, sums)

template <int R, int DR, int STAGES>
__device__ void mla_decode_keys(bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp,
                                int qhs, const bf16* kn, int kp, bf16* cache, const int* past, int heads, int maxSeq,
                                int chunk, float scale_log2) {
	static_assert(STAGES >= 2, "a tile computed while the next loads");
	static_assert(MLK_BN == DEC_WARPS * 8, "each warp scores one n-tile of 8 keys");
	constexpr int W = R + DR, KS = W / 16, KP = (KS + 1) / 2, DP = R / 16, DPW = (DP + DEC_WARPS - 1) / DEC_WARPS;
	typedef Tile<W> T;
	typedef DecodeSplit<W, STAGES, true> Split; // only its bookkeeping: its loads are of BN-key tiles
	constexpr int THREADS = Split::THREADS;
	extern __shared__ __align__(128) unsigned char smem[];
	const Split sp(smem, kn, kp, nullptr, 0, cache, cache, past, heads, 1, maxSeq, chunk); // appends the new latent
	const int b = sp.b, split = blockIdx.x, splits = gridDim.x;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int nkeys = sp.nkeys, ntiles = (nkeys + MLK_BN - 1) / MLK_BN, newAt = sp.newAt;
	const long long base = sp.kvBase + (long long)sp.k0 * W; // the split's first position in the cache
	const unsigned sQ = sp.sQ, sKV = sQ + 16 * T::ROW_BYTES;
	const unsigned sP = sKV + STAGES * MLK_BN * T::ROW_BYTES;
	unsigned char* extra = smem + 16 * T::ROW_BYTES + STAGES * MLK_BN * T::ROW_BYTES;
	unsigned* pOut = reinterpret_cast<unsigned*>(extra);                   // the p tile as bf16 pairs
	float* tileMax = reinterpret_cast<float*>(extra + 16 * MLK_PP * 2); // [warp][16]
	auto stage = [&](int s) { return sKV + s * MLK_BN * T::ROW_BYTES; };
	// load queues tile j into its stage, the new latent from kn.
	auto load = [&](int j) {
		const unsigned dst = stage(j % STAGES);
		for (int i = tid; i < MLK_BN * T::CHUNKS; i += THREADS) {
			const int r = i / T::CHUNKS, c = i - r * T::CHUNKS, key = j * MLK_BN + r;
			const bool ok = key < nkeys;
			const bf16* src = !ok ? cache : key == newAt ? sp.kNew + c * 8 : cache + base + (long long)key * W + c * 8;
			cp16(T::at(dst, r, c), src, ok);
		}
	};

	// The query rows: q_lat then q_pe of each head, zero past the heads;
	// they complete with the first tile.
	for (int i = tid; i < 16 * T::CHUNKS; i += THREADS) {
		const int r = i / T::CHUNKS, c = i - r * T::CHUNKS;
		const bool ok = r < heads;
		const bf16* src = c < R / 8 ? qlat + ((long long)b * heads + r) * R + c * 8
		                            : qpe + (long long)b * qp + r * qhs + (c - R / 8) * 8;
		cp16(T::at(sQ, r, c), ok ? src : qlat, ok);
	}
#pragma unroll
	for (int j = 0; j < STAGES - 1; j++) {
		if (j < ntiles) load(j);
		cp_commit();
	}

	const int kw = warp * 8, dp0 = warp * DPW; // the warp's keys of a tile, its first dim pair of P·C
	float o[2 * DPW][4];
	RowState st[2] = {{NEG_INF, 0.0f}, {NEG_INF, 0.0f}};
#pragma unroll
	for (int d = 0; d < 2 * DPW; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

	for (int j = 0; j < ntiles; j++) {
		// Tile j is in; every warp is done with tile j-1, so its stage
		// takes tile j+STAGES-1.
		cp_wait<STAGES - 2>();
		__syncthreads();
		if (j + STAGES - 1 < ntiles) load(j + STAGES - 1);
		cp_commit();
		const unsigned kT = stage(j % STAGES);

		// The warp's 8 keys against the 16 query rows, over all W dims: two
		// k-steps per ldmatrix of keys, even and odd k-steps in two chains.
		float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
		for (int kp2 = 0; kp2 < KP; kp2++) {
			unsigned kb[4], qa[4];
			ldsm_x4(kb, T::at(kT, kw + (lane & 7), min(4 * kp2 + (lane >> 3), 2 * KS - 1)));
			ldsm_x4(qa, T::at(sQ, lane & 15, 4 * kp2 + (lane >> 4)));
			mma16816(s, qa, kb[0], kb[1]);
			if (2 * kp2 + 1 < KS) {
				unsigned qb[4];
				ldsm_x4(qb, T::at(sQ, lane & 15, 4 * kp2 + 2 + (lane >> 4)));
				mma16816(s2, qb, kb[2], kb[3]);
			}
		}
#pragma unroll
		for (int e = 0; e < 4; e++) {
			s[e] += s2[e];
			if (j * MLK_BN + kw + 2 * (lane & 3) + (e & 1) >= nkeys) s[e] = NEG_INF;
		}
		// The tile's max of every row, over all warps' keys.
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const float mx = quad_max(fmaxf(s[2 * i], s[2 * i + 1]));
			if ((lane & 3) == 0) tileMax[warp * 16 + (lane >> 2) + i * 8] = mx;
		}
		__syncthreads();
		float alpha[2];
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = (lane >> 2) + i * 8;
			float mx = tileMax[r];
#pragma unroll
			for (int w = 1; w < DEC_WARPS; w++) mx = fmaxf(mx, tileMax[w * 16 + r]);
			const float m_new = fmaxf(st[i].m, mx);
			const float mb = m_new == NEG_INF ? 0.0f : m_new * scale_log2; // a row that has seen no key yet
			alpha[i] = exp2_ftz(fmaf(st[i].m, scale_log2, -mb));
			s[2 * i] = exp2_ftz(fmaf(s[2 * i], scale_log2, -mb));
			s[2 * i + 1] = exp2_ftz(fmaf(s[2 * i + 1], scale_log2, -mb));
			st[i].m = m_new;
			st[i].l = st[i].l * alpha[i] + s[2 * i] + s[2 * i + 1]; // this thread's share of the row's sum
			pOut[(r * MLK_PP + kw + 2 * (lane & 3)) / 2] = pack2(s[2 * i], s[2 * i + 1]);
		}
		rescale(o, alpha);
		__syncthreads(); // p is whole; tileMax is read
		// o_lat += P·C over the warp's dims; C is the tile's first R columns.
#pragma unroll
		for (int kk = 0; kk < MLK_BN / 16; kk++) {
			unsigned pa[4];
			ldsm_x4(pa, sP + (lane & 15) * (MLK_PP * 2) + (kk * 16 + (lane >> 4) * 8) * 2);
			mla_pc<R, T>(o, pa, kT, kk, dp0, lane);
		}
	}
	cp_wait<0>();
	__syncthreads(); // every warp is done with tileMax: it takes the sums

	// The warps share the max: each row's sum is the sum of their shares.
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const float l = quad_sum(st[i].l);
		if ((lane & 3) == 0) tileMax[warp * 16 + (lane >> 2) + i * 8] = l;
	}
	__syncthreads();
	// Every warp holds the rows' max and its dims' sums; each writes its dims.
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = (lane >> 2) + i * 8;
		if (r >= heads) continue;
		float l = tileMax[r];
#pragma unroll
		for (int w = 1; w < DEC_WARPS; w++) l += tileMax[w * 16 + r];
		mla_split_out<R>(o, i, st[i].m * scale_log2, l, (long long)b * heads + r, splits, split, dp0, warp, lane, olat, part,
		                 stats);
	}
}

// mla_decode_keys_r<R>_p<DR>_s<STAGES>; __launch_bounds__ asks for two
// blocks an SM, which the host's stage count makes room for in shared memory.
#define MLA_DECODE_KEYS(NAME, R, DR, S)                                                                             \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, 2) NAME(                                          \
	    bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs, const bf16* kn,     \
	    int kp, bf16* cache, const int* past, int heads, int maxSeq, int chunk, float scale_log2) {                 \
		grid_wait();                                                                                                \
		grid_release();                                                                                             \
		mla_decode_keys<R, DR, S>(olat, part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads, maxSeq, chunk, \
		                          scale_log2);                                                                   \
	}
MLA_DECODE_KEYS_INSTANCES(MLA_DECODE_KEYS)
