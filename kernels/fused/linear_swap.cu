// linear_swap (sm_90a): out = x·wᵀ + bias for a decode step of up to 64
// rows, the weights streamed by tensor copies at the memory's rate and
// multiplied by wgmma with the operands swapped: w's rows are wgmma's M
// (64 a consumer warpgroup) and x's token rows its N (ROWS: 16, 32 or 64,
// the rows rounded up), so a tile of weights is read once whatever the
// rows, and x, a few KiB a stage, comes from L2.
//
// Operands (pitches in elements, each a multiple of 8, every matrix on a
// 16-byte boundary: what the tensor maps need):
//   xmap  x bf16 [M, K], box {64, ROWS}: rows past M read as zeros
//   wmap  w bf16 [N, K], box {64, SW_BM}; with SwiGLU w [2N, K] (the gate
//         rows, then the up rows) as a 3-D map {K, N, 2}, box {64, 8, 2}
//   both with the 128-byte swizzle; K's tail and rows past N read as zeros.
//   out   TO [M, N], pitch op (bf16 activations, or f32 logits); with
//         SwiGLU bf16 [M, N], N the output columns (I)
//   bias  [N] of dtype biasType (0 none, 1 bf16, 2 f16, 3 f32)
//   part  f32 [tiles - whole][splits][M][SW_BM] where splits > 1: the
//         split tiles' partial sums
//   counters i32 [tiles - whole], zero between launches (a split tile's
//         last block puts its counter back, so a captured graph replays
//         with no memset)
//   status i32 [8]: a timed-out wait's record (hopper.cuh), zero while none
//
// Work: a tile is SW_BM weight rows (outputs; with SwiGLU SW_BM/2 output
// columns, their gate and up rows). `whole` tiles are a unit of work each,
// all their k-steps (HG_BK); the other tiles - whole (all, with whole 0)
// have theirs cut into `splits` ranges of `per` steps (the last shorter), a
// unit each, and go first (SwUnits). A persistent grid (at most a block an
// SM) takes units blockIdx.x, + gridDim.x, ...; the host (swPlan) keeps
// whole waves of tiles whole and splits only the rest, in few long ranges:
// a split unit costs its epilogue's latencies on top of its k-steps.
//   - warp 8, the producer: one thread fills a ring of STAGES stages
//     (hop_gemm.cuh's HopRing), each SW_BM rows of w and ROWS rows of x over
//     HG_BK k, by tensor copies, w's under an evict-first L2 policy. The
//     ring is one stream of k-steps over all of the block's units: the
//     producer runs up to STAGES steps ahead of the consumers whatever the
//     unit, so it fills the next unit's stages while they do a unit's
//     epilogue. The first STAGES stages' w is requested before grid_wait
//     (the weights are no kernel's output, so their stream starts under the
//     kernel before); their x follows the wait, on the same full barriers.
//   - warps 0-7, two consumer warpgroups, own 64 weight rows of a tile each:
//     hop_gemm_steps, four wgmma m64nROWSk16 a stage (w as A, x as B, both
//     K-major), so the accumulators hold outᵀ: thread (warp wi, lane) has
//     weight rows 16wi + lane/4 and + 8 of its warpgroup's 64, tokens
//     8j + 2(lane%4) and + 1 of n-block j.
// A unit of a split tile writes its sums to part, then one thread counts
// the block on the tile's counter (after a barrier and a fence: CUTLASS's
// split-K semaphore); the last of the tile's blocks adds the splits' sums
// in split order (its own from registers: the same f32 values; each
// split's loads in flight together), so the result does not depend on
// which block finishes last, and puts the counter back to 0. A whole tile
// of a split plan sums its own k-steps range by range alike (0 + range 0 +
// range 1 ...), so that every row's sum is the same arithmetic whichever
// tile holds it: SwiGLU's tiles hold other rows than the plain kernel's.
//
// A split tile's sums in its cluster (CL > 0, the cluster instances): where
// a plan is all split tiles of CL splits, one unit a block (grid = units),
// the CL blocks of a tile are one cluster of CL (rank = split). Each keeps
// its sums in its shared memory, and after a cluster barrier split 0 adds
// the others' (through distributed shared memory) to its own in split order
// (the counters' arithmetic: the same bits), then a second barrier keeps
// every block until it has read them, and it alone writes the tile: no
// fence, count or round trip through L2.
//
// SwiGLU (SWIGLU, linear_swiglu's): a stage's w is eight copies of 8 gate
// rows and their 8 up rows (the 3-D map's box), so slab q of 16 rows holds
// the gate rows of output columns 8q..8q+7 of the tile in rows 0-7 and their
// up rows in rows 8-15: a consumer thread's rows r and r + 8 are a column's
// gate and up, as in linear_stream's LS_SWIGLU. The 128-byte swizzle is a
// function of the shared address, so eight 2 KiB boxes on 1 KiB boundaries
// lay out as one 128-row box would.
//
// The norm across a block boundary (linear_add_rms_norm_linear's two
// launches at 16 rows, MODE): a block's last projection (SW_ADDNORM, plain
// and bf16 out) writes its output y = bf16(acc + bias), then, as
// add_rms_norm would, resid = bf16(y + resid), and beside them
// u = bf16(gamma · resid) and each tile's Σ resid² of every row (its 128
// features: each thread's two squares, the warp's lanes of one row by
// shuffles, the 8 warps in order) into sq [tile][M]; resid and gamma are
// read as each unit starts, under its k-steps (resid is the output of a
// kernel two or more back: complete, as the one before is, once the grid
// wait returns). The next block's first projection (SW_RSTD, plain with
// its bias, or SwiGLU) takes u as x and, after its grid wait, sums the
// producer's sqTiles partials of each row in a fixed order (eight lanes a
// row, each every eighth tile, then a shuffle tree) into
// rstd = rsqrt(Σ/K + eps); its sums are scaled by their row's rstd before
// the bias or SwiGLU. So the normalised input is never written:
// out = rstd·(w·bf16(gamma·h)) + bias, where the parts compute
// w·bf16(gamma·bf16(h·rstd)) + bias: the same roundings but in another
// place, and a sum of squares in another order; y and resid are the parts'
// bit for bit.
//
// Rounding: as linear_stream (linear.cuh's lin_bias): sums in f32, the bias
// rounded to bf16 first when out is bf16, out rounded once; with SwiGLU gate
// and up rounded to bf16, then lin_swiglu, so that the output is the plain
// kernel's then swiglu's arithmetic.
//
// A wait that lasts HOP_WAIT_CYCLES records what it waited for in status
// (HG_WAIT_*, block, thread, k-step counter, parity) and the kernel winds
// down instead of hanging (its output, and a split tile's counter, are then
// garbage).
//
// Rate at 16 rows (bench/RESULTS.md, linear_swap): 92% of the copy rate's
// floor on Qwen2-7B's gate_up (whole waves, the last split in two) and
// 103% on its lm_head, above cuBLAS on both; the shapes whose tiles all
// split stay up to 40% under cuBLAS (infer bench linear --variants
// swap,cublas measures it).

