// What the two absorbed MLA decode kernels share, mla_decode (mla.cu) and
// mla_decode_keys (mla_keys.cu): P·C into a warp's o_lat dims, and a
// split's output.

#pragma once
#include "attention.cuh"
#include "hopper.cuh" // bulk copies and mbarriers, MlaKeyTiles<..., true>'s only
#include "mla_probe.cuh"

// mla_pc adds P·C of k-step kk (keys [16kk, 16kk+16) of the tile at kT,
// whose first R columns are C; pa P's A fragment) to this warp's o_lat dims
// (NO/2 groups of 16 from group dp0): mla_decode's and mla_decode_keys's.
template <int R, typename T, int NO>
__device__ __forceinline__ void mla_pc(float (&o)[NO][4], const unsigned (&pa)[4], unsigned kT, int kk, int dp0, int lane) {
	constexpr int DP = R / 16, DPW = NO / 2;
#pragma unroll
	for (int x = 0; x < DPW; x++) {
		const int dp = dp0 + x;
		if (dp >= DP) break;
		unsigned vb[4];
		ldsm_x4_t(vb, T::at(kT, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
		mma16816(o[2 * x], pa, vb[0], vb[1]);
		mma16816(o[2 * x + 1], pa, vb[2], vb[3]);
	}
}

// mla_split_out is the end of mla_decode and mla_decode_keys for one (row,
// head), bh, fragment row half i: this warp's o_lat dims (NO/2 groups of 16
// from group dp0) as o / l rounded to bf16 into olat when the split is the
// only one, else o unnormalised into part and (m, l), m the scaled max,
// into stats (written by warp 0's quad leaders).
template <int R, int NO>
__device__ __forceinline__ void mla_split_out(const float (&o)[NO][4], int i, float m, float l, long long bh,
                                              int splits, int split, int dp0, int warp, int lane, bf16* olat,
                                              float* part, float* stats) {
	constexpr int DP = R / 16, DPW = NO / 2;
	if (splits == 1) {
		const float inv = 1.0f / l;
		bf16* dst = olat + bh * R + 2 * (lane & 3);
#pragma unroll
		for (int x = 0; x < DPW; x++) {
			const int dp = dp0 + x;
			if (dp >= DP) break;
#pragma unroll
			for (int hh = 0; hh < 2; hh++)
				*reinterpret_cast<unsigned*>(dst + dp * 16 + hh * 8) =
				    pack2(o[2 * x + hh][2 * i] * inv, o[2 * x + hh][2 * i + 1] * inv);
		}
		return;
	}
	const long long at = bh * splits + split;
	if (warp == 0 && (lane & 3) == 0) {
		stats[at * 2] = m;
		stats[at * 2 + 1] = l;
	}
#pragma unroll
	for (int x = 0; x < DPW; x++) {
		const int dp = dp0 + x;
		if (dp >= DP) break;
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			float* dst = part + at * R + dp * 16 + hh * 8 + 2 * (lane & 3);
			dst[0] = o[2 * x + hh][2 * i];
			dst[1] = o[2 * x + hh][2 * i + 1];
		}
	}
}

// mla_split_part_staged is mla_split_out of every fragment row of a split
// of several (splits > 1) at once, for the heads of row b (bh0 = b·heads):
// the warps' o_lat dims go to shared memory first (stage: 16 rows of R + 8
// floats, 16-byte aligned, nothing of it in use), then every thread of the
// block stores whole 16-byte pieces of the heads' rows of part, a warp 512
// contiguous bytes, where mla_split_out's fragment stores put 8 bytes in
// each of 8 rows an instruction: the same values, a sixteenth of the
// store instructions and whole 32-byte sectors. The stats as mla_split_out
// writes them. Ends with the stores issued; stage is free again after a
// barrier.
template <int R, int NO, int THREADS>
__device__ __forceinline__ void mla_split_part_staged(const float (&o)[NO][4], const float (&m)[2], const float (&l)[2],
                                                      long long bh0, int heads, int splits, int split, int dp0,
                                                      int warp, int lane, float* stage, float* part, float* stats) {
	constexpr int DP = R / 16, DPW = NO / 2, SP = R + 8; // SP: a row's floats in stage, 8 of them padding
	static_assert(R % 4 == 0 && SP % 4 == 0, "rows of whole 16-byte pieces, 16-byte aligned");
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = (lane >> 2) + i * 8;
		if (warp == 0 && (lane & 3) == 0 && r < heads) {
			const long long at = (bh0 + r) * splits + split;
			stats[at * 2] = m[i];
			stats[at * 2 + 1] = l[i];
		}
#pragma unroll
		for (int x = 0; x < DPW; x++) {
			const int dp = dp0 + x;
			if (dp >= DP) break;
#pragma unroll
			for (int hh = 0; hh < 2; hh++)
				*reinterpret_cast<float2*>(stage + r * SP + dp * 16 + hh * 8 + 2 * (lane & 3)) =
				    make_float2(o[2 * x + hh][2 * i], o[2 * x + hh][2 * i + 1]);
		}
	}
	__syncthreads();
	for (int k = threadIdx.x; k < heads * (R / 4); k += THREADS) {
		const int r = k / (R / 4), c = 4 * (k - r * (R / 4));
		*reinterpret_cast<float4*>(part + ((bh0 + r) * splits + split) * R + c) =
		    *reinterpret_cast<const float4*>(stage + r * SP + c);
	}
}

