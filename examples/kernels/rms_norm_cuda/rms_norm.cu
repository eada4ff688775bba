// RMSNorm in CUDA C++, one block per row (fuselm kernel ABI 1).
//
// out[r,:] = w * bf16(x[r,:] * rsqrt(mean(x[r,:]^2) + eps)), the sum of
// squares in f32, the normalized value rounded to bf16 before the multiply
// by w, as HF's Qwen2RMSNorm does.
// out, x: bf16 [rows, cols], row r at out + r*out_pitch (x + r*x_pitch);
// w: bf16 [cols]. Launch (fuselm.json): grid = rows, any block of whole warps.
#include "fuselm.cuh"

FUSELM_ABI(1);

__device__ float block_sum(float v) {
	__shared__ float partial[32];
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	if (lane == 0) partial[warp] = v;
	__syncthreads();
	const int warps = (blockDim.x + 31) / 32;
	v = lane < warps ? partial[lane] : 0.0f;
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;  // every thread holds the block's sum
}

FUSELM_RMS_NORM(rms_norm_rowwise) {
	const int r = blockIdx.x;
	const bf16* xr = x + (long long)r * x_pitch;
	bf16* outr = out + (long long)r * out_pitch;
	float ss = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		const float v = __bfloat162float(xr[c]);
		ss += v * v;
	}
	const float rstd = rsqrtf(block_sum(ss) / (float)cols + eps);
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		const float normed = __bfloat162float(__float2bfloat16_rn(__bfloat162float(xr[c]) * rstd));
		outr[c] = __float2bfloat16_rn(__bfloat162float(w[c]) * normed);
	}
}
