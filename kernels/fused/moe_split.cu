// moe_routed_split (sm_90a): DeepSeek-V2's routed experts for one token in
// one launch after the router's logits, the moe_routed op's variant
// route_split. The folded path (moe.cu) runs them in two launches, gate/up
// then down, and reads its weights in tiles of 64 k by many rows (128
// bytes of a row at a time, 50–65% of the copy rate at one token); here
// every block routes the token, then streams whole weight rows, a few
// contiguous rows a copy, for its share of the gate/up and then of the
// down projections, in one run of copies.
//
// Work: the token's K choices × I intermediate columns are cut into items
// of MS_COLS columns (K·S items, S = I/MS_COLS the slices of an expert), and
// block b takes items b, b + grid, ... Item (k, s), expert e = the k-th
// choice:
//   A  act[k, j] = bf16(bf16(silu(bf16(gate_j · x))) · bf16(up_j · x)) for
//      the slice's columns j (HF's act_fn(gate_proj(x)) * up_proj(x)),
//      written to actg [K, I];
//   B  y[k, n] = bf16(down[e, n, :] · act[k, :]) for the output rows n of
//      the slice's share of H, [s·H/S, (s+1)·H/S), written to yg [K, H]:
//      the expert's output, rounded once as HF's and the folded path's;
//   C  out[n] = bf16(Σ_k weight_k · y[k, n]) in choice order (moe_combine's
//      sum), over that row range, by whichever of the K blocks of slice s
//      finishes its B last.
// B needs all of act[k, :], that is every A of choice k: each block runs
// the A of all its items first, then counts them done on the choice's
// counter, and waits for the choice's S before its B's products (not its
// copies: the down rows stream in meanwhile). All blocks are resident at
// once (one an SM), so every A finishes and no wait can deadlock.
//
// The stream: a stage is MS_ROWS whole weight rows, moved by the copy
// engine in one or two bulk copies of contiguous rows into a ring of
// `stages` slots, one mbarrier a slot: a copy costs the copy engine about
// the same whatever its size up to kilobytes (copies of a row's 1 KiB ran at
// 2 µs a stage of 16 of them, a quarter of an SM's share of the copy rate),
// so a stage is few, large copies, its rows packed (the fragment loads meet
// two-way bank conflicts, which the stream hides). A block's stages are its
// items' A tiles (each MS_ROWS/2 columns: their MS_ROWS/2 consecutive gate
// rows in one copy, then their up rows in another, so that the mma's
// accumulator rows g and g + 8 are a column's gate and up), then their B
// tiles (MS_ROWS consecutive down rows, one copy). Warp 0 issues; every
// warp takes an eighth of a row's k (linear_stream's permuted k
// order: the weights as the mma's A, x or act as its B, token 0 of 8), and
// at the end of each stage (a tile) the warps' sums meet in shared memory,
// added in warp order. Results differ from moe_route then moe_experts' within the
// f32 sums' order (not bit for bit); the routes (idx, weight, written by
// block 0) are moe_route's bit for bit (route.cuh).
//
// Operands:
//   out  bf16 [H]; x bf16 [H], 16-byte aligned; logits f32 [E]
//   gateUp bf16 [E, 2I, H] (gate rows then up rows), down bf16 [E, H, I],
//        packed, 16-byte aligned
//   idx i32 [K], weight f32 [K]: the routes, written by block 0
//   actg bf16 [K, I], yg bf16 [K, H]: scratch
//   counters i32 [MS_COUNTERS]: zero between launches (each is put back by
//        the last block to use it): [0, 32) the choices' finished A items,
//        [32, 64) their blocks past the wait, [64, 64 + S) the slices'
//        finished B items
//   status i32 [8]: a timed-out wait's record (hopper.cuh), zero while none
//   trace i64 [MS_TRACE] or null: block 0's timeline (ms_mark), for a probe
// H and I multiples of 64, H ≤ MS_MAX_H, I ≤ MS_MAX_I; K ≤ MS_MAX_K;
// S ≤ MS_MAX_S; E ≤ 32·ROUTE_PER_LANE.
//
// Shared memory (dynamic; the host's msShared): MS_HEAD bytes of small
// arrays (the slots' mbarriers, the routes, the router's scratch, the
// warps' sums), x (H bf16), act (I bf16), then the ring.