#define MLK_BN 32 // keys per tile of MlaKeyTiles: 8 per warp
#define MLK_PP 40 // bf16 per row of the p tile: 32 and 8 of padding, so ldmatrix meets no bank twice
#define MLK_EXTRA (16 * MLK_PP * 2 + DEC_WARPS * 16 * 4) // the p tile, then the warps' tile maxima (and, at the end, sums)

// MlkRows is the layout of MlaKeyTiles' bulk-copied key tiles (BULK): row
// r at r·ROW_BYTES, its chunks in order (a bulk copy writes a row as it is
// in the cache), ROW_BYTES an odd count of 16-byte chunks (D·2 + 16 bytes
// where D/8 is even), so that the 8 rows of an ldmatrix matrix, all at one
// chunk, fall on the 8 different 16-byte bank groups of 128 bytes.
template <int D> struct MlkRows {
	static_assert(D % 8 == 0, "rows of whole 16-byte chunks");
	static constexpr int CHUNKS = D / 8;
	static constexpr int ROW_BYTES = (CHUNKS | 1) * 16;
	__device__ static unsigned at(unsigned base, int r, int c) { return base + r * ROW_BYTES + (c << 4); }
};
// MlkKeys is the layout of MlaKeyTiles' key tiles: Tile's swizzle for
// cp.async, MlkRows for bulk copies.
template <int D, bool BULK> struct MlkKeys {
	typedef Tile<D> type;
};
template <int D> struct MlkKeys<D, true> {
	typedef MlkRows<D> type;
};