#include "hop_gemm.cuh"
#include "linear.cuh"
#include "instances.cuh"

#define SW_BM (64 * HG_CONSUMERS)                 // weight rows of a tile
#define SW_CONSUMER_THREADS (128 * HG_CONSUMERS)  // the consumer warpgroups
#define SW_THREADS (SW_CONSUMER_THREADS + 32)     // and the producer warp
#define SW_BAR 1                                  // named barrier of the consumers

// SwLayout is the shared memory of linear_swap<ROWS, STAGES>: per stage the
// w tile (SW_BM rows) then the x tile (ROWS rows), rows of 128 bytes, each
// on a 1 KiB boundary (the swizzle's period).
template <int ROWS, int STAGES> struct SwLayout {
	static constexpr int W_BYTES = SW_BM * HG_ROW_BYTES;
	static constexpr int X_BYTES = ROWS * HG_ROW_BYTES;
	static constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
	static constexpr int ALIGN = 1024; // the dynamic base is rounded up to it
	static constexpr int SMEM = STAGES * STAGE_BYTES + ALIGN;
	static_assert(X_BYTES % ALIGN == 0, "x's tile ends on the swizzle's period");
};

// SwUnits are the units of work: the split tiles first (tiles 0 to
// tiles - whole - 1), each cut into splits ranges of per k-steps (the last
// shorter), a unit each, the ranges of a tile adjacent (so on adjacent
// blocks, together); then the whole tiles, a unit each of all ktiles steps.
// The split units go first so that their epilogues (partial sums, count,
// the last block's reads) overlap the whole tiles' stream instead of ending
// the kernel. Unit u is tile, split and kb: its k-steps [kb, kb + steps);
// split is -1 for a whole tile. A split tile's partial sums and counter are
// indexed by the tile.
struct SwUnits {
	int tiles, whole, splits, per, ktiles;

