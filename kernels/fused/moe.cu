// DeepSeek-V2's routed experts on tensor cores: the router (moe_route), the
// tokens' choices sorted by expert into groups padded to the GEMM's M tile
// (moe_align), a grouped GEMM for every expert's gate and up projections
// with SwiGLU in its epilogue (moe_gate_up), the same grouped GEMM for the
// down projections (group_gemm, also the group_gemm op), and the weighted
// sum of each token's experts (moe_combine). Nothing is read on the host:
// grids are sized for the worst case and blocks past the work exit (or, at
// decode's tiling, a persistent grid takes the tiles from a counter:
// group_gemm_dyn), so one path serves a decode step inside a CUDA graph
// and an 11K-token prefill.
//
// Rounding is HF's bf16 path (transformers' grouped experts): gate and up
// rounded to bf16, silu(gate) rounded, its product with up rounded; each
// expert's down output rounded; the routing-weighted sum over a token's
// experts in f32 in choice order, rounded once.

#include "mma.cuh"
#include "groups.cuh"
#include "route.cuh"
#include "instances.cuh"

// ROUTE_WARPS tokens per block of moe_route, a warp each (route.cuh's
// route_token). MAX_GROUPS (groups.cuh) is the most groups group_gemm
// schedules (and experts moe_align sorts into).
#define ROUTE_WARPS 4

// moe_align_count and moe_align run ALIGN_BLOCKS blocks of ALIGN_THREADS
// threads (one expert a thread where they scan: MAX_GROUPS at most); each
// of their ALIGN_CHUNKS warps owns a chunk of the choices. ALIGN_STEPS is
// the steps of 32 choices whose experts a warp loads at once before it
// takes them.
#define ALIGN_THREADS 256
#define ALIGN_BLOCKS 16
#define ALIGN_WARPS (ALIGN_THREADS / 32)
#define ALIGN_CHUNKS (ALIGN_BLOCKS * ALIGN_WARPS)
#define ALIGN_STEPS 8
static_assert(ALIGN_THREADS >= MAX_GROUPS, "a thread an expert");
static_assert(ALIGN_CHUNKS % 4 == 0, "a scan reads a chunk's counts four at a time");

// ---------------------------------------------------------------- routing

// moe_route routes each token (route_token), a warp a token.
//   idx i32 [N, ip], weight f32 [N, wp] (K columns written); logits f32
//   [N, lp] (E columns read); the router's configuration as Route's.
// Launch: grid.x = ceil(N / ROUTE_WARPS), ROUTE_WARPS·32 threads.
extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route(int* idx, int ip, float* weight, int wp, const float* logits, int lp, int N, int E, int K,
              int groupLimited, int groups, int topkGroups, int norm, float scale) {
	__shared__ float stage[ROUTE_WARPS][32 * ROUTE_PER_LANE];
	grid_wait();
	grid_release();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int t = blockIdx.x * ROUTE_WARPS + warp;
	if (t >= N) return;
	const Route r{E, K, groupLimited, groups, topkGroups, norm, scale};
	int e;
	float w;
	route_token(logits + (long long)t * lp, r, stage[warp], e, w);
	if (lane < K) {
		idx[(long long)t * ip + lane] = e;
		weight[(long long)t * wp + lane] = w;
	}
}

// ---------------------------------------------------------- grouped GEMM

// fold_rank is choice i's place among its expert's choices: how many
// choices before it chose the same expert (ex: fold_count's).
__device__ __forceinline__ int fold_rank(const int* ex, int i) {
	const int e = ex[i];
	int rank = 0;
	for (int j = 0; j < i; j++) rank += ex[j] == e;
	return rank;
}

// find_tile maps m-tile mt of a grouped GEMM to its group (groups.cuh:
// group_tile_starts, then group_of_tile). It sets the tile's group g, its
// first row and the group's end, or returns false when mt is past the work
// (the block exits).
template <int BM>
__device__ bool find_tile(const int* first, int E, int M, int mt, int& g, int& row0, int& rowEnd) {
	__shared__ int start[MAX_GROUPS + 1]; // start[g]: group g's first m-tile
	if (threadIdx.x < 32) group_tile_starts<BM>(first, E, M, start);
	__syncthreads();
	if (mt >= start[E]) return false;
	g = group_of_tile(start, E, mt);
	row0 = first[g] + (mt - start[g]) * BM;
	rowEnd = first[g + 1];
	return true;
}

// GemmRing is the layout of group_gemm_tile's cp.async ring in dynamic
// shared memory: STAGES stages, each BM rows of x then BN rows of w, BK
// wide (Tile<BK>); k-tile kt goes to stage kt % STAGES. BYTES is the
// dynamic shared memory a block is launched with (moe.go's
// gemmConfig.shared, held to it by TestGemmConfigsCompile).
template <int BM, int BN, int BK, int STAGES> struct GemmRing {
	static constexpr int A_BYTES = BM * Tile<BK>::ROW_BYTES, STAGE_BYTES = (BM + BN) * Tile<BK>::ROW_BYTES;
	static constexpr int BYTES = STAGES * STAGE_BYTES;
	// a is where k-tile kt's rows of x start; its rows of w follow, A_BYTES on.
	__device__ static unsigned a(unsigned base, int kt) { return base + (kt % STAGES) * STAGE_BYTES; }
};

// NoPre is group_gemm_tile's default Pre: nothing between a tile's first
// weights and its rows of x.
struct NoPre {
	__device__ void operator()() const {}
};

