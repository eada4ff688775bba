// Broken on purpose: compiled for blocks of at most 64 threads, launched
// (fuselm.json) with 1024.
#include "fuselm.cuh"

FUSELM_ABI(1);

extern "C" __global__ void __launch_bounds__(64) rms_norm_bounded(bf16* out, int out_pitch, const bf16* x, int x_pitch,
                                                                  const bf16* w, int rows, int cols, float eps) {
	for (int c = threadIdx.x; c < cols; c += blockDim.x) out[(long long)blockIdx.x * out_pitch + c] = x[c];
}
