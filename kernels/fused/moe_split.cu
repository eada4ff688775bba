// moe_routed_split (sm_90a): DeepSeek-V2's routed experts for one token in
// one launch after the router's logits, the moe_routed op's variant
// route_split. The folded path (moe.cu) runs them in two launches, gate/up
// then down, so the down projection's weights cannot be asked for before
// the gate/up grid has finished; here every block asks for both its gate/up
// and its down weights as soon as it has routed the token, and the stream
// runs on from one to the other without a launch between them.
//
// Work: the token's K experts × I intermediate columns are cut into items
// of MS_COLS columns (an expert's slice: K·I/MS_COLS items), and block b
// takes items b, b + grid, ... For an item (expert e, columns [j0, j0 +
// MS_COLS)) it computes
//   act[j] = bf16(bf16(silu(bf16(gate_j · x))) · bf16(up_j · x)),  j in the slice
//   part[item, n] = Σ_j down[e, n, j] · act[j]                     (f32, every n < H)
// gate/up as HF rounds act_fn(gate_proj(x)) * up_proj(x); then the blocks
// meet (a grid-wide count: every block is resident, one an SM) and block b
// combines the output columns [b·H/grid, (b+1)·H/grid):
//   y_k[n] = bf16(Σ_slices part[k·slices + s, n])      (the expert's down output, in slice order)
//   out[n] = bf16(Σ_k weight_k · y_k[n])                (choice order, as moe_combine)
// So each expert's output is rounded once, as HF's and the folded path's
// are; only the f32 sums' order differs from theirs (over K = H in 64-k
// steps, over I in slices), hence results within an ulp of theirs, not bit
// for bit. Block 0 also writes the routes (idx, weight), moe_route's bit
// for bit (route.cuh).
//
// The stream: a stage is MS_ROWS weight rows × MS_BK k (16 KiB, one
// 128-byte swizzled row each) by tensor copies into a ring of `stages`
// slots, one mbarrier a slot: an item is H/MS_BK gate/up stages (rows 0-63
// the slice's gate rows, 64-127 its up rows, k [64q, 64q + 64)) then
// H/MS_ROWS down stages (down rows [128q, 128q + 128), k the slice's 64
// columns; with rotate, each block starts its gate/up k-stages at its own
// offset). Thread 0 issues; every warp waits for the stage, multiplies its
// part, and the block syncs before the slot is asked for again, as
// linear_stream does. Gate/up: warp w holds an m16 tile of the slice's
// gate rows 8w..8w+7 and up rows 8w..8w+7 (so one lane holds a column's
// gate and up), x as the mma's B (token 0 of 8), over all stages; at the
// last it writes act for its 8 columns. Down: warp w the 16 rows
// 16w..16w+15 of the stage over the slice's 64 k: complete, written to
// part straight away.
//
// Operands:
//   gu   tensor map of gate_up bf16 [E, 2I, H] (gate rows then up rows),
//        boxes of 64 k × 64 rows, 128-byte swizzle
//   dn   tensor map of down bf16 [E, H, I], boxes of 64 k × 128 rows,
//        128-byte swizzle
//   out  bf16 [H]; x bf16 [H], 16-byte aligned; logits f32 [E]
//   idx i32 [K], weight f32 [K]: the routes, written by block 0
//   part f32 [K·I/MS_COLS, H]: the items' down sums
//   counters i32 [2]: zero between launches (the last block to leave puts
//        them back)
//   status i32 [8]: a timed-out wait's record (hopper.cuh), zero while none
// H a multiple of MS_ROWS up to MS_MAX_H, I of MS_COLS; K ≤ MS_MAX_K;
// E ≤ 32·ROUTE_PER_LANE; ceil(H / grid)·K ≤ MS_THREADS.
//
// Shared memory (dynamic; the host's msShared): MS_HEAD bytes of small
// arrays (the slots' mbarriers, the routes, act, the router's scratch, the
// combine's sums), x (H bf16), then the ring on a 1 KiB boundary (the
// swizzle's period).

#include "hopper.cuh"
#include "route.cuh"