// group_gemm_tile is one tile of the grouped GEMM: for the BM rows from
// row0 of group g (rows to rowEnd, its end) and the BN-column n-tile nt0,
//   out[r, n] = Σ_k a(r)[k] · w[g, n, k]
// with a(r) = x row r, or, with a gather table, x row gather[r] / gdiv
// (a row whose gather entry is negative is zero: the padding of an
// expert's rows). With SWIGLU, w holds each group's gate rows [0, N/2)
// then its up rows [N/2, N), and the block computes BN/2 columns j of both
// and writes out[r, j] = bf16(bf16(silu(bf16(gate))) · bf16(up)), as HF
// rounds act_fn(gate_proj(x)) * up_proj(x); else out[r, n] = bf16(sum).
// Rows of the group past its end are not written.
//   out bf16 [M, op] (N or N/2 columns); x bf16 [*, xp] (K columns); gather
//   i32 [M] or null; w bf16 [E, N, K] packed; first i32 [E+1], ascending in
//   [0, M]. K and N are multiples of 8; rows start on 16-byte boundaries.
//   aRow [BM], bRow [BN]: the block's row tables in shared memory, written
//   here: the x row of each tile row and the w row (within the group) of
//   each tile column, -1 for none.
// Tiling: WARPS_M × WARPS_N warps, each a (BM/WARPS_M) × (BN/WARPS_N)
// tile of m16n8k16 mma.sync (bf16 in, f32 accumulate); K in BK-wide
// steps through a STAGES-deep cp.async ring of swizzled tiles (Tile<BK>:
// chunk c of row r at slot c ^ (r & 7), so ldmatrix reads 8 distinct bank
// groups); one barrier per step. With SWIGLU each warp's columns are half
// gate, half up, for the same intermediate columns, so one thread holds
// the gate and up of every output it writes.
// A block of WARPS_M·WARPS_N·32 threads with GemmRing's BYTES of dynamic
// shared memory runs it (group_gemm, group_gemm_dyn); it leaves
// the shared tiles and row tables in use (the caller synchronizes before
// the next).
// With early, the tile's first STAGES-1 k-tiles of w are queued first,
// as one cp.async group, then pre() runs (a wait for x: moe_one's down
// tile waits there for its rows' gate/up tiles) and only then their rows
// of x, a group a stage: the weights stream in under the wait. The groups
// complete in order, so the loop's wait for stage 0's rows of x covers
// the weights' group too.
// With FOLD and slots (each choice's row, shared, as moe_one's blocks hold
// them), a tile finds its rows there instead of ranking every choice again.
template <int BM, int BN, int WARPS_M, int WARPS_N, int BK, int STAGES, bool SWIGLU, bool FOLD, class Pre = NoPre>
__device__ __forceinline__ void group_gemm_tile(bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv,
                                                const bf16* w, const int* first, int N, int K, int choices, int g,
                                                int row0, int rowEnd, int nt0, int* aRow, int* bRow,
                                                bool early = false, Pre pre = {}, const int* slots = nullptr) {
	constexpr int THREADS = WARPS_M * WARPS_N * 32, WTM = BM / WARPS_M, WTN = BN / WARPS_N;
	constexpr int MT = WTM / 16, NT = WTN / 8;
	typedef Tile<BK> T;
	typedef GemmRing<BM, BN, BK, STAGES> Ring;
	constexpr int A_LOADS = BM * T::CHUNKS / THREADS, B_LOADS = BN * T::CHUNKS / THREADS; // 16-byte copies a thread
	static_assert(BK % 64 == 0 && WTM % 16 == 0 && WTN % 16 == 0, "tile shapes");
	static_assert(STAGES >= 2, "a ring of one stage would overwrite the k-tile being read");
	static_assert(BM * T::CHUNKS % THREADS == 0 && BN * T::CHUNKS % THREADS == 0, "whole copies per thread");
	static_assert(!SWIGLU || NT % 2 == 0, "a warp's columns split into gate and up halves of whole n-frags");
	extern __shared__ __align__(128) unsigned char smem[];

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wm = warp / WARPS_N, wn = warp % WARPS_N;
	if (FOLD) {
		// gather is each choice's expert (fold_count's, in shared memory):
		// the rows of this tile are the choices of group g whose rank
		// falls in it.
		for (int r = tid; r < BM; r += THREADS) aRow[r] = -1;
		__syncthreads();
		for (int i = tid; i < choices; i += THREADS) {
			if (gather[i] != g) continue;
			const int r = (slots != nullptr ? slots[i] : first[g] + fold_rank(gather, i)) - row0;
			if (r >= 0 && r < BM) aRow[r] = i / gdiv;
		}
	} else {
		for (int r = tid; r < BM; r += THREADS) {
			const int row = row0 + r;
			int src = -1;
			if (row < rowEnd) {
				if (gather == nullptr) src = row;
				else if (gather[row] >= 0) src = gather[row] / gdiv;
			}
			aRow[r] = src;
		}
	}
	for (int c = tid; c < BN; c += THREADS) {
		int wr = -1;
		if (SWIGLU) {
			const int half = WTN / 2, inter = N / 2;
			const int in = c % WTN, j = nt0 * (BN / 2) + (c / WTN) * half + in % half;
			if (j < inter) wr = in < half ? j : inter + j;
		} else {
			const int j = nt0 * BN + c;
			if (j < N) wr = j;
		}
		bRow[c] = wr;
	}
	__syncthreads();
	const bf16* wg = w + (long long)g * N * K;
	const unsigned base = smem_addr(smem);

	// rows copies loads 16-byte chunks a thread of the k-tile at k0 into
	// the tile at dst: tile row r from row idx[r] of src (pitch p), zeros
	// where that is -1 or past K.
	auto rows = [&](int loads, unsigned dst, const int* idx, const bf16* src, long long p, int k0) {
#pragma unroll
		for (int it = 0; it < loads; it++) {
			const int i = tid + it * THREADS, r = i / T::CHUNKS, c = i - r * T::CHUNKS, k = k0 + c * 8;
			const int row = idx[r];
			const bool ok = row >= 0 && k < K;
			cp16(T::at(dst, r, c), ok ? src + row * p + k : src, ok);
		}
	};
	auto load = [&](int kt) {
		const int k0 = kt * BK;
		const unsigned a = Ring::a(base, kt), b = a + Ring::A_BYTES;
		rows(A_LOADS, a, aRow, x, xp, k0);
		rows(B_LOADS, b, bRow, wg, K, k0);
	};

	const int ktiles = (K + BK - 1) / BK;
	if (early) {
#pragma unroll
		for (int s = 0; s < STAGES - 1; s++)
			if (s < ktiles) rows(B_LOADS, Ring::a(base, s) + Ring::A_BYTES, bRow, wg, K, s * BK);
		cp_commit();
		pre();
#pragma unroll
		for (int s = 0; s < STAGES - 1; s++) {
			if (s < ktiles) rows(A_LOADS, Ring::a(base, s), aRow, x, xp, s * BK);
			cp_commit();
		}
	} else {
#pragma unroll
		for (int s = 0; s < STAGES - 1; s++) {
			if (s < ktiles) load(s);
			cp_commit();
		}
	}
	float acc[MT][NT][4];
#pragma unroll
	for (int i = 0; i < MT; i++)
#pragma unroll
		for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

	for (int kt = 0; kt < ktiles; kt++) {
		cp_wait<STAGES - 2>();
		__syncthreads(); // step kt has landed; the stage step kt-1 read is free
		if (kt + STAGES - 1 < ktiles) load(kt + STAGES - 1);
		cp_commit();
		const unsigned a = Ring::a(base, kt), b = a + Ring::A_BYTES;
#pragma unroll
		for (int ks = 0; ks < BK / 16; ks++) {
			unsigned af[MT][4], bf[NT][2];
#pragma unroll
			for (int i = 0; i < MT; i++) ldsm_x4(af[i], T::at(a, wm * WTM + i * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
			for (int j = 0; j < NT / 2; j++) {
				unsigned r4[4];
				ldsm_x4(r4, T::at(b, wn * WTN + j * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
				bf[2 * j][0] = r4[0];
				bf[2 * j][1] = r4[1];
				bf[2 * j + 1][0] = r4[2];
				bf[2 * j + 1][1] = r4[3];
			}
#pragma unroll
			for (int i = 0; i < MT; i++)
#pragma unroll
				for (int j = 0; j < NT; j++) mma16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
		}
	}
	cp_wait<0>();

	// Epilogue: C fragments straight to global memory, two columns a store.
#pragma unroll
	for (int i = 0; i < MT; i++) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int row = row0 + wm * WTM + i * 16 + (lane >> 2) + 8 * h;
			if (row >= rowEnd) continue;
			bf16* dst = out + (long long)row * op;
			if (SWIGLU) {
				const int inter = N / 2;
#pragma unroll
				for (int j = 0; j < NT / 2; j++) {
					const int col = nt0 * (BN / 2) + wn * (WTN / 2) + j * 8 + 2 * (lane & 3);
					if (col >= inter) continue;
					float v[2];
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const float gt = round_bf16(acc[i][j][2 * h + e]);
						const float up = round_bf16(acc[i][j + NT / 2][2 * h + e]);
						v[e] = round_bf16(gt / (1.0f + expf(-gt))) * up;
					}
					*reinterpret_cast<unsigned*>(dst + col) = pack2(v[0], v[1]);
				}
			} else {
#pragma unroll
				for (int j = 0; j < NT; j++) {
					const int col = nt0 * BN + wn * WTN + j * 8 + 2 * (lane & 3);
					if (col >= N) continue;
					*reinterpret_cast<unsigned*>(dst + col) = pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
				}
			}
		}
	}
}

// group_gemm is the grouped GEMM a block a tile: the block computes m-tile
// blockIdx.y (see find_tile) and n-tile blockIdx.x (group_gemm_tile), or
// exits where blockIdx.y is past the work.
//   out, x, gather, w, first: group_gemm_tile's; M the rows of the bound.
// Launch: grid (ceil(N / BN) — ceil(N/2 / (BN/2)) with SWIGLU —, an upper
// bound of the m-tiles), group_gemm_tile's block.
template <int BM, int BN, int WARPS_M, int WARPS_N, int BK, int STAGES, bool SWIGLU, bool FOLD = false>
__device__ void group_gemm(bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv, const bf16* w,
                           const int* first, int E, int M, int N, int K, int choices = 0) {
	__shared__ int aRow[BM], bRow[BN];
	int g, row0, rowEnd;
	if (!find_tile<BM>(first, E, M, blockIdx.y, g, row0, rowEnd)) return;
	group_gemm_tile<BM, BN, WARPS_M, WARPS_N, BK, STAGES, SWIGLU, FOLD>(out, op, x, xp, gather, gdiv, w, first, N, K,
	                                                                    choices, g, row0, rowEnd, blockIdx.x, aRow, bRow);
}

// tickets_done counts the block out of a persistent grid's ticket pair
// (counter 0 the tickets, 1 the blocks finished) once it has taken its
// last ticket, a fence between the two, and in thread 0 of the grid's last
// block sets the pair back to zero (after a second fence, when no block
// takes a ticket any more, so that no increment can be lost under the
// reset) and returns true; false elsewhere. Thread 0 of every block calls
// it last.
__device__ __forceinline__ bool tickets_done(int* pair) {
	if (threadIdx.x != 0) return false;
	__threadfence(); // this block's last ticket before its count
	if (atomicAdd(&pair[1], 1) != (int)gridDim.x - 1) return false;
	__threadfence(); // every block's last ticket before the reset
	pair[0] = 0;
	pair[1] = 0;
	return true;
}

// NoAfter is group_gemm_dyn's default After: nothing after a tile.
struct NoAfter {
	__device__ void operator()(int, int) const {}
};

// The folded path's timestamp probe (an experiment's build, -DMOE_PROBE=1;
// TestMoEFoldProbe reads it): thread 0 of each block of the persistent
// gate/up (kernel 0) and down (kernel 1) kernels writes %globaltimer at
// each MoeStamp into moe_probe[kernel][block][stamp]. In the normal build
// moe_stamp is empty.
#define MOE_PROBE_BLOCKS 1024
#define MOE_PROBE_STAMPS 24
#define MOE_PROBE_TILES 4
// moe_one stamps its gate/up tiles as kernel 0 and its down tiles as
// kernel 1, where MOE_ENTRY is the block's first down ticket and
// MOE_WAITED the end of that tile's wait for its gate/up tiles.
enum MoeStamp {
	MOE_ENTRY,   // the kernel's first instruction
	MOE_WAITED,  // grid_wait returned
	MOE_COUNTED, // the routes counted, the tables ready (gate/up); the tile starts (both)
	MOE_TILE,    // MOE_TILE + 2i: tile i's ticket taken; + 2i + 1: its GEMM done, i < MOE_PROBE_TILES
	MOE_COMBINE = MOE_TILE + 2 * MOE_PROBE_TILES, // down: the n-tile's last arrival known (fold_last returned true)
	MOE_COMBINED, // down: the combine done
	MOE_EXIT,     // the block's last ticket and its count done
	MOE_SMID,     // value: the SM
	MOE_TILES,    // value: the block's tiles
};
#ifdef MOE_PROBE
__device__ unsigned long long moe_probe[2][MOE_PROBE_BLOCKS][MOE_PROBE_STAMPS];
__device__ __forceinline__ void moe_stamp(int k, int s, unsigned long long v = ~0ull) {
	if (threadIdx.x != 0 || blockIdx.x >= MOE_PROBE_BLOCKS || blockIdx.y != 0) return;
	if (v == ~0ull) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v)::"memory");
	moe_probe[k][blockIdx.x][s] = v;
}
#else
__device__ __forceinline__ void moe_stamp(int, int, unsigned long long = 0) {}
#endif

