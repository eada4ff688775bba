package cpu_test

import (
	"fmt"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// BenchmarkLinear times a 2048×2048 projection of 64 tokens (prefill) and of
// 1 token (decode), with f32 and bf16 weights.
func BenchmarkLinear(b *testing.B) {
	for _, n := range []int{64, 1} {
		for _, wdt := range []kernels.DType{kernels.F32, kernels.BF16} {
			b.Run(fmt.Sprintf("N=%d,K=2048,M=2048,%s", n, wdt), func(b *testing.B) {
				f := newFixture(&testing.T{}, 1)
				x, w := f.randn(kernels.F32, 1, n, 2048), f.randn(wdt, 0.02, 2048, 2048)
				out := f.dev.Alloc(kernels.F32, n, 2048)
				b.ResetTimer()
				for range b.N {
					f.ops.Linear(out, x, w, nil)
				}
				b.ReportMetric(float64(2*n*2048*2048)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
