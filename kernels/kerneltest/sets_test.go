package kerneltest_test

import (
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/cuda"
	_ "github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	_ "github.com/fuselm/fuselm/kernels/naive"
)

// TestSets holds every registered kernel set, on every device of its kind
// present here, against the cpu reference (the harness's cases), and
// replays its decode ops from a graph where the device records graphs, as
// ggml's test-backend-ops runs every op of every backend. A set registered
// later gets all of it by registering. The cpu set runs with f32 and with
// bf16 activations (the latter shows what HF's bf16 rounding costs).
func TestSets(t *testing.T) {
	devs := map[string][]kernels.Device{"cpu": {cpu.NewDevice()}}
	if bf, err := cpu.NewDeviceAct(kernels.BF16); err == nil {
		devs["cpu"] = append(devs["cpu"], bf)
	} else {
		t.Fatal(err)
	}
	cudaErr := cuda.Probe()
	if cudaErr == nil {
		dev, err := cuda.Open(0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		devs["cuda"] = []kernels.Device{dev}
	}
	for _, set := range kernels.Sets() {
		if len(devs[set.Device]) == 0 {
			t.Run(set.Name, func(t *testing.T) { t.Skipf("no %s device: %v", set.Device, cudaErr) })
			continue
		}
		for _, dev := range devs[set.Device] {
			t.Run(set.Name+"/"+dev.ActDType().String(), func(t *testing.T) {
				t.Run("ops", func(t *testing.T) { kerneltest.Run(t, dev, set.Name, kerneltest.DefaultTolerances()) })
				t.Run("decode graph", func(t *testing.T) { kerneltest.RunDecodeGraph(t, dev, set.Name) })
			})
		}
	}
}
