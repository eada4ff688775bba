// Broken on purpose: a typo (rstd is declared as rsdt). fuselm shows
// NVRTC's log with this file's name and line.
#include "fuselm.cuh"

FUSELM_ABI(1);

FUSELM_RMS_NORM(rms_norm_typo) {
	const float rsdt = 1.0f;
	out[blockIdx.x * out_pitch] = __float2bfloat16_rn(rstd);
}
