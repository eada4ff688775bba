package cuda

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// cublasAPI is libcublas's entry points.
type cublasAPI struct {
	lib     *library
	version int // 10000*major + 100*minor + patch, 0 when unknown

	cublasCreate, cublasDestroy, cublasSetStream, cublasSetWorkspace, cublasSetMathMode uintptr
	cublasGemmEx, cublasGemmStridedBatchedEx, cublasGemmBatchedEx                       uintptr
	cublasGetStatusName, cublasGetStatusString, cublasGetProperty                       uintptr
}

var (
	blasOnce sync.Once
	blas     *cublasAPI
	blasErr  error
)

// cuBLAS constants (cublas_api.h, library_types.h).
const (
	cublasOpN           = 0
	cublasOpT           = 1
	cublasDefaultMath   = 0
	cublasCompute32F    = 68
	cudaR32F            = 0
	cudaR16F            = 2
	cudaR16BF           = 14
	cublasWorkspaceSize = 32 << 20 // what cuBLAS needs to run under graph capture without allocating
)

// cublasGemmDefault is CUBLAS_GEMM_DEFAULT (-1) as the C enum's bits.
var cublasGemmDefault = uintptr(uint32(0xffffffff))

// loadCUBLAS opens libcublas once per process. A library opened by full path
// has the libcublasLt of the same directory loaded first, so that its
// dependency resolves to the same version.
func loadCUBLAS(driverVersion int) (*cublasAPI, error) {
	blasOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				blas, blasErr = nil, fmt.Errorf("cuda: loading cuBLAS: %v", r)
			}
		}()
		f := osFinder()
		var sonames []string
		for _, m := range majorsFor(driverVersion) {
			sonames = append(sonames, fmt.Sprintf("libcublas.so.%d", m))
		}
		preload := func(dir, soname string) {
			lt := filepath.Join(dir, strings.Replace(soname, "libcublas.", "libcublasLt.", 1))
			if f.isFile(lt) {
				f.open(lt)
			}
		}
		lib, err := f.find("libcublas", sonames, preload)
		if err != nil {
			blasErr = err
			return
		}
		b := &cublasAPI{lib: lib}
		err = lib.resolve([]symbol{
			sym(&b.cublasCreate, "cublasCreate_v2"),
			sym(&b.cublasDestroy, "cublasDestroy_v2"),
			sym(&b.cublasSetStream, "cublasSetStream_v2"),
			sym(&b.cublasSetWorkspace, "cublasSetWorkspace_v2"),
			sym(&b.cublasSetMathMode, "cublasSetMathMode"),
			sym(&b.cublasGemmEx, "cublasGemmEx"),
			sym(&b.cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx"),
			sym(&b.cublasGemmBatchedEx, "cublasGemmBatchedEx"),
			optSym(&b.cublasGetStatusName, "cublasGetStatusName"),
			optSym(&b.cublasGetStatusString, "cublasGetStatusString"),
			optSym(&b.cublasGetProperty, "cublasGetProperty"),
		})
		if err != nil {
			blasErr = err
			return
		}
		if b.cublasGetProperty != 0 {
			var v [3]int32
			ok := true
			for i := range v {
				ok = ok && uint32(ccall(b.cublasGetProperty, uintptr(i), uintptr(unsafe.Pointer(&v[i])))) == 0
			}
			if ok {
				b.version = int(v[0])*10000 + int(v[1])*100 + int(v[2])
			}
		}
		blas = b
	})
	return blas, blasErr
}

func (b *cublasAPI) check(r uintptr, call string) error {
	code := uint32(r)
	if code == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(code), Name: fmt.Sprintf("CUBLAS_STATUS_%d", code)}
	if b.cublasGetStatusName != 0 {
		if s := cString(ccall(b.cublasGetStatusName, uintptr(code))); s != "" {
			e.Name = s
		}
	}
	if b.cublasGetStatusString != 0 {
		e.Msg = cString(ccall(b.cublasGetStatusString, uintptr(code)))
	}
	return e
}

func (b *cublasAPI) versionString() string {
	if b.version == 0 {
		return "version unknown"
	}
	return fmt.Sprintf("%d.%d.%d", b.version/10000, b.version/100%100, b.version%100)
}

// gemmCall is one cuBLAS (column-major) GEMM's arguments:
// C = alpha·op(A)·op(B) + beta·C with op(A) m×k, op(B) k×n, C m×n, all
// column-major with leading dimensions lda, ldb, ldc, and for batches the
// element strides between consecutive problems.
type gemmCall struct {
	opA, opB                  int
	m, n, k                   int
	a, b, c                   uintptr
	aType, bType, cType       int
	lda, ldb, ldc             int
	strideA, strideB, strideC int64
}

