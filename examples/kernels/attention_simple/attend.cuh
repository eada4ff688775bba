// One query head's attention over n keys of the KV cache, the simplest
// correct way: every score into shared memory, its softmax, then each
// output dim as the probability-weighted sum of the values. f32 throughout,
// the output rounded to bf16 once. Slow (each block reads its keys and
// values once per query head, and the scores are not tiled), but short.
#pragma once
#include "fuselm.cuh"

__device__ float block_reduce(float v, bool take_max) {
	__shared__ float partial[32];
	__shared__ float result;
	for (int o = 16; o > 0; o >>= 1) {
		const float w = __shfl_xor_sync(0xffffffffu, v, o);
		v = take_max ? fmaxf(v, w) : v + w;
	}
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	__syncthreads();  // partial may still be read by an earlier call
	if (lane == 0) partial[warp] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		float r = partial[0];
		for (int i = 1; i < (blockDim.x + 31) / 32; i++) r = take_max ? fmaxf(r, partial[i]) : r + partial[i];
		result = r;
	}
	__syncthreads();
	return result;
}

// attend writes out[0, head_dim) = softmax(q·kᵀ·scale)·v over keys
// [0, n): q bf16 [head_dim]; keys and values bf16 [n, head_dim], packed
// (one kv head of one row of the cache); scores f32 [n] of shared memory.
__device__ void attend(bf16* out, const bf16* q, const bf16* keys, const bf16* values, int n, int head_dim,
                       float scale, float* scores) {
	float best = -__int_as_float(0x7f800000);  // -inf
	for (int j = threadIdx.x; j < n; j += blockDim.x) {
		float s = 0.0f;
		for (int d = 0; d < head_dim; d++)
			s += __bfloat162float(q[d]) * __bfloat162float(keys[(long long)j * head_dim + d]);
		scores[j] = s * scale;
		best = fmaxf(best, scores[j]);
	}
	best = block_reduce(best, true);
	float sum = 0.0f;
	for (int j = threadIdx.x; j < n; j += blockDim.x) {
		scores[j] = __expf(scores[j] - best);
		sum += scores[j];
	}
	sum = block_reduce(sum, false);  // its barriers also make every score visible
	for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
		float acc = 0.0f;
		for (int j = 0; j < n; j++) acc += scores[j] * __bfloat162float(values[(long long)j * head_dim + d]);
		out[d] = __float2bfloat16_rn(acc / sum);
	}
}