// group_gemm_dyn is group_gemm on a persistent grid: instead of a block a
// tile of the bound, most of which find no work at decode (the bound
// counts up to a tile of padding for every expert), each block takes
// tickets from a counter until they run past the work. Ticket t is m-tile
// t / ntiles and n-tile t % ntiles, so consecutive tickets share an
// expert's rows of x, and every tile is group_gemm's block (mt, nt): the
// same loads, products and epilogue, so the outputs are group_gemm's bit
// for bit. The work is start[E]·ntiles tiles (group_tile_starts:
// first[E]/BM where every group is padded to whole m-tiles, as moe_align
// pads them).
// counters[0] is the next ticket, counters[1] the blocks finished; both
// are zero when the grid starts, and the last block to finish sets them
// back to zero, so that a graph replays the launch with no memset. Every
// block takes its last ticket (the one past the work) before it counts
// itself finished, and a fence orders the two: when the last block counts
// itself, no block takes a ticket any more, and its reset cannot be lost
// under another block's increment.
// With FOLD, gather and first are fold_count's (shared), as group_gemm's
// FOLD takes them, and choices their count. After each tile every thread
// of the block calls after(nt, mtiles), the tile's n-tile and the m-tiles
// of the work (the folded down kernel's combine, group_gemm_fold); the
// default does nothing.
//   out, x, gather, w, first, E, M, N, K: group_gemm's; counters i32 [2],
//   a pair of its own per kernel (a kernel overlapping this one touches
//   its own pair only), zero between launches.
// Launch: 1-D, the blocks an SM holds times the SMs, at most ceil(N / BN)
// (ceil(N/2 / (BN/2)) with SWIGLU) times the bound of the m-tiles;
// group_gemm_tile's block. The caller has passed grid_wait: the counters,
// as first, are touched after it only.
template <int BM, int BN, int WARPS_M, int WARPS_N, int BK, int STAGES, bool SWIGLU, bool FOLD = false,
          class After = NoAfter>
__device__ void group_gemm_dyn(bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv, const bf16* w,
                               const int* first, int E, int M, int N, int K, int* counters, int choices = 0,
                               After after = {}) {
	__shared__ int aRow[BM], bRow[BN];
	__shared__ int start[MAX_GROUPS + 1]; // start[g]: group g's first m-tile
	__shared__ int ticket;
	const int ntiles = SWIGLU ? (N / 2 + BN / 2 - 1) / (BN / 2) : (N + BN - 1) / BN;
	constexpr int PK = SWIGLU ? 0 : 1;
	int tiles = 0;
	moe_stamp(PK, MOE_COUNTED);
	if (threadIdx.x < 32) group_tile_starts<BM>(first, E, M, start);
	for (;;) {
		if (threadIdx.x == 0) ticket = atomicAdd(&counters[0], 1);
		__syncthreads(); // the ticket (and, the first time, start) is written
		const int t = ticket;
		if (t >= start[E] * ntiles) break;
		if (tiles < MOE_PROBE_TILES) moe_stamp(PK, MOE_TILE + 2 * tiles);
		const int mt = t / ntiles, nt = t - mt * ntiles, g = group_of_tile(start, E, mt);
		const int row0 = first[g] + (mt - start[g]) * BM;
		group_gemm_tile<BM, BN, WARPS_M, WARPS_N, BK, STAGES, SWIGLU, FOLD>(out, op, x, xp, gather, gdiv, w, first, N, K,
		                                                                    choices, g, row0, first[g + 1], nt, aRow, bRow);
		if (tiles < MOE_PROBE_TILES) moe_stamp(PK, MOE_TILE + 2 * tiles + 1);
		tiles++;
		after(nt, start[E]);
		__syncthreads(); // every thread has read the ticket; the tiles and row tables are free
	}
	tickets_done(counters);
#ifdef MOE_PROBE
	unsigned sm;
	asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
	moe_stamp(PK, MOE_SMID, sm);
	moe_stamp(PK, MOE_TILES, tiles);
#endif
	moe_stamp(PK, MOE_EXIT);
}

