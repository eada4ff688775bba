// linear_wgmma: out = x·wᵀ + bias for prefill's many rows on Hopper (sm_90a
// only: wgmma, setmaxnreg, stmatrix and the copy engine's tensor copies),
// the "wgmma" variants of linear, and with SwiGLU in its epilogue those of
// linear_swiglu (LwSwiGLU below). Rounding as torch's addmm and cuBLAS with
// beta = 1 over bf16 bias rows (naive's Linear): the sum in f32, the bias
// in bf16 (the host rounds any other bias into a bf16 copy, as those rows
// are), out = round(acc + bias) once.
//
// Operands (pitches in elements, each a multiple of 8, every matrix on a
// 16-byte boundary: what the tensor maps need):
//   xmap  x bf16 [M, K], box {64, LW_BM}
//   wmap  w bf16 [N, K], box {64, BN} (LwPlain); with LwSwiGLU w [2N, K],
//         the gate rows then the up rows, box {64, BN/2}; in clusters
//         (CLUSTER = 2, below) box {64, BN/2} for both
//   omap  out bf16 [M, N], box {HG_BOX, 64}
//   all three with the 128-byte swizzle; elements past a map's bounds read
//   as zeros and are not written.
//   bias bf16 [N], or null for none, on a 4-byte boundary and readable up to
//   an even length (read in pairs); group ≥ 1.
//
// Persistent blocks (one an SM) of three warpgroups walk the output tiles t
// = blockIdx.x, + gridDim.x, ... in LwTiles's order: swaths of `group`
// m-tiles, m-tile fastest within a swath, so that the blocks running at
// once share about group m-tiles of x and SMs/group n-tiles of w in L2
// (n-fastest, group_wgmma's order, would stream all of w once per m-tile).
//   - warpgroup 0, the producer (setmaxnreg down to LW_PRODUCER_REGS): one
//     thread fills a ring of STAGES stages (hop_gemm.cuh's HopRing), each
//     LW_BM rows of x and BN rows of w over HG_BK k, by two tensor copies.
//     K's tail, rows past M and columns past N come in as zeros.
//   - warpgroups 1 and 2, the consumers (setmaxnreg up to
//     LW_CONSUMER_REGS), own 64 rows of the tile each and all BN columns:
//     hop_gemm_steps, four wgmma m64nBNk16 a stage, one stage in flight
//     while the next is issued. The epilogue E turns the accumulators into
//     output columns 8 at a time; stmatrix puts them into one of the
//     warpgroup's LW_OUT_BUFS boxes of 64 rows × HG_BOX columns in the
//     layout the tensor copies swizzle, and one thread stores each box by a
//     tensor copy, which runs on while the warpgroup fills the next box and
//     starts the next tile's wgmmas (the producer has its stages loaded
//     meanwhile). Before a box is written, its buffer's last store must
//     have read it: thread 0 waits for the stores before the barrier that
//     precedes each store, so the store of box b overlaps the filling of b+1.
//   With HOLD (the _h instances: variants wgmma_hold, wgmma_hold_mc2) the
//     epilogue never waits for a store: the tensor cores idle from a
//     tile's last wgmma to the next tile's first in this cooperative
//     kernel, and each box's wait for the previous box's store (four a
//     tile at BN = 256) is a store's latency of it. The consumers keep the stage of
//     the tile's last k-step instead of releasing it (hop_gemm_steps'
//     keep_last; a barrier of both consumers then says that no wgmma reads
//     it), and a warpgroup writes all its boxes at once: the first
//     LW_OUT_BUFS into its own buffers, the rest (HELD) into its part of
//     that stage; then one barrier, and thread 0 stores them all. In the
//     next tile, once its second k-step is issued, thread 0 waits for the
//     stores to have read their boxes (long done) and releases the held
//     stage for its warpgroup's four warps (HopRing::release_for; in a
//     cluster on both blocks, whose producers multicast into it). The
//     producer has the other STAGES - 1 stages loaded for the next tile
//     meanwhile. Not measured.
//
// In clusters (CLUSTER = 2, the _c2 instances: variants wgmma_mc2 and
// wgmma_n128_mc2) the two blocks of a cluster take two m-tiles of one
// n-tile, rank r m-tile 2i + r (the units of LwTiles are those pairs), so
// that they read the same w: each producer copies its own x and half of the
// stage's w rows, that half by multicast into both blocks' shared memory,
// and w crosses from L2 once a cluster instead of once a block. Each
// block's full barrier expects the whole stage (its x, its half of w and
// the other's), and its empty barrier counts the consumer warps of both
// blocks (each warp arrives on both), since the other producer's next copy
// writes into this block's stage too. Where the m-tiles are odd, the second
// block of the last pair lies past M: it copies the last m-tile's x (any
// rows would do), does the same work, and its stores fall past M. A cluster
// barrier follows the barriers' initialization (no copy or arrival reaches
// a barrier not yet initialized) and ends the consumers (no arrival reaches
// a block that has exited).
//
// The epilogue is a type, chosen when the kernel is instantiated:
//   E::COLS      the output columns of a tile (a multiple of HG_BOX): N
//                is out's columns, tiles cover them COLS at a time;
//   E::W_BOXES   the tensor copies of w rows a stage takes (BN / W_BOXES
//                rows each, wmap's box), and e.w_row(nt, b) where copy b
//                of n-tile nt starts among w's rows;
//   e.load(col0, lane)  before a tile's k-steps, whose first output column
//                is col0: loads what frag needs of this thread's columns
//                into registers, so that the loads land under the wgmmas;
//   e.frag(acc, j, row, col, lo, hi)  output 8-column block j of the tile
//                as this thread's bf16 pairs: columns col and col + 1
//                (global) of rows row (lo) and row + 8 (hi).
// LwPlain (COLS = BN, one copy of BN rows) adds the bias. LwSwiGLU (COLS =
// BN/2) loads a stage's w as two copies of BN/2 rows, the gate rows of the
// tile's columns then their up rows (group_wgmma's way: w as HF stacks
// gate_proj over up_proj), so block j takes gate from acc[j] and up from
// acc[j + BN/16], the same columns of the same thread. A residual add would
// read out's old values.
//
// A wait that lasts HOP_WAIT_CYCLES records what it waited for in status
// (HG_WAIT_*, block, thread, k-step counter, parity) and the kernel winds
// down instead of hanging.