#define MS_WARPS 8
#define MS_THREADS (MS_WARPS * 32)
#define MS_BK 64                       // k of a stage: one 128-byte row
#define MS_ROWS 128                    // weight rows of a stage
#define MS_STAGE (MS_ROWS * MS_BK * 2) // bytes of a stage: 16 KiB
#define MS_COLS 64                     // intermediate columns of an item
#define MS_MAX_STAGES 16
#define MS_MAX_K 32
#define MS_MAX_H 8192
#define MS_ALIGN 1024
// The head of shared memory: byte offsets.
#define MS_BARS 0                                     // u64 [MS_MAX_STAGES]
#define MS_EX (MS_BARS + 8 * MS_MAX_STAGES)           // i32 [MS_MAX_K]: the routes' experts
#define MS_W (MS_EX + 4 * MS_MAX_K)                   // f32 [MS_MAX_K]: their weights
#define MS_ACT (MS_W + 4 * MS_MAX_K)                  // bf16 [MS_COLS]: the item's activations
#define MS_SCRATCH (MS_ACT + 2 * MS_COLS)             // f32 [32·ROUTE_PER_LANE]: route_token's
#define MS_RED (MS_SCRATCH + 4 * 32 * ROUTE_PER_LANE) // f32 [MS_THREADS]: the combine's expert outputs
#define MS_FLAG (MS_RED + 4 * MS_THREADS)             // i32: the grid count gave up
#define MS_HEAD (MS_FLAG + 128)

// ld_acquire reads a counter other blocks add to, ordered before this
// thread's later reads.
__device__ __forceinline__ int ld_acquire(const int* p) {
	int v;
	asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
	return v;
}