	__device__ int split_units() const { return splits > 1 ? (tiles - whole) * splits : 0; }
	__device__ int total() const { return split_units() + (splits > 1 ? whole : tiles); }
	__device__ int steps(int u, int& tile, int& split, int& kb) const {
		if (u < split_units()) {
			tile = u / splits, split = u % splits, kb = split * per;
			return min(per, ktiles - kb);
		}
		tile = splits > 1 ? u - split_units() + tiles - whole : u, split = -1, kb = 0;
		return ktiles;
	}
};

// linear_swap: see the top of this file. Launch: min(units, SMs) blocks of
// SW_THREADS threads, SwLayout<ROWS, STAGES>::SMEM bytes of dynamic shared
// memory; 1 ≤ M ≤ ROWS; splits ≥ 1 and every split at least one k-step;
// 0 ≤ whole < tiles where splits > 1.
// SW_SQ_LANE is the producer's tiles each of SW_RSTD's eight lanes of a row
// sums at most: the producer has at most 8·SW_SQ_LANE tiles (swapChain).
#define SW_SQ_LANE 8

// The norm's half a kernel takes (see the top of this file): none, the
// producer's epilogue, the consumer's scale.
enum SwMode { SW_PLAIN, SW_ADDNORM, SW_RSTD };

// SwNorm is the operands of MODE's half of the norm: SW_ADDNORM's resid
// [M, N] (pitch rp), gamma [N], u [M, N] (pitch up) and sq [tiles][M];
// SW_RSTD's sq [sqTiles][M] and eps.
struct SwNorm {
	bf16* resid;
	int rp;
	const bf16* gamma;
	bf16* u;
	int up;
	float* sq;
	int sqTiles;
	float eps;
};

