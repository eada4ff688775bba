// The grouped GEMM for Hopper (sm_90a only: wgmma, setmaxnreg and the copy
// engine's tensor copies), the "grouped_wgmma" variant of group_gemm and
// moe_experts at prefill's hundreds of rows per group. Same problem,
// groups, layouts and rounding as moe.cu's group_gemm: out = the f32 sum
// rounded to bf16 once; with SWIGLU, gate and up rounded to bf16, silu(gate)
// rounded, its product with up rounded (HF's act_fn(gate_proj(x)) *
// up_proj(x)).
//
// Persistent blocks of three warpgroups walk the output tiles t =
// blockIdx.x, + gridDim.x, ... in the order (m-tile, n-tile), n fastest, so
// the blocks running at once share a few m-tiles of x and one or two
// groups' weights in L2. The m-tiles come from the device offsets
// (groups.cuh, scanned once per block): no host read, graph-safe.
//   - warpgroup 0, the producer (setmaxnreg down to GW_PRODUCER_REGS),
//     fills a ring of STAGES stages, each a 128 × 64 tile of x rows (A)
//     and a BN × 64 tile of weight rows (B), guarded by mbarriers: full
//     (the copy engine completes it with its bytes; with GATHER also the
//     producer's 128 threads, as their cp.async copies land) and empty
//     (each consumer warp arrives when its wgmmas no longer read the
//     stage). One thread issues the tensor copies of B (two boxes of BN/2
//     weight rows: with SWIGLU the gate rows of the tile's BN/2 columns,
//     then their up rows) and of A (x rows [row0, row0 + 128) in place);
//     with GATHER the 128 threads copy A's rows x[gather[r] / gdiv] by
//     cp.async, 16 bytes each, into the swizzled layout the copy engine
//     would have written (chunk c of row r at c ^ (r % 8)).
//   - warpgroups 1 and 2, the consumers (setmaxnreg up to
//     GW_CONSUMER_REGS), own 64 rows of the tile each and all BN columns:
//     four wgmma m64nBNk16 per stage, A and B K-major from shared memory,
//     one stage's group in flight while the next is issued; a stage is
//     released when the group after it has been waited for. The epilogue
//     writes the accumulators straight from registers (two columns a store)
//     while the producer already loads the next tile's stages.
// Rows of the tile past the group's end are computed from whatever x holds
// there (the next group's rows, zeros past x, zeros for gathered padding)
// and not written; columns past N likewise (weight rows past the map are
// zeros). K is covered in 64-column steps, the tail zero-filled by the copy
// engine (and by cp.async's zero fill with GATHER).
// With OUT_TMA (the plain GEMM over groups padded to whole m-tiles, as
// moe_align pads the routed experts' rows: no tile crosses a group's end)
// the epilogue stages the output through shared memory instead: a
// consumer warpgroup puts its 64 rows by HG_BOX columns at a time into
// one of its two boxes by stmatrix, in the layout omap's 128-byte swizzle
// reads, and one thread stores the box by a tensor copy, which runs on
// while the warpgroup fills the next box and starts the next tile's
// wgmmas; before a box is written again, its last store has read it. The
// direct stores (two columns of eight rows an instruction, 16-byte pieces)
// cost the down projection about a third of its time at the prefill's
// shapes (TestWgmmaProbe).
//
// A wait that lasts HOP_WAIT_CYCLES records what it waited for in status
// (HG_WAIT_*, block, thread, k-step counter, parity) and the kernel winds
// down instead of hanging.

#include "groups.cuh"
#include "hop_gemm.cuh"
#include "instances.cuh"

#define GW_BM 128              // rows of a tile: GW_CONSUMERS × 64
#define GW_BK HG_BK            // k of a stage: one 128-byte swizzle row of bf16
#define GW_CONSUMERS HG_CONSUMERS // consumer warpgroups
#define GW_THREADS (128 * (1 + GW_CONSUMERS))
#define GW_PRODUCER_REGS 56    // setmaxnreg of the producer warpgroup (it holds 8 gathered rows)
#define GW_CONSUMER_REGS 224   // and of the consumers
#define GW_ROW_BYTES HG_ROW_BYTES // bytes of a stage row: GW_BK bf16
#define GW_OUT_BUFS 2          // OUT_TMA: output boxes a consumer warpgroup stages at once
#define GW_WG_BAR 1            // OUT_TMA: named barrier of consumer warpgroup w: GW_WG_BAR + w
static_assert(HG_REGS_FIT(GW_PRODUCER_REGS, GW_CONSUMER_REGS, GW_THREADS), "setmaxnreg asks for more registers than the block has");

