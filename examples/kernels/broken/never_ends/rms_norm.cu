// Broken on purpose: waits for a flag no one sets. fuselm's watchdog
// (FUSELM_WATCHDOG, 60 s unless set) reports it instead of waiting forever.
#include "fuselm.cuh"

FUSELM_ABI(1);

FUSELM_RMS_NORM(rms_norm_spin) {
	volatile const unsigned short* flag = (volatile const unsigned short*)x;
	while (flag[0] != 0x7fff || cols >= 0) {
	}
	out[0] = x[0];
}
