// The fused set's memory-bound kernels: each reads its inputs once and writes
// its outputs once, with 16-byte accesses where the host found every row
// start aligned for them (VEC 8), rounding where HF's bf16 code rounds.
// Pitches are in elements.

#include "binary.cuh"
#include "common.cuh"
#include "instances.cuh"
#include "norm_rope.cuh"
#include "route.cuh"

// rms_norm's, rope's and rms_norm_rope's device functions, and what they
// compute, are in norm_rope.cuh.

#define RMS_NORM(NAME, ADD, TW, V, NV)                                                                    \
	extern "C" __global__ void NAME(bf16* out, int op, bf16* resid, int rp,                                 \
	                                                         const bf16* x, int xp, const TW* w, int cols, \
	                                                         float eps) {                                   \
		grid_wait();                                                                                       \
		grid_release();                                                                                    \
		rms_norm<ADD, TW, V, NV>(out, op, resid, rp, x, xp, w, cols, eps, blockIdx.x, blockDim.x);         \
	}
RMS_NORM_INSTANCES(RMS_NORM)

// add_add_rms_norm is add_rms_norm of bf16(x + y): add's sum, then the
// residual add and the norm, in one pass (rms_norm with ADD2). y bf16
// [rows, cols] with pitch yp; the rest as add_rms_norm's.
#define ADD_ADD_RMS_NORM(NAME, TW, V, NV)                                                                     \
	extern "C" __global__ void NAME(bf16* out, int op, bf16* resid, int rp, const bf16* x, int xp,          \
	                                const bf16* y, int yp, const TW* w, int cols, float eps) {               \
		grid_wait();                                                                                       \
		grid_release();                                                                                    \
		rms_norm<true, TW, V, NV, true>(out, op, resid, rp, x, xp, w, cols, eps, blockIdx.x, blockDim.x, y, yp); \
	}
ADD_ADD_RMS_NORM_INSTANCES(ADD_ADD_RMS_NORM)