// GwLayout is the shared memory of group_wgmma<BN, STAGES>: per stage the
// A tile (GW_BM rows) then the B tile (BN rows), rows of 128 bytes; with
// OUT_TMA then each consumer's output boxes (SMEM_TMA in all).
template <int BN, int STAGES> struct GwLayout {
	static constexpr int A_BYTES = GW_BM * GW_ROW_BYTES;
	static constexpr int B_BYTES = BN * GW_ROW_BYTES;
	static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
	static constexpr int ALIGN = 1024; // the 128-byte swizzle's period; the dynamic base is rounded up to it
	static constexpr int SMEM = STAGES * STAGE_BYTES + ALIGN;
	static constexpr int OUT = STAGES * STAGE_BYTES; // OUT_TMA: the first output box
	static constexpr int OUT_BYTES = 64 * HG_BOX * 2; // a box: a consumer's 64 rows
	static constexpr int SMEM_TMA = SMEM + GW_CONSUMERS * GW_OUT_BUFS * OUT_BYTES;
};

// GwPlain is the plain GEMM's epilogue for hg_box: output block j of
// this thread's two rows, rounded once.
struct GwPlain {
	template <int NB>
	__device__ __forceinline__ void frag(const float (&acc)[NB][4], int j, int, int, unsigned& lo, unsigned& hi) const {
		lo = pack2(acc[j][0], acc[j][1]);
		hi = pack2(acc[j][2], acc[j][3]);
	}
};