// The tilings (named as in moe.go's gemmConfigs): m16 for decode, where
// each expert has a few rows and the weights stream through once; m64 for
// some hundred tokens; m128 for prefill, where the tensor cores bound it.
#define GROUP_GEMM(GEMM, GATE_UP, BM, BN, WM, WN, BK, ST)                                                        \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GEMM(bf16* out, int op, const bf16* x, int xp, const bf16* w, const int* first, int E, int M, \
	                      int N, int K) {                                                                          \
		grid_wait();                                                                                              \
		grid_release();                                                                                           \
		group_gemm<BM, BN, WM, WN, BK, ST, false>(out, op, x, xp, nullptr, 1, w, first, E, M, N, K);              \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GATE_UP(bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv, const bf16* w,   \
	                       const int* first, int E, int M, int N, int K) {                                         \
		grid_wait();                                                                                              \
		grid_release();                                                                                           \
		group_gemm<BM, BN, WM, WN, BK, ST, true>(out, op, x, xp, gather, gdiv, w, first, E, M, N, K);             \
	}
GROUP_GEMM_INSTANCES(GROUP_GEMM)

// The persistent-grid instances (group_gemm_dyn) of decode's tiling, m16
// (moe.go's dynTiling): its arguments and group_gemm's and moe_gate_up's,
// and the counter pair.
#define GROUP_GEMM_DYN(GEMM, GATE_UP, BM, BN, WM, WN, BK, ST)                                                    \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GEMM(bf16* out, int op, const bf16* x, int xp, const bf16* w, const int* first, int E, int M, int N, int K, \
	         int* counters) {                                                                                     \
		grid_wait();                                                                                              \
		grid_release();                                                                                           \
		group_gemm_dyn<BM, BN, WM, WN, BK, ST, false>(out, op, x, xp, nullptr, 1, w, first, E, M, N, K, counters); \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GATE_UP(bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv, const bf16* w,            \
	            const int* first, int E, int M, int N, int K, int* counters) {                                     \
		grid_wait();                                                                                              \
		grid_release();                                                                                           \
		group_gemm_dyn<BM, BN, WM, WN, BK, ST, true>(out, op, x, xp, gather, gdiv, w, first, E, M, N, K, counters); \
	}
GROUP_GEMM_DYN_INSTANCES(GROUP_GEMM_DYN)

// ------------------------------- decode: align and combine (and route) folded

// The folded decode path (moe.go's MoEExperts at tiling m16 and at most
// MOE_FOLD_MAX choices) runs the experts in two launches instead of four:
// every block of the gate/up kernel counts the choices itself and ranks
// those of its own expert (moe_align's work, a few hundred operations),
// and the last tile of each n-tile of the down kernel sums that tile's
// columns of every token (moe_combine's work). The rows, the products and
// the weighted sum are the unfolded path's, so the two agree bit for bit.
// Both kernels run a block a tile of the bound (MOE_FOLD) or on the
// persistent grid (MOE_FOLD_DYN, past a few tokens, where most of the
// bound's blocks would find no work): there every block counts and ranks
// the choices before it takes tickets, and the last tile of each down
// n-tile, whichever block runs it, sums that n-tile. The moe_routed op
// folds moe_route in too (moe_gate_up_route): every gate/up block routes
// the tokens itself, and the experts run in the same two launches after
// the router's logits.
#define MOE_FOLD_MAX 128

// padded_starts writes start[e], group e's first row, and start[E], all
// the rows, from count[e] of E groups: each count rounded up to whole
// m-tiles of bm rows, summed in group order (moe_align's offsets, and
// fold_count's). The 32 threads of one warp call it; the caller
// synchronizes before start is read.
__device__ void padded_starts(const int* count, int E, int bm, int* start) {
	const int lane = threadIdx.x & 31;
	int run = 0;
	for (int e0 = 0; e0 < E; e0 += 32) {
		const int e = e0 + lane;
		const int n = e < E ? (count[e] + bm - 1) / bm * bm : 0;
		int incl = n;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int v = __shfl_up_sync(FULL_MASK, incl, o);
			if (lane >= o) incl += v;
		}
		if (e < E) start[e] = run + incl - n;
		run += __shfl_sync(FULL_MASK, incl, 31);
	}
	if (lane == 0) start[E] = run;
}

// fold_starts is the end of fold_count once every choice is counted in
// count: first[e], expert e's first padded row, the counts rounded up to
// whole m-tiles of BM rows. It synchronizes the block before and after.
template <int BM> __device__ void fold_starts(int* first, const int* count, int E) {
	__syncthreads();
	if (threadIdx.x < 32) padded_starts(count, E, BM, first);
	__syncthreads();
}

// fold_count is the first half of moe_align in one block's shared memory:
// ex[i] is choice i's expert and first[e] expert e's first padded row
// (fold_starts). A choice's row within its expert is its rank (fold_rank),
// so the order within an expert is choice order, as moe_align's. An expert
// outside [0, E) traps.
//   idx i32 [N, ip] (K columns); first [E+1], ex [≥ N·K], count [E]:
//   shared. N·K ≤ MOE_FOLD_MAX, E ≤ MAX_GROUPS.
template <int BM> __device__ void fold_count(int* first, int* ex, int* count, const int* idx, int ip, int N, int K, int E) {
	const int tid = threadIdx.x, choices = N * K;
	for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
	__syncthreads();
	for (int i = tid; i < choices; i += blockDim.x) {
		const int t = i / K, e = idx[(long long)t * ip + (i - t * K)];
		if (e < 0 || e >= E) __trap();
		ex[i] = e;
		atomicAdd(&count[e], 1);
	}
	fold_starts<BM>(first, count, E);
}

// fold_tables writes, from one block's fold_count (first and ex, shared),
// the tables the down kernel and its combine read, first [E+1] and slot
// [choices] (each choice's row), and moe_align's sorted (each row's
// choice, -1 for padding): moe_align's outputs, in choice order within an
// expert. One block calls it.
__device__ void fold_tables(int* first, int* sorted, int* slot, const int* sFirst, const int* ex, int choices, int E) {
	for (int e = threadIdx.x; e <= E; e += blockDim.x) first[e] = sFirst[e];
	for (int r = threadIdx.x; r < sFirst[E]; r += blockDim.x) sorted[r] = -1;
	__syncthreads();
	for (int i = threadIdx.x; i < choices; i += blockDim.x) {
		const int r = sFirst[ex[i]] + fold_rank(ex, i);
		slot[i] = r;
		sorted[r] = i;
	}
}

