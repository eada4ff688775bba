// The fused set's memory-bound kernels: each reads its inputs once and writes
// its outputs once, with 16-byte accesses where the host found every row
// start aligned for them (VEC 8), rounding where HF's bf16 code rounds.
// Pitches are in elements.

#include "binary.cuh"
#include "common.cuh"
#include "instances.cuh"
#include "norm_rope.cuh"

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
// With RF the kernel releases the one after it before its own grid_wait
// (that kernel's pre-wait prologue then runs under the kernel before this
// one: q+kv_a's weights under moe_one's tail).
#define ADD_ADD_RMS_NORM(NAME, RF, TW, V, NV)                                                                 \
	extern "C" __global__ void NAME(bf16* out, int op, bf16* resid, int rp, const bf16* x, int xp,          \
	                                const bf16* y, int yp, const TW* w, int cols, float eps) {               \
		if (RF) grid_release();                                                                            \
		grid_wait();                                                                                       \
		if (!RF) grid_release();                                                                           \
		rms_norm<true, TW, V, NV, true>(out, op, resid, rp, x, xp, w, cols, eps, blockIdx.x, blockDim.x, y, yp); \
	}
ADD_ADD_RMS_NORM_INSTANCES(ADD_ADD_RMS_NORM)

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

// argmax_chunk is block_argmax_of over one whole chunk of ARGMAX_CHUNK
// columns at a 16-byte aligned c0 of row: each thread loads its columns by
// 16-byte loads all at once (one round trip where the element loop took
// one every few columns), then orders them as block_argmax_of does (better
// is a total order, so the same pair whatever the order). Other chunks
// (the row's last, or a row not aligned) go through block_argmax_of.
template <typename T> __device__ void argmax_chunk(const T* row, int c0, int c1, float& v, int& i) {
	constexpr int VEC = 16 / sizeof(T), LOADS = ARGMAX_CHUNK / ARGMAX_THREADS / VEC;
	static_assert(ARGMAX_CHUNK % (ARGMAX_THREADS * VEC) == 0, "whole 16-byte loads a thread");
	if (c1 - c0 != ARGMAX_CHUNK || (reinterpret_cast<unsigned long long>(row + c0) & 15) != 0) {
		block_argmax_of(row, c0, c1, v, i);
		return;
	}
	uint4 raw[LOADS];
#pragma unroll
	for (int l = 0; l < LOADS; l++)
		raw[l] = *reinterpret_cast<const uint4*>(row + c0 + (l * ARGMAX_THREADS + threadIdx.x) * VEC);
	v = NEG_INF;
	i = NO_INDEX;
#pragma unroll
	for (int l = 0; l < LOADS; l++) {
		const T* e = reinterpret_cast<const T*>(&raw[l]);
#pragma unroll
		for (int j = 0; j < VEC; j++) {
			const int c = c0 + (l * ARGMAX_THREADS + threadIdx.x) * VEC + j;
			const float xv = to_f32(e[j]);
			if (better(xv, c, v, i)) {
				v = xv;
				i = c;
			}
		}
	}
	block_argmax(v, i);
}

template <typename T>
__device__ void argmax_split(int* out, int os, const T* x, int xp, int cols, int2* part, int* counters) {
	__shared__ bool lastBlock;
	const int b = blockIdx.y, s = blockIdx.x, splits = gridDim.x;
	const T* row = x + (long long)b * xp;
	float bv;
	int bi;
	argmax_chunk(row, s * ARGMAX_CHUNK, min(cols, (s + 1) * ARGMAX_CHUNK), bv, bi);
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
		put_choice(out, os, b, bv, bi);
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