// group_wgmma: see the top of this file.
//   xmap: x bf16 [rows, K] (pitch xp), 2-D, box {64, GW_BM}, read when not
//   GATHER; x, xp: the same matrix, read through gather when GATHER;
//   wmap: w bf16 [E, N, K] packed, 3-D, box {64, BN/2, 1}; both maps with
//   the 128-byte swizzle, out-of-bounds elements zero.
//   omap (OUT_TMA): out's tensor map, 2-D, box {HG_BOX, 64}, the 128-byte
//   swizzle;
//   out bf16 [M, op] (N columns, N/2 with SWIGLU); gather i32 [M]: the
//   choice t·gdiv + k of each row, negative for padding (GATHER only);
//   first i32 [E+1], ascending in [0, M]; status i32 [8], zero.
//   K and N are multiples of 8, N even with SWIGLU; E ≤ MAX_GROUPS.
// Launch: a persistent grid (the SMs), GW_THREADS threads,
// GwLayout<BN, STAGES>::SMEM bytes of dynamic shared memory (SMEM_TMA with
// OUT_TMA).
template <int BN, int STAGES, bool SWIGLU, bool GATHER, bool OUT_TMA = false>
__device__ __forceinline__ void group_wgmma(const TmaMap* xmap, const TmaMap* wmap, bf16* out, int op, const bf16* x,
                                            int xp, const int* gather, int gdiv, const int* first, int E, int M, int N,
                                            int K, int* status, const TmaMap* omap = nullptr) {
	typedef GwLayout<BN, STAGES> L;
	static_assert(!OUT_TMA || (!SWIGLU && BN % HG_BOX == 0), "tensor stores: the plain GEMM's whole boxes");
	constexpr int HALF = BN / 2; // rows of a weight box; with SWIGLU the tile's output columns
	extern __shared__ unsigned char smem_raw[];
	__shared__ int start[MAX_GROUPS + 1];
	__shared__ __align__(8) unsigned long long bars[2 * STAGES];

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	auto sA = [&](int s) { return base + s * L::STAGE_BYTES; };
	auto sB = [&](int s) { return base + s * L::STAGE_BYTES + L::A_BYTES; };
	const HopRing<STAGES> ring{bars};

	// full: the expect_tx arrival (+ each producer thread's copies); empty:
	// one arrival per consumer warp.
	if (threadIdx.x == 0) ring.init(GATHER ? 1 + 128 : 1, GW_CONSUMERS * 4);
	if (threadIdx.x < 32) group_tile_starts<GW_BM>(first, E, M, start);
	__syncthreads();

	const int inter = N / 2;
	const int ntn = SWIGLU ? (inter + HALF - 1) / HALF : (N + BN - 1) / BN; // n-tiles
	const int total = start[E] * ntn;
	const int ktiles = (K + GW_BK - 1) / GW_BK;
	// The tile t's group g, first row, the group's end and n-tile.
	auto tile = [&](int t, int& g, int& row0, int& rowEnd, int& nt) {
		const int mt = t / ntn;
		nt = t - mt * ntn;
		g = group_of_tile(start, E, mt);
		row0 = first[g] + (mt - start[g]) * GW_BM;
		rowEnd = first[g + 1];
	};

	const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
	if (wg == 0) {
		// The producer.
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(GW_PRODUCER_REGS));
		if (!GATHER && tid != 0) return;
		int it = 0; // k-steps issued so far, over all of this block's tiles
		for (int t = blockIdx.x; t < total; t += gridDim.x) {
			int g, row0, rowEnd, nt;
			tile(t, g, row0, rowEnd, nt);
			const int b0 = SWIGLU ? nt * HALF : nt * BN, b1 = SWIGLU ? inter + nt * HALF : nt * BN + HALF;
			// With GATHER, thread tid copies chunk tid % 8 of rows tid / 8 + 16i.
			int src[GW_BM / 16]; // x rows, -1 for none
			if (GATHER) {
#pragma unroll
				for (int i = 0; i < GW_BM / 16; i++) {
					const int row = row0 + tid / 8 + 16 * i;
					const int c = row < rowEnd ? gather[row] : -1;
					src[i] = c >= 0 ? c / gdiv : -1;
				}
			}
			for (int kt = 0; kt < ktiles; kt++, it++) {
				const int s = ring.stage(it);
				if (!ring.acquire(it, status, HG_WAIT_EMPTY)) return;
				if (tid == 0) {
					const unsigned full = ring.full(s);
					mbar_expect_tx(full, L::B_BYTES + (GATHER ? 0 : L::A_BYTES));
					tma_load_3d(sB(s), wmap, full, kt * GW_BK, b0, g);
					tma_load_3d(sB(s) + HALF * GW_ROW_BYTES, wmap, full, kt * GW_BK, b1, g);
					if (!GATHER) tma_load_2d(sA(s), xmap, full, kt * GW_BK, row0);
				}
				if (GATHER) {
					const int c = tid % 8, k = kt * GW_BK + c * 8;
#pragma unroll
					for (int i = 0; i < GW_BM / 16; i++) {
						const int r = tid / 8 + 16 * i;
						const bool ok = src[i] >= 0 && k < K;
						cp16(sA(s) + r * GW_ROW_BYTES + ((c ^ (r & 7)) << 4), ok ? x + (long long)src[i] * xp + k : x, ok);
					}
					cp_async_arrive(ring.full(s));
				}
			}
		}
		return;
	}

	// A consumer: warpgroup w owns the tile's rows [64w, 64w+64), warp wi
	// of it 16 of them, this thread rows lane/4 and lane/4 + 8 of those.
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(GW_CONSUMER_REGS));
	const int w = wg - 1, wi = tid / 32, lane = tid % 32;
	auto a = [&](int s) { return sA(s) + 64 * w * GW_ROW_BYTES; }; // this warpgroup's rows of the stage
	// OUT_TMA: the warpgroup's boxes, and the row and chunk of a box whose
	// address this lane gives to stmatrix.
	auto sOut = [&](int b) { return base + L::OUT + (w * GW_OUT_BUFS + b) * L::OUT_BYTES; };
	const int srow = 16 * wi + 8 * ((lane >> 3) & 1) + (lane & 7), schunk = lane >> 4;
	float acc[BN / 8][4];
	int it = 0, box = 0;
	for (int t = blockIdx.x; t < total; t += gridDim.x) {
		int g, row0, rowEnd, nt;
		tile(t, g, row0, rowEnd, nt);
		// With GATHER the fence makes the producer's cp.async rows seen by wgmma.
		const bool ok = hop_gemm_steps<BN, STAGES, GATHER>(acc, ring, it, ktiles, a, sB, status, HG_WAIT_FULL);
		if constexpr (OUT_TMA) {
			if (!bar_all(GW_WG_BAR + w, 128, ok)) break; // a wait gave up: the warpgroup stops together
#pragma unroll
			for (int c = 0; c < BN / HG_BOX; c++) {
				const unsigned buf = sOut(box % GW_OUT_BUFS);
				hg_box(GwPlain{}, acc, c, buf, row0 + 64 * w + 16 * wi + lane / 4, nt * BN, lane, srow, schunk);
				fence_async_shared();
				if (tid == 0) tma_store_wait(); // the earlier boxes are read: the next box's buffer is free
				bar_sync(GW_WG_BAR + w, 128);
				if (tid == 0) {
#ifndef GW_NO_STORE // a diagnostic build (TestWgmmaProbe): the stores left out
					tma_store_2d(omap, buf, nt * BN + c * HG_BOX, row0 + 64 * w);
#endif
					tma_store_commit();
				}
				box++;
			}
			continue;
		}
		if (!ok) return;

		// Epilogue: this thread's rows r and r + 8, columns 8n + 2·(lane%4)
		// and the next of each 8-column slice n.
		const int r = row0 + 64 * w + 16 * wi + lane / 4;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int row = r + 8 * h;
			if (row >= rowEnd) continue;
			bf16* dst = out + (long long)row * op;
			if (SWIGLU) {
#pragma unroll
				for (int n = 0; n < HALF / 8; n++) {
					const int col = nt * HALF + 8 * n + 2 * (lane & 3);
					if (col >= inter) continue;
					float v[2];
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const float gt = round_bf16(acc[n][2 * h + e]);
						const float up = round_bf16(acc[n + HALF / 8][2 * h + e]);
						v[e] = round_bf16(gt / (1.0f + expf(-gt))) * up;
					}
#ifdef GW_NO_STORE
					if (!isnan(v[0])) continue; // a diagnostic build (TestWgmmaProbe): the stores left out
#endif
					*reinterpret_cast<unsigned*>(dst + col) = pack2(v[0], v[1]);
				}
			} else {
#pragma unroll
				for (int n = 0; n < BN / 8; n++) {
					const int col = nt * BN + 8 * n + 2 * (lane & 3);
					if (col >= N) continue;
#ifdef GW_NO_STORE
					if (!isnan(acc[n][2 * h])) continue;
#endif
					*reinterpret_cast<unsigned*>(dst + col) = pack2(acc[n][2 * h], acc[n][2 * h + 1]);
				}
			}
		}
	}
	if (OUT_TMA && tid == 0) tma_store_wait(); // shared memory outlives the stores' reads
}

