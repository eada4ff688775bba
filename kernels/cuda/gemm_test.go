package cuda

import (
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// colMajorGemm runs a gemmCall the way cuBLAS defines it, on host arrays
// named by the call's addresses, checking the leading-dimension rules
// cuBLAS enforces.
func colMajorGemm(t *testing.T, g gemmCall, mem map[uintptr][]float64, alpha, beta float64, batch int) {
	t.Helper()
	rowsA, rowsB := g.m, g.k // rows of the stored column-major operands
	if g.opA == cublasOpT {
		rowsA = g.k
	}
	if g.opB == cublasOpT {
		rowsB = g.n
	}
	if g.lda < max(1, rowsA) || g.ldb < max(1, rowsB) || g.ldc < max(1, g.m) {
		t.Fatalf("cuBLAS would refuse %+v", g)
	}
	A, B, C := mem[g.a], mem[g.b], mem[g.c]
	for p := 0; p < batch; p++ {
		oa, ob, oc := int(g.strideA)*p, int(g.strideB)*p, int(g.strideC)*p
		for i := 0; i < g.m; i++ {
			for j := 0; j < g.n; j++ {
				s := 0.0
				for l := 0; l < g.k; l++ {
					var av, bv float64
					if g.opA == cublasOpN {
						av = A[oa+i+l*g.lda]
					} else {
						av = A[oa+l+i*g.lda]
					}
					if g.opB == cublasOpN {
						bv = B[ob+l+j*g.ldb]
					} else {
						bv = B[ob+j+l*g.ldb]
					}
					s += av * bv
				}
				C[oc+i+j*g.ldc] = alpha*s + beta*C[oc+i+j*g.ldc]
			}
		}
	}
}

// rowMajorRef is the row-major problem computed directly.
func rowMajorRef(transA, transB bool, m, n, k int, alpha float64, A []float64, lda, sA int, B []float64, ldb, sB int, beta float64, C []float64, ldc, sC, batch int) {
	for p := 0; p < batch; p++ {
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				s := 0.0
				for l := 0; l < k; l++ {
					var av, bv float64
					if transA {
						av = A[p*sA+l*lda+i]
					} else {
						av = A[p*sA+i*lda+l]
					}
					if transB {
						bv = B[p*sB+j*ldb+l]
					} else {
						bv = B[p*sB+l*ldb+j]
					}
					s += av * bv
				}
				C[p*sC+i*ldc+j] = alpha*s + beta*C[p*sC+i*ldc+j]
			}
		}
	}
}

func randVec(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.Float64()*2 - 1
	}
	return v
}

func TestRowMajorGemmMapping(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for trial := 0; trial < 200; trial++ {
		transA, transB := r.Intn(2) == 1, r.Intn(2) == 1
		m, n, k := 1+r.Intn(9), 1+r.Intn(9), 1+r.Intn(9)
		batch := 1 + r.Intn(3)
		aCols, aRows := k, m
		if transA {
			aCols, aRows = m, k
		}
		bCols, bRows := n, k
		if transB {
			bCols, bRows = k, n
		}
		lda, ldb, ldc := aCols+r.Intn(3), bCols+r.Intn(3), n+r.Intn(3)
		sA, sB, sC := aRows*lda+r.Intn(4), bRows*ldb+r.Intn(4), m*ldc+r.Intn(4)
		A, B := randVec(r, sA*batch), randVec(r, sB*batch)
		C0 := randVec(r, sC*batch)
		alpha, beta := 1.5, 0.25

		want := append([]float64(nil), C0...)
		rowMajorRef(transA, transB, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, want, ldc, sC, batch)

		checkGemm("test", transA, transB, m, n, k, kernels.F32, lda, kernels.F32, ldb, kernels.F32, ldc)
		g := rowMajorGemm(transA, transB, m, n, k, 1, kernels.F32, lda, int64(sA), 2, kernels.F32, ldb, int64(sB), 3, kernels.F32, ldc, int64(sC))
		got := append([]float64(nil), C0...)
		colMajorGemm(t, g, map[uintptr][]float64{1: A, 2: B, 3: got}, alpha, beta, batch)
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-12 {
				t.Fatalf("transA=%v transB=%v m=%d n=%d k=%d lda=%d ldb=%d ldc=%d batch=%d: element %d is %g, want %g (call %+v)",
					transA, transB, m, n, k, lda, ldb, ldc, batch, i, got[i], want[i], g)
			}
		}
	}
}

func TestGemmLinearMapping(t *testing.T) {
	// x[m,k]·w[n,k]ᵀ: cuBLAS gets (T, N, n, m, k, w, ldb, x, lda, C, ldc).
	g := rowMajorGemm(false, true, 16, 4096, 3584, 0xa, kernels.BF16, 3584, 0, 0xb, kernels.BF16, 3584, 0, 0xc, kernels.F32, 4096, 0)
	want := gemmCall{opA: cublasOpT, opB: cublasOpN, m: 4096, n: 16, k: 3584,
		a: 0xb, aType: cudaR16BF, lda: 3584, b: 0xa, bType: cudaR16BF, ldb: 3584, c: 0xc, cType: cudaR32F, ldc: 4096}
	if g != want {
		t.Errorf("got %+v\nwant %+v", g, want)
	}
}

func TestCheckGemmPanics(t *testing.T) {
	for _, c := range []struct {
		name       string
		f          func()
		wantInText string
	}{
		{"short lda", func() { checkGemm("Gemm", false, true, 4, 5, 6, kernels.BF16, 5, kernels.BF16, 6, kernels.F32, 5) }, "lda 5 < 6"},
		{"short ldb", func() { checkGemm("Gemm", false, false, 4, 5, 6, kernels.BF16, 6, kernels.BF16, 4, kernels.F32, 5) }, "ldb 4 < 5"},
		{"short ldc", func() { checkGemm("Gemm", false, true, 4, 5, 6, kernels.BF16, 6, kernels.BF16, 6, kernels.F32, 4) }, "ldc 4 < 5"},
		{"mixed", func() { checkGemm("Gemm", false, true, 4, 5, 6, kernels.BF16, 6, kernels.F32, 6, kernels.F32, 5) }, "B is f32"},
		{"c type", func() { checkGemm("Gemm", false, true, 4, 5, 6, kernels.F32, 6, kernels.F32, 6, kernels.BF16, 5) }, "C is bf16"},
		{"i32", func() { checkGemm("Gemm", false, true, 4, 5, 6, kernels.I32, 6, kernels.I32, 6, kernels.F32, 5) }, "A is i32"},
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil {
					t.Errorf("%s: no panic", c.name)
					return
				}
				if s, _ := r.(string); !strings.Contains(s, c.wantInText) {
					t.Errorf("%s: panic %v lacks %q", c.name, r, c.wantInText)
				}
			}()
			c.f()
		}()
	}
	// Valid: transA with lda ≥ m.
	checkGemm("Gemm", true, false, 4, 5, 6, kernels.BF16, 4, kernels.BF16, 5, kernels.BF16, 5)
}
