package cpu_test

import (
	"testing"

	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestHarness runs the shared harness on the cpu set itself: trivially equal
// to the reference, but it exercises every case the CUDA sets will face.
func TestHarness(t *testing.T) {
	kerneltest.Run(t, cpu.NewDevice(), "cpu", kerneltest.DefaultTolerances())
}