// The instances (named as in group_wgmma.go's gwConfigs): tiles of BN
// columns through STAGES stages, the plain GEMM (group_gemm, down) and
// with tensor stores (moe_experts' down, over padded groups), gate/up
// with SwiGLU over rows gathered beforehand (A by tensor copies) and over
// rows gathered by the producer (cp.async).
#define GROUP_WGMMA(PLAIN, PLAIN_TMA, GATE_UP, GATHER, BN, ST)                                                       \
	extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) PLAIN(                                           \
	    const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op, const int* first, \
	    int E, int M, int N, int K, int* status) {                                                                 \
		group_wgmma<BN, ST, false, false>(&xmap, &wmap, out, op, nullptr, 0, nullptr, 1, first, E, M, N, K, status);  \
	}                                                                                                                \
	extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) PLAIN_TMA(                                       \
	    const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap omap, \
	    const int* first, int E, int M, int N, int K, int* status) {                                               \
		group_wgmma<BN, ST, false, false, true>(&xmap, &wmap, nullptr, 0, nullptr, 0, nullptr, 1, first, E, M, N, K,   \
		                                        status, &omap);                                                        \
	}                                                                                                                \
	extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) GATE_UP(                                         \
	    const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, bf16* out, int op, const int* first, \
	    int E, int M, int N, int K, int* status) {                                                                 \
		group_wgmma<BN, ST, true, false>(&xmap, &wmap, out, op, nullptr, 0, nullptr, 1, first, E, M, N, K, status);   \
	}                                                                                                                \
	extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) GATHER(                                          \
	    const __grid_constant__ TmaMap wmap, bf16* out, int op, const bf16* x, int xp, const int* gather, int gdiv,   \
	    const int* first, int E, int M, int N, int K, int* status) {                                               \
		group_wgmma<BN, ST, true, true>(nullptr, &wmap, out, op, x, xp, gather, gdiv, first, E, M, N, K, status);      \
	}
GROUP_WGMMA_INSTANCES(GROUP_WGMMA)
