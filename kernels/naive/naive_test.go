package naive

import (
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestOpsEveryPath runs the harness again with the sizes that choose code
// paths shrunk or raised, so that its small shapes take the paths big ones
// take: attention in many query chunks, MLA decode one row per pass, and
// each MoE layout.
func TestOpsEveryPath(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	budget, graphTokens := chunkBudget, moeGraphTokens
	defer func() { chunkBudget, moeGraphTokens = budget, graphTokens }()
	chunkBudget = 64 << 10
	t.Run("small chunks, exact moe", func(t *testing.T) {
		moeGraphTokens = 0
		kerneltest.Run(t, dev, "naive", kerneltest.DefaultTolerances())
	})
	t.Run("small chunks, padded moe", func(t *testing.T) {
		moeGraphTokens = math.MaxInt32
		kerneltest.Run(t, dev, "naive", kerneltest.DefaultTolerances())
	})
}
