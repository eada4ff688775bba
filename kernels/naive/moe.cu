// MoE routing, the bookkeeping around the expert GEMMs of the naive set, and
// the expert GEMM of small steps (larger ones are cuBLAS calls made by moe.go).

#include "common.cuh"
#include "instances.cuh"

// ROUTE_THREADS (the most experts moe_route handles: one thread each),
// MAX_TOPK (the most experts one token may choose), EXPERT_ROWS and
// EXPERT_COLS (moe_expert_gemm's rows per weight pass and columns per warp)
// come from the host as -D options (naive.go).

// moe_route chooses each token's experts, as DeepSeek-V2's MoEGate:
// scores = softmax(logits) in f32; with groupLimited, only the experts of the
// topkGroups groups (E/groups consecutive experts each) whose best score is
// highest compete and the others score 0; the K best scores win (ties to the
// lower index), in descending order; weight = score / (Σ chosen + 1e-20) when
// norm (and K > 1), times scale.
// logits f32 [N, lp] (E columns used); idx i32 [N, ip], weight f32 [N, wp]
// (K columns written). Launch: grid.x = N (one block per token),
// ROUTE_THREADS threads (E <= ROUTE_THREADS, K <= MAX_TOPK, checked by the host).
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route(int* idx, int ip, float* weight, int wp, const float* logits, int lp, int E, int K,
              int groupLimited, int groups, int topkGroups, int norm, float scale) {
	__shared__ float score[ROUTE_THREADS];
	__shared__ int chosenGroup[ROUTE_THREADS];
	__shared__ float topW[MAX_TOPK];
	__shared__ int topI[MAX_TOPK];
	const long long t = blockIdx.x;
	const int e = threadIdx.x;

	const float l = e < E ? logits[t * lp + e] : NEG_INF;
	const float m = block_reduce<MaxOp>(l);
	const float ex = e < E ? expf(l - m) : 0.0f;
	const float sum = block_reduce<SumOp>(ex);
	const float p = ex / sum;
	float cand = e < E ? p : NEG_INF;

	if (groupLimited) {
		const int gsize = E / groups;
		if (e < E) score[e] = p;
		chosenGroup[e] = 0;
		__syncthreads();
		float gbest = NEG_INF; // thread g holds group g's best score
		if (e < groups)
			for (int j = 0; j < gsize; j++) gbest = fmaxf(gbest, score[e * gsize + j]);
		for (int k = 0; k < topkGroups; k++) {
			float bv = gbest;
			int bi = e;
			block_argmax(bv, bi);
			if (e == bi) {
				chosenGroup[e] = 1;
				gbest = NEG_INF;
			}
		}
		__syncthreads();
		if (e < E && !chosenGroup[e / gsize]) cand = 0.0f;
	}

	for (int k = 0; k < K; k++) {
		float bv = cand;
		int bi = e;
		block_argmax(bv, bi);
		if (e == bi) cand = NEG_INF;
		if (e == 0) {
			topW[k] = bv;
			topI[k] = bi;
		}
	}
	__syncthreads();
	if (e == 0) {
		float total = 0.0f;
		for (int k = 0; k < K; k++) total += topW[k];
		const float denom = norm && K > 1 ? total + 1e-20f : 1.0f;
		for (int k = 0; k < K; k++) {
			idx[t * ip + k] = topI[k];
			weight[t * wp + k] = topW[k] / denom * scale;
		}
	}
}

// iota_i32 is p[i] = i*step for i < n (step 0 zeroes). p i32 [n].
// Launch: 1-D grid-stride over n.
extern "C" __global__ void iota_i32(int* p, int n, int step) {
	GRID_STRIDE(i, n) p[i] = (int)i * step;
}

// expert_of is the expert of choice i = t*K + k of idx i32 [N, ip]; an expert
// outside [0, E) traps.
__device__ __forceinline__ int expert_of(const int* idx, int ip, int K, int E, long long i) {
	const long long t = i / K;
	const int e = idx[t * ip + (i - t * K)];
	if (e < 0 || e >= E) __trap();
	return e;
}

// moe_count adds every token's choices to the per-expert counts.
// counts i32 [E], zeroed before; idx i32 [N, ip] (K columns used).
// Launch: 1-D grid-stride over N*K.
extern "C" __global__ void moe_count(int* counts, const int* idx, int ip, int N, int K, int E) {
	GRID_STRIDE(i, (long long)N * K) atomicAdd(&counts[expert_of(idx, ip, K, E, i)], 1);
}