// add_rms_norm_gemv is add_rms_norm of one row, then that row's product
// with a few weight rows, f32 out, and optionally the row's routes
// (add_rms_norm_linear for a MoE router's logits at decode, and
// add_rms_norm_linear_route, where add_rms_norm, a GEMV kernel and
// moe_route ran one after the other):
//   s = bf16(resid + x); h = bf16(gamma · bf16(s · rstd)), add_rms_norm's
//   row bit for bit (its T threads, accesses and sums); out[n] = Σ_k h[k] ·
//   w[n, k] in f32; with rt.K > 0, idx and weight the routes of out's row
//   (route_token: moe_route's bit for bit on these logits).
// Block (g, r) takes row r and the weight rows n ∈ [g·N/G, (g+1)·N/G), at
// most one a warp: warp i's row n0 + i, read before the grid wait (weights
// are no kernel's output) into registers, lane l holding 16-byte chunks
// l, l + 32, ... (GEMV_WV of them: K ≤ 256·GEMV_WV). After the wait every
// block of the row normalises it (the row is a few KB of L2), keeps h in
// shared memory, and each warp's lanes sum their chunks' products in k
// order, then the warp's shuffles sum the lanes. Block g = 0 writes h; the
// block that counts itself last on counter[r] (every block reads resid
// first) writes resid; the block that counts itself last on counter[rows +
// r] once its logits are written (after a fence) routes the row with its
// first warp. Each puts its counter back to 0.
//   out f32 [M, op]; h, resid bf16 [M, hp / rp]; x bf16 [M, xp]; gamma TW
//   [K]; w bf16 [N, K] packed; counter i32 [2·rows], rows ≥ M, zero
//   between launches; idx i32 [M, ip], weight f32 [M, wp] (rt.K columns),
//   unread with rt.K = 0. K a multiple of VEC, rows on VEC-element
//   boundaries; N ≤ 32·ROUTE_PER_LANE when routing.
// Launch: grid (G, M) with G·(T/32) ≥ N, T threads (add_rms_norm's for K:
// T·NV·VEC ≥ K), K·2 bytes of dynamic shared memory.
#define GEMV_WV 16
template <typename TW, int VEC, int NV>
__device__ void add_rms_norm_gemv(float* out, int op, bf16* h, int hp, bf16* resid, int rp, const bf16* x, int xp,
                                  const TW* gamma, int K, float eps, const bf16* w, int N, int* counter, int rows,
                                  int* idx, int ip, float* weight, int wp, const Route rt) {
	extern __shared__ __align__(16) unsigned char smem[];
	bf16* hs = reinterpret_cast<bf16*>(smem);
	__shared__ int last, routes;
	__shared__ float sc[32 * ROUTE_PER_LANE];
	const int r = blockIdx.y, T = blockDim.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int n0 = (int)((long long)blockIdx.x * N / gridDim.x), n1 = (int)((long long)(blockIdx.x + 1) * N / gridDim.x);
	const int n = n0 + warp;
	const bool has = n < n1;
	uint4 wv[GEMV_WV];
#pragma unroll
	for (int i = 0; i < GEMV_WV; i++) {
		const int k = (lane + 32 * i) * 8;
		wv[i] = has && k < K ? *reinterpret_cast<const uint4*>(w + (long long)n * K + k) : make_uint4(0, 0, 0, 0);
	}
	grid_wait();
	grid_release();

	// add_rms_norm's row (rms_norm<true, TW, VEC, NV>), resid kept for later.
	const bf16* xrow = x + (long long)r * xp;
	bf16* rrow = resid + (long long)r * rp;
	float v[NV][VEC];
	Vec<bf16, VEC> sum[NV];
	float ss = 0.0f;
#pragma unroll
	for (int i = 0; i < NV; i++) {
		const int c = (threadIdx.x + i * T) * VEC;
		if (c < K) {
			const Vec<bf16, VEC> a = load<bf16, VEC>(xrow + c);
			sum[i] = load<bf16, VEC>(rrow + c);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				sum[i].v[j] = __float2bfloat16_rn(to_f32(a.v[j]) + to_f32(sum[i].v[j]));
				const float e = to_f32(sum[i].v[j]);
				v[i][j] = e;
				ss += e * e;
			}
		}
	}
	ss = block_reduce<SumOp>(ss); // its barriers: every thread of the block has read resid
	if (threadIdx.x == 0) last = atomicAdd(counter + r, 1) == (int)gridDim.x - 1;
	const float rstd = rsqrtf(ss / (float)K + eps);
#pragma unroll
	for (int i = 0; i < NV; i++) {
		const int c = (threadIdx.x + i * T) * VEC;
		if (c < K) {
			const Vec<TW, VEC> gv = load<TW, VEC>(gamma + c);
			Vec<bf16, VEC> y;
#pragma unroll
			for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(to_f32(gv.v[j]) * round_bf16(v[i][j] * rstd));
			store<bf16, VEC>(hs + c, y);
			if (blockIdx.x == 0) store<bf16, VEC>(h + (long long)r * hp + c, y);
		}
	}
	__syncthreads(); // hs whole, last set
	if (last) {
#pragma unroll
		for (int i = 0; i < NV; i++) {
			const int c = (threadIdx.x + i * T) * VEC;
			if (c < K) store<bf16, VEC>(rrow + c, sum[i]);
		}
		if (threadIdx.x == 0) counter[r] = 0;
	}
	if (has) {
		float acc = 0.0f;
#pragma unroll
		for (int i = 0; i < GEMV_WV; i++) {
			const int k = (lane + 32 * i) * 8;
			if (k < K) {
				const uint4 hv = *reinterpret_cast<const uint4*>(hs + k);
				const bf16* a = reinterpret_cast<const bf16*>(&wv[i]);
				const bf16* b = reinterpret_cast<const bf16*>(&hv);
#pragma unroll
				for (int j = 0; j < 8; j++) acc += to_f32(a[j]) * to_f32(b[j]);
			}
		}
		acc = warp_reduce<SumOp>(acc);
		if (lane == 0) out[(long long)r * op + n] = acc;
	}
	if (rt.K == 0) return;
	__syncthreads(); // the block's logits are written
	if (threadIdx.x == 0) {
		__threadfence(); // the block's logits before its count
		routes = atomicAdd(counter + rows + r, 1) == (int)gridDim.x - 1;
		if (routes) {
			__threadfence(); // every block's logits before this block reads them
			counter[rows + r] = 0;
		}
	}
	__syncthreads();
	if (!routes || warp != 0) return;
	int e;
	float wt;
	route_token(out + (long long)r * op, rt, sc, e, wt);
	if (lane < rt.K) {
		idx[(long long)r * ip + lane] = e;
		weight[(long long)r * wp + lane] = wt;
	}
}