// moe_gate_up_fold is moe_gate_up over the choices of idx, which every
// block counts itself (fold_count; it ranks its own expert's); block
// (0, 0) also writes the tables (fold_tables). With DYN the blocks are a
// persistent grid that, once they have counted, take their tiles from the
// ticket pair tickets as group_gemm_dyn's (bit for bit the same tiles);
// else a block a tile, as group_gemm's.
//   out bf16 [M, op]; x bf16 [N, xp]; idx i32 [N, ip] (K columns); w, E, M,
//   NN (2I), KK (H): moe_gate_up's. first i32 [E+1], sorted i32 [M], slot
//   i32 [N·K] written. tickets i32 [2] (DYN only): group_gemm_dyn's
//   counters, zero between launches.
// Launch: moe_gate_up's grid and block (tiling of the instance), or with
// DYN group_gemm_dyn's.
template <int BM, int BN, int WM, int WN, int BK, int ST, bool DYN>
__device__ void moe_gate_up_fold(bf16* out, int op, const bf16* x, int xp, const int* idx, int ip, int N, int K,
                                 const bf16* w, int* first, int* sorted, int* slot, int E, int M, int NN, int KK,
                                 int* tickets) {
	__shared__ int sFirst[MAX_GROUPS + 1], sCount[MAX_GROUPS], sEx[MOE_FOLD_MAX];
	if constexpr (DYN) moe_stamp(0, MOE_ENTRY);
	grid_wait();
	if constexpr (DYN) moe_stamp(0, MOE_WAITED);
	grid_release();
	fold_count<BM>(sFirst, sEx, sCount, idx, ip, N, K, E);
	const int choices = N * K;
	if (blockIdx.x == 0 && blockIdx.y == 0) fold_tables(first, sorted, slot, sFirst, sEx, choices, E);
	if constexpr (DYN)
		group_gemm_dyn<BM, BN, WM, WN, BK, ST, true, true>(out, op, x, xp, sEx, K, w, sFirst, E, M, NN, KK, tickets, choices);
	else group_gemm<BM, BN, WM, WN, BK, ST, true, true>(out, op, x, xp, sEx, K, w, sFirst, E, M, NN, KK, choices);
}

// fold_route routes the N tokens in one block, a warp a token (route_token,
// moe_route's code, so the routes are moe_route's bit for bit): choice i's
// expert into ex[i] (shared), each expert's choices counted in count
// (shared, zeroed before); with tables also into idx i32 [N, ip] and
// weight f32 [N, wp]. stage is the warps' route_token scratch; the block
// has WARPS warps.
template <int WARPS>
__device__ __forceinline__ void fold_route(const float* logits, int lp, int N, const Route r,
                                           float (*stage)[32 * ROUTE_PER_LANE], int* ex, int* count, bool tables,
                                           int* idx, int ip, float* weight, int wp) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = r.K;
	for (int t = warp; t < N; t += WARPS) {
		int e;
		float wt;
		__syncwarp(); // the warp's stage is free again
		route_token(logits + (long long)t * lp, r, stage[warp], e, wt);
		if (lane < K) {
			if (e < 0 || e >= r.E) __trap(); // no score won: NaN logits
			ex[t * K + lane] = e;
			atomicAdd(&count[e], 1);
			if (tables) {
				idx[(long long)t * ip + lane] = e;
				weight[(long long)t * wp + lane] = wt;
			}
		}
	}
}

// moe_gate_up_route is moe_route and moe_gate_up_fold in one kernel (the
// moe_routed op): every block routes the N tokens itself from their
// logits, a warp a token (route_token, moe_route's code, so the routes are
// moe_route's bit for bit), into shared memory and its counts, then runs
// moe_gate_up_fold's GEMM over those choices. Block (0, 0) also writes the
// routes to idx and weight (the down kernel's combine reads weight after
// its grid_wait, that is after this grid has finished) and the tables
// (fold_tables). Nothing of the GEMM can start before the routes: its
// expert, hence its weights, and its rows are what they decide; only the
// counts are zeroed before grid_wait. With DYN, as moe_gate_up_fold's:
// a persistent grid that routes, then takes tickets.
//   out bf16 [M, op]; x bf16 [N, xp]; logits f32 [N, lp] (r.E columns);
//   idx i32 [N, ip] and weight f32 [N, wp] (r.K columns) written; w, M, NN
//   (2I), KK (H), first, sorted, slot, tickets: moe_gate_up_fold's. N·K ≤
//   MOE_FOLD_MAX; r as route_token takes it, r.E ≤ MAX_GROUPS.
// Launch: moe_gate_up's grid and block (tiling of the instance), or with
// DYN group_gemm_dyn's.
template <int BM, int BN, int WM, int WN, int BK, int ST, bool DYN>
__device__ void moe_gate_up_route(bf16* out, int op, const bf16* x, int xp, const float* logits, int lp, int N,
                                  const Route r, int* idx, int ip, float* weight, int wp, const bf16* w, int* first,
                                  int* sorted, int* slot, int M, int NN, int KK, int* tickets) {
	constexpr int WARPS = WM * WN;
	__shared__ int sFirst[MAX_GROUPS + 1], sCount[MAX_GROUPS], sEx[MOE_FOLD_MAX];
	__shared__ float stage[WARPS][32 * ROUTE_PER_LANE];
	const int K = r.K, E = r.E;
	const bool tables = blockIdx.x == 0 && blockIdx.y == 0;
	for (int e = threadIdx.x; e < E; e += blockDim.x) sCount[e] = 0;
	__syncthreads();
	grid_wait();
	grid_release();
	fold_route<WARPS>(logits, lp, N, r, stage, sEx, sCount, tables, idx, ip, weight, wp);
	fold_starts<BM>(sFirst, sCount, E);
	const int choices = N * K;
	if (tables) fold_tables(first, sorted, slot, sFirst, sEx, choices, E);
	if constexpr (DYN)
		group_gemm_dyn<BM, BN, WM, WN, BK, ST, true, true>(out, op, x, xp, sEx, K, w, sFirst, E, M, NN, KK, tickets, choices);
	else group_gemm<BM, BN, WM, WN, BK, ST, true, true>(out, op, x, xp, sEx, K, w, sFirst, E, M, NN, KK, choices);
}

// fold_last counts the block's tile on counter, after a fence that
// publishes the tile's outputs, and tells every thread of the block
// whether it came last of arrivals (then, after a second fence, the other
// tiles' outputs are visible to it through L2).
__device__ __forceinline__ bool fold_last(int* counter, int arrivals) {
	__shared__ bool last;
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) last = atomicAdd(counter, 1) == arrivals - 1;
	__syncthreads();
	if (last) __threadfence();
	return last;
}

// fold_combine is moe_combine for the BN columns of n-tile nt, by one
// block: out[t, c] = bf16(Σ_k weight[t, k] · y[slot[t·K + k], c]) in k
// order, y read through L2 (the other blocks' rows).
//   out bf16 [N, outp]; y bf16 [*, yp] (NN columns, a multiple of 8); slot
//   i32 [N·K]; weight f32 [N, wp].
template <int BN>
__device__ __forceinline__ void fold_combine(bf16* out, int outp, const bf16* y, int yp, const int* slot,
                                             const float* weight, int wp, int N, int K, int NN, unsigned nt) {
	constexpr int KC = 8; // choices whose rows a thread has in flight at once
	const int c0 = nt * BN, per = min(BN, NN - c0) / 8;
	for (int i = threadIdx.x; i < N * per; i += blockDim.x) {
		const int t = i / per, c = c0 + (i - t * per) * 8;
		float acc[8];
#pragma unroll
		for (int j = 0; j < 8; j++) acc[j] = 0.0f;
		for (int k0 = 0; k0 < K; k0 += KC) {
			// Every load of the chunk first (one trip to L2, not one a
			// choice), then the sums in k order as before.
			uint4 raw[KC];
			float wk[KC];
#pragma unroll
			for (int k = 0; k < KC; k++)
				if (k0 + k < K) {
					wk[k] = weight[(long long)t * wp + k0 + k];
					raw[k] = __ldcg(reinterpret_cast<const uint4*>(y + (long long)slot[t * K + k0 + k] * yp + c));
				}
#pragma unroll
			for (int k = 0; k < KC; k++)
				if (k0 + k < K) {
					const bf16* v = reinterpret_cast<const bf16*>(&raw[k]);
#pragma unroll
					for (int j = 0; j < 8; j++) acc[j] += wk[k] * __bfloat162float(v[j]);
				}
		}
		uint4 o;
		unsigned* ow = reinterpret_cast<unsigned*>(&o);
#pragma unroll
		for (int j = 0; j < 4; j++) ow[j] = pack2(acc[2 * j], acc[2 * j + 1]);
		*reinterpret_cast<uint4*>(out + (long long)t * outp + c) = o;
	}
}