#include "hop_gemm.cuh"
#include "instances.cuh"

#define LW_BM (64 * HG_CONSUMERS) // rows of a tile
#define LW_THREADS (128 * (1 + HG_CONSUMERS))
#define LW_PRODUCER_REGS 40       // setmaxnreg of the producer warpgroup
#define LW_CONSUMER_REGS 232      // and of the consumers
#define LW_OUT_BUFS 2             // output boxes a consumer warpgroup stages at once
#define LW_WG_BAR 1               // named barrier of consumer warpgroup w: LW_WG_BAR + w
#define LW_BOTH_BAR (LW_WG_BAR + HG_CONSUMERS) // named barrier of all the consumer warpgroups (HOLD)
static_assert(HG_REGS_FIT(LW_PRODUCER_REGS, LW_CONSUMER_REGS, LW_THREADS), "setmaxnreg asks for more registers than the block has");

// LwLayout is the shared memory of linear_wgmma<BN, STAGES, E>: per stage
// the x tile (LW_BM rows) then the w tile (BN rows), rows of 128 bytes;
// then each consumer's output boxes.
template <int BN, int STAGES> struct LwLayout {
	static constexpr int A_BYTES = LW_BM * HG_ROW_BYTES;
	static constexpr int B_BYTES = BN * HG_ROW_BYTES;
	static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
	static constexpr int OUT = STAGES * STAGE_BYTES;  // the first output box
	static constexpr int OUT_BYTES = 64 * HG_BOX * 2; // a box: a consumer's 64 rows
	static constexpr int ALIGN = 1024;                // the 128-byte swizzle's period; the dynamic base is rounded up to it
	static constexpr int SMEM = OUT + HG_CONSUMERS * LW_OUT_BUFS * OUT_BYTES + ALIGN;
};