#include "hopper.cuh"
#include "linear.cuh"
#include "route.cuh"

#define MS_WARPS 8
#define MS_THREADS (MS_WARPS * 32)
#define MS_ROWS 16   // weight rows of a stage: one m16 tile
#define MS_COLS 64   // intermediate columns of an item
#define MS_MAX_STAGES 16
#define MS_MAX_K 32
#define MS_MAX_H 8192
#define MS_MAX_I 4096
#define MS_MAX_S 192
#define MS_COUNTERS (64 + MS_MAX_S)
// The head of shared memory: byte offsets.
#define MS_BARS 0                                     // u64 [MS_MAX_STAGES]
#define MS_EX (MS_BARS + 8 * MS_MAX_STAGES)           // i32 [MS_MAX_K]: the routes' experts
#define MS_W (MS_EX + 4 * MS_MAX_K)                   // f32 [MS_MAX_K]: their weights
#define MS_SCRATCH (MS_W + 4 * MS_MAX_K)              // f32 [32·ROUTE_PER_LANE]: route_token's
#define MS_RED (MS_SCRATCH + 4 * 32 * ROUTE_PER_LANE) // f32 [MS_WARPS][MS_ROWS]: the warps' sums of a tile
#define MS_FLAG (MS_RED + 4 * MS_WARPS * MS_ROWS)     // i32: a wait gave up; i32: this block combines
#define MS_HEAD 2048                                  // bytes of the head
#define MS_TRACE 128                                  // marks a trace holds
static_assert(MS_FLAG + 8 <= MS_HEAD, "the head's arrays fit MS_HEAD");

// ms_mark records the time (ns, the GPU's global timer) at trace[i] when
// trace is set: block 0's thread 0 only (the probe of TestMoESplitTimeline).
__device__ __forceinline__ void ms_mark(long long* trace, int i) {
	if (trace == nullptr || blockIdx.x != 0 || threadIdx.x != 0 || i >= MS_TRACE) return;
	long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	trace[i] = t;
}

// ms_wait_count spins, by one thread, until *c reaches want; false (with
// status recorded, code 2, unless a wait already was) when it waited
// HOP_WAIT_CYCLES or another wait gave up.
__device__ bool ms_wait_count(const int* c, int want, int* status, int item) {
	const long long t0 = clock64();
	volatile int* vs = status;
	while (ld_acquire(c) < want) {
		if (vs[0] != 0) return false;
		if (clock64() - t0 > HOP_WAIT_CYCLES) {
			if (atomicCAS(status, 0, 2) == 0) {
				status[1] = blockIdx.x;
				status[4] = threadIdx.x;
				status[5] = item;
				__threadfence();
			}
			return false;
		}
	}
	return true;
}

