package naive

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels/cudaset"
)

var update = flag.Bool("update", false, "write instances.cuh from the Go tables")

// TestInstancesHeader holds instances.cuh to the Go tables it is generated
// from (with -update it writes it), and checks that each module's .cu
// expands the lists of the kernels it defines.
func TestInstancesHeader(t *testing.T) {
	want := cudaset.InstancesHeader(instancesRegen, instances())
	if *update {
		if err := os.WriteFile("instances.cuh", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if got, err := sources.ReadFile("instances.cuh"); err != nil || string(got) != want {
		t.Errorf("instances.cuh is not what the Go tables make (%v): run %s", err, instancesRegen)
	}
	for _, c := range []struct {
		file string
		fams []cudaset.Instances
	}{
		{"elementwise.cu", []cudaset.Instances{binaryInstances(), siluInstances(), rmsRstdInstances(), rmsScaleInstances(),
			ropeInstances(), argmaxInstances()}},
		{"attention.cu", []cudaset.Instances{kvMaskedCopyInstances(), softmaxInstances(), normalizeInstances()}},
		{"moe.cu", []cudaset.Instances{expertGemmInstances()}},
	} {
		src, err := sources.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range c.fams {
			if use := "\n" + f.Macro + "_INSTANCES(" + f.Macro + ")\n"; !strings.Contains(string(src), use) {
				t.Errorf("%s has no line %q", c.file, strings.TrimSpace(use))
			}
		}
	}
}