// LwTiles numbers the output tiles of mtiles × ntiles in swaths of group
// m-tiles (the last swath may have fewer), each walked m-tile fastest,
// then n-tile by n-tile.
struct LwTiles {
	int mtiles, ntiles, group;

	__device__ int total() const { return mtiles * ntiles; }

	__device__ void at(int t, int& mt, int& nt) const {
		const int per = group * ntiles; // tiles of a full swath
		const int sw = t / per, in = t - sw * per;
		const int rows = min(group, mtiles - sw * group);
		nt = in / rows;
		mt = sw * group + in - nt * rows;
	}
};

// LwPlain is the plain epilogue of tiles of BN columns: out = acc + bias,
// rounded once; no bias when bias is null. A thread's bias pairs (one
// register of two bf16 per 8-column block: 32 at BN = 256) are loaded with
// the tile and first read in its epilogue, so the loads land under the
// wgmmas; columns past N take zeros (the tensor stores leave them).
template <int BN> struct LwPlain {
	static constexpr int COLS = BN;
	static constexpr int W_BOXES = 1;
	const unsigned* bias; // bf16 pairs
	int N;
	unsigned b[BN / 8]; // bias[col], bias[col + 1] of block j

	__device__ __forceinline__ int w_row(int nt, int) const { return nt * BN; }

	__device__ __forceinline__ void load(int col0, int lane) {
		if (!bias) return;
#pragma unroll
		for (int j = 0; j < BN / 8; j++) {
			const int col = col0 + 8 * j + 2 * (lane & 3);
			b[j] = col < N ? __ldg(bias + col / 2) : 0u;
		}
	}

	template <int NB>
	__device__ __forceinline__ void frag(const float (&acc)[NB][4], int j, int, int, unsigned& lo, unsigned& hi) const {
		float b0 = 0.0f, b1 = 0.0f;
		if (bias) {
			b0 = __uint_as_float(b[j] << 16); // the pair widened to f32: the low bf16, then the high
			b1 = __uint_as_float(b[j] & 0xffff0000u);
		}
		lo = pack2(acc[j][0] + b0, acc[j][1] + b1);
		hi = pack2(acc[j][2] + b0, acc[j][3] + b1);
	}
};

// LwSwiGLU is the epilogue of the MLP's gate/up projection: tiles of BN/2
// output columns, out = silu(gate) · up with w's gate rows [0, inter) and up
// rows [inter, 2·inter), rounded as HF's act_fn(gate_proj(x)) * up_proj(x)
// in bf16 and as fused's swiglu: gate and up to bf16 (the projection's
// output), silu(gate) to bf16, the product to bf16. The gate copy of the
// last n-tile may run past inter into up rows, and the up copy past 2·inter
// (zeros): both only feed columns past inter, which the stores leave.
template <int BN> struct LwSwiGLU {
	static constexpr int COLS = BN / 2;
	static constexpr int W_BOXES = 2;
	int inter; // I: out's columns, the first up row of w

	__device__ __forceinline__ int w_row(int nt, int b) const { return b * inter + nt * COLS; }

	__device__ __forceinline__ void load(int, int) {}

	__device__ __forceinline__ static float act(float g, float u) {
		g = round_bf16(g);
		return round_bf16(g / (1.0f + expf(-g))) * round_bf16(u);
	}

	template <int NB>
	__device__ __forceinline__ void frag(const float (&acc)[NB][4], int j, int, int, unsigned& lo, unsigned& hi) const {
		static_assert(NB == BN / 8, "the accumulators of BN columns: gate blocks, then up blocks");
		constexpr int UP = BN / 16; // the first up block
		lo = pack2(act(acc[j][0], acc[j + UP][0]), act(acc[j][1], acc[j + UP][1]));
		hi = pack2(act(acc[j][2], acc[j + UP][2]), act(acc[j][3], acc[j + UP][3]));
	}
};

// lw_first is the first unit of work of this block (of its cluster, with
// CLUSTER > 1), lw_stride the grid's blocks (clusters) between its units.
template <int CLUSTER> __device__ __forceinline__ int lw_first() { return CLUSTER == 1 ? (int)blockIdx.x : cluster_id(); }
template <int CLUSTER> __device__ __forceinline__ int lw_stride() { return CLUSTER == 1 ? (int)gridDim.x : cluster_count(); }