// rowMajorGemm maps a row-major problem onto cuBLAS's column-major one.
//
// The row-major problem: C[m,n] = alpha·op(A)·op(B) + beta·C, where op(A) is
// A stored [m,k] (transA false, lda ≥ k) or A stored [k,m] and transposed
// (transA true, lda ≥ m); op(B) is B stored [k,n] (transB false, ldb ≥ n)
// or B stored [n,k] and transposed (transB true, ldb ≥ k, the Linear case
// x·wᵀ); C is [m,n] with ldc ≥ n.
//
// A row-major r×c matrix with leading dimension ld is, in the same memory,
// the column-major c×r matrix of its transpose with the same ld. So
// row-major C is column-major Cᵀ (n×m, ldc), and C = op(A)·op(B) becomes
// Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS's first operand is B and its second is A, with
// n and m swapped:
//
//   - op(B)ᵀ: B stored [k,n] reads column-major as the n×k matrix Bᵀ =
//     op(B)ᵀ, so no transpose (N, ld ldb ≥ n); B stored [n,k] reads as k×n,
//     the transpose of op(B)ᵀ, so T (ld ldb ≥ k).
//   - op(A)ᵀ: A stored [m,k] reads as the k×m matrix Aᵀ: N (lda ≥ k);
//     A stored [k,m] reads as m×k: T (lda ≥ m).
//
// cublasGemmEx(h, opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc).
func rowMajorGemm(transA, transB bool, m, n, k int,
	a uintptr, aType kernels.DType, lda int, sA int64,
	b uintptr, bType kernels.DType, ldb int, sB int64,
	c uintptr, cType kernels.DType, ldc int, sC int64) gemmCall {
	return gemmCall{
		opA: op(transB), opB: op(transA),
		m: n, n: m, k: k,
		a: b, aType: cudaType(bType), lda: ldb, strideA: sB,
		b: a, bType: cudaType(aType), ldb: lda, strideB: sA,
		c: c, cType: cudaType(cType), ldc: ldc, strideC: sC,
	}
}

func op(trans bool) int {
	if trans {
		return cublasOpT
	}
	return cublasOpN
}

func cudaType(dt kernels.DType) int {
	switch dt {
	case kernels.F32:
		return cudaR32F
	case kernels.F16:
		return cudaR16F
	case kernels.BF16:
		return cudaR16BF
	}
	panic(fmt.Sprintf("cuda: no cuBLAS type for %v", dt))
}

// checkGemm panics on a row-major problem cuBLAS would refuse: a bad type
// combination (A and B alike, bf16, f16 or f32; C like them or f32) or
// leading dimensions too short for the rows they separate.
func checkGemm(what string, transA, transB bool, m, n, k int, aType kernels.DType, lda int, bType kernels.DType, ldb int, cType kernels.DType, ldc int) {
	bad := func(format string, args ...any) {
		panic(fmt.Sprintf("cuda: %s(transA=%v transB=%v m=%d n=%d k=%d): ", what, transA, transB, m, n, k) + fmt.Sprintf(format, args...))
	}
	if m < 0 || n < 0 || k < 0 {
		bad("negative size")
	}
	switch aType {
	case kernels.BF16, kernels.F16, kernels.F32:
	default:
		bad("A is %v; want bf16, f16 or f32", aType)
	}
	if bType != aType {
		bad("A is %v but B is %v", aType, bType)
	}
	if cType != aType && cType != kernels.F32 {
		bad("C is %v; want %v or f32", cType, aType)
	}
	aCols, bCols := k, n
	if transA {
		aCols = m
	}
	if transB {
		bCols = k
	}
	if lda < max(1, aCols) {
		bad("lda %d < %d", lda, aCols)
	}
	if ldb < max(1, bCols) {
		bad("ldb %d < %d", ldb, bCols)
	}
	if ldc < max(1, n) {
		bad("ldc %d < %d", ldc, n)
	}
}

// Gemm queues C[m,n] = alpha·A[m,k]·op(B) + beta·C, all row-major with
// leading dimensions in elements: op(B) is B stored [k,n] (transB false,
// ldb ≥ n) or B stored [n,k] and transposed (transB true, ldb ≥ k: the
// Linear case x·wᵀ). A and B are both bf16, f16 or f32; C is their type or
// f32; accumulation is f32. Errors are recorded with Fail.
func (d *Device) Gemm(transB bool, m, n, k int, alpha float32,
	a uintptr, aType kernels.DType, lda int,
	b uintptr, bType kernels.DType, ldb int,
	beta float32, c uintptr, cType kernels.DType, ldc int) {
	checkGemm("Gemm", false, transB, m, n, k, aType, lda, bType, ldb, cType, ldc)
	if m == 0 || n == 0 {
		return
	}
	g := rowMajorGemm(false, transB, m, n, k, a, aType, lda, 0, b, bType, ldb, 0, c, cType, ldc, 0)
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	al, be := alpha, beta
	r := d.blasCall(d.blas.cublasGemmEx, d.blasH, uintptr(g.opA), uintptr(g.opB),
		uintptr(g.m), uintptr(g.n), uintptr(g.k), uintptr(unsafe.Pointer(&al)),
		g.a, uintptr(g.aType), uintptr(g.lda),
		g.b, uintptr(g.bType), uintptr(g.ldb), uintptr(unsafe.Pointer(&be)),
		g.c, uintptr(g.cType), uintptr(g.ldc),
		cublasCompute32F, cublasGemmDefault)
	if uint32(r) != 0 { // the message is made only for an error: GEMMs run on every eager step
		d.failLocked(d.blas.check(r, fmt.Sprintf("cublasGemmEx(row-major m=%d n=%d k=%d transB=%v, %v·%v→%v, lda=%d ldb=%d ldc=%d)",
			m, n, k, transB, aType, bType, cType, lda, ldb, ldc)))
	}
}