// MlaKeyTiles is the loop over one split's keys that mla_decode_keys
// (mla_keys.cu) and mla_flat (mla_flat.cu) share: tiles of MLK_BN
// positions, each of the DEC_WARPS warps scoring its own 8 over all R+DR
// dims, one shared running max per tile, p rounded to bf16 through shared
// memory, each warp multiplying all of p by its quarter of the R output
// dims (mla_keys.cu says why). Shared memory, from smem (SHARED bytes): the
// 16 query rows (Tile<R+DR>), STAGES stages of MLK_BN key rows (layout K),
// MLK_EXTRA bytes, then with BULK the stages' mbarriers.
//
// The key tiles come one of two ways. Without BULK, by cp.async from every
// thread into Tile's swizzle: the user queues the queries (loadQ) and the
// first tiles (load), up to STAGES of them, each its own cp.async group
// and the queries in one of them or after them, then calls run with the
// count queued; run waits for all of those before the first tile and keeps
// STAGES-1 tiles in flight from then on. With BULK (sm_90a: mla_flat), by
// the copy engine, one bulk copy a cached row issued by a lane of warp 0,
// into MlkRows, each stage completing on its mbarrier: the user calls
// initBars first, then as before, the queries still by cp.async in one
// group; run waits for that group before the first tile and for a tile's
// mbarrier before each tile.
template <int R, int DR, int STAGES, bool BULK = false> struct MlaKeyTiles {
	static_assert(STAGES >= 2, "a tile computed while the next loads");
	static_assert(MLK_BN == DEC_WARPS * 8, "each warp scores one n-tile of 8 keys");
	static_assert(!BULK || MLK_BN == 32, "a lane of warp 0 copies a row of a tile");
	static_assert(MLK_EXTRA % 8 == 0, "the mbarriers after MLK_EXTRA are 8-byte aligned");
	typedef Tile<R + DR> T;                         // the queries
	typedef typename MlkKeys<R + DR, BULK>::type K; // the key tiles
	static constexpr int W = R + DR, KS = W / 16, KP = (KS + 1) / 2, DP = R / 16, DPW = (DP + DEC_WARPS - 1) / DEC_WARPS;
	static constexpr int THREADS = DEC_WARPS * 32;
	static constexpr int STAGE_BYTES = MLK_BN * K::ROW_BYTES;
	static constexpr int BAR_BYTES = BULK ? (8 * STAGES + 15) / 16 * 16 : 0; // a stage's mbarrier each
	static constexpr int SHARED = 16 * T::ROW_BYTES + STAGES * STAGE_BYTES + MLK_EXTRA + BAR_BYTES;

	const bf16* keys; // the split's first position in the cache
	const bf16* kNew; // the new latent, which the cache holds at position newAt of the split once appended
	int nkeys, newAt, tid, lane, warp;
	unsigned sQ, sKV, sP;
	unsigned* pOut;  // the p tile as bf16 pairs
	float* tileMax;  // [warp][16]
	mutable MlaProbe probe; // its user's, for the tiles' stamps (mla_probe.cuh; nothing in the normal build)

	__device__ MlaKeyTiles(unsigned char* smem, const bf16* keys_, const bf16* kNew_, int nkeys_, int newAt_)
	    : keys(keys_), kNew(kNew_), nkeys(nkeys_), newAt(newAt_), tid(threadIdx.x), lane(threadIdx.x & 31),
	      warp(threadIdx.x >> 5) {
		sQ = smem_addr(smem);
		sKV = sQ + 16 * T::ROW_BYTES;
		sP = sKV + STAGES * STAGE_BYTES;
		unsigned char* extra = smem + 16 * T::ROW_BYTES + STAGES * STAGE_BYTES;
		pOut = reinterpret_cast<unsigned*>(extra);
		tileMax = reinterpret_cast<float*>(extra + 16 * MLK_PP * 2);
	}
	__device__ int tiles() const { return (nkeys + MLK_BN - 1) / MLK_BN; }
	__device__ unsigned stage(int s) const { return sKV + s * STAGE_BYTES; }
	__device__ unsigned bar(int s) const { return sP + MLK_EXTRA + 8 * s; } // BULK: stage s's mbarrier

	// initBars readies the stages' mbarriers (BULK; without, nothing), one
	// arrival a phase (load's expect_tx), before the first load; a barrier
	// of the block. run waits for every tile loaded, so they end with no
	// phase pending, and nothing else uses their bytes (no mbarrier.inval).
	__device__ void initBars() const {
		if constexpr (BULK) {
			if (tid == 0) {
				for (int s = 0; s < STAGES; s++) mbar_init(bar(s), 1);
				mbar_init_fence();
			}
			__syncthreads();
		}
	}

	// load queues tile j into its stage, the new latent's row from kNew;
	// early, before the kernel's grid_wait, it leaves that row out (kNew is
	// not written yet: the caller stores it with newRow after the wait).
	// With BULK the rows past nkeys are zeroed by plain stores (p·c must
	// not meet garbage there), and lane r of warp 0 copies row r (the
	// cache's rows and kNew are W·2 contiguous bytes, 16-byte aligned) onto
	// the stage's mbarrier, which expects the bytes of the rows copied.
	__device__ void load(int j, bool early = false) const {
		if constexpr (BULK) {
			const unsigned dst = stage(j % STAGES), b = bar(j % STAGES);
			const int k0 = j * MLK_BN, rows = min(MLK_BN, nkeys - k0); // j < tiles(): at least one
			for (int i = tid; i < (MLK_BN - rows) * K::CHUNKS; i += THREADS) {
				const int r = i / K::CHUNKS;
				st_shared16(K::at(dst, rows + r, i - r * K::CHUNKS), make_uint4(0, 0, 0, 0));
			}
			if (warp == 0) {
				const int key = k0 + lane;
				const bool late = early && newAt >= k0 && newAt < k0 + rows; // newRow stores it
				const unsigned bytes = (rows - (late ? 1 : 0)) * W * 2;      // none when the new latent is the tile's one key
				if (lane == 0) {
					if (bytes > 0)
						mbar_expect_tx(b, bytes);
					else
						mbar_arrive(b);
				}
				__syncwarp();
				if (lane < rows && !(early && key == newAt))
					bulk_load(K::at(dst, lane, 0), key == newAt ? kNew : keys + (long long)key * W, W * 2, b);
			}
		} else {
			const unsigned dst = stage(j % STAGES);
			for (int i = tid; i < MLK_BN * K::CHUNKS; i += THREADS) {
				const int r = i / K::CHUNKS, c = i - r * K::CHUNKS, key = j * MLK_BN + r;
				const bool ok = key < nkeys;
				if (early && ok && key == newAt) continue;
				const bf16* src = !ok ? keys : key == newAt ? kNew + c * 8 : keys + (long long)key * W + c * 8;
				cp16(K::at(dst, r, c), src, ok);
			}
		}
	}

	// newRow stores the new latent into its row of tile j's stage.
	__device__ void newRow(int j) const {
		const int r = newAt - j * MLK_BN;
		for (int c = tid; c < K::CHUNKS; c += THREADS)
			st_shared16(K::at(stage(j % STAGES), r, c), *reinterpret_cast<const uint4*>(kNew + c * 8));
	}

	// appendNew stores the new latent at dst, its row of the cache, and,
	// when it is in one of the first `queued` tiles (queued before the grid
	// wait without it), into its row of that tile's stage: each chunk read
	// once. Nothing where the split does not hold it.
	__device__ void appendNew(bf16* dst, int queued) const {
		if (newAt < 0 || newAt >= nkeys) return;
		const bool staged = newAt < queued * MLK_BN;
		const int j = newAt / MLK_BN, r = newAt - j * MLK_BN;
		for (int c = tid; c < K::CHUNKS; c += THREADS) {
			const uint4 v = *reinterpret_cast<const uint4*>(kNew + c * 8);
			*reinterpret_cast<uint4*>(dst + c * 8) = v;
			if (staged) st_shared16(K::at(stage(j % STAGES), r, c), v);
		}
	}

	// loadQ queues the query rows: q_lat then q_pe of each head, zero past
	// the heads. qlat: row b's first head; qpe: row b's first head's q_pe,
	// qhs apart.
	__device__ void loadQ(const bf16* qlat, const bf16* qpe, int qhs, int heads) const {
		for (int i = tid; i < 16 * T::CHUNKS; i += THREADS) {
			const int r = i / T::CHUNKS, c = i - r * T::CHUNKS;
			const bool ok = r < heads;
			const bf16* src = c < R / 8 ? qlat + (long long)r * R + c * 8 : qpe + (long long)r * qhs + (c - R / 8) * 8;
			cp16(T::at(sQ, r, c), ok ? src : qlat, ok);
		}
	}

	// run accumulates the split into o (this warp's dims of o_lat,
	// unnormalised) and st (each row's max; this thread's share of its sum),
	// and returns with every copy done and the stages free.
	__device__ void run(float (&o)[2 * DPW][4], RowState (&st)[2], float scale_log2, int queued) const {
		const int kw = warp * 8, dp0 = warp * DPW, ntiles = tiles();
#pragma unroll
		for (int d = 0; d < 2 * DPW; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
		st[0] = st[1] = RowState{NEG_INF, 0.0f};
		for (int j = 0; j < ntiles; j++) {
			// Tile j is in; every warp is done with tile j-1, so its stage
			// takes tile j+STAGES-1. The first tile waits for everything
			// queued before the loop (the queries may come last); with BULK
			// the queries are the only cp.async group, and tile j is the
			// (j / STAGES)-th phase of its stage's mbarrier.
			if constexpr (BULK) {
				if (j == 0) cp_wait<0>();
				mbar_wait_trap(bar(j % STAGES), (j / STAGES) & 1);
			} else if (j == 0)
				cp_wait<0>();
			else
				cp_wait<STAGES - 2>();
			__syncthreads();
			probe.tile(MLA_READY, j);
			if (j + STAGES - 1 < ntiles && j + STAGES - 1 >= queued) load(j + STAGES - 1);
			if constexpr (!BULK) cp_commit();
			const unsigned kT = stage(j % STAGES);

			// The warp's 8 keys against the 16 query rows, over all W dims:
			// two k-steps per ldmatrix of keys, even and odd k-steps in two
			// chains.
			float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
			for (int kp2 = 0; kp2 < KP; kp2++) {
				unsigned kb[4], qa[4];
				ldsm_x4(kb, K::at(kT, kw + (lane & 7), min(4 * kp2 + (lane >> 3), 2 * KS - 1)));
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
				mla_pc<R, K>(o, pa, kT, kk, dp0, lane);
			}
			probe.tile(MLA_COMPUTED, j);
		}
		cp_wait<0>();
		__syncthreads(); // every warp is done with the stages and tileMax
	}

	// sums is each row's sum of p over the split, l[i] for this thread's
	// fragment rows (lane/4 and lane/4 + 8), from every warp's shares: the
	// warps share the max, so the row's sum is the sum of theirs.
	__device__ void sums(const RowState (&st)[2], float (&l)[2]) const {
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const float x = quad_sum(st[i].l);
			if ((lane & 3) == 0) tileMax[warp * 16 + (lane >> 2) + i * 8] = x;
		}
		__syncthreads();
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = (lane >> 2) + i * 8;
			l[i] = tileMax[r];
#pragma unroll
			for (int w = 1; w < DEC_WARPS; w++) l[i] += tileMax[w * 16 + r];
		}
	}
};