// linear_wgmma: see the top of this file. Launch: a persistent grid (at most
// one block an SM, at most the tiles; with CLUSTER > 1 whole clusters, at
// most as many as run at once and as the tiles' units), LW_THREADS threads,
// LwLayout<BN, STAGES>::SMEM bytes of dynamic shared memory.
template <int BN, int STAGES, int CLUSTER, bool HOLD, typename E>
__device__ __forceinline__ void linear_wgmma(const TmaMap* xmap, const TmaMap* wmap, const TmaMap* omap, E epi, int M, int N,
                                             int K, int group, int* status) {
	typedef LwLayout<BN, STAGES> L;
	constexpr int OUT_COLS = E::COLS;
	// w's tensor copies a stage: E's, each cut into as many as the cluster
	// has blocks; block rank issues copies rank, rank + CLUSTER, ...
	constexpr int W_COPIES = E::W_BOXES > CLUSTER ? E::W_BOXES : CLUSTER;
	constexpr int W_CUT = W_COPIES / E::W_BOXES, W_ROWS = BN / W_COPIES; // copies of an E box; rows of a copy (wmap's box)
	static_assert(OUT_COLS % HG_BOX == 0, "a tile's output is whole boxes");
	// With HOLD, a warpgroup's boxes past its LW_OUT_BUFS go into the
	// stage of the tile's last k-step, HELD of them a warpgroup.
	constexpr int BOXES = OUT_COLS / HG_BOX, HELD = HOLD && BOXES > LW_OUT_BUFS ? BOXES - LW_OUT_BUFS : 0;
	static_assert(HELD * HG_CONSUMERS * L::OUT_BYTES <= L::STAGE_BYTES, "the held boxes fit in a stage");
	static_assert(W_COPIES % E::W_BOXES == 0 && W_COPIES % CLUSTER == 0 && BN % W_COPIES == 0 && W_ROWS % 8 == 0,
	              "w's copies are whole 8-row core matrices, as many for each block of a cluster");
	extern __shared__ unsigned char smem_raw[];
	__shared__ __align__(8) unsigned long long bars[2 * STAGES];

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	auto sA = [&](int s) { return base + s * L::STAGE_BYTES; };
	auto sB = [&](int s) { return base + s * L::STAGE_BYTES + L::A_BYTES; };
	auto sOut = [&](int w, int b) { return base + L::OUT + (w * LW_OUT_BUFS + b) * L::OUT_BYTES; };
	auto sHeld = [&](int s, int w, int b) { return base + s * L::STAGE_BYTES + (w * HELD + b) * L::OUT_BYTES; };
	const HopRing<STAGES, CLUSTER> ring{bars};

	// full: the expect_tx arrival; empty: one arrival per consumer warp of
	// the cluster. In a cluster, no block copies into another's stages or
	// arrives on its barriers before that block has initialized them.
	if (threadIdx.x == 0) ring.init(1, HG_CONSUMERS * 4 * CLUSTER);
	if constexpr (CLUSTER == 1)
		__syncthreads();
	else
		cluster_sync();

	// The tiles' units: CLUSTER m-tiles of one n-tile, which the blocks of
	// a cluster take, rank r m-tile CLUSTER·i + r (past the last m-tile
	// when their count is not a multiple: see the producer), walked in
	// swaths of group m-tiles as the tiles are without clusters.
	const int mtiles = (M + LW_BM - 1) / LW_BM;
	const LwTiles tiles{(mtiles + CLUSTER - 1) / CLUSTER, (N + OUT_COLS - 1) / OUT_COLS, CLUSTER == 1 ? group : max(1, group / CLUSTER)};
	const int rank = CLUSTER == 1 ? 0 : (int)cluster_rank();
	const int total = tiles.total();
	const int ktiles = (K + HG_BK - 1) / HG_BK;
	const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
	if (wg == 0) {
		// The producer: one thread issues every copy. In a cluster it
		// multicasts its copies of w to every block, and each block's full
		// barrier expects the whole stage: its x, its copies of w and the
		// others'. A block whose m-tile lies past M (the last unit's, when
		// the m-tiles do not divide among the cluster) copies x of the last
		// m-tile instead: its outputs all fall past M, which the stores
		// leave, but it takes its share of w's copies.
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(LW_PRODUCER_REGS));
		if (tid != 0) return;
		int it = 0; // k-steps issued so far, over all of this block's tiles
		for (int t = lw_first<CLUSTER>(); t < total; t += lw_stride<CLUSTER>()) {
			int mt, nt;
			tiles.at(t, mt, nt);
			for (int kt = 0; kt < ktiles; kt++, it++) {
				const int s = ring.stage(it);
				if (!ring.acquire(it, status, HG_WAIT_EMPTY)) return;
				const unsigned full = ring.full(s);
				mbar_expect_tx(full, L::STAGE_BYTES);
				tma_load_2d(sA(s), xmap, full, kt * HG_BK, (CLUSTER == 1 ? mt : min(mt * CLUSTER + rank, mtiles - 1)) * LW_BM);
#pragma unroll
				for (int c = 0; c < W_COPIES / CLUSTER; c++) {
					const int b = c * CLUSTER + rank; // the copy: rows [b·W_ROWS, (b+1)·W_ROWS) of the stage's w
					const unsigned dst = sB(s) + b * W_ROWS * HG_ROW_BYTES;
					const int wrow = epi.w_row(nt, b / W_CUT) + b % W_CUT * W_ROWS;
					if constexpr (CLUSTER == 1)
						tma_load_2d(dst, wmap, full, kt * HG_BK, wrow);
					else
						tma_load_2d_multicast(dst, wmap, full, kt * HG_BK, wrow, (1u << CLUSTER) - 1);
				}
			}
		}
		return;
	}

	// A consumer: warpgroup w owns the tile's rows [64w, 64w+64), warp wi
	// of it 16 of them, this thread rows lane/4 and lane/4 + 8 of those.
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(LW_CONSUMER_REGS));
	const int w = wg - 1, wi = tid / 32, lane = tid % 32;
	auto a = [&](int s) { return sA(s) + 64 * w * HG_ROW_BYTES; }; // this warpgroup's rows of the stage
	// The row of a box whose address this lane gives to stmatrix (lanes
	// 8i..8i+7 give matrix i's rows: i odd the lower 8 of the warp's 16),
	// and the 16-byte chunk (of the pair 2p, 2p+1) it falls in.
	const int srow = 16 * wi + 8 * ((lane >> 3) & 1) + (lane & 7), schunk = lane >> 4;
	float acc[BN / 8][4];
	int it = 0, box = 0;
	int held = -1; // HELD: the stage that holds the last tile's boxes until their stores have read them; -1 none
	for (int t = lw_first<CLUSTER>(); t < total; t += lw_stride<CLUSTER>()) {
		int mt, nt;
		tiles.at(t, mt, nt);
		mt = mt * CLUSTER + rank;
		const int row = mt * LW_BM + 64 * w, col0 = nt * OUT_COLS; // the warpgroup's first row, the tile's first column
		epi.load(col0, lane);
		if constexpr (HOLD) {
			// The boxes are written at once and stored at once, no wait
			// between them: the stores of the last tile, issued a main loop
			// ago, have read them by the time this tile's second k-step is
			// issued, where thread 0 waits for them (a formality) and frees
			// the held stage for the warpgroup's four warps.
			const int last = ktiles - 1 < 1 ? ktiles - 1 : 1;
			auto step = [&](int kt) {
				if (HELD > 0 && kt == last && held >= 0) {
					if (tid == 0) {
						tma_store_wait();
						ring.release_for(held, 4);
					}
					held = -1;
				}
			};
			const bool ok = hop_gemm_steps<BN, STAGES, false>(acc, ring, it, ktiles, a, sB, status, HG_WAIT_FULL, HELD > 0, step);
			if (tid == 0) tma_store_wait(); // the last tile's boxes are read (without HELD, the first wait for them)
			// With HELD, both consumers: the stage's wgmmas are done in
			// both before either writes boxes into it; a wait that gave up
			// stops both.
			if (!(HELD > 0 ? bar_all(LW_BOTH_BAR, 128 * HG_CONSUMERS, ok) : bar_all(LW_WG_BAR + w, 128, ok))) break;
#pragma unroll
			for (int c = 0; c < BOXES; c++) {
				const unsigned buf = c < LW_OUT_BUFS ? sOut(w, c) : sHeld(ring.stage(it - 1), w, c - LW_OUT_BUFS);
				hg_box(epi, acc, c, buf, row + 16 * wi + lane / 4, col0, lane, srow, schunk);
			}
			fence_async_shared();
			bar_sync(LW_WG_BAR + w, 128);
			if (tid == 0) {
#pragma unroll
				for (int c = 0; c < BOXES; c++)
					tma_store_2d(omap, c < LW_OUT_BUFS ? sOut(w, c) : sHeld(ring.stage(it - 1), w, c - LW_OUT_BUFS), col0 + c * HG_BOX,
					             row);
				tma_store_commit();
			}
			if (HELD > 0) held = ring.stage(it - 1);
			continue;
		}
		const bool ok = hop_gemm_steps<BN, STAGES, false>(acc, ring, it, ktiles, a, sB, status, HG_WAIT_FULL);
		if (!bar_all(LW_WG_BAR + w, 128, ok)) break; // a wait gave up: the warpgroup stops together

		// Epilogue: the warpgroup's 64 rows from row, in boxes of HG_BOX
		// output columns.
#pragma unroll
		for (int c = 0; c < OUT_COLS / HG_BOX; c++) {
			const unsigned buf = sOut(w, box % LW_OUT_BUFS);
			hg_box(epi, acc, c, buf, row + 16 * wi + lane / 4, col0, lane, srow, schunk);
			fence_async_shared();
			if (tid == 0) tma_store_wait(); // the earlier boxes are read: the next box's buffer is free
			bar_sync(LW_WG_BAR + w, 128);
			if (tid == 0) {
				tma_store_2d(omap, buf, col0 + c * HG_BOX, row);
				tma_store_commit();
			}
			box++;
		}
	}
	if (tid == 0) tma_store_wait(); // shared memory outlives the stores' reads
	if constexpr (CLUSTER > 1) {
		// No block leaves while another's consumers may still arrive on its
		// empty barriers (every copy into its stages it has waited for).
		__syncwarp();
		cluster_sync();
	}
}

