// linear_skinny: out = x·wᵀ + bias for the few rows of a decode step (M ≤ 16),
// a stream of the weights at the memory's rate.
//
// Operands (pitches in elements):
//   out  TO [M, N], pitch op (bf16 activations, or f32 logits)
//   x    bf16 [M, K], pitch xp; rows start on 16-byte boundaries (xp % 8 == 0)
//   w    bf16 [N, K], packed; K % 8 == 0 and w 16-byte aligned
//   bias [N] of dtype biasType (0 none, 1 bf16, 2 f16, 3 f32)
//   part f32 scratch for split columns, counters i32 [split columns], zero
//        between launches (the last block of a column puts its counter back)
//
// Work: a block column is LIN_FEATS consecutive features; each of the
// block's LIN_WARPS warps owns one m16 tile of them. The weights are the
// mma's A operand (16 features × 16 k) and x its B operand (16 k × 8 tokens,
// NT tiles of 8 tokens), so out comes transposed in the accumulators and
// M ≤ 8 costs one mma per k-step, not two.
//
// Weights go from global memory straight into the A fragments, with no
// shared-memory stage: the order of k inside a dot product is free, so each
// thread's 16-byte load of 8 consecutive k of one weight row is taken as the
// fragment elements (k = 2t, 2t+1, 2t+8, 2t+9 of two mma k-steps) and x is
// read from shared memory in the same permuted order. Thread (g, t) of a
// warp (g = lane/4, t = lane%4) loads, per 32-k chunk, k [8t, 8t+8) of
// feature rows g and g+8 of its tile; its register r (elements 2r, 2r+1)
// then holds physical k 8t+2r, 8t+2r+1, and mma step s ∈ {0,1} of the chunk
// takes registers 2s (as logical k 2t, 2t+1) and 2s+1 (as 2t+8, 2t+9). The B
// fragment of token g is x[g][8t+4s .. 8t+4s+4): one 16-byte shared load per
// chunk serves both steps.
//
// Pipeline: LIN_U chunks make a stage; a warp keeps two stages of weight
// loads in flight (registers) while it multiplies the one before. x lives in
// shared memory LIN_PHASE k at a time, two buffers filled with cp.async a
// phase ahead; a block's warps meet at a barrier once per phase.
//
// Grid (the host's plan): blocks [0, full) each own one column over all of
// K and write out directly; the remaining columns are split over K in
// `splits` ranges of `chunk` k (a multiple of LIN_STAGE): each split block
// writes its f32 partial to part, and the column's last block to finish
// sums them in split order (deterministic), adds the bias and writes out.
// part: [splits][M][splitCols·LIN_FEATS] with splitCols = columns − full.
//
// Rounding: sums in f32 (the mma's accumulators); the bias is rounded to
// bf16 first when out is bf16, then out = round(acc + bias) once: what
// cuBLAS's addmm with beta = 1 over bf16 bias rows gives (naive's Linear).

#include "linear.cuh"
#include "instances.cuh"

#define LIN_WARPS 8                      // warps of a block, one m16 tile of features each
#define LIN_FEATS (LIN_WARPS * 16)       // features of a block column
#define LIN_CHUNK 32                     // k of one 16-byte load by each of a group's 4 lanes
#define LIN_U 4                          // chunks per pipeline stage
#define LIN_STAGE (LIN_CHUNK * LIN_U)    // k of one stage
#define LIN_PHASE 512                    // k of x in one shared buffer
#define LIN_XROW (LIN_PHASE + 32)        // shared row pitch: 64 bytes of pad, no bank conflicts
#define LIN_THREADS (LIN_WARPS * 32)
#define LIN_MIN_BLOCKS 2                 // blocks an SM should hold (caps registers at 128)
#define LIN_PREFETCH 2                   // stages asked of L2 before the wait on the kernel before

__device__ __forceinline__ uint4 lin_ldg(const bf16* p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	             : "l"(p));
	return v;
}

