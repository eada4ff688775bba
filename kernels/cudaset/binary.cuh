// binary: out = op(a, b) elementwise over bf16 rows, the arithmetic of
// naive's add and mul, which fused's add shares.

#pragma once

#include "common.cuh"

struct AddOp {
	__device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
	__device__ __forceinline__ float operator()(float a, float b) const { return a * b; }
};

// binary is out = op(a, b) elementwise, rounded to bf16.
// out, a, b bf16 [rows, cols] with pitches outp, ap, bp; out may be a or b.
// Launch: 1-D grid-stride over rows*cols/VEC.
template <typename Op, int VEC>
__device__ void binary(bf16* out, int outp, const bf16* a, int ap, const bf16* b, int bp, int rows, int cols) {
	Op op;
	const int cv = cols / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const long long r = i / cv;
		const int c = (int)(i - r * cv) * VEC;
		const Vec<bf16, VEC> x = load<bf16, VEC>(a + r * ap + c);
		const Vec<bf16, VEC> y = load<bf16, VEC>(b + r * bp + c);
		Vec<bf16, VEC> z;
#pragma unroll
		for (int j = 0; j < VEC; j++) z.v[j] = __float2bfloat16_rn(op(to_f32(x.v[j]), to_f32(y.v[j])));
		store<bf16, VEC>(out + r * outp + c, z);
	}
}
