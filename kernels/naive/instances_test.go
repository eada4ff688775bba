package naive

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
		"elementwise.cu": {binaryInstances(), siluInstances(), rmsRstdInstances(), rmsScaleInstances(), ropeInstances(),
			argmaxInstances()},
		"attention.cu": {kvMaskedCopyInstances(), softmaxInstances(), normalizeInstances()},
		"moe.cu":       {expertGemmInstances()},
	}
	for _, bad := range cudaset.CheckInstances(sources, "instances.cuh", instancesRegen, instances(), uses, *update) {
		t.Error(bad)
	}
}