template <int ROWS, int STAGES, typename TO, bool SWIGLU, int MODE = SW_PLAIN, int CL = 0>
__device__ __forceinline__ void linear_swap(const TmaMap* xmap, const TmaMap* wmap, TO* out, int op, const void* bias, int biasType,
                                            float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status,
                                            SwNorm nm = {}) {
	static_assert(MODE != SW_ADDNORM || (!SWIGLU && sizeof(TO) == 2), "the producer's half: plain, bf16 out");
	static_assert(MODE != SW_RSTD || 8 * ROWS <= SW_CONSUMER_THREADS, "eight consumer threads a row sum its squares");
	typedef SwLayout<ROWS, STAGES> L;
	constexpr int COLS = SWIGLU ? SW_BM / 2 : SW_BM; // output columns of a tile
	extern __shared__ unsigned char smem_raw[];
	__shared__ __align__(8) unsigned long long bars[2 * STAGES];
	__shared__ int last; // whether this block sums the splits of its tile
	__shared__ float rstd[MODE == SW_RSTD ? ROWS : 1];                  // SW_RSTD: each row's 1/rms
	__shared__ float sqWarps[MODE == SW_ADDNORM ? SW_CONSUMER_THREADS / 32 : 1][ROWS]; // SW_ADDNORM: each consumer warp's Σ resid² of every row
	__shared__ float clSums[CL > 0 ? ROWS / 2 * SW_CONSUMER_THREADS : 1];              // CL > 0: this split's sums, [j·4 + e][thread]

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	auto sW = [&](int s) { return base + s * L::STAGE_BYTES; };
	auto sX = [&](int s) { return base + s * L::STAGE_BYTES + L::W_BYTES; };
	const HopRing<STAGES> ring{bars};
	if (threadIdx.x == 0) ring.init(1, HG_CONSUMERS * 4);
	__syncthreads();

	const SwUnits units{(N + COLS - 1) / COLS, whole, splits, per, (K + HG_BK - 1) / HG_BK};
	const int total = units.total();
	if constexpr (CL > 0) {
		if (splits != CL || whole != 0 || (int)gridDim.x != total) __trap(); // a plan the cluster instance cannot run
	}

	if (threadIdx.x >= SW_CONSUMER_THREADS) {
		// The producer: one thread issues every copy, in the consumers'
		// order of k-steps (it counts them over all of the block's units).
		if (threadIdx.x != SW_CONSUMER_THREADS) return;
		const unsigned long long policy = l2_evict_first();
		auto load_w = [&](int s, int tile, int kt) {
			const unsigned full = ring.full(s);
			mbar_expect_tx(full, L::STAGE_BYTES);
			if constexpr (SWIGLU) {
#pragma unroll
				for (int q = 0; q < SW_BM / 16; q++)
					tma_load_3d_hint(sW(s) + 16 * q * HG_ROW_BYTES, wmap, full, kt * HG_BK, tile * COLS + 8 * q, 0, policy);
			} else {
				tma_load_2d_hint(sW(s), wmap, full, kt * HG_BK, tile * SW_BM, policy);
			}
		};
		// Before the wait: w of the ring's first stages.
		int pre = 0;
		for (int u = blockIdx.x; u < total && pre < STAGES; u += gridDim.x) {
			int tile, split, kb;
			const int n = units.steps(u, tile, split, kb);
			for (int k = 0; k < n && pre < STAGES; k++, pre++) load_w(pre, tile, kb + k);
		}
		grid_wait();
		grid_release();
		int it = 0; // k-steps issued so far
		for (int u = blockIdx.x; u < total; u += gridDim.x) {
			int tile, split, kb;
			const int n = units.steps(u, tile, split, kb);
			for (int k = 0; k < n; k++, it++) {
				const int s = ring.stage(it);
				if (it >= pre) {
					if (!ring.acquire(it, status, HG_WAIT_EMPTY)) return;
					load_w(s, tile, kb + k);
				}
				tma_load_2d(sX(s), xmap, ring.full(s), (kb + k) * HG_BK, 0);
			}
		}
		return;
	}

	// A consumer: warpgroup w owns weight rows [64w, 64w + 64) of a tile,
	// this thread rows r and r + 8 (r below) and tokens 8j + 2t, + 1.
	grid_wait();
	grid_release();
	const int w = threadIdx.x / 128, wi = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, t = lane % 4;
	const int r = 64 * w + 16 * wi + lane / 4;
	if constexpr (MODE == SW_RSTD) {
		// Row threadIdx/8's squares: this lane's every eighth tile, then
		// the eight lanes' sums by a shuffle tree (a fixed order). The
		// barrier at the end of the first unit's k-steps publishes rstd.
		if (threadIdx.x < 8 * ROWS) {
			const int row = threadIdx.x / 8, q = threadIdx.x % 8;
			float v[SW_SQ_LANE]; // every load in flight at once, then their sum in order
#pragma unroll
			for (int i = 0; i < SW_SQ_LANE; i++) {
				const int p = q + 8 * i;
				v[i] = row < M && p < nm.sqTiles ? __ldcg(nm.sq + (long long)p * M + row) : 0.0f;
			}
			float ss = v[0];
#pragma unroll
			for (int i = 1; i < SW_SQ_LANE; i++) ss += v[i];
#pragma unroll
			for (int o = 4; o >= 1; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
			if (q == 0) rstd[row] = rsqrtf(ss / (float)K + nm.eps);
		}
	}
	auto a = [&](int s) { return sW(s) + 64 * w * HG_ROW_BYTES; };
	float acc[ROWS / 8][4];
	int it = 0;
	for (int u = blockIdx.x; u < total; u += gridDim.x) {
		int tile, split, kb;
		const int n = units.steps(u, tile, split, kb);
		// SW_ADDNORM: the residual and gamma of this thread's outputs, read
		// now so that they arrive under the k-steps.
		float rv[ROWS / 8][2][2], gv[2];
		if constexpr (MODE == SW_ADDNORM) {
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int f = tile * SW_BM + r + 8 * h;
				gv[h] = f < N ? to_f32(nm.gamma[f]) : 0.0f;
#pragma unroll
				for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int tok = 8 * j + 2 * t + e;
						rv[j][e][h] = f < N && tok < M ? to_f32(nm.resid[(long long)tok * nm.rp + f]) : 0.0f;
					}
			}
		}
		// A whole tile of a split plan sums its k-steps range by range as
		// the split tiles' are summed (0 + range 0 + range 1 ...), so that a
		// row's sum does not depend on which tile holds it: linear_swiglu's
		// rows lie in other tiles than linear's, and match it bit for bit.
		const bool ranges = split < 0 && splits > 1;
		float sum[ROWS / 8][4];
#pragma unroll
		for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) sum[j][e] = 0.0f;
		bool ok = true;
		for (int k0 = 0; ok && k0 < n; k0 += per) {
			ok = hop_gemm_steps<ROWS, STAGES, false>(acc, ring, it, min(per, n - k0), a, sX, status, HG_WAIT_FULL);
			if (ranges) {
#pragma unroll
				for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) sum[j][e] += acc[j][e];
			}
		}
		if (!bar_all(SW_BAR, SW_CONSUMER_THREADS, ok)) break; // a wait gave up: the consumers stop together
		if (ranges) {
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[j][e] = sum[j][e];
		}

		if (CL > 0 && split >= 0) {
			// The tile's splits are the cluster (see above): split 0 sums them.
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) clSums[(j * 4 + e) * SW_CONSUMER_THREADS + threadIdx.x] = acc[j][e];
			cluster_sync();
			if (split == 0) {
				const unsigned a = smem_addr(clSums) + 4 * threadIdx.x;
				float v[ROWS / 8][4];
#pragma unroll
				for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) v[j][e] = 0.0f + acc[j][e];