// moe_offsets is the exclusive prefix sum of the counts: expert e's rows of
// the sorted buffer are [offsets[e], offsets[e+1]); cursor[e] = offsets[e].
// counts, cursor i32 [E]; offsets i32 [E+1]. Launch: one thread (E is small).
extern "C" __global__ void moe_offsets(int* offsets, int* cursor, const int* counts, int E) {
	int sum = 0;
	for (int e = 0; e < E; e++) {
		offsets[e] = sum;
		cursor[e] = sum;
		sum += counts[e];
	}
	offsets[E] = sum;
}

// moe_assign gives every choice i = t*K + k its row of the expert-sorted
// buffer: slot[i] = cursor[e]++ (the order among an expert's rows is
// arbitrary; every row is computed on its own). cursor i32 [E], the first row
// of each expert; slot i32 [N*K]; idx i32 [N, ip].
// Launch: 1-D grid-stride over N*K.
extern "C" __global__ void moe_assign(int* slot, int* cursor, const int* idx, int ip, int N, int K, int E) {
	GRID_STRIDE(i, (long long)N * K) slot[i] = atomicAdd(&cursor[expert_of(idx, ip, K, E, i)], 1);
}

// moe_expert_gemm is y[r] = x[r]·w[e]ᵀ for every expert e and each of its
// rows r of the expert-sorted x, [offsets[e], offsets[e+1]): HF's loop of one
// projection per chosen expert, made one launch so that nothing is read on
// the host. An expert nobody chose costs its blocks an exit and none of its
// weights; a chosen one has its weights read once per EXPERT_ROWS of its rows
// (once whenever a step has at most EXPERT_ROWS tokens, as every token takes
// an expert at most once). Each warp computes whole output columns: the lanes
// stream the column's weight row in VEC-wide loads, multiply it with every
// row's x (read through L1: a step's rows are few), and reduce across the
// warp; sums in f32, rounded to bf16 as cuBLAS's.
// y bf16 [rows, yp]; x bf16 [rows, K] packed; w bf16 [E, N, K]; offsets i32
// [E+1]. Launch: grid (ceil(N / (warps·EXPERT_COLS)), E), warps·32 threads;
// K % VEC == 0.
template <int VEC>
__device__ void moe_expert_gemm(bf16* y, int yp, const bf16* x, const bf16* w, const int* offsets, int N, int K) {
	const int e = blockIdx.y;
	const int r0 = offsets[e], r1 = offsets[e + 1];
	if (r0 == r1) return;
	const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int n1 = min(N, (int)(blockIdx.x + 1) * warps * EXPERT_COLS);
	for (int n = blockIdx.x * warps * EXPERT_COLS + warp; n < n1; n += warps) {
		const bf16* wn = w + ((long long)e * N + n) * K;
		for (int c0 = r0; c0 < r1; c0 += EXPERT_ROWS) {
			const int nr = min(EXPERT_ROWS, r1 - c0);
			float acc[EXPERT_ROWS];
#pragma unroll
			for (int r = 0; r < EXPERT_ROWS; r++) acc[r] = 0.0f;
#pragma unroll 4
			for (int k = lane * VEC; k < K; k += 32 * VEC) {
				const Vec<bf16, VEC> wv = load<bf16, VEC>(wn + k);
#pragma unroll
				for (int r = 0; r < EXPERT_ROWS; r++) {
					if (r < nr) {
						const Vec<bf16, VEC> xv = load<bf16, VEC>(x + (long long)(c0 + r) * K + k);
#pragma unroll
						for (int j = 0; j < VEC; j++) acc[r] = fmaf(to_f32(wv.v[j]), to_f32(xv.v[j]), acc[r]);
					}
				}
			}
#pragma unroll
			for (int r = 0; r < EXPERT_ROWS; r++) {
				if (r < nr) {
					const float s = warp_reduce<SumOp>(acc[r]);
					if (lane == 0) y[(long long)(c0 + r) * yp + n] = __float2bfloat16_rn(s);
				}
			}
		}
	}
}

#define MOE_EXPERT_GEMM(NAME, V)                                                                            \
	extern "C" __global__ void NAME(bf16* y, int yp, const bf16* x, const bf16* w,          \
	                                                const int* offsets, int N, int K) {                     \
		moe_expert_gemm<V>(y, yp, x, w, offsets, N, K);                                                     \
	}
MOE_EXPERT_GEMM_INSTANCES(MOE_EXPERT_GEMM)