// fold_finish is the end of a down tile of n-tile nt in the folded path:
// the tile counts itself (fold_last, arrivals of them), and the last to
// come sums the n-tile (fold_combine; the probe's stamps with STAMP), then
// leaves its counter at zero for the next launch. nt is either caller's
// own index type (blockIdx's, a ticket's), so each indexes as it did.
template <int BN, bool STAMP, typename Index>
__device__ __forceinline__ void fold_finish(int* counters, Index nt, int arrivals, bf16* out, int outp, const bf16* y,
                                            int yp, const int* slot, const float* weight, int wp, int N, int K, int NN) {
	if (!fold_last(&counters[nt], arrivals)) return;
	if (STAMP) moe_stamp(1, MOE_COMBINE);
	fold_combine<BN>(out, outp, y, yp, slot, weight, wp, N, K, NN, nt);
	if (STAMP) moe_stamp(1, MOE_COMBINED);
	if (threadIdx.x == 0) counters[nt] = 0; // ready for the next launch
}

// group_gemm_fold is group_gemm (the experts' down projections into y,
// every choice's row) and then moe_combine for each n-tile: every tile of
// an n-tile counts itself on its counter (fold_last), and the last to come
// sums the tile's columns of every token (fold_combine), then leaves the
// counter at zero for the next launch. A block a tile (every block,
// finished or past the work, arrives: gridDim.y of them), or with DYN a
// persistent grid taking its tiles from the ticket pair tickets as
// group_gemm_dyn's (the m-tiles of the work arrive, start[E]), so that the
// last of an n-tile combines it in the middle of its block's tickets.
//   y bf16 [M, yp]; act, w, first, E, M, NN (H), KK (I): group_gemm's.
//   out bf16 [N, outp]; slot i32 [N·K]; weight f32 [N, wp]; counters i32
//   [≥ ceil(NN / BN)], zero between launches; tickets i32 [2] (DYN only),
//   group_gemm_dyn's counters. NN a multiple of 8.
// Launch: group_gemm's grid and block, or with DYN group_gemm_dyn's.
template <int BM, int BN, int WM, int WN, int BK, int ST, bool DYN>
__device__ void group_gemm_fold(bf16* y, int yp, const bf16* act, int ap, const bf16* w, const int* first, int E,
                                int M, int NN, int KK, bf16* out, int outp, const int* slot, const float* weight,
                                int wp, int N, int K, int* counters, int* tickets) {
	if constexpr (DYN) moe_stamp(1, MOE_ENTRY);
	grid_wait();
	if constexpr (DYN) moe_stamp(1, MOE_WAITED);
	grid_release();
	auto combine = [&](unsigned nt, int arrivals) {
		fold_finish<BN, DYN>(counters, nt, arrivals, out, outp, y, yp, slot, weight, wp, N, K, NN);
	};
	if constexpr (DYN) {
		group_gemm_dyn<BM, BN, WM, WN, BK, ST, false>(y, yp, act, ap, nullptr, 1, w, first, E, M, NN, KK, tickets, 0,
		                                              combine);
	} else {
		group_gemm<BM, BN, WM, WN, BK, ST, false>(y, yp, act, ap, nullptr, 1, w, first, E, M, NN, KK);
		combine(blockIdx.x, gridDim.y);
	}
}

