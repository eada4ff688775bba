// fuselm.cuh: the public header of fuselm's kernel ABI (docs/KERNEL_ABI.md).
// A user's .cu file includes it (#include "fuselm.cuh"); fuselm hands it to
// NVRTC, so the file needs no include path. It gives the ABI's version, the
// bf16 type, and one macro per op that declares a kernel with the exact
// parameters fuselm passes, so that a signature cannot drift from the ABI.
//
// Every pointer is to device memory; pitches are in elements; bf16 is
// __nv_bfloat16; int is 32 bits.
#pragma once
#include <cuda_bf16.h>

#define FUSELM_ABI_VERSION 1

// FUSELM_ABI(n) fails the compile when the file was written for ABI n and
// this header is another's.
#define FUSELM_ABI(n) static_assert((n) == FUSELM_ABI_VERSION, "this kernel was written for another fuselm kernel ABI")

typedef __nv_bfloat16 bf16;

// rms_norm: out[r,:] = w * bf16(x[r,:] * rsqrt(mean(x[r,:]^2) + eps)).
#define FUSELM_RMS_NORM(name)                                                                            \
	extern "C" __global__ void name(bf16* out, int out_pitch, const bf16* x, int x_pitch, const bf16* w, \
	                                int rows, int cols, float eps)

// add_rms_norm: resid += x (rounded to bf16), then out = rms_norm(resid).
#define FUSELM_ADD_RMS_NORM(name)                                                                             \
	extern "C" __global__ void name(bf16* out, int out_pitch, bf16* resid, int resid_pitch, const bf16* x,     \
	                                int x_pitch, const bf16* w, int rows, int cols, float eps)

// rope: rotates, in place, dims [offset, offset+dim) of each head of each token.
#define FUSELM_ROPE(name)                                                                                  \
	extern "C" __global__ void name(bf16* x, int pitch, int tokens, int heads, int head_stride, int offset, \
	                                const int* pos, const float* cos, const float* sin, int cs_pitch,      \
	                                int max_pos, int dim, int interleaved)

// swiglu: out[r,c] = silu(gate_up[r,c]) * gate_up[r,cols+c].
#define FUSELM_SWIGLU(name) \
	extern "C" __global__ void name(bf16* out, int out_pitch, const bf16* gate_up, int gate_up_pitch, int rows, int cols)

// attn_prefill: causal GQA attention of a packed ragged batch over the KV cache.
#define FUSELM_ATTN_PREFILL(name)                                                                             \
	extern "C" __global__ void name(bf16* out, int out_pitch, const bf16* q, int q_pitch, const bf16* k_cache, \
	                                const bf16* v_cache, const int* start, const int* past, int batch,         \
	                                int heads, int kv_heads, int head_dim, int max_seq, float scale, int causal)

// attn_decode: GQA attention of one new token per row over the KV cache.
#define FUSELM_ATTN_DECODE(name)                                                                              \
	extern "C" __global__ void name(bf16* out, int out_pitch, const bf16* q, int q_pitch, const bf16* k_cache, \
	                                const bf16* v_cache, const int* past, int batch, int heads, int kv_heads,  \
	                                int head_dim, int max_seq, float scale)