// The instances (named as in linear_wgmma.go's lwConfigs): tiles of BN
// w rows through STAGES stages, in clusters of CL blocks along x (1: none),
// the epilogue holding the last stage or not (HOLD 1 or 0), with the plain
// epilogue (linear) and with SwiGLU's (linear_swiglu: N is out's columns,
// I; its two boxes a warpgroup fit its own buffers, so with HOLD it holds
// no stage and only moves the wait for the stores to the next tile).
#define LW_CLUSTER_DIMS_1
#define LW_CLUSTER_DIMS_2 __cluster_dims__(2, 1, 1)
#define LINEAR_WGMMA(NAME, SWIGLU_NAME, BN, ST, CL, HOLD)                                                                       \
	extern "C" __global__ void LW_CLUSTER_DIMS_##CL __launch_bounds__(LW_THREADS, 1)                                      \
	    NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap omap, \
	         const unsigned* bias, int M, int N, int K, int group, int* status) {                                          \
		linear_wgmma<BN, ST, CL, HOLD>(&xmap, &wmap, &omap, LwPlain<BN>{bias, N}, M, N, K, group, status);                     \
	}                                                                                                                     \
	extern "C" __global__ void LW_CLUSTER_DIMS_##CL __launch_bounds__(LW_THREADS, 1)                                      \
	    SWIGLU_NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap,                              \
	                const __grid_constant__ TmaMap omap, int M, int N, int K, int group, int* status) {                   \
		linear_wgmma<BN, ST, CL, HOLD>(&xmap, &wmap, &omap, LwSwiGLU<BN>{N}, M, N, K, group, status);                          \
	}
LINEAR_WGMMA_INSTANCES(LINEAR_WGMMA)