// GemmStridedBatched queues batch problems C_i = alpha·op(A_i)·op(B_i) +
// beta·C_i, row-major as in Gemm, with op(A) A stored [m,k] (transA false,
// lda ≥ k) or [k,m] transposed (transA true, lda ≥ m), and X_i at element
// offset i·sX from X.
func (d *Device) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32,
	a uintptr, aType kernels.DType, lda int, sA int64,
	b uintptr, bType kernels.DType, ldb int, sB int64,
	beta float32, c uintptr, cType kernels.DType, ldc int, sC int64, batch int) {
	checkGemm("GemmStridedBatched", transA, transB, m, n, k, aType, lda, bType, ldb, cType, ldc)
	if batch < 0 {
		panic(fmt.Sprintf("cuda: GemmStridedBatched: batch %d", batch))
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	g := rowMajorGemm(transA, transB, m, n, k, a, aType, lda, sA, b, bType, ldb, sB, c, cType, ldc, sC)
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	al, be := alpha, beta
	r := d.blasCall(d.blas.cublasGemmStridedBatchedEx, d.blasH, uintptr(g.opA), uintptr(g.opB),
		uintptr(g.m), uintptr(g.n), uintptr(g.k), uintptr(unsafe.Pointer(&al)),
		g.a, uintptr(g.aType), uintptr(g.lda), uintptr(g.strideA),
		g.b, uintptr(g.bType), uintptr(g.ldb), uintptr(g.strideB), uintptr(unsafe.Pointer(&be)),
		g.c, uintptr(g.cType), uintptr(g.ldc), uintptr(g.strideC), uintptr(batch),
		cublasCompute32F, cublasGemmDefault)
	if uint32(r) != 0 { // the message is made only for an error: GEMMs run on every eager step
		d.failLocked(d.blas.check(r, fmt.Sprintf("cublasGemmStridedBatchedEx(row-major m=%d n=%d k=%d transA=%v transB=%v batch=%d, %v·%v→%v, lda=%d ldb=%d ldc=%d)",
			m, n, k, transA, transB, batch, aType, bType, cType, lda, ldb, ldc)))
	}
}

// GemmBatched is GemmStridedBatched with the problems' matrices given by
// device arrays of batch device pointers each (aPtrs, bPtrs, cPtrs), the
// grouped GEMM of MoE experts.
func (d *Device) GemmBatched(transA, transB bool, m, n, k int, alpha float32,
	aPtrs uintptr, aType kernels.DType, lda int,
	bPtrs uintptr, bType kernels.DType, ldb int,
	beta float32, cPtrs uintptr, cType kernels.DType, ldc int, batch int) {
	checkGemm("GemmBatched", transA, transB, m, n, k, aType, lda, bType, ldb, cType, ldc)
	if batch < 0 {
		panic(fmt.Sprintf("cuda: GemmBatched: batch %d", batch))
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	g := rowMajorGemm(transA, transB, m, n, k, aPtrs, aType, lda, 0, bPtrs, bType, ldb, 0, cPtrs, cType, ldc, 0)
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	al, be := alpha, beta
	r := d.blasCall(d.blas.cublasGemmBatchedEx, d.blasH, uintptr(g.opA), uintptr(g.opB),
		uintptr(g.m), uintptr(g.n), uintptr(g.k), uintptr(unsafe.Pointer(&al)),
		g.a, uintptr(g.aType), uintptr(g.lda),
		g.b, uintptr(g.bType), uintptr(g.ldb), uintptr(unsafe.Pointer(&be)),
		g.c, uintptr(g.cType), uintptr(g.ldc), uintptr(batch),
		cublasCompute32F, cublasGemmDefault)
	if uint32(r) != 0 { // the message is made only for an error: GEMMs run on every eager step
		d.failLocked(d.blas.check(r, fmt.Sprintf("cublasGemmBatchedEx(row-major m=%d n=%d k=%d transA=%v transB=%v batch=%d, %v·%v→%v, lda=%d ldb=%d ldc=%d)",
			m, n, k, transA, transB, batch, aType, bType, cType, lda, ldb, ldc)))
	}
}
