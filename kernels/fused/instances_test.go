package fused

import (
	"flag"
	"testing"

	"github.com/fuselm/fuselm/kernels/cudaset"
)

var update = flag.Bool("update", false, "write instances.cuh from the Go tables")

// TestInstancesHeader holds instances.cuh to the Go tables it is generated
// from (with -update it writes it), and checks that each module's .cu
// expands the lists of the kernels it defines.
func TestInstancesHeader(t *testing.T) {
	uses := map[string][]cudaset.Instances{
		"elementwise.cu":   {rmsNormInstances(), addAddRMSNormInstances(), ropeInstances(), swigluInstances(), addInstances(), argmaxInstances()},
		"attention.cu":     {flashPrefillInstances(), flashDecodeInstances()},
		"mla.cu":           {mlaPrefillInstances(), mlaDecodeInstances(), mlaAbsorbInstances()},
		"mla_keys.cu":      {mlaKeysInstances()},
		"moe.cu":           {groupGemmInstances(), groupGemmDynInstances(), moeFoldInstances(), moeFoldDynInstances(), moeOneInstances()},
		"linear.cu":        {linearInstances()},
		"hopper.cu":        {hopperInstances()},
		"mla_hopper.cu":    {mlaHopperInstances()},
		"group_wgmma.cu":   {gwInstances()},
		"linear_wgmma.cu":  {lwInstances()},
		"linear_stream.cu": {lsInstances(), lsSwiGLUInstances(), lsAddInstances(), lsNormInstances(), lsNormSwiGLUInstances()},
	}
	for _, bad := range cudaset.CheckInstances(sources, "instances.cuh", instancesRegen, instances(), uses, *update) {
		t.Error(bad)
	}
}
