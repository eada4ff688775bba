package cpu_test

import (
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestHarness runs the shared harness on the cpu set itself: trivially equal
// to the reference, but it exercises every case the CUDA sets will face.
func TestHarness(t *testing.T) {
	kerneltest.Run(t, cpu.NewDevice(), "cpu", kerneltest.DefaultTolerances())
}

// TestHarnessBF16 holds the cpu set with bf16 activations against the f32
// one, with the harness's bf16 tolerance: what HF's bf16 rounding costs.
func TestHarnessBF16(t *testing.T) {
	dev, err := cpu.NewDeviceAct(kernels.BF16)
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.Run(t, dev, "cpu", kerneltest.DefaultTolerances())
}