#define ADD_RMS_NORM_GEMV(NAME, TW, V, NV)                                                                       \
	extern "C" __global__ void NAME(float* out, int op, bf16* h, int hp, bf16* resid, int rp, const bf16* x,     \
	                                int xp, const TW* gamma, int K, float eps, const bf16* w, int N, int* counter, \
	                                int rows, int* idx, int ip, float* weight, int wp, int E, int topK,          \
	                                int groupLimited, int groups, int topkGroups, int norm, float scale) {       \
		add_rms_norm_gemv<TW, V, NV>(out, op, h, hp, resid, rp, x, xp, gamma, K, eps, w, N, counter, rows, idx, ip, \
		                             weight, wp, Route{E, topK, groupLimited, groups, topkGroups, norm, scale});  \
	}
ADD_RMS_NORM_GEMV_INSTANCES(ADD_RMS_NORM_GEMV)

#define ROPE(NAME, INTERLEAVED, V)                                                                             \
	extern "C" __global__ void NAME(bf16* x, int pitch, int heads, int hstride, int offset, const int* pos, \
	                                       const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) { \
		grid_wait();                                                                                                \
		grid_release();                                                                                             \
		rope<INTERLEAVED, V>(x, pitch, heads, hstride, offset, pos, cosT, sinT, cspitch, maxPos, dim, blockIdx.x);  \
	}
ROPE_INSTANCES(ROPE)

#define RMS_NORM_ROPE(NAME, INTERLEAVED, TW, V, NV, RV)                                                       \
	extern "C" __global__ void NAME(bf16* q, int qp, int heads, int hstride, int offset, bf16* kv, int kvp,  \
	                                const TW* w, int rank, float eps, int normT, const int* pos,             \
	                                const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) { \
		grid_wait();                                                                                          \
		grid_release();                                                                                       \
		rms_norm_rope<INTERLEAVED, TW, V, NV, RV>(q, qp, heads, hstride, offset, kv, kvp, w, rank, eps, normT, \
		                                          pos, cosT, sinT, cspitch, maxPos, dim, blockIdx.x, blockIdx.y); \
	}
RMS_NORM_ROPE_INSTANCES(RMS_NORM_ROPE)

// swiglu is out = bf16(bf16(silu(gate)) · up) with gate = gu[:, :inter] and
// up = gu[:, inter:], as HF's act_fn(gate_proj(x)) * up_proj(x) in bf16: one
// pass where eager torch makes two.
// out bf16 [rows, inter] with pitch op; gu bf16 [rows, 2·inter] with pitch gp.
// Launch: 1-D grid-stride over rows·inter/VEC.
template <int VEC> __device__ void swiglu(bf16* out, int op, const bf16* gu, int gp, int rows, int inter) {
	const int cv = inter / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const long long r = i / cv;
		const int c = (int)(i - r * cv) * VEC;
		const Vec<bf16, VEC> g = load<bf16, VEC>(gu + r * gp + c);
		const Vec<bf16, VEC> u = load<bf16, VEC>(gu + r * gp + inter + c);
		Vec<bf16, VEC> y;
#pragma unroll
		for (int j = 0; j < VEC; j++) {
			const float v = to_f32(g.v[j]);
			y.v[j] = __float2bfloat16_rn(round_bf16(v / (1.0f + expf(-v))) * to_f32(u.v[j]));
		}
		store<bf16, VEC>(out + r * op + c, y);
	}
}