__device__ __forceinline__ void lin_prefetch(const bf16* p) {
	asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Stage holds one stage of a warp's weight loads: rows g and g+8 of its tile.
struct LinStage {
	uint4 a[LIN_U], b[LIN_U];
};

template <int NT, typename TO>
__device__ __forceinline__ void linear_skinny(TO* out, int op, const bf16* x, int xp, const bf16* w, const void* bias, int biasType,
	              float* part, int* counters, int M, int N, int K, int full, int splits, int chunk) {
	__shared__ __align__(16) bf16 xs[2][NT * 8][LIN_XROW];
	__shared__ int lastFlag;

	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int g = lane >> 2, t = lane & 3;

	// The block's column and k range.
	int col, split = 0, kb = 0, ke = K;
	if ((int)blockIdx.x < full) {
		col = blockIdx.x;
	} else {
		const int r = blockIdx.x - full;
		col = full + r / splits;
		split = r - (r / splits) * splits;
		kb = split * chunk;
		ke = min(K, kb + chunk);
	}
	const int fa = col * LIN_FEATS + warp * 16 + g, fb = fa + 8;
	const bool okA = fa < N, okB = fb < N;
	const bf16* wa = w + (long long)(okA ? fa : 0) * K + 8 * t;
	const bf16* wb = w + (long long)(okB ? fb : 0) * K + 8 * t;

	auto loadStage = [&](LinStage& s, int k) {
#pragma unroll
		for (int u = 0; u < LIN_U; u++) {
			const int kk = k + u * LIN_CHUNK;
			const bool in = kk + 8 * t < ke;
			s.a[u] = make_uint4(0, 0, 0, 0);
			s.b[u] = make_uint4(0, 0, 0, 0);
			if (in && okA) s.a[u] = lin_ldg(wa + kk);
			if (in && okB) s.b[u] = lin_ldg(wb + kk);
		}
	};
	// loadPhase starts the copy of x[:, k0, k0+LIN_PHASE) ∩ [kb, ke) into
	// buffer buf, zeros beyond ke (a weight of 0 times stale shared memory
	// could be NaN).
	auto loadPhase = [&](int buf, int k0) {
		constexpr int vecs = LIN_PHASE / 8;
		for (int i = threadIdx.x; i < M * vecs; i += LIN_THREADS) {
			const int r = i / vecs, c = (i - r * vecs) * 8;
			const bool valid = k0 + c < ke;
			cp16(smem_addr(&xs[buf][r][c]), x + (long long)r * xp + (valid ? k0 + c : 0), valid);
		}
		cp_commit();
	};

	float acc[NT][4];
#pragma unroll
	for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

	// step multiplies the stage cur at k (whose x is in buffer buf at
	// offset off) after starting the next stage's loads into nxt.
	auto step = [&](const LinStage& cur, int buf, int off) {
#pragma unroll
		for (int u = 0; u < LIN_U; u++) {
			uint4 xv[NT];
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const int tok = j * 8 + g;
				xv[j] = tok < M ? lin_lds(&xs[buf][tok][off + u * LIN_CHUNK + 8 * t]) : make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (int s = 0; s < 2; s++) {
#pragma unroll
				for (int j = 0; j < NT; j++) {
					const unsigned a[4] = {lin_word(cur.a[u], 2 * s), lin_word(cur.b[u], 2 * s),
					                       lin_word(cur.a[u], 2 * s + 1), lin_word(cur.b[u], 2 * s + 1)};
					mma16816(acc[j], a, lin_word(xv[j], 2 * s), lin_word(xv[j], 2 * s + 1));
				}
			}
		}
	};

	const int stages = (ke - kb + LIN_STAGE - 1) / LIN_STAGE;
	// Launched to overlap the kernel before it (which writes x, or what x
	// is made from): the first LIN_PREFETCH stages of the warp's weight
	// rows are asked of L2 before the wait, each of a row's four lanes one
	// 128-byte line, so that their loads find them there. (Loads themselves
	// would be sunk below the wait by the compiler.)
	static_assert(LIN_PREFETCH * LIN_STAGE == 4 * 64, "a row's four lanes ask one 128-byte line each");
	if (kb + 64 * t < ke) {
		if (okA) lin_prefetch(wa - 8 * t + kb + 64 * t);
		if (okB) lin_prefetch(wb - 8 * t + kb + 64 * t);
	}
	grid_wait();
	grid_release();
	LinStage s0, s1;
	loadStage(s0, kb);
	// visit handles stage st held in cur: at a phase start, the next phase
	// of x is started and this one awaited; the next stage's weights are
	// started into nxt before cur is multiplied.
	auto visit = [&](int st, const LinStage& cur, LinStage& nxt) {
		const int k = kb + st * LIN_STAGE, rel = st * LIN_STAGE;
		const int phase = rel / LIN_PHASE;
		if (rel % LIN_PHASE == 0) {
			if (st == 0) loadPhase(0, k);
			__syncthreads(); // every warp is done with the buffer the next phase fills
			if (k + LIN_PHASE < ke) loadPhase((phase + 1) & 1, k + LIN_PHASE);
			else cp_commit();
			cp_wait<1>();
			__syncthreads();
		}
		if (st + 1 < stages) loadStage(nxt, k + LIN_STAGE);
		step(cur, phase & 1, rel - phase * LIN_PHASE);
	};
	for (int st = 0; st < stages; st += 2) {
		visit(st, s0, s1);
		if (st + 1 < stages) visit(st + 1, s1, s0);
	}

	// Accumulator (j, e): feature (e < 2 ? fa : fb), token 8j + 2t + (e & 1).
	if ((int)blockIdx.x < full) {
#pragma unroll
		for (int j = 0; j < NT; j++) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int f = e < 2 ? fa : fb, tok = j * 8 + 2 * t + (e & 1);
				if (tok < M && f < N) out[(long long)tok * op + f] = from_f32<TO>(acc[j][e] + lin_bias<TO>(bias, biasType, f));
			}
		}
		return;
	}

	// A split block: its partial, then the column's last block reduces.
	const int splitCols = (N + LIN_FEATS - 1) / LIN_FEATS - full;
	const int ppitch = splitCols * LIN_FEATS;
	const int cbase = (col - full) * LIN_FEATS;
	float* mine = part + (long long)split * M * ppitch + cbase;
