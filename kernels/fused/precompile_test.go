package fused

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// TestModulesCompileConcurrently holds NVRTC's concurrent compiles
// (cuda.Device.Precompile's) to its serial ones: four of the set's modules
// compiled on four goroutines at once give the cubins each gives alone.
// Without a GPU, where FUSELM_NVRTC names a libnvrtc.
func TestModulesCompileConcurrently(t *testing.T) {
	c := nvrtcCompiler(t, "four modules at once")
	var bs []cuda.Build
	for _, m := range []cudaset.Module{swModule(), lsModule(), msModule(), module("linear.cu", linearKernels())} {
		p, err := cudaset.Source(m)
		if err != nil {
			t.Fatal(err)
		}
		p.Name = "fused_" + m.File
		bs = append(bs, cuda.Build{P: p, Opts: m.Opts})
	}
	start := time.Now()
	alone, errs := c.CompileEach(bs, 1)
	serial := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", bs[i].P.Name, err)
		}
	}
	start = time.Now()
	together, errs := c.CompileEach(bs, len(bs))
	t.Logf("one at a time %v, %d at once %v", serial, len(bs), time.Since(start))
	for i, err := range errs {
		switch {
		case err != nil:
			t.Errorf("%s, compiled beside the others: %v", bs[i].P.Name, err)
		case len(together[i]) == 0 || !bytes.Equal(together[i], alone[i]):
			t.Errorf("%s: %d bytes compiled beside the others, %d alone, not the same cubin", bs[i].P.Name, len(together[i]), len(alone[i]))
		}
	}
	if slices.ContainsFunc(alone, func(b []byte) bool { return len(b) == 0 }) {
		t.Error("an empty cubin")
	}
}