#define MOE_FOLD(GATE_UP, GEMM, ROUTED, BM, BN, WM, WN, BK, ST)                                                  \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GATE_UP(bf16* out, int op, const bf16* x, int xp, const int* idx, int ip, int N, int K, const bf16* w,    \
	            int* first, int* sorted, int* slot, int E, int M, int NN, int KK) {                              \
		moe_gate_up_fold<BM, BN, WM, WN, BK, ST, false>(out, op, x, xp, idx, ip, N, K, w, first, sorted, slot, E, \
		                                                M, NN, KK, nullptr);                                      \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GEMM(bf16* y, int yp, const bf16* act, int ap, const bf16* w, const int* first, int E, int M, int NN,     \
	         int KK, bf16* out, int outp, const int* slot, const float* weight, int wp, int N, int K,              \
	         int* counters) {                                                                                     \
		group_gemm_fold<BM, BN, WM, WN, BK, ST, false>(y, yp, act, ap, w, first, E, M, NN, KK, out, outp, slot,   \
		                                               weight, wp, N, K, counters, nullptr);                      \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    ROUTED(bf16* out, int op, const bf16* x, int xp, const float* logits, int lp, int N, int E, int K,        \
	           int groupLimited, int groups, int topkGroups, int norm, float scale, int* idx, int ip,             \
	           float* weight, int wp, const bf16* w, int* first, int* sorted, int* slot, int M, int NN, int KK) { \
		moe_gate_up_route<BM, BN, WM, WN, BK, ST, false>(out, op, x, xp, logits, lp, N,                           \
		                                                 Route{E, K, groupLimited, groups, topkGroups, norm, scale},  \
		                                                 idx, ip, weight, wp, w, first, sorted, slot, M, NN, KK,      \
		                                                 nullptr);                                                    \
	}
MOE_FOLD_INSTANCES(MOE_FOLD)

// The folded path on the persistent grid (moe.go's foldDynVariant, and
// foldedVariant past foldTokens): MOE_FOLD's gate/up, down and routing
// gate/up kernels in the persistent grid's tiling (dynTiling at
// dynStages), each with its ticket pair after the arguments of MOE_FOLD's.
#define MOE_FOLD_DYN(GATE_UP, GEMM, ROUTED, BM, BN, WM, WN, BK, ST)                                               \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GATE_UP(bf16* out, int op, const bf16* x, int xp, const int* idx, int ip, int N, int K, const bf16* w,    \
	            int* first, int* sorted, int* slot, int E, int M, int NN, int KK, int* tickets) {                \
		moe_gate_up_fold<BM, BN, WM, WN, BK, ST, true>(out, op, x, xp, idx, ip, N, K, w, first, sorted, slot, E,  \
		                                               M, NN, KK, tickets);                                       \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    GEMM(bf16* y, int yp, const bf16* act, int ap, const bf16* w, const int* first, int E, int M, int NN,     \
	         int KK, bf16* out, int outp, const int* slot, const float* weight, int wp, int N, int K,              \
	         int* counters, int* tickets) {                                                                       \
		group_gemm_fold<BM, BN, WM, WN, BK, ST, true>(y, yp, act, ap, w, first, E, M, NN, KK, out, outp, slot,    \
		                                              weight, wp, N, K, counters, tickets);                       \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    ROUTED(bf16* out, int op, const bf16* x, int xp, const float* logits, int lp, int N, int E, int K,        \
	           int groupLimited, int groups, int topkGroups, int norm, float scale, int* idx, int ip,             \
	           float* weight, int wp, const bf16* w, int* first, int* sorted, int* slot, int M, int NN, int KK,   \
	           int* tickets) {                                                                                    \
		moe_gate_up_route<BM, BN, WM, WN, BK, ST, true>(out, op, x, xp, logits, lp, N,                            \
		                                                Route{E, K, groupLimited, groups, topkGroups, norm, scale},   \
		                                                idx, ip, weight, wp, w, first, sorted, slot, M, NN, KK,       \
		                                                tickets);                                                     \
	}
MOE_FOLD_DYN_INSTANCES(MOE_FOLD_DYN)

// moe_one is the folded path in one launch on the persistent grid: every
// block counts and ranks the choices (fold_count, as moe_gate_up_fold's
// blocks do; block 0 also writes the tables, fold_tables), then takes
// tickets from one pair: the gate/up tiles first (mt-major, as
// moe_gate_up_fold's), then the down tiles (as group_gemm_fold's). A
// gate/up tile, once its rows of act are written, counts itself on its
// m-tile's counter in done (after a fence); a down tile queues its first
// weights, waits until every gate/up tile of its m-tile has counted
// (thread 0 reads the counter with acquire, then a barrier), then reads
// its rows of act through L2 and goes on as group_gemm_fold's tile: its
// n-tile's last tile sums the n-tile (fold_combine, with each choice's row
// from the block's own ranks, sSlot, where the tables block 0 writes may
// not yet be visible). A gate/up tile finds its rows from the block's
// sSlot. While plenty of work remains a block takes its next ticket as a
// tile starts, so that the round trip runs under the tile. No wait can
// block forever: a down ticket comes after every gate/up ticket, a block's
// ticket held ahead comes after the one it runs (so a block in a down
// tile's wait holds no gate/up ticket), and a gate/up tile, once taken,
// runs on a block that waits on nothing. The same tiles, rows and sums as the two
// launches, so bit for bit their outputs.
//   act bf16 [M, ap]; x bf16 [N, xp]; idx i32 [N, ip] (K columns);
//   gateUp bf16 [E, NN, KK] (NN = 2I, KK = H); first i32 [E+1], sorted i32
//   [M], slot i32 [N·K] written; y bf16 [M, yp]; down bf16 [E, KK, NN/2];
//   out bf16 [N, outp]; weight f32 [N, wp]; counters i32 [≥ ceil(KK /
//   BN)] (the n-tiles'), done i32 [≥ the m-tiles], tickets i32 [2]: zero
//   between launches, and the grid's last block leaves them so.
// Launch: 1-D, the blocks an SM holds times the SMs (at most the tiles of
// both GEMMs); group_gemm_tile's block and GemmRing's shared memory.
template <int BM, int BN, int WM, int WN, int BK, int ST>
__device__ void moe_one(bf16* act, int ap, const bf16* x, int xp, const int* idx, int ip, int N, int K,
                        const bf16* gateUp, int* first, int* sorted, int* slot, int E, int M, int NN, int KK, bf16* y,
                        int yp, const bf16* down, bf16* out, int outp, const float* weight, int wp, int* counters,
                        int* done, int* tickets) {
	__shared__ int sFirst[MAX_GROUPS + 1], sCount[MAX_GROUPS], sEx[MOE_FOLD_MAX], sSlot[MOE_FOLD_MAX];
	__shared__ int aRow[BM], bRow[BN];
	__shared__ int start[MAX_GROUPS + 1];
	__shared__ int ticket;
	const int tid = threadIdx.x, I = NN / 2, choices = N * K;
	int ups = 0, downs = 0; // the probe's tile counts (moe_stamp: kernel 0 the gate/up tiles, 1 the down tiles)
	moe_stamp(0, MOE_ENTRY);
	grid_wait();
	moe_stamp(0, MOE_WAITED);
	grid_release();
	fold_count<BM>(sFirst, sEx, sCount, idx, ip, N, K, E);
	if (blockIdx.x == 0) fold_tables(first, sorted, slot, sFirst, sEx, choices, E);
	for (int i = tid; i < choices; i += blockDim.x) sSlot[i] = sFirst[sEx[i]] + fold_rank(sEx, i);
	if (tid < 32) group_tile_starts<BM>(sFirst, E, M, start);
	__syncthreads();
	moe_stamp(0, MOE_COUNTED);
	const int mtiles = start[E], upTiles = (I + BN / 2 - 1) / (BN / 2), downTiles = (KK + BN - 1) / BN;
	const int t1 = mtiles * upTiles, t2 = t1 + mtiles * downTiles;
	int held = -1; // thread 0: the next ticket, taken as the tile before it started; -1 for none
	for (;;) {
		if (tid == 0) ticket = held >= 0 ? held : atomicAdd(&tickets[0], 1);
		__syncthreads(); // the ticket is written
		const int t = ticket;
		if (t >= t2) break;
		// While more than two tickets a block remain after this one, thread
		// 0 takes the next one now: its round trip runs under the tile. Near
		// the end a ticket held ahead would be a tile no idle block can
		// take, so the last ones go to whichever block asks first.
		if (tid == 0) held = t + 2 * (int)gridDim.x < t2 ? atomicAdd(&tickets[0], 1) : -1;
		if (t < t1) {
			const int mt = t / upTiles, nt = t - mt * upTiles, g = group_of_tile(start, E, mt);
			const int row0 = sFirst[g] + (mt - start[g]) * BM;
			if (ups < MOE_PROBE_TILES) moe_stamp(0, MOE_TILE + 2 * ups);
			group_gemm_tile<BM, BN, WM, WN, BK, ST, true, true>(act, ap, x, xp, sEx, K, gateUp, sFirst, NN, KK, choices,
			                                                    g, row0, sFirst[g + 1], nt, aRow, bRow, false, NoPre{}, sSlot);
			if (ups < MOE_PROBE_TILES) moe_stamp(0, MOE_TILE + 2 * ups + 1);
			ups++;
			__syncthreads(); // every thread's rows of act stored
			if (tid == 0) {
				__threadfence(); // after the barrier: the block's rows before the count (a release by thread 0)
				atomicAdd(&done[mt], 1);
			}
		} else {
			const int u = t - t1, mt = u / downTiles, nt = u - mt * downTiles, g = group_of_tile(start, E, mt);
			const int row0 = sFirst[g] + (mt - start[g]) * BM;
			int* ready = &done[mt];
			if (downs < MOE_PROBE_TILES) moe_stamp(1, MOE_TILE + 2 * downs);
			if (downs == 0) moe_stamp(1, MOE_ENTRY); // the first down ticket
			const bool firstDown = downs == 0;
			auto wait = [ready, upTiles, firstDown] {
				wait_count(ready, upTiles, 64); // every gate/up tile of the m-tile has written its rows
				if (firstDown) moe_stamp(1, MOE_WAITED);
			};
			group_gemm_tile<BM, BN, WM, WN, BK, ST, false, false, decltype(wait)>(
			    y, yp, act, ap, nullptr, 1, down, sFirst, KK, I, 0, g, row0, sFirst[g + 1], nt, aRow, bRow, true, wait);
			if (downs < MOE_PROBE_TILES) moe_stamp(1, MOE_TILE + 2 * downs + 1);
			downs++;
			fold_finish<BN, true>(counters, nt, mtiles, out, outp, y, yp, sSlot, weight, wp, N, K, KK);
		}
		__syncthreads(); // every thread has read the ticket; the tiles and row tables are free
	}
	if (tickets_done(tickets))
		for (int m = 0; m < mtiles; m++) done[m] = 0; // every block has counted itself out: none reads them any more
#ifdef MOE_PROBE
	unsigned sm;
	asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
	moe_stamp(0, MOE_SMID, sm);
	moe_stamp(0, MOE_TILES, ups);
	moe_stamp(1, MOE_SMID, sm);
	moe_stamp(1, MOE_TILES, downs);
#endif
	moe_stamp(0, MOE_EXIT);
	if (downs > 0) moe_stamp(1, MOE_EXIT);
}

#define MOE_ONE(NAME, BM, BN, WM, WN, BK, ST)                                                                     \
	extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                    \
	    NAME(bf16* act, int ap, const bf16* x, int xp, const int* idx, int ip, int N, int K, const bf16* gateUp,  \
	         int* first, int* sorted, int* slot, int E, int M, int NN, int KK, bf16* y, int yp, const bf16* down,  \
	         bf16* out, int outp, const float* weight, int wp, int* counters, int* done, int* tickets) {          \
		moe_one<BM, BN, WM, WN, BK, ST>(act, ap, x, xp, idx, ip, N, K, gateUp, first, sorted, slot, E, M, NN, KK, \
		                                y, yp, down, out, outp, weight, wp, counters, done, tickets);             \
	}
MOE_ONE_INSTANCES(MOE_ONE)

// -------------------------------------------------- permutation and sum

// align_walk is one warp's walk over its chunk [lo, hi) of moe_align's
// choices, a step of 32 at a time in choice order: it calls step(i, e)
// with all 32 lanes, lane l's choice i = s + l of the step at s and its
// expert e, or -1 past hi. The lanes load ALIGN_STEPS steps' experts
// before they take the first (the loads in flight together), and move
// from choice to choice without a division: choice i = t·K + k is
// idx[t·ip + k], and a step of 32 choices is dt tokens and dk columns on.
// An expert outside [0, E) traps.
template <typename Step>
__device__ __forceinline__ void align_walk(const int* idx, int ip, int K, int E, int lo, int hi, Step step) {
	const int lane = threadIdx.x & 31;
	const int dt = 32 / K, dk = 32 - dt * K;
	int t = (lo + lane) / K, k = lo + lane - t * K;
	const int* at = idx + (long long)t * ip + k;
	const long long next = (long long)dt * ip + dk;
	for (int s = lo; s < hi; s += 32 * ALIGN_STEPS) {
		int e[ALIGN_STEPS];
#pragma unroll
		for (int u = 0; u < ALIGN_STEPS; u++) {
			e[u] = s + 32 * u + lane < hi ? *at : -1;
			at += next;
			k += dk;
			if (k >= K) {
				k -= K;
				at += ip - K;
			}
		}
#pragma unroll
		for (int u = 0; u < ALIGN_STEPS; u++) {
			if (s + 32 * u >= hi) break; // the warp's last steps are past its chunk
			if (s + 32 * u + lane < hi && (e[u] < 0 || e[u] >= E)) __trap();
			step(s + 32 * u + lane, e[u]);
		}
	}
}

// align_chunk is warp chunk c's choices [lo, hi) of moe_align's: the
// choices over ALIGN_CHUNKS, rounded up to whole steps of 32, in order.
__device__ __forceinline__ void align_chunk(int choices, int c, int& lo, int& hi) {
	const int size = (choices + ALIGN_CHUNKS * 32 - 1) / (ALIGN_CHUNKS * 32) * 32;
	lo = min(c * size, choices);
	hi = min(lo + size, choices);
}

// moe_align_count is the first half of moe_align: warp chunk c (block b's
// warp w, c = b·ALIGN_WARPS + w) counts its choices of each expert into
// counts[e·ALIGN_CHUNKS + c]. In a step, the lanes that chose the same
// expert find each other (__match_any_sync) and the lowest of them (the
// group's leader) adds the group to the warp's own row of shared counts:
// no atomics. An expert outside [0, E) traps.
//   counts i32 [E·ALIGN_CHUNKS]; idx i32 [N, ip] (K columns). E ≤ MAX_GROUPS.
// Launch: ALIGN_BLOCKS blocks of ALIGN_THREADS threads.
extern "C" __global__ void __launch_bounds__(ALIGN_THREADS)
    moe_align_count(int* counts, const int* idx, int ip, int N, int K, int E) {
	__shared__ int cnt[ALIGN_WARPS][MAX_GROUPS];
	grid_wait();
	grid_release();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = blockIdx.x * ALIGN_WARPS + warp;
	int lo, hi;
	align_chunk(N * K, c, lo, hi);
	int* row = cnt[warp];
	for (int e = lane; e < E; e += 32) row[e] = 0;
	__syncwarp();
	align_walk(idx, ip, K, E, lo, hi, [&](int, int e) {
		const unsigned same = __match_any_sync(FULL_MASK, e);
		if (e >= 0 && lane == __ffs(same) - 1) row[e] += __popc(same);
		__syncwarp(); // the row as the next step's leaders read it
	});
	for (int e = lane; e < E; e += 32) counts[e * ALIGN_CHUNKS + c] = row[e];
}

// moe_align sorts the N·K choices by expert, after moe_align_count: expert
// e's choices get rows [first[e], first[e] + count[e]) of the sorted order
// and its rows run on to first[e+1], the count rounded up to whole m-tiles
// of BM rows; sorted[r] = t·K + k for the row of choice (t, k) and -1 for a
// padding row, slot[t·K + k] = its row. The order within an expert is
// ascending choice index (stable; fold_tables' order too).
// Every block scans the chunks' counts, an expert a thread, into each
// expert's total and its first row in each of the block's warps' chunks
// (first[e] plus the counts of the chunks before it); block 0 writes
// first, and block b the padding rows of experts b, b + ALIGN_BLOCKS, ....
// Then each warp walks its chunk again: a choice gets the warp's next row
// of its expert plus the number of lower lanes in the step that chose it,
// and the group's leader moves the warp's next row on by the group. Each
// sorted entry is written once, and nothing by an atomic.
//   first i32 [E+1]; sorted i32 [≥ first[E]]; slot i32 [N·K]; counts:
//   moe_align_count's, 16-byte aligned; idx i32 [N, ip] (K columns). E ≤
//   MAX_GROUPS.
// Launch: ALIGN_BLOCKS blocks of ALIGN_THREADS threads.
extern "C" __global__ void __launch_bounds__(ALIGN_THREADS)
    moe_align(int* first, int* sorted, int* slot, const int* counts, const int* idx, int ip, int N, int K, int E, int BM) {
	// next[w][e]: this block's warp w's next row of expert e
	__shared__ int next[ALIGN_WARPS][MAX_GROUPS], count[MAX_GROUPS], start[MAX_GROUPS + 1];
	grid_wait();
	grid_release();
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, c0 = blockIdx.x * ALIGN_WARPS;
	const unsigned below = (1u << lane) - 1; // the lanes under this one
	if (tid < E) {
		const int4* row = reinterpret_cast<const int4*>(counts + tid * ALIGN_CHUNKS);
		int run = 0;
#pragma unroll 8
		for (int q = 0; q < ALIGN_CHUNKS / 4; q++) {
			const int4 v = row[q];
			const int n[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const int w = 4 * q + j - c0;
				if (w >= 0 && w < ALIGN_WARPS) next[w][tid] = run;
				run += n[j];
			}
		}
		count[tid] = run;
	}
	__syncthreads(); // the counts and the chunks' offsets
	if (tid < 32) padded_starts(count, E, BM, start);
	__syncthreads(); // start
	if (blockIdx.x == 0)
		for (int e = tid; e <= E; e += ALIGN_THREADS) first[e] = start[e];
	for (int e = blockIdx.x; e < E; e += gridDim.x)
		for (int r = start[e] + count[e] + tid; r < start[e + 1]; r += ALIGN_THREADS) sorted[r] = -1;
	int* row = next[warp];
	for (int e = lane; e < E; e += 32) row[e] += start[e];
	__syncwarp();
	int lo, hi;
	align_chunk(N * K, c0 + warp, lo, hi);
	align_walk(idx, ip, K, E, lo, hi, [&](int i, int e) {
		const unsigned same = __match_any_sync(FULL_MASK, e);
		const int leader = __ffs(same) - 1;
		int base = 0; // the group's first row
		if (e >= 0 && lane == leader) {
			base = row[e];
			row[e] = base + __popc(same);
		}
		base = __shfl_sync(FULL_MASK, base, leader);
		if (e >= 0) {
			const int r = base + __popc(same & below);
			sorted[r] = i;
			slot[i] = r;
		}
		__syncwarp(); // the row as the next step's leaders read it
	});
}
