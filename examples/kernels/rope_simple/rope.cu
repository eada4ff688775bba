// RoPE as the simplest correct kernel: one thread per rotated pair
// (fuselm kernel ABI 1).
//
// Rotates, in place, dims [offset, offset+dim) of each of the heads of
// every token: head h of token t starts at x + t*pitch + h*head_stride.
// Pair i (i < dim/2) is the dims (i, i+dim/2) (Qwen2's rotate_half) or
// (2i, 2i+1) when interleaved (DeepSeek-V2), rotated by the angle of
// position pos[t]: cos/sin f32 [max_pos, cs_pitch], entry [pos[t], i].
//   x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin, in f32, rounded once.
// Launch (fuselm.json): grid = cdiv(tokens*heads*dim/2, block).
#include "fuselm.cuh"

FUSELM_ABI(1);

FUSELM_ROPE(rope_one_pair_per_thread) {
	const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	const int half = dim / 2;
	if (i >= (long long)tokens * heads * half) return;
	const int t = (int)(i / ((long long)heads * half));
	const int rem = (int)(i % ((long long)heads * half));
	const int h = rem / half, j = rem % half;
	const int p = pos[t];
	if (p < 0 || p >= max_pos) return;
	const float c = cos[(long long)p * cs_pitch + j], s = sin[(long long)p * cs_pitch + j];
	bf16* head = x + (long long)t * pitch + (long long)h * head_stride + offset;
	const int i1 = interleaved ? 2 * j : j, i2 = interleaved ? 2 * j + 1 : j + half;
	const float x1 = __bfloat162float(head[i1]), x2 = __bfloat162float(head[i2]);
	head[i1] = __float2bfloat16_rn(x1 * c - x2 * s);
	head[i2] = __float2bfloat16_rn(x2 * c + x1 * s);
}