#pragma unroll
	for (int j = 0; j < NT; j++) {
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int fl = warp * 16 + g + (e < 2 ? 0 : 8), tok = j * 8 + 2 * t + (e & 1);
			if (tok < M) mine[(long long)tok * ppitch + fl] = acc[j][e];
		}
	}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) lastFlag = atomicAdd(&counters[col - full], 1) == splits - 1;
	__syncthreads();
	if (!lastFlag) return;
	__threadfence();
	constexpr int quads = LIN_FEATS / 4;
	for (int i = threadIdx.x; i < M * quads; i += LIN_THREADS) {
		const int tok = i / quads, fl = (i - tok * quads) * 4;
		const float* p = part + (long long)tok * ppitch + cbase + fl;
		float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
		for (int s = 0; s < splits; s++) {
			const float4 v = __ldcg(reinterpret_cast<const float4*>(p + (long long)s * M * ppitch));
			sum.x += v.x;
			sum.y += v.y;
			sum.z += v.z;
			sum.w += v.w;
		}
		const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
		const int f0 = col * LIN_FEATS + fl;
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (f0 + q < N) out[(long long)tok * op + f0 + q] = from_f32<TO>(vals[q] + lin_bias<TO>(bias, biasType, f0 + q));
		}
	}
	if (threadIdx.x == 0) counters[col - full] = 0; // ready for the next launch
}

#define LINEAR_SKINNY(NAME, NT, TO)                                                                             \
	extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MIN_BLOCKS) NAME(                             \
		TO* out, int op, const bf16* x, int xp, const bf16* w, const void* bias, int biasType, float* part,     \
		int* counters, int M, int N, int K, int full, int splits, int chunk) {                                  \
		linear_skinny<NT, TO>(out, op, x, xp, w, bias, biasType, part, counters, M, N, K, full, splits, chunk); \
	}
LINEAR_SKINNY_INSTANCES(LINEAR_SKINNY)
