package cudaset

import "github.com/fuselm/fuselm/kernels"

// Addmm is out = x·wᵀ + bias through cuBLAS, as torch's addmm rounds it:
// with a bias, out is first filled with the bias rows (copy_rows, so a bf16
// out holds the bias rounded to bf16) and the GEMM adds to them (beta = 1):
// out = round(x·wᵀ + round(bias)), the sum in f32. Shapes as
// kernels.CheckLinear; cuBLAS multiplies bf16 weights only.
func (k *Kit) Addmm(out, x, w, bias *kernels.Tensor) {
	k.Need(IsBF16(w), kernels.OpLinear, "w %v (cuBLAS multiplies bf16 by bf16)", w)
	n, kk, m := x.Rows(), x.Cols(), w.Rows()
	beta := float32(0)
	if bias != nil {
		b := k.Mat(bias)
		b.Pitch = 0 // every row reads the bias
		k.CopyRows(k.Mat(out), 0, b, 0, 1, 1, n, m)
		beta = 1
	}
	k.Gemm(true, n, m, kk, 1, k.Mat(x), k.Mat(w), beta, k.Mat(out))
}

// Gemm is c = alpha·a·op(b) + beta·c through cuBLAS, for row-major a [m,k],
// c [m,n] and b [k,n], or [n,k] used transposed when transB; leading
// dimensions are the pitches.
func (k *Kit) Gemm(transB bool, m, n, kk int, alpha float32, a, b Mat, beta float32, c Mat) {
	if m == 0 || n == 0 {
		return
	}
	k.D.Gemm(transB, m, n, kk, alpha, a.P, a.DT, a.Pitch, b.P, b.DT, b.Pitch, beta, c.P, c.DT, c.Pitch)
}

// GemmBatched is Gemm over batch problems, problem i's matrices sA, sB, sC
// elements after problem i-1's (0 shares one matrix).
func (k *Kit) GemmBatched(transB bool, m, n, kk int, alpha float32, a Mat, sA int64, b Mat, sB int64,
	beta float32, c Mat, sC int64, batch int) {
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	k.D.GemmStridedBatched(false, transB, m, n, kk, alpha, a.P, a.DT, a.Pitch, sA, b.P, b.DT, b.Pitch, sB,
		beta, c.P, c.DT, c.Pitch, sC, batch)
}

// Batch2 is a two-level batch of matrices: matrix (i, j) starts Si*i + Sj*j
// elements after M.
type Batch2 struct {
	M      Mat
	Si, Sj int64
}

// GemmBatch2 is Gemm over the ni×nj problems of two-level batches, as
// strided-batched calls along the longer level, one per index of the shorter.
func (k *Kit) GemmBatch2(transB bool, m, n, kk int, alpha float32, a, b Batch2, beta float32, c Batch2, ni, nj int) {
	if nj <= ni {
		for j := range nj {
			k.GemmBatched(transB, m, n, kk, alpha, a.M.Skip(a.Sj*int64(j)), a.Si, b.M.Skip(b.Sj*int64(j)), b.Si,
				beta, c.M.Skip(c.Sj*int64(j)), c.Si, ni)
		}
		return
	}
	for i := range ni {
		k.GemmBatched(transB, m, n, kk, alpha, a.M.Skip(a.Si*int64(i)), a.Sj, b.M.Skip(b.Si*int64(i)), b.Sj,
			beta, c.M.Skip(c.Si*int64(i)), c.Sj, nj)
	}
}

// GemmGroups is y[rows of g] = x[rows of g]·w[g]ᵀ for every group g, whose
// rows are [first[g], first[g+1]) of x and y (offsets on the host): one
// cuBLAS GEMM per non-empty group, as eager PyTorch's loop over experts;
// w holds the groups' n×kk matrices one after another.
func (k *Kit) GemmGroups(first []int32, x, w, y Mat, n, kk int) {
	size := int64(n) * int64(kk)
	for g := 0; g+1 < len(first); g++ {
		r0, m := int(first[g]), int(first[g+1]-first[g])
		k.Gemm(true, m, n, kk, 1, x.Sub(r0, 0), w.Skip(int64(g)*size), 0, y.Sub(r0, 0))
	}
}