#pragma unroll
				for (int s = 1; s < (CL > 0 ? CL : 1); s++)
#pragma unroll
					for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
						for (int e = 0; e < 4; e++) v[j][e] += ld_cluster_f32(cluster_at(a + 4 * (j * 4 + e) * SW_CONSUMER_THREADS, s));
#pragma unroll
				for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) acc[j][e] = v[j][e];
			}
			cluster_sync(); // no block leaves while split 0 reads its shared memory
			if (split != 0) continue;
		} else if (split >= 0) {
			float* mine = part + ((long long)tile * splits + split) * M * SW_BM;
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int tok = 8 * j + 2 * t + (e & 1);
					if (tok < M) mine[tok * SW_BM + r + (e < 2 ? 0 : 8)] = acc[j][e];
				}
			}
			// One thread publishes the block's sums: the barrier orders every
			// consumer's stores before its release fence (as CUTLASS's
			// split-K semaphore), and its fence after the count orders the
			// other splits' sums before the reads below, so 255 fences do not
			// each wait for their stores.
			bar_sync(SW_BAR, SW_CONSUMER_THREADS);
			if (threadIdx.x == 0) {
				__threadfence();
				last = atomicAdd(&counters[tile], 1) == splits - 1;
				if (last) __threadfence();
			}
			bar_sync(SW_BAR, SW_CONSUMER_THREADS);
			if (!last) continue;
			// The splits in split order, each split's loads all in flight
			// together: a chain of splits L2 round trips, not ROWS/2·splits.
			const float* sums = part + (long long)tile * splits * M * SW_BM;
			float v[ROWS / 8][4];
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) v[j][e] = 0.0f;
			for (int s = 0; s < splits; s++) {
				const float* theirs = sums + (long long)s * M * SW_BM;
#pragma unroll
				for (int j = 0; j < ROWS / 8; j++) {
#pragma unroll
					for (int e = 0; e < 4; e++) {
						const int tok = 8 * j + 2 * t + (e & 1);
						const float p = s == split ? acc[j][e] : tok < M ? __ldcg(theirs + tok * SW_BM + r + (e < 2 ? 0 : 8)) : 0.0f;
						v[j][e] += p;
					}
				}
			}
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[j][e] = v[j][e];
			if (threadIdx.x == 0) counters[tile] = 0; // ready for the next launch
		}

		if constexpr (MODE == SW_RSTD) { // each row's sums scaled by its 1/rms
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[j][e] *= rstd[8 * j + 2 * t + (e & 1)];
		}

		// The tile's outputs: rows r and r + 8, or with SwiGLU the column
		// whose gate and up they are. Their bias is read once, before the
		// stores (which may alias it for all the compiler knows).
		const int f = tile * SW_BM + r;
		float b0 = 0.0f, b8 = 0.0f;
		if constexpr (!SWIGLU) {
			if (f < N) b0 = lin_bias<TO>(bias, biasType, f);
			if (f + 8 < N) b8 = lin_bias<TO>(bias, biasType, f + 8);
		}