// Launch: grid min(K·S, SMs) blocks (every one resident at once),
// MS_THREADS threads, msShared bytes of dynamic shared memory (slots of
// MS_ROWS·max(H, I) elements); 2 ≤ stages ≤ MS_MAX_STAGES.
extern "C" __global__ void __launch_bounds__(MS_THREADS, 1)
    moe_routed_split(bf16* out, const bf16* x, const float* logits, int E, int K, int groupLimited, int groups,
                     int topkGroups, int norm, float scale, int* idx, float* weight, const bf16* gateUp,
                     const bf16* down, bf16* actg, bf16* yg, int H, int I, int stages, int* counters, int* status,
                     long long* trace) {
	extern __shared__ __align__(128) unsigned char smem[];
	const unsigned bars = smem_addr(smem) + MS_BARS;
	int* sEx = reinterpret_cast<int*>(smem + MS_EX);
	float* sW = reinterpret_cast<float*>(smem + MS_W);
	float* red = reinterpret_cast<float*>(smem + MS_RED);
	volatile int* flag = reinterpret_cast<int*>(smem + MS_FLAG);
	bf16* xs = reinterpret_cast<bf16*>(smem + MS_HEAD);
	bf16* act = xs + H;
	bf16* ring = reinterpret_cast<bf16*>(smem + (MS_HEAD + 2 * (H + I) + 127) / 128 * 128);
	int* doneA = counters;      // [K]
	int* passed = counters + 32; // [K]
	int* doneB = counters + 64;  // [S]

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int S = I / MS_COLS, items = K * S;
	const int mine = (items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
	const int perA = MS_COLS / (MS_ROWS / 2); // stages of an item's A: one a tile
	auto itemOf = [&](int m) { return (int)blockIdx.x + m * (int)gridDim.x; };
	auto rows0 = [&](int s) { return s * H / S; }; // slice s's first output row (s·H < 2^31)
	auto tilesB = [&](int m) {
		const int s = itemOf(m) % S;
		return (rows0(s + 1) - rows0(s) + MS_ROWS - 1) / MS_ROWS;
	};
	int total = mine * perA;
	for (int m = 0; m < mine; m++) total += tilesB(m);

	// Stage q of the block: its phase (A or B), item m and tile.
	struct Stage {
		bool a;
		int m, tile;
	};
	auto stageOf = [&](int q) {
		if (q < mine * perA) return Stage{true, q / perA, q % perA};
		q -= mine * perA;
		int m = 0;
		for (; m < mine - 1 && q >= tilesB(m); m++) q -= tilesB(m);
		return Stage{false, m, q};
	};

	ms_mark(trace, 0);
	if (tid == 0) {
		for (int s = 0; s < stages; s++) mbar_init(bars + 8 * s, 1);
		flag[0] = 0;
		mbar_init_fence();
	}
	__syncthreads();
	grid_wait();
	grid_release();
	ms_mark(trace, 1);
	// Warp 0 routes the token while the others copy x.
	if (warp == 0) {
		int e = 0;
		float w = 0.0f;
		route_token(logits, Route{E, K, groupLimited, groups, topkGroups, norm, scale},
		            reinterpret_cast<float*>(smem + MS_SCRATCH), e, w);
		if (lane < K) {
			if (e < 0 || e >= E) __trap(); // no score won: NaN logits
			sEx[lane] = e;
			sW[lane] = w;
			if (blockIdx.x == 0) {
				idx[lane] = e;
				weight[lane] = w;
			}
		}
	} else {
		for (int i = tid - 32; i < H / 8; i += MS_THREADS - 32)
			reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(x)[i];
	}
	__syncthreads();

	// issue, by warp 0, requests stage q into its slot: the tile's gate
	// rows and its up rows (two copies, H elements a row, by lanes 0 and 1),
	// or its down rows (one copy, I a row).
	const int slotElems = MS_ROWS * max(H, I);
	auto issue = [&](int q) {
		const Stage st = stageOf(q);
		const int it = itemOf(st.m), k = it / S, s = it % S, e = sEx[k], slot = q % stages;
		const unsigned bar = bars + 8 * slot, dst = smem_addr(ring + slot * slotElems);
		if (st.a) {
			const int j = s * MS_COLS + st.tile * (MS_ROWS / 2), half = MS_ROWS / 2 * H;
			if (lane == 0) mbar_expect_tx(bar, MS_ROWS * H * 2);
			__syncwarp();
			if (lane < 2) bulk_load(dst + lane * half * 2, gateUp + ((long long)e * 2 * I + lane * I + j) * H, half * 2, bar);
		} else if (lane == 0) {
			const int n0 = rows0(s) + st.tile * MS_ROWS, rows = min(MS_ROWS, rows0(s + 1) - n0);
			mbar_expect_tx(bar, rows * I * 2);
			bulk_load(dst, down + ((long long)e * H + n0) * I, rows * I * 2, bar);
		}
	};
	ms_mark(trace, 2);
	if (warp == 0)
		for (int q = 0; q < min(stages, total); q++) issue(q);
	ms_mark(trace, 3);

	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int q = 0; q < total; q++) {
		const Stage st = stageOf(q);
		const int slot = q % stages, it = itemOf(st.m), k = it / S, s = it % S;
		if (!st.a && st.tile == 0) {
			// The first of an item's B stages: the first of all counts this
			// block's A items done, and every one waits for its choice's
			// act (the copies already run).
			if (st.m == 0) {
				// Thread 0's fence after the barrier publishes every
				// thread's act (the fence is cumulative).
				__syncthreads();
				if (tid == 0) {
					__threadfence();
					for (int m = 0; m < mine; m++) atomicAdd(&doneA[itemOf(m) / S], 1);
				}
			}
			ms_mark(trace, MS_TRACE - 4);
			if (tid == 0) {
				if (!ms_wait_count(&doneA[k], S, status, it)) flag[0] = 1;
				else if (atomicAdd(&passed[k], 1) == S - 1) {
					// Every block of the choice is past its wait: ready for
					// the next launch.
					doneA[k] = 0;
					passed[k] = 0;
				}
				__threadfence(); // the other blocks' act, read below, after the count
			}
			__syncthreads();
			ms_mark(trace, MS_TRACE - 3);
			if (flag[0]) return;
			for (int i = tid; i < I / 8; i += MS_THREADS)
				reinterpret_cast<uint4*>(act)[i] = __ldcg(reinterpret_cast<const uint4*>(actg + (long long)k * I) + i);
			__syncthreads();
			ms_mark(trace, MS_TRACE - 2);
		}
		ms_mark(trace, 4 + 2 * q);
		if (!mbar_wait(bars + 8 * slot, (q / stages) & 1, status, 1, q)) return;
		ms_mark(trace, 5 + 2 * q);
		const int kn = st.a ? H : I; // a row's k: its pitch in the slot too
		const bf16* vec = st.a ? xs : act;
		const bf16* wa = ring + slot * slotElems + g * kn + 8 * t;
		const bf16* wb = wa + 8 * kn;
		const int kw = (kn / MS_WARPS + 31) / 32 * 32, kb = warp * kw, ke = min(kb + kw, kn);
		for (int c = kb; c < ke; c += 32) {
			const uint4 a = lin_lds(wa + c), b = lin_lds(wb + c);
			const uint4 xv = g == 0 ? lin_lds(vec + c + 8 * t) : make_uint4(0, 0, 0, 0);
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const unsigned af[4] = {lin_word(a, 2 * h), lin_word(b, 2 * h), lin_word(a, 2 * h + 1), lin_word(b, 2 * h + 1)};
				mma16816(acc, af, lin_word(xv, 2 * h), lin_word(xv, 2 * h + 1));
			}
		}
		// Accumulator rows g and g + 8, token 0 (t = 0's c0 and c2).
		if (t == 0) {
			red[warp * MS_ROWS + g] = acc[0];
			red[warp * MS_ROWS + g + 8] = acc[2];
		}
		acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
		__syncthreads(); // every warp is done with the slot (and has written its sums)
		if (warp == 0 && q + stages < total) issue(q + stages);
		if (st.a) {
			// Threads 0-7: a column's gate (row tid) and up (row tid + 8).
			if (tid < MS_ROWS / 2) {
				float gt = 0.0f, up = 0.0f;
#pragma unroll
				for (int w = 0; w < MS_WARPS; w++) {
					gt += red[w * MS_ROWS + tid];
					up += red[w * MS_ROWS + tid + MS_ROWS / 2];
				}
				const int j = s * MS_COLS + st.tile * (MS_ROWS / 2) + tid;
				actg[(long long)k * I + j] = __float2bfloat16_rn(lin_swiglu(round_bf16(gt), round_bf16(up)));
			}
		} else {
			const int n = rows0(s) + st.tile * MS_ROWS + tid;
			if (tid < MS_ROWS && n < rows0(s + 1)) {
				float v = 0.0f;
#pragma unroll
				for (int w = 0; w < MS_WARPS; w++) v += red[w * MS_ROWS + tid];
				yg[(long long)k * H + n] = __float2bfloat16_rn(v);
			}
			if (st.tile == tilesB(st.m) - 1) {
				// The item's rows are done: the last of the slice's K items
				// sums them in choice order.
				__syncthreads();
				if (tid == 0) {
					__threadfence(); // publishes the block's y (cumulative, after the barrier)
					flag[1] = atomicAdd(&doneB[s], 1) == K - 1;
					__threadfence(); // and orders the other blocks' y, read below, after the count
				}
				__syncthreads();
				if (flag[1]) {
					for (int n = rows0(s) + tid; n < rows0(s + 1); n += MS_THREADS) {
						float v = 0.0f;
						for (int c = 0; c < K; c++) v += sW[c] * __bfloat162float(__ldcg(yg + (long long)c * H + n));
						out[n] = __float2bfloat16_rn(v);
					}
					if (tid == 0) doneB[s] = 0; // ready for the next launch
				}
			}
		}
		__syncthreads(); // the sums are read before the next tile writes them
	}
	ms_mark(trace, MS_TRACE - 1);
}
