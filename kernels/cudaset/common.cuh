// Shared by every module of every CUDA kernel set: element types, vector
// access, block reductions and the packed batch's row lookup. Every set's
// .cu files include it; cudaset gives it to NVRTC with the set's headers.
//
// Conventions of every kernel:
//   - Matrices are rows of contiguous elements, row r at base + r*pitch
//     (pitch in elements); a pitch of 0 repeats row 0 for every row.
//   - VEC is the number of elements one thread moves per access: 8 (16 bytes
//     of bf16) when the host found every row start aligned for it, else 1.
//   - Arithmetic is f32; results are rounded to bf16 with round-to-nearest-even.
//   - Block sizes are multiples of 32 (the reductions use full-warp shuffles).

#pragma once

#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// f16 values (weights, and the operands of an f16 attention prefill) are
// read and written through PTX conversions, so that no fp16 header is
// needed: half_bits is their raw bits.
struct half_bits {
	unsigned short x;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(half_bits v) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
	return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ half_bits from_f32<half_bits>(float v) {
	half_bits h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(v));
	return h;
}

// round_bf16 is v rounded to bf16 and back: the value a bf16 tensor would hold.
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Vec is N consecutive elements loaded or stored in one access.
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
	T v[N];
};

template <typename T, int N> __device__ __forceinline__ Vec<T, N> load(const T* p) {
	return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N> __device__ __forceinline__ void store(T* p, const Vec<T, N>& v) {
	*reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Grid-stride loop over the n items of a 1-D launch.
#define GRID_STRIDE(i, n)                                                      \
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (long long)gridDim.x * blockDim.x)

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000u)

struct SumOp {
	__device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
	__device__ __forceinline__ static float identity() { return 0.0f; }
};

struct MaxOp {
	__device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
	__device__ __forceinline__ static float identity() { return NEG_INF; }
};

template <typename Op> __device__ __forceinline__ float warp_reduce(float v) {
	Op op;
	for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

// block_reduce combines v over the block and returns the result to every
// thread. Every warp reduces the per-warp partials itself, in the same order,
// so all threads see the same value. Safe to call repeatedly.
template <typename Op> __device__ float block_reduce(float v) {
	__shared__ float part[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	v = warp_reduce<Op>(v);
	if (lane == 0) part[warp] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? part[lane] : Op::identity();
	v = warp_reduce<Op>(v);
	__syncthreads(); // part is free for the next call
	return v;
}

// better orders (value, index) pairs for argmax as torch.argmax does: NaN
// above every number, then the larger value, then the lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
	const bool nan = v != v, bnan = bv != bv;
	if (nan != bnan) return nan;
	return nan || v == bv ? i < bi : v > bv;
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(FULL_MASK, v, o);
		int oi = __shfl_xor_sync(FULL_MASK, i, o);
		if (better(ov, oi, v, i)) {
			v = ov;
			i = oi;
		}
	}
}

#define NO_INDEX 0x7fffffff

// block_argmax leaves in every thread's (v, i) the best pair of the block.
__device__ void block_argmax(float& v, int& i) {
	__shared__ float pv[32];
	__shared__ int pi[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	warp_argmax(v, i);
	if (lane == 0) {
		pv[warp] = v;
		pi[warp] = i;
	}
	__syncthreads();
	const bool have = lane < (int)(blockDim.x >> 5);
	v = have ? pv[lane] : NEG_INF;
	i = have ? pi[lane] : NO_INDEX;
	warp_argmax(v, i);
	__syncthreads();
}

// block_argmax_of leaves in every thread's (v, i) the block's best pair
// of row[c0, c1) by better: the first NaN, else the first of the largest
// values, as torch.argmax. A row of -inf gives c0.
template <typename T> __device__ void block_argmax_of(const T* row, int c0, int c1, float& v, int& i) {
	v = NEG_INF;
	i = NO_INDEX;
#pragma unroll 4
	for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
		const float x = to_f32(row[c]);
		if (better(x, c, v, i)) {
			v = x;
			i = c;
		}
	}
	block_argmax(v, i);
}

// put_choice writes row b's argmax i to out[b·os] and, with os = 2, the
// chosen element's value v (as f32 bits) beside it: the pair's value from
// block_argmax, to_f32 of that element's bits, so nothing is read back.
__device__ __forceinline__ void put_choice(int* out, int os, int b, float v, int i) {
	out[b * os] = i;
	if (os == 2) out[b * 2 + 1] = __float_as_int(v);
}

// row_of is the row b of token t in a packed batch: the last b < B with
// start[b] <= t (start i32 [B+1], ascending; empty rows are skipped).
__device__ __forceinline__ int row_of(const int* start, int B, int t) {
	int lo = 0, hi = B - 1;
	while (lo < hi) {
		const int mid = (lo + hi + 1) / 2;
		if (start[mid] <= t) lo = mid;
		else hi = mid - 1;
	}
	return lo;
}

// Programmatic dependent launch (cudaset.Kit.Overlap,
// cuda.Device.LaunchOverlapped): a kernel launched to overlap the one
// before it on the stream calls grid_wait before it reads
// what the kernels before it wrote or writes what they read, and
// grid_release once the kernel after it may begin (its blocks then take the
// SMs this grid leaves free and run up to their own grid_wait). Work before
// grid_wait overlaps the previous kernel's tail: address arithmetic, and
// loads of weights, which no kernel writes. Launched without overlap, or
// below sm_90, both return at once.
__device__ __forceinline__ void grid_wait() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_release() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