// Launch: grid min(items, SMs) blocks (every one resident at once: the
// grid count waits for all), MS_THREADS threads, msShared bytes of dynamic
// shared memory; 2 ≤ stages ≤ MS_MAX_STAGES.
extern "C" __global__ void __launch_bounds__(MS_THREADS, 1)
    moe_routed_split(const __grid_constant__ TmaMap gu, const __grid_constant__ TmaMap dn, bf16* out, const bf16* x,
                     const float* logits, int E, int K, int groupLimited, int groups, int topkGroups, int norm,
                     float scale, int* idx, float* weight, float* part, int H, int I, int stages, int rotate,
                     int* counters, int* status) {
	extern __shared__ __align__(128) unsigned char smem[];
	const unsigned base = smem_addr(smem), bars = base + MS_BARS;
	int* sEx = reinterpret_cast<int*>(smem + MS_EX);
	float* sW = reinterpret_cast<float*>(smem + MS_W);
	bf16* act = reinterpret_cast<bf16*>(smem + MS_ACT);
	float* red = reinterpret_cast<float*>(smem + MS_RED);
	volatile int* flag = reinterpret_cast<int*>(smem + MS_FLAG);
	bf16* xs = reinterpret_cast<bf16*>(smem + MS_HEAD);
	const unsigned ring = (base + MS_HEAD + 2 * H + MS_ALIGN - 1) & ~(MS_ALIGN - 1);

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int slices = I / MS_COLS, items = K * slices;
	const int kst = H / MS_BK, per = kst + H / MS_ROWS; // gate/up stages of an item, and all of them
	const int mine = (items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
	const int total = mine * per;
	// With rotate, block b walks an item's gate/up k-stages from stage b
	// (mod kst) round: the blocks' rows lie 4 KiB·64 apart, and in step
	// they would all ask for the same offset within a row at once.
	const int rot = rotate ? (int)blockIdx.x % kst : 0;

	if (tid == 0) {
		for (int s = 0; s < stages; s++) mbar_init(bars + 8 * s, 1);
		*flag = 0;
		mbar_init_fence();
		// The maps are no kernel's output: their fetch runs under the
		// kernel before.
		asm volatile("prefetch.tensormap [%0];\n" ::"l"(&gu) : "memory");
		asm volatile("prefetch.tensormap [%0];\n" ::"l"(&dn) : "memory");
	}
	__syncthreads();
	grid_wait();
	grid_release();
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

	// issue, by thread 0, requests stage s of the block into its slot.
	auto issue = [&](int s) {
		const int slot = s % stages, it = blockIdx.x + (s / per) * gridDim.x, q = s % per;
		const int e = sEx[it / slices], j0 = (it % slices) * MS_COLS;
		const unsigned dst = ring + slot * MS_STAGE, bar = bars + 8 * slot;
		mbar_expect_tx(bar, MS_STAGE);
		if (q < kst) {
			const int k0 = (q + rot) % kst * MS_BK;
			tma_load_3d(dst, &gu, bar, k0, j0, e);
			tma_load_3d(dst + MS_STAGE / 2, &gu, bar, k0, I + j0, e);
		} else {
			tma_load_3d(dst, &dn, bar, j0, (q - kst) * MS_ROWS, e);
		}
	};
	if (tid == 0)
		for (int s = 0; s < min(stages, total); s++) issue(s);

	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	// Gate/up: the warp's m16 rows are the slice's gate rows 8w..8w+7 and
	// its up rows (stage rows 64 on) 8w..8w+7.
	const int gr = (lane & 15) < 8 ? 8 * warp + (lane & 7) : MS_COLS + 8 * warp + (lane & 7);
	for (int s = 0; s < total; s++) {
		const int slot = s % stages, q = s % per, it = blockIdx.x + (s / per) * gridDim.x;
		const unsigned a = ring + slot * MS_STAGE;
		if (!mbar_wait(bars + 8 * slot, (s / stages) & 1, status, 1, s)) return;
		if (q < kst) {
#pragma unroll
			for (int ks = 0; ks < MS_BK / 16; ks++) {
				unsigned af[4], b0 = 0, b1 = 0;
				ldsm_x4(af, Tile<MS_BK>::at(a, gr, ks * 2 + (lane >> 4)));
				if (g == 0) { // token 0 is the B tile's column 0
					const bf16* xk = xs + (q + rot) % kst * MS_BK + ks * 16 + 2 * t;
					b0 = *reinterpret_cast<const unsigned*>(xk);
					b1 = *reinterpret_cast<const unsigned*>(xk + 8);
				}
				mma16816(acc, af, b0, b1);
			}
			if (q == kst - 1) {
				// Accumulator rows g and g + 8: column 8w + g's gate and up.
				if (t == 0) {
					const float gt = round_bf16(acc[0]), up = round_bf16(acc[2]);
					act[8 * warp + g] = __float2bfloat16_rn(round_bf16(gt / (1.0f + expf(-gt))) * up);
				}
				acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
			}
		} else {
			float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
			for (int ks = 0; ks < MS_COLS / 16; ks++) {
				unsigned af[4], b0 = 0, b1 = 0;
				ldsm_x4(af, Tile<MS_BK>::at(a, 16 * warp + (lane & 15), ks * 2 + (lane >> 4)));
				if (g == 0) {
					b0 = *reinterpret_cast<const unsigned*>(act + ks * 16 + 2 * t);
					b1 = *reinterpret_cast<const unsigned*>(act + ks * 16 + 2 * t + 8);
				}
				mma16816(d, af, b0, b1);
			}
			if (t == 0) {
				float* p = part + (long long)it * H + (q - kst) * MS_ROWS + 16 * warp + g;
				p[0] = d[0];
				p[8] = d[2];
			}
		}
		__syncthreads(); // every warp is done with the slot (and act is written before down reads it)
		if (tid == 0 && s + stages < total) issue(s + stages);
	}

	// Every block's sums are written: count in, and wait for the others.
	__syncthreads();
	if (tid == 0) {
		__threadfence();
		atomicAdd(&counters[0], 1);
		const long long t0 = clock64();
		volatile int* vs = status;
		while (ld_acquire(&counters[0]) < (int)gridDim.x) {
			if (vs[0] != 0) {
				*flag = 1;
				break;
			}
			if (clock64() - t0 > HOP_WAIT_CYCLES) {
				if (atomicCAS(status, 0, 2) == 0) {
					status[1] = blockIdx.x;
					status[4] = tid;
					status[5] = total;
					__threadfence();
				}
				*flag = 1;
				break;
			}
		}
	}
	__syncthreads();
	if (*flag) return;

	// Block b combines the output columns [c0, c1): each expert's slices
	// summed in order and rounded (thread (c, k)), then the experts in
	// choice order.
	const int c0 = (int)((long long)blockIdx.x * H / gridDim.x), c1 = (int)((long long)(blockIdx.x + 1) * H / gridDim.x);
	const int cols = c1 - c0;
	for (int i = tid; i < cols * K; i += MS_THREADS) {
		const int c = i / K, k = i - c * K;
		const float* p = part + (long long)k * slices * H + c0 + c;
		float sum = 0.0f;
		for (int sl = 0; sl < slices; sl++) sum += __ldcg(p + (long long)sl * H);
		red[i] = round_bf16(sum);
	}
	__syncthreads();
	for (int c = tid; c < cols; c += MS_THREADS) {
		float v = 0.0f;
		for (int k = 0; k < K; k++) v += sW[k] * red[c * K + k];
		out[c0 + c] = __float2bfloat16_rn(v);
	}
	// The last block out puts the count back for the next launch: every
	// block has passed its wait by the time it counts itself here.
	if (tid == 0 && atomicAdd(&counters[1], 1) == (int)gridDim.x - 1) {
		counters[0] = 0;
		counters[1] = 0;
	}
}