#pragma unroll
		for (int j = 0; j < ROWS / 8; j++) {
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int tok = 8 * j + 2 * t + e;
				if (tok >= M) continue;
				if constexpr (SWIGLU) {
					const int c = tile * COLS + 8 * (r / 16) + r % 16;
					if (c < N) out[(long long)tok * op + c] = from_f32<TO>(lin_swiglu(round_bf16(acc[j][e]), round_bf16(acc[j][e + 2])));
				} else if constexpr (MODE == SW_ADDNORM) {
					// y, then resid += y and u = gamma·resid as add_rms_norm
					// rounds them; acc keeps resid's square for the sums.
#pragma unroll
					for (int h = 0; h < 2; h++) {
						const int ff = f + 8 * h;
						const bf16 y = from_f32<bf16>(acc[j][e + 2 * h] + (h ? b8 : b0));
						const float hs = round_bf16(to_f32(y) + rv[j][e][h]);
						acc[j][e + 2 * h] = hs * hs;
						if (ff < N) {
							out[(long long)tok * op + ff] = y;
							nm.resid[(long long)tok * nm.rp + ff] = __float2bfloat16_rn(hs);
							nm.u[(long long)tok * nm.up + ff] = __float2bfloat16_rn(gv[h] * hs);
						}
					}
				} else {
					if (f < N) out[(long long)tok * op + f] = from_f32<TO>(acc[j][e] + b0);
					if (f + 8 < N) out[(long long)tok * op + f + 8] = from_f32<TO>(acc[j][e + 2] + b8);
				}
			}
		}
		if constexpr (MODE == SW_ADDNORM) {
			// The tile's Σ resid² of each row: this thread's two features
			// (0 past N or M), its warp's 16 by shuffles over the lanes of
			// the row, then the 8 warps in order.
#pragma unroll
			for (int j = 0; j < ROWS / 8; j++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const int tok = 8 * j + 2 * t + e;
					float ss = tok < M ? (f < N ? acc[j][e] : 0.0f) + (f + 8 < N ? acc[j][e + 2] : 0.0f) : 0.0f;
#pragma unroll
					for (int o = 4; o <= 16; o *= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
					if (lane < 4) sqWarps[threadIdx.x / 32][tok] = ss;
				}
			bar_sync(SW_BAR, SW_CONSUMER_THREADS);
			if (threadIdx.x < M) {
				float ss = 0.0f;
#pragma unroll
				for (int wp = 0; wp < SW_CONSUMER_THREADS / 32; wp++) ss += sqWarps[wp][threadIdx.x];
				nm.sq[(long long)tile * M + threadIdx.x] = ss;
			}
			bar_sync(SW_BAR, SW_CONSUMER_THREADS); // sqWarps is free for the next unit
		}
	}
}

// The instances (named as in linear_swap.go's swConfigs): token rows ROWS
// through STAGES stages, the plain epilogue with bf16 and f32 out
// (linear), and SwiGLU's (linear_swiglu: N is out's columns, I).
#define LINEAR_SWAP(NAME, F32_NAME, SWIGLU_NAME, ROWS, ST)                                                                        \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op, const void* bias,       \
	         int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status) {        \
		linear_swap<ROWS, ST, bf16, false>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole, splits, per,    \
		                                   status);                                                                               \
	}                                                                                                                             \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    F32_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, float* out, int op,                    \
	             const void* bias, int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits, int per, \
	             int* status) {                                                                                                   \
		linear_swap<ROWS, ST, float, false>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole, splits, per,   \
		                                    status);                                                                              \
	}                                                                                                                             \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    SWIGLU_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op,                  \
	                float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status) {               \
		linear_swap<ROWS, ST, bf16, true>(&xmap, &wmap, out, op, nullptr, 0, part, counters, M, N, K, whole, splits, per,         \
		                                  status);                                                                                \
	}
