// Broken on purpose: forgets the mean (divides the sum of squares by 1,
// not by cols). It compiles and runs; the check against the cpu set
// names the case and by how much it is off, and the set is not timed.
#include "fuselm.cuh"

FUSELM_ABI(1);

FUSELM_RMS_NORM(rms_norm_no_mean) {
	const bf16* xr = x + (long long)blockIdx.x * x_pitch;
	float ss = 0.0f;
	for (int c = 0; c < cols; c++) ss += __bfloat162float(xr[c]) * __bfloat162float(xr[c]);
	const float rstd = rsqrtf(ss + eps);
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		out[(long long)blockIdx.x * out_pitch + c] = __float2bfloat16_rn(__bfloat162float(w[c]) * __bfloat162float(xr[c]) * rstd);
}
