// What the decode linears (linear_skinny in linear.cu, linear_stream in
// linear_stream.cu) share: 16-byte shared loads taken apart into the mma's
// operand words, the bias as torch's addmm adds it, and swiglu's
// arithmetic for linear_stream's SwiGLU epilogue. Built on mma.cuh.

#pragma once
#include "mma.cuh"

__device__ __forceinline__ uint4 lin_lds(const bf16* p) {
	uint4 v;
	const unsigned a = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
	return v;
}

__device__ __forceinline__ unsigned lin_word(const uint4& v, int i) {
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// lin_bias is bias[f] as the addmm path adds it: rounded to bf16 first when
// the output is bf16 (the bias rows were copied into the bf16 output).
template <typename TO> __device__ __forceinline__ float lin_bias(const void* bias, int type, int f) {
	float b = 0.0f;
	if (type == 1) b = to_f32(((const bf16*)bias)[f]);
	else if (type == 2) b = to_f32(((const half_bits*)bias)[f]);
	else if (type == 3) b = ((const float*)bias)[f];
	return sizeof(TO) == 2 ? round_bf16(b) : b;
}

// lin_swiglu is swiglu's arithmetic (elementwise.cu's swiglu, HF's
// act_fn(gate) * up in bf16) on a gate and an up already rounded to bf16:
// silu(gate) rounded to bf16, times up; the caller's store rounds the
// product.
__device__ __forceinline__ float lin_swiglu(float gate, float up) { return round_bf16(gate / (1.0f + expf(-gate))) * up; }