LINEAR_SWAP_INSTANCES(LINEAR_SWAP)

// The norm's halves (linear_add_rms_norm_linear's, MODE above), at the
// instances of swNormConfigs: the producer (plain, bf16 out: y, resid, u,
// sq) and the consumer, plain with its bias and with SwiGLU (x is u).
#define LINEAR_SWAP_NORM(ADDNORM_NAME, RSTD_NAME, RSTD_SWIGLU_NAME, ROWS, ST)                                                    \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    ADDNORM_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op,                 \
	                 const void* bias, int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits,      \
	                 int per, int* status, bf16* resid, int rp, const bf16* gamma, bf16* u, int up, float* sq) {                  \
		linear_swap<ROWS, ST, bf16, false, SW_ADDNORM>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole,     \
		                                               splits, per, status, SwNorm{resid, rp, gamma, u, up, sq, 0, 0.0f});        \
	}                                                                                                                             \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    RSTD_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op, const void* bias,  \
	              int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status,     \
	              const float* sq, int sqTiles, float eps) {                                                                      \
		linear_swap<ROWS, ST, bf16, false, SW_RSTD>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole,        \
		                                            splits, per, status,                                                          \
		                                            SwNorm{nullptr, 0, nullptr, nullptr, 0, (float*)sq, sqTiles, eps});           \
	}                                                                                                                             \
	extern "C" __global__ void __launch_bounds__(SW_THREADS, 1)                                                                   \
	    RSTD_SWIGLU_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op,             \
	                     float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status,            \
	                     const float* sq, int sqTiles, float eps) {                                                               \
		linear_swap<ROWS, ST, bf16, true, SW_RSTD>(&xmap, &wmap, out, op, nullptr, 0, part, counters, M, N, K, whole, splits,     \
		                                           per, status,                                                                   \
		                                           SwNorm{nullptr, 0, nullptr, nullptr, 0, (float*)sq, sqTiles, eps});            \
	}
LINEAR_SWAP_NORM_INSTANCES(LINEAR_SWAP_NORM)

// The norm's halves with a split tile's sums in its cluster of CL (see
// above): the producer's and the consumer's plain, for plans of CL splits a
// tile and no whole tiles (Qwen2-7B's o and down at 16 rows in 4, qkv in 3).
#define LINEAR_SWAP_CLUSTER(ADDNORM_NAME, RSTD_NAME, ROWS, ST, CL)                                                              \
	extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(SW_THREADS, 1)                                      \
	    ADDNORM_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op,                 \
	                 const void* bias, int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits,      \
	                 int per, int* status, bf16* resid, int rp, const bf16* gamma, bf16* u, int up, float* sq) {                  \
		linear_swap<ROWS, ST, bf16, false, SW_ADDNORM, CL>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole, \
		                                                   splits, per, status, SwNorm{resid, rp, gamma, u, up, sq, 0, 0.0f});    \
	}                                                                                                                             \
	extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(SW_THREADS, 1)                                      \
	    RSTD_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op, const void* bias,  \
	              int biasType, float* part, int* counters, int M, int N, int K, int whole, int splits, int per, int* status,     \
	              const float* sq, int sqTiles, float eps) {                                                                      \
		linear_swap<ROWS, ST, bf16, false, SW_RSTD, CL>(&xmap, &wmap, out, op, bias, biasType, part, counters, M, N, K, whole,    \
		                                                splits, per, status,                                                      \
		                                                SwNorm{nullptr, 0, nullptr, nullptr, 0, (float*)sq, sqTiles, eps});       \
	}
LINEAR_SWAP_CLUSTER_INSTANCES(LINEAR_SWAP_CLUSTER)
