// Broken on purpose: writes far outside out, an illegal address. The
// context is lost; fuselm says which file and op, and exits 1.
#include "fuselm.cuh"

FUSELM_ABI(1);

FUSELM_RMS_NORM(rms_norm_far) {
	out[(long long)blockIdx.x * out_pitch + (1ll << 40)] = x[0];
}
