package fused

import "os"

// The experiment's knob (FUSELM_XP_GW_DIRECT=1; not yet run on a GPU):
// moe_experts' prefill down projection on group_wgmma stores its output
// from registers as before, not by tensor stores.
func init() {
	if os.Getenv("FUSELM_XP_GW_DIRECT") == "1" {
		wgmmaTMAOut = false
	}
}
