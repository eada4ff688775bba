package naive

import (
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestOpsEveryPath runs the harness's cases of the ops whose code path a
// size chooses again with those sizes shrunk or raised, so that its small
// shapes take the paths big ones take: attention in many query chunks, MLA
// decode one row per pass, and each MoE layout.
func TestOpsEveryPath(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	budget, graphTokens := chunkBudget, moeGraphTokens
	defer func() { chunkBudget, moeGraphTokens = budget, graphTokens }()
	chunkBudget = 64 << 10
	t.Run("small chunks, exact moe", func(t *testing.T) {
		moeGraphTokens = 0
		kerneltest.RunOps(t, dev, "naive", kerneltest.DefaultTolerances(),
			kernels.OpAttnPrefill, kernels.OpAttnDecode, kernels.OpMLAPrefill, kernels.OpMLADecode, kernels.OpMoEExperts)
	})
	t.Run("small chunks, padded moe", func(t *testing.T) {
		moeGraphTokens = math.MaxInt32
		kerneltest.RunOps(t, dev, "naive", kerneltest.DefaultTolerances(), kernels.OpMoEExperts)
	})
}
