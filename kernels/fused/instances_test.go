package fused

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
	} else if got := sourceText(t, "instances.cuh"); got != want {
		t.Errorf("instances.cuh is not what the Go tables make: run %s", instancesRegen)
	}
	for _, c := range []struct {
		file string
		fams []cudaset.Instances
	}{
		{"elementwise.cu", []cudaset.Instances{rmsNormInstances(), ropeInstances(), swigluInstances(), addInstances(), argmaxInstances()}},
		{"attention.cu", []cudaset.Instances{flashPrefillInstances(), flashDecodeInstances()}},
		{"mla.cu", []cudaset.Instances{mlaPrefillInstances(), mlaDecodeInstances()}},
		{"mla_keys.cu", []cudaset.Instances{mlaKeysInstances()}},
		{"moe.cu", []cudaset.Instances{groupGemmInstances()}},
		{"linear.cu", []cudaset.Instances{linearInstances()}},
		{"hopper.cu", []cudaset.Instances{hopperInstances()}},
		{"mla_hopper.cu", []cudaset.Instances{mlaHopperInstances()}},
		{"group_wgmma.cu", []cudaset.Instances{gwInstances()}},
	} {
		src := sourceText(t, c.file)
		for _, f := range c.fams {
			if use := "\n" + f.Macro + "_INSTANCES(" + f.Macro + ")\n"; !strings.Contains(src, use) {
				t.Errorf("%s has no line %q", c.file, strings.TrimSpace(use))
			}
		}
	}
}