#define SWIGLU(NAME, V)                                                                                      \
	extern "C" __global__ void NAME(bf16* out, int op, const bf16* gu, int gp, int rows, int inter) {        \
		grid_wait();                                                                                         \
		grid_release();                                                                                      \
		swiglu<V>(out, op, gu, gp, rows, inter);                                                             \
	}
SWIGLU_INSTANCES(SWIGLU)

// add is naive's binary<AddOp> (binary.cuh), launched to overlap the kernel
// before it (a decode step's MoE adds its shared experts' output to the
// routed ones'). Launch: 1-D grid-stride over rows·cols/VEC.
#define ADD(NAME, V)                                                                                            \
	extern "C" __global__ void NAME(bf16* out, int op, const bf16* a, int ap, const bf16* b, int bp, int rows, \
	                                int cols) {                                                                 \
		grid_wait();                                                                                            \
		grid_release();                                                                                         \
		binary<AddOp, V>(out, op, a, ap, b, bp, rows, cols);                                                   \
	}
ADD_INSTANCES(ADD)

// argmax_split is out[b·os] = the first index of the largest element of row
// b, NaN counting as the largest (as torch.argmax), and with os = 2
// out[b·2 + 1] = that element's value as f32 bits. One block per row reads
// a vocabulary's logits at a fraction of the memory's rate; here a row is
// cut into ARGMAX_CHUNK columns a block, so that the row's bytes are read
// by many SMs at once, and the row's last block to finish reduces the
// blocks' pairs.
// out i32 [B, os]; x T [B, cols] with pitch xp; part int2 [B, splits]
// scratch (value bits, index); counters i32 [≥ B], zero between launches
// (the last block puts its row's back).
// Launch: grid (splits, B) of ARGMAX_THREADS, splits = ceil(cols / ARGMAX_CHUNK).
#define ARGMAX_THREADS 256
#define ARGMAX_CHUNK 4096

template <typename T>
__device__ void argmax_split(int* out, int os, const T* x, int xp, int cols, int2* part, int* counters) {
	__shared__ bool lastBlock;
	const int b = blockIdx.y, s = blockIdx.x, splits = gridDim.x;
	const T* row = x + (long long)b * xp;
	float bv;
	int bi;
	block_argmax_of(row, s * ARGMAX_CHUNK, min(cols, (s + 1) * ARGMAX_CHUNK), bv, bi);
	if (threadIdx.x == 0) {
		part[(long long)b * splits + s] = make_int2(__float_as_int(bv), bi);
		__threadfence();
		lastBlock = atomicAdd(&counters[b], 1) == splits - 1;
	}
	__syncthreads();
	if (!lastBlock) return;
	__threadfence();
	bv = NEG_INF;
	bi = NO_INDEX;
	for (int i = threadIdx.x; i < splits; i += ARGMAX_THREADS) {
		const int2 p = __ldcg(&part[(long long)b * splits + i]);
		if (better(__int_as_float(p.x), p.y, bv, bi)) {
			bv = __int_as_float(p.x);
			bi = p.y;
		}
	}
	block_argmax(bv, bi);
	if (threadIdx.x == 0) {
		put_choice(out, os, b, row, bi);
		counters[b] = 0; // ready for the next launch
	}
}

#define ARGMAX_SPLIT(NAME, T)                                                                                \
	extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                                             \
	    NAME(int* out, int os, const T* x, int xp, int cols, int2* part, int* counters) {                      \
		grid_wait();                                                                                         \
		grid_release();                                                                                      \
		argmax_split<T>(out, os, x, xp, cols, part, counters);                                               \
	}
ARGMAX_SPLIT_INSTANCES(ARGMAX_SPLIT)
