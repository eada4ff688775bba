package kerneltest

import (
	"math"
	"slices"

	"github.com/fuselm/fuselm/kernels"
)

// groupTopK is the choices per token of the routing that sizes a
// group_gemm benchmark's groups: DeepSeek-V2-Lite's top-6.
const groupTopK = 6

// groupGemmShapes are DeepSeek-V2-Lite's expert GEMMs (E = 64; gate/up
// N = 2·1408, K = 2048; down N = 2048, K = 1408) at W3's prefill (11,041
// tokens × 6 choices) and at decode batch 16 and 1.
func groupGemmShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, m := range []int{11041 * groupTopK, 16 * groupTopK, groupTopK} {
		s = append(s, sh("M", m, "N", 2816, "K", 2048, "E", 64), sh("M", m, "N", 2048, "K", 1408, "E", 64))
	}
	return s
}

// touchedGroups is the expected number of the E groups that M rows of
// tokens choosing groupTopK distinct ones at random leave non-empty.
func touchedGroups(s kernels.Shape) float64 {
	e, tokens := f(s, "E"), math.Ceil(f(s, "M")/groupTopK)
	return e * (1 - math.Pow(1-math.Min(groupTopK, e)/e, tokens))
}

// groupSizes routes ceil(M/groupTopK) tokens to groupTopK distinct of e
// experts each (fewer for the last token, so that the choices are m), with
// uneven popularity, as a trained router's: expert j is drawn with weight
// exp(0.5·z_j), z_j standard normal, by the Gumbel top-k trick. It returns
// each expert's count.
func (b *Builder) groupSizes(m, e int) []int {
	rng := b.stream()
	logw := make([]float64, e)
	for j := range logw {
		logw[j] = 0.5 * rng.NormFloat64()
	}
	sizes := make([]int, e)
	keys := make([]float64, e)
	order := make([]int, e)
	for left := m; left > 0; left -= groupTopK {
		for j := range keys {
			keys[j] = logw[j] - math.Log(-math.Log(rng.Float64()))
			order[j] = j
		}
		slices.SortFunc(order, func(a, c int) int {
			if keys[a] > keys[c] {
				return -1
			}
			return 1
		})
		for _, j := range order[:min(groupTopK, e, left)] {
			sizes[j]++
		}
	}
	return sizes
}

// buildGroupGemm is a grouped GEMM whose copies share the weights and
// route their rows anew, so that rotating over the copies reads other
// groups' weights than the L2 holds; the bytes count the weights of the
// groups the copies actually use.
func buildGroupGemm(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n, k, e := s["M"], s["N"], s["K"], s["E"]
	w := b.Random(b.Alloc(kernels.BF16, e, n, k), 1/math.Sqrt(float64(k)))
	c := b.copiesFor(bc.Bytes(s))
	type rows struct{ x, first, out *kernels.Tensor }
	var touched float64
	rs := each(b, c, func() rows {
		sizes := b.groupSizes(m, e)
		first := make([]int32, e+1)
		for g, n := range sizes {
			first[g+1] = first[g] + int32(n)
			if n > 0 {
				touched++
			}
		}
		return rows{x: b.Random(b.Act(m, k), 1), first: b.ints(first, e+1), out: b.Act(m, n)}
	})
	bytes := float64(bf16) * (touched/float64(c)*float64(n*k) + float64(m*k+m*n))
	return &Problem{Copies: c, Outs: []*kernels.Tensor{rs[0].out}, Bytes: bytes,
		Run: func(o kernels.Ops, i int) { o.GroupGemm(rs[i].out, rs[i].x, w, rs[i].first) }}
}

// buildDenseOfGroups is the dense GEMM of a group_gemm shape's total M, N,
// K: x [M,K] · w [N,K]ᵀ, what cuBLAS does with the same work in one piece.
func buildDenseOfGroups(b *Builder, s kernels.Shape) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	c := b.copiesFor(float64(bf16) * float64(m*k+n*k+m*n))
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	return &Problem{Copies: c, Outs: outs[:1], Bytes: float64(bf16) * float64(m*k+n*k+m*n),
		Run: func(o kernels.Ops, i int) { o.Linear(outs[i], xs[i], ws[i], nil) }}
}
