// The flash attention bodies the mma.sync kernels share: flash_prefill,
// the prefill of attention.cu (GQA over the KV cache) and of mla.cu (MLA),
// and DecodeSplit, the block bookkeeping of flash_decode_keys
// (attention.cu), mla_decode (mla.cu) and mla_decode_keys (mla_keys.cu).
// attention.cu's top comment describes the design.

#pragma once
#include "flash.cuh"
#include "rope.cuh"

#define BN 64 // keys per tile

// flash_prefill is attention of the new tokens of row b of a packed batch
// over that row's keys (the new ones already appended), for query head
// blockIdx.y: causal unless causal is 0 (then every new token sees all
// its row's keys: the kernel benchmarks' non-causal case).
//   out bf16 [T, heads·DV], pitch op; q bf16 [T, heads·DQK] (rotated),
//   pitch qp; kv the head's keys (DQK wide) and values (DV wide) by
//   position (CacheKV, or mla.cu's MLA source); start i32 [B+1], past i32
//   [B]: token t0+i of row b (t0 = start[b]) sits at position past[b]+i
//   and sees keys 0..past[b]+i.
// A block takes BM = WARPS·16·MT queries of one row and one head, a warp MT
// m-tiles of 16 of them. Keys come in tiles of BN, double-buffered through
// cp.async; tiles wholly above the diagonal are never loaded, only the ones
// crossing it are masked. Blocks of the latest queries (the most keys)
// start first. Q stays in registers when MT = 1, else it is re-read from
// shared memory for each key tile.
// Launch: grid (ceil(max new tokens / BM), heads, rows), WARPS·32 threads,
// shared BM·Tile<DQK>::ROW_BYTES + 2·BN·(Tile<DQK>::ROW_BYTES +
// Tile<DV>::ROW_BYTES) bytes.
template <int DQK, int DV, int WARPS, int MT, typename KV>
__device__ void flash_prefill(bf16* out, int op, const bf16* q, int qp, const KV& kv, const int* start,
                              const int* past, int b, float scale_log2, int causal) {
	constexpr int BM = WARPS * 16 * MT, KS = DQK / 16, NS = BN / 8, NO = DV / 8, THREADS = WARPS * 32;
	constexpr bool QREGS = MT == 1;
	typedef Tile<DQK> TK;
	typedef Tile<DV> TV;
	constexpr int STAGE_BYTES = BN * (TK::ROW_BYTES + TV::ROW_BYTES);
	extern __shared__ __align__(128) unsigned char smem[];
	const int h = blockIdx.y;
	const int t0 = start[b], n = start[b + 1] - t0, p0 = past[b];
	const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
	if (q0 >= n) return;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int kend = p0 + (causal ? min(q0 + BM, n) : n); // keys [0, kend) are read
	const int ntiles = (kend + BN - 1) / BN;

	const unsigned sQ = smem_addr(smem);
	const unsigned sKV = sQ + BM * TK::ROW_BYTES; // stage s: K tile, then V tile
	auto sK = [&](int s) { return sKV + s * STAGE_BYTES; };
	auto sV = [&](int s) { return sKV + s * STAGE_BYTES + BN * TK::ROW_BYTES; };
	auto loadKV = [&](int j) {
		const int k0 = j * BN;
		kv.loadK(sK(j & 1), k0, kend - k0, tid, THREADS);
		kv.loadV(sV(j & 1), k0, kend - k0, tid, THREADS);
	};
	TK::template load<BM>(sQ, q + (long long)(t0 + q0) * qp + h * DQK, qp, n - q0, tid, THREADS);
	loadKV(0);
	cp_commit();

	const int wr = warp * 16 * MT; // the warp's first row in the block
	unsigned qa[QREGS ? MT : 1][QREGS ? KS : 1][4];
	float o[MT][NO][4];
	RowState st[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
#pragma unroll
		for (int i = 0; i < 2; i++) st[mt][i] = RowState{NEG_INF, 0.0f};
#pragma unroll
		for (int d = 0; d < NO; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
	}
	// Query position of row i (0, 1) of m-tile mt of this thread.
	const int qpos0 = p0 + q0 + wr + (lane >> 2);

	for (int j = 0; j < ntiles; j++) {
		if (j + 1 < ntiles) loadKV(j + 1);
		cp_commit();
		cp_wait<1>();
		__syncthreads();
		if (QREGS && j == 0) {
#pragma unroll
			for (int ks = 0; ks < KS; ks++)
				ldsm_x4(qa[0][ks], TK::at(sQ, wr + (lane & 15), ks * 2 + (lane >> 4)));
		}
		const unsigned kT = sK(j & 1), vT = sV(j & 1);
		float s[MT][NS][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < NS; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			unsigned a[MT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				if (QREGS) {
#pragma unroll
					for (int x = 0; x < 4; x++) a[mt][x] = qa[0][ks][x];
				} else {
					ldsm_x4(a[mt], TK::at(sQ, wr + mt * 16 + (lane & 15), ks * 2 + (lane >> 4)));
				}
			}
#pragma unroll
			for (int np = 0; np < NS / 2; np++) {
				unsigned kb[4];
				ldsm_x4(kb, TK::at(kT, np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma16816(s[mt][2 * np], a[mt], kb[0], kb[1]);
					mma16816(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
				}
			}
		}
		// Mask the keys past a row's position (or past kend) on the tiles
		// that cross the block's diagonal, then the online softmax.
		const int k0 = j * BN;
		if (causal && k0 + BN - 1 > p0 + q0 + wr || k0 + BN > kend) {
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int i = 0; i < 2; i++)
#pragma unroll
					for (int nt = 0; nt < NS; nt++)
#pragma unroll
						for (int e = 0; e < 2; e++) {
							const int key = k0 + nt * 8 + 2 * (lane & 3) + e;
							if (causal && key > qpos0 + mt * 16 + i * 8 || key >= kend) s[mt][nt][2 * i + e] = NEG_INF;
						}
		}
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			float alpha[2];
			softmax_tile<NS>(s[mt], st[mt], scale_log2, alpha);
			rescale(o[mt], alpha);
		}
		// O += P·V, P's C fragments reused as A fragments.
#pragma unroll
		for (int kk = 0; kk < NS / 2; kk++) {
			unsigned pa[MT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++) p_frag<NS>(pa[mt], s[mt], kk);
#pragma unroll
			for (int dp = 0; dp < NO / 2; dp++) {
				unsigned vb[4];
				ldsm_x4_t(vb, TV::at(vT, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma16816(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
					mma16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
				}
			}
		}
		__syncthreads(); // the stage is free for tile j+2
	}
	cp_wait<0>();

	// out = O / l, rows of the block that are new tokens of the row.
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int row = q0 + wr + mt * 16 + (lane >> 2) + i * 8;
			const float inv = 1.0f / quad_sum(st[mt][i].l);
			if (row >= n) continue;
			bf16* dst = out + (long long)(t0 + row) * op + h * DV + 2 * (lane & 3);
#pragma unroll
			for (int d = 0; d < NO; d++) {
				const unsigned v = pack2(o[mt][d][2 * i] * inv, o[mt][d][2 * i + 1] * inv);
				*reinterpret_cast<unsigned*>(dst + d * 8) = v;
			}
		}
	}
}

#define DEC_WARPS 4
#define DEC_STAGES 3

// DecodeSplit is what both decode variants share about their block: the
// row b, kv head g and key range [k0, k0+nkeys) of the split, the new
// token's key and value (appended to the cache by the block whose split
// holds them, and read from kn, vn rather than from the cache), the shared
// memory stages, and the pipelined loads of key tiles and of the group's
// queries. STAGES tiles are in flight. With SHARED the values are the
// keys' leading columns (MLA's latent cache, mla.cu): a stage holds one
// tile, sV is sK, and there is no vn or vc. With ROPE the queries and the
// new key are read unrotated and rotated by rope (rotate_half over all D
// dims, as the rope kernel rotates them) on their way into shared memory
// and the cache: the queries by startRoPE, the key wherever it is stored.
// With EARLY the block queues its first tiles before its grid_wait, under
// the kernel before it: the cached positions only (earlier steps wrote
// them; kn and vn, the kernel before's output, may still be being written),
// so the constructor appends nothing and the caller runs, in order,
// prime(true), grid_wait, append, newRows and queries, then commits the
// queries' group. A length past maxSeq traps.
// Shared memory: 16 query rows, then STAGES·(SHARED ? 1 : 2)·BN rows, of
// Tile<D>::ROW_BYTES; a split of fewer tiles than STAGES uses only its
// tiles' stages (decodeSharedFor).
template <int D, int STAGES = DEC_STAGES, bool SHARED = false, bool ROPE = false, bool EARLY = false> struct DecodeSplit {
	typedef Tile<D> T;
	static constexpr int THREADS = DEC_WARPS * 32;
	static constexpr int TILES = SHARED ? 1 : 2; // tiles of a stage
	int b, g, group, len, k0, nkeys, ntiles, newAt, tid;
	long long rowHead, kvBase; // the group's first row of [B·heads]; the (row, kv head)'s cache
	const bf16 *kNew, *vNew;
	bf16 *kc, *vc;
	unsigned sQ, sKV;
	HalfRope<D> rope; // ROPE: the new token's angles

	__device__ DecodeSplit(unsigned char* smem, const bf16* kn, int kp, const bf16* vn, int vp, bf16* kc_, bf16* vc_,
	                       const int* past, int heads, int kvh, int maxSeq, int chunk, HalfRope<D> rope_ = {})
	    : b(blockIdx.z), g(blockIdx.y), group(heads / kvh), tid(threadIdx.x), kc(kc_), vc(vc_), rope(rope_) {
		len = past[b] + 1;
		if (len < 1 || len > maxSeq) __trap();
		k0 = blockIdx.x * chunk;
		nkeys = max(0, min(k0 + chunk, len) - k0);
		ntiles = (nkeys + BN - 1) / BN;
		newAt = len - 1 - k0; // the new token's key in this split, when in [0, nkeys)
		rowHead = (long long)b * heads + g * group;
		kvBase = ((long long)b * kvh + g) * maxSeq * D;
		kNew = kn + (long long)b * kp + g * D;
		vNew = SHARED ? nullptr : vn + (long long)b * vp + g * D;
		sQ = smem_addr(smem);
		sKV = sQ + 16 * T::ROW_BYTES;
		if (!EARLY) append();
	}
	// append stores the new token's key (rotated with ROPE) and value in
	// the cache, from the block whose split holds them.
	__device__ void append() const {
		if (newAt >= 0 && newAt < nkeys) {
			for (int i = tid; i < D / 8; i += THREADS) {
				store<bf16, 8>(kc + kvBase + (long long)(len - 1) * D + i * 8, newKey(i));
				if (!SHARED) store<bf16, 8>(vc + kvBase + (long long)(len - 1) * D + i * 8, load<bf16, 8>(vNew + i * 8));
			}
		}
	}
	// newKey is chunk c of the new token's key as the cache holds it.
	__device__ Vec<bf16, 8> newKey(int c) const { return ROPE ? rope.chunk(kNew, c) : load<bf16, 8>(kNew + c * 8); }

	__device__ unsigned sK(int s) const { return sKV + (TILES * s) * BN * T::ROW_BYTES; }
	__device__ unsigned sV(int s) const { return sKV + (TILES * s + TILES - 1) * BN * T::ROW_BYTES; }

	// loadKV brings tile j of the split into stage j % STAGES; early (before
	// the grid_wait), all but the new token's row, which newRows stores.
	__device__ void loadKV(int j, bool early = false) const {
		const int s = j % STAGES, first = j * BN;
		for (int i = tid; i < BN * T::CHUNKS; i += THREADS) {
			const int r = i / T::CHUNKS, c = i - r * T::CHUNKS, key = first + r;
			const bool ok = key < nkeys;
			if (early && ok && key == newAt) continue;
			const long long at = kvBase + (long long)(k0 + key) * D + c * 8;
			if (ROPE && ok && key == newAt)
				st_shared16(T::at(sK(s), r, c), bits16(newKey(c))); // visible after next's barrier
			else
				cp16(T::at(sK(s), r, c), !ok ? kc : key == newAt ? kNew + c * 8 : kc + at, ok);
			if (!SHARED) cp16(T::at(sV(s), r, c), !ok ? vc : key == newAt ? vNew + c * 8 : vc + at, ok);
		}
	}

	// newRows (EARLY, after the grid_wait) stores the new token's key and
	// value into their row of the tile prime(true) queued them in, if it
	// did; a later tile's loadKV takes them as it takes any row. Visible
	// after next's barrier.
	__device__ void newRows() const {
		if (newAt < 0 || newAt >= nkeys || newAt >= (STAGES - 1) * BN) return;
		const int j = newAt / BN, s = j % STAGES, r = newAt - j * BN;
		for (int c = tid; c < T::CHUNKS; c += THREADS) {
			st_shared16(T::at(sK(s), r, c), bits16(newKey(c)));
			if (!SHARED) st_shared16(T::at(sV(s), r, c), bits16(load<bf16, 8>(vNew + c * 8)));
		}
	}

	// queries (EARLY, after newRows) queues the group's queries as start
	// does, or with ROPE stores them rotated as startRoPE does; the caller
	// commits them as one cp.async group, after prime's.
	__device__ void queries(const bf16* q, int qp) const {
		if (ROPE)
			storeRoPE(q, qp);
		else
			T::template load<16>(sQ, q + (long long)b * qp + g * group * D, D, group, tid, THREADS);
	}

	// start queues the group's queries and the first tiles (see prime).
	__device__ void start(const bf16* q, int qp) const {
		T::template load<16>(sQ, q + (long long)b * qp + g * group * D, D, group, tid, THREADS);
		prime();
	}

	// startRoPE is start with the queries rotated: the first tiles queued,
	// then the group's queries read, rotated and stored by this block's
	// threads (rows past the group zeroed, as start's load zeroes them),
	// in shared memory once next(0) has passed its barrier. Every split's
	// block of the (row, kv head) rotates its own copy alike.
	__device__ void startRoPE(const bf16* q, int qp) const {
		prime();
		storeRoPE(q, qp);
	}
	__device__ void storeRoPE(const bf16* q, int qp) const {
		const bf16* q0 = q + (long long)b * qp + g * group * D;
		for (int i = tid; i < 16 * T::CHUNKS; i += THREADS) {
			const int r = i / T::CHUNKS, c = i - r * T::CHUNKS;
			uint4 v = make_uint4(0, 0, 0, 0);
			if (r < group) v = bits16(rope.chunk(q0 + r * D, c));
			st_shared16(T::at(sQ, r, c), v);
		}
	}

	// prime queues the first STAGES-1 tiles, a cp.async group each, the
	// queries' loads (issued before it) in the first group; early, before
	// the grid_wait (EARLY), the cached rows only.
	__device__ void prime(bool early = false) const {
#pragma unroll
		for (int j = 0; j < STAGES - 1; j++) {
			if (j < ntiles) loadKV(j, early);
			cp_commit();
		}
	}

	// next queues tile j+STAGES-1 and waits for tile j. With EARLY the
	// queries' group follows prime's, so the first tile waits for all but
	// the group just queued (tile STAGES-1's).
	__device__ void next(int j) const {
		if (j + STAGES - 1 < ntiles) loadKV(j + STAGES - 1);
		cp_commit();
		if (EARLY && j == 0)
			cp_wait<1>();
		else
			cp_wait<STAGES - 1>();
		__syncthreads();
	}
};
