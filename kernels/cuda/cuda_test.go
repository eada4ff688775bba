package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// The tests below need a GPU and skip without one. Each opens device 0 with
// the kernel cache in a temporary directory.

func openDevice(t *testing.T) *Device {
	t.Helper()
	if err := Probe(); err != nil {
		t.Skip("no CUDA device: " + err.Error())
	}
	t.Setenv("FUSELM_KERNEL_CACHE", t.TempDir())
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, len(v)*4)
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[i*4:], math.Float32bits(x))
	}
	return b
}

func bf16Bytes(v []float32) []byte {
	b := make([]byte, len(v)*2)
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[i*2:], F32ToBF16(x))
	}
	return b
}

func mustSync(t *testing.T, d *Device) {
	t.Helper()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceDescribe(t *testing.T) {
	d := openDevice(t)
	t.Logf("%s\nprops %+v\noptions %q\n%s", d.Name(), d.Props(), d.CompileOptions(), Describe())
	p := d.Props()
	if p.SMs <= 0 || p.TotalMem <= 0 || p.CCMajor <= 0 || p.Arch == "" || p.NVRTCVersion == 0 || p.MaxSharedOptin < 48<<10 {
		t.Errorf("implausible props %+v", p)
	}
	if d.ActDType() != kernels.BF16 {
		t.Error("activations are not bf16")
	}
}

func TestRoundTrip(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewSource(1))
	n := 1000003
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.Intn(9)-4)))
	}
	copy(x, []float32{0, float32(math.Copysign(0, -1)), 1e-40, float32(math.Inf(1)), float32(math.Inf(-1)), 3.4028235e38, 1.00390625, 1.01171875})

	check := func(name string, got []float32, want func(i int) float32) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("%s: %d elements, want %d", name, len(got), n)
		}
		for i, g := range got {
			if w := want(i); math.Float32bits(g) != math.Float32bits(w) {
				t.Fatalf("%s: element %d is %g, want %g", name, i, g, w)
			}
		}
	}

	// f32 → bf16, rounded to nearest even.
	tb := d.Alloc(kernels.BF16, n)
	if err := d.Upload(tb, f32Bytes(x), kernels.F32); err != nil {
		t.Fatal(err)
	}
	got, err := d.ReadF32(tb)
	if err != nil {
		t.Fatal(err)
	}
	check("f32→bf16", got, func(i int) float32 { return BF16ToF32(F32ToBF16(x[i])) })

	// bf16 → bf16 raw, and the device reads bf16 bits as the host does.
	if err := d.Upload(tb, bf16Bytes(x), kernels.BF16); err != nil {
		t.Fatal(err)
	}
	tf := d.Alloc(kernels.F32, n)
	m, err := d.Module("widen", `#include <cuda_bf16.h>
extern "C" __global__ void widen(float* out, const __nv_bfloat16* in, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) out[i] = __bfloat162float(in[i]);
}`)
	if err != nil {
		t.Fatal(err)
	}
	widen, err := m.Func("widen")
	if err != nil {
		t.Fatal(err)
	}
	d.Launch(widen, Dim3{X: uint32((n + 255) / 256)}, Dim3{X: 256}, 0, d.Ptr(tf), tb, n)
	got, err = d.ReadF32(tf)
	if err != nil {
		t.Fatal(err)
	}
	check("bf16 widened on the device", got, func(i int) float32 { return BF16ToF32(F32ToBF16(x[i])) })

	// f32 → f32.
	if err := d.Upload(tf, f32Bytes(x), kernels.F32); err != nil {
		t.Fatal(err)
	}
	got, err = d.ReadF32(tf)
	if err != nil {
		t.Fatal(err)
	}
	check("f32→f32", got, func(i int) float32 { return x[i] })

	// f16 → bf16 and f16 → f32, from random finite halves.
	h := make([]byte, n*2)
	for i := 0; i < n; i++ {
		v := uint16(r.Intn(1 << 16))
		if v&0x7c00 == 0x7c00 {
			v &^= 0x4000 // no inf or NaN
		}
		binary.LittleEndian.PutUint16(h[i*2:], v)
	}
	half := func(i int) float32 { return kernels.F16ToF32(binary.LittleEndian.Uint16(h[i*2:])) }
	if err := d.Upload(tb, h, kernels.F16); err != nil {
		t.Fatal(err)
	}
	if got, err = d.ReadF32(tb); err != nil {
		t.Fatal(err)
	}
	check("f16→bf16", got, func(i int) float32 { return BF16ToF32(F32ToBF16(half(i))) })
	if err := d.Upload(tf, h, kernels.F16); err != nil {
		t.Fatal(err)
	}
	if got, err = d.ReadF32(tf); err != nil {
		t.Fatal(err)
	}
	check("f16→f32", got, half)

	// i32.
	ti := d.Alloc(kernels.I32, 5)
	if err := d.WriteI32(ti, []int32{1, -2, 3, math.MaxInt32, math.MinInt32}); err != nil {
		t.Fatal(err)
	}
	iv, err := d.ReadI32(ti)
	if err != nil || fmt.Sprint(iv) != fmt.Sprint([]int32{1, -2, 3, math.MaxInt32, math.MinInt32}) {
		t.Fatalf("ReadI32 = %v, %v", iv, err)
	}

	// A pitched view: columns [3, 8) of a [7, 10] matrix.
	mat := d.Alloc(kernels.F32, 7, 10)
	mv := make([]float32, 70)
	for i := range mv {
		mv[i] = float32(i)
	}
	if err := d.Upload(mat, f32Bytes(mv), kernels.F32); err != nil {
		t.Fatal(err)
	}
	cols, err := d.ReadF32(mat.ColSlice(3, 8))
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 7; r++ {
		for c := 0; c < 5; c++ {
			if cols[r*5+c] != float32(r*10+c+3) {
				t.Fatalf("pitched read (%d,%d) = %g", r, c, cols[r*5+c])
			}
		}
	}
	if err := d.Upload(mat.ColSlice(3, 8), make([]byte, 7*5*4), kernels.F32); err == nil {
		t.Error("Upload into a pitched view accepted")
	}
	if err := d.Upload(mat, make([]byte, 12), kernels.F32); err == nil {
		t.Error("Upload of the wrong size accepted")
	}

	// Free returns memory to the cache; the next Alloc of the class reuses it.
	before := d.MemStats()
	d.Free(tf)
	tf2 := d.Alloc(kernels.F32, n)
	after := d.MemStats()
	if after.Hits != before.Hits+1 || after.Mallocs != before.Mallocs {
		t.Errorf("no reuse after Free: %+v then %+v", before, after)
	}
	d.Free(tf2)
	mustSync(t, d)
}

func TestUploadThroughput(t *testing.T) {
	d := openDevice(t)
	const n = 128 << 20 // elements: 512 MiB of f32
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i%1000) * 0.001
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), n*4)
	// The same bytes memory-mapped from a file in the page cache, as a checkpoint is.
	path := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	mapped, err := syscall.Mmap(int(file.Fd()), 0, len(raw), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mapped)

	tb := d.Alloc(kernels.BF16, n)
	tf := d.Alloc(kernels.F32, n)
	for _, c := range []struct {
		name string
		t    *kernels.Tensor
		data []byte
		dt   kernels.DType
	}{
		{"f32→bf16", tb, raw, kernels.F32},
		{"bf16→bf16", tb, raw[:n*2], kernels.BF16},
		{"f32→f32", tf, raw, kernels.F32},
		{"f32→bf16 from an mmap'd file", tb, mapped, kernels.F32},
		{"bf16→bf16 from an mmap'd file", tb, mapped[:n*2], kernels.BF16},
	} {
		mustSync(t, d)
		start := time.Now()
		if err := d.Upload(c.t, c.data, c.dt); err != nil {
			t.Fatal(err)
		}
		mustSync(t, d)
		s := time.Since(start).Seconds()
		t.Logf("upload %s: %d MiB of source in %.1f ms: %.2f GB/s", c.name, len(c.data)>>20, s*1e3, float64(len(c.data))/s/1e9)
	}
	got, err := d.ReadF32(tf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != src[i] {
			t.Fatalf("element %d is %g, want %g", i, got[i], src[i])
		}
	}
	if got, err = d.ReadF32(tb); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 4099 { // the last upload: src's first half read as bf16
		want := BF16ToF32(binary.LittleEndian.Uint16(raw[i*2:]))
		if math.Float32bits(got[i]) != math.Float32bits(want) && want == want {
			t.Fatalf("bf16 element %d is %g, want %g", i, got[i], want)
		}
	}
}

const incSrc = `
extern "C" __global__ void inc(int* p, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) p[i] += 1;
}`

func TestModuleDiskCache(t *testing.T) {
	d := openDevice(t)
	src := incSrc + fmt.Sprintf("\n// %d\n", time.Now().UnixNano()) // a fresh key
	start := time.Now()
	m, err := d.Module("inc", src)
	if err != nil {
		t.Fatal(err)
	}
	compile := time.Since(start)
	if st := d.ModuleStats(); st.Compiled != 1 || st.DiskHits != 0 {
		t.Fatalf("first Module: %+v", st)
	}
	files, _ := filepath.Glob(filepath.Join(d.CacheDir(), "*.cubin"))
	if len(files) != 1 {
		t.Fatalf("cache dir %s holds %v", d.CacheDir(), files)
	}
	if m2, _ := d.Module("inc", src); m2 != m || d.ModuleStats().MemHits != 1 {
		t.Errorf("second Module on the device was not served from memory: %+v", d.ModuleStats())
	}

	// A second device (same GPU) finds the cubin on disk.
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	start = time.Now()
	m2, err := d2.Module("inc", src)
	if err != nil {
		t.Fatal(err)
	}
	load := time.Since(start)
	if st := d2.ModuleStats(); st.Compiled != 0 || st.DiskHits != 1 {
		t.Errorf("Module on a new device: %+v", st)
	}
	t.Logf("compile %v, load from disk %v", compile, load)

	// The loaded kernel runs.
	f, err := m2.Func("inc")
	if err != nil {
		t.Fatal(err)
	}
	buf := d2.Alloc(kernels.I32, 1000)
	if err := d2.WriteI32(buf, make([]int32, 1000)); err != nil {
		t.Fatal(err)
	}
	d2.Launch(f, Dim3{X: 4}, Dim3{X: 256}, 0, buf, int32(1000))
	d2.Launch(f, Dim3{X: 4}, Dim3{X: 256}, 0, buf, int32(1000))
	v, err := d2.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range v {
		if x != 2 {
			t.Fatalf("element %d is %d after two increments", i, x)
		}
	}

	// A damaged cache file is compiled again and replaced.
	if err := os.WriteFile(files[0], []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	d3, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d3.Close()
	if _, err := d3.Module("inc", src); err != nil {
		t.Fatal(err)
	}
	if st := d3.ModuleStats(); st.Compiled != 1 || st.CacheErrors != 1 {
		t.Errorf("damaged cache file: %+v", st)
	}
}

func TestCompileError(t *testing.T) {
	d := openDevice(t)
	_, err := d.Module("bad.cu", "extern \"C\" __global__ void k(int* p) { p[0] = undefined_thing; }")
	if err == nil {
		t.Fatal("bad source compiled")
	}
	var e *Error
	if !errors.As(err, &e) || e.Name != "NVRTC_ERROR_COMPILATION" || !strings.Contains(e.Log, "undefined_thing") {
		t.Fatalf("error %v", err)
	}
	t.Logf("%v", err)
}

func TestBuiltinHeaders(t *testing.T) {
	// Reports whether NVRTC finds cuda_bf16.h without an include path
	// (informative: Open adds one when it finds the headers).
	d := openDevice(t)
	var opts []string
	for _, o := range d.CompileOptions() {
		if !strings.HasPrefix(o, "--include-path=") {
			opts = append(opts, o)
		}
	}
	_, err := d.nvrtc.compile(Program{Name: "bf16.cu", Src: "#include <cuda_bf16.h>\nextern \"C\" __global__ void k(__nv_bfloat16* p) { p[0] = __float2bfloat16(1.f); }"}, opts, d.cubin)
	t.Logf("cuda_bf16.h with no include path: %v (options with one: %q)", err, d.CompileOptions())
}

func TestDynamicShared(t *testing.T) {
	d := openDevice(t)
	m, err := d.Module("smem", `
extern "C" __global__ void rev(int* p, int n) {
	extern __shared__ int s[];
	for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = p[i];
	__syncthreads();
	for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = s[n - 1 - i];
}`)
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Func("rev")
	if err != nil {
		t.Fatal(err)
	}
	bytes := d.Props().MaxSharedOptin
	n := bytes / 4
	if err := f.SetMaxDynamicShared(bytes); err != nil {
		t.Fatal(err)
	}
	a, err := f.Attrs()
	t.Logf("attrs %+v, %v", a, err)
	buf := d.Alloc(kernels.I32, n)
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(i)
	}
	if err := d.WriteI32(buf, v); err != nil {
		t.Fatal(err)
	}
	d.Launch(f, Dim3{X: 1}, Dim3{X: 1024}, bytes, buf, n)
	got, err := d.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range got {
		if int(x) != n-1-i {
			t.Fatalf("element %d is %d", i, x)
		}
	}
}

// TestModuleGlobal finds a module's __device__ array (its address and
// size), reads its initial values back through a tensor, reads what a
// kernel wrote into it, and refuses a name the module lacks.
func TestModuleGlobal(t *testing.T) {
	d := openDevice(t)
	m, err := d.Module("global", `
__device__ int counts[5] = {1, 2, 3, 4, 5};
extern "C" __global__ void bump(int by) { counts[threadIdx.x] += by; }`)
	if err != nil {
		t.Fatal(err)
	}
	ptr, n, err := m.Global("counts")
	if err != nil {
		t.Fatal(err)
	}
	if ptr == 0 || n != 5*4 {
		t.Fatalf("counts at %#x, %d bytes; want 20", ptr, n)
	}
	read := func() []int32 {
		t.Helper()
		buf := d.Alloc(kernels.I32, n/4)
		defer d.Free(buf)
		d.Memcpy(d.Ptr(buf), ptr, n)
		v, err := d.ReadI32(buf)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := read(); !slices.Equal(v, []int32{1, 2, 3, 4, 5}) {
		t.Errorf("counts read back as %v", v)
	}
	f, err := m.Func("bump")
	if err != nil {
		t.Fatal(err)
	}
	if f.Module() != m {
		t.Errorf("bump's Module is not the module it was found in")
	}
	d.Launch(f, Dim3{X: 1}, Dim3{X: 5}, 0, int32(10))
	if v := read(); !slices.Equal(v, []int32{11, 12, 13, 14, 15}) {
		t.Errorf("counts after bump(10): %v", v)
	}
	if _, _, err := m.Global("absent"); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("Global(absent): %v, want an error naming it", err)
	}
}

// devMatrix uploads host values as a [rows, ld] matrix of dt and returns it
// with the values as the device holds them (rounded to dt).
func devMatrix(t *testing.T, d *Device, dt kernels.DType, rows, ld int, r *rand.Rand) (*kernels.Tensor, []float64) {
	t.Helper()
	n := rows * ld
	v := make([]float32, n)
	host := make([]float64, n)
	for i := range v {
		v[i] = float32(r.Float64()*2 - 1)
		if dt == kernels.BF16 {
			v[i] = BF16ToF32(F32ToBF16(v[i]))
		}
		host[i] = float64(v[i])
	}
	tt := d.Alloc(dt, max(n, 1))
	if err := d.Upload(tt, f32Bytes(v)[:n*4], kernels.F32); err != nil {
		t.Fatal(err)
	}
	return tt, host
}

// compareGemm checks got against want on the m×n problem (row-major, ldc),
// and that the padding columns of C kept their old values.
func compareGemm(t *testing.T, what string, got, want, old []float64, absSum []float64, m, n, ldc int, cType kernels.DType) {
	t.Helper()
	for i := 0; i < m; i++ {
		for j := 0; j < ldc; j++ {
			idx := i*ldc + j
			if j >= n {
				if got[idx] != old[idx] {
					t.Fatalf("%s: padding (%d,%d) changed from %g to %g", what, i, j, old[idx], got[idx])
				}
				continue
			}
			tol := 1e-5*absSum[idx] + 1e-6
			if cType == kernels.BF16 {
				tol += math.Abs(want[idx]) / 128
			}
			if math.Abs(got[idx]-want[idx]) > tol {
				t.Fatalf("%s: C(%d,%d) = %g, want %g (tolerance %g)", what, i, j, got[idx], want[idx], tol)
			}
		}
	}
}

func readF64(t *testing.T, d *Device, tt *kernels.Tensor) []float64 {
	t.Helper()
	v, err := d.ReadF32(tt)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func absSums(transA, transB bool, m, n, k int, A []float64, lda, sA int, B []float64, ldb, sB int, ldc, sC, batch int, alpha, beta float64, C []float64) []float64 {
	abs := func(v []float64) []float64 {
		o := make([]float64, len(v))
		for i, x := range v {
			o[i] = math.Abs(x)
		}
		return o
	}
	s := abs(C)
	rowMajorRef(transA, transB, m, n, k, math.Abs(alpha), abs(A), lda, sA, abs(B), ldb, sB, math.Abs(beta), s, ldc, sC, batch)
	return s
}

func TestGemm(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewSource(4))
	type types struct{ in, out kernels.DType }
	for _, ty := range []types{{kernels.BF16, kernels.F32}, {kernels.BF16, kernels.BF16}, {kernels.F32, kernels.F32}} {
		for _, sh := range [][3]int{{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 96, 128}, {129, 257, 100}, {16, 1000, 3584}} {
			for _, transB := range []bool{false, true} {
				for _, pitched := range []bool{false, true} {
					m, n, k := sh[0], sh[1], sh[2]
					pad := func(x int) int {
						if pitched {
							return x + 3
						}
						return x
					}
					lda, ldc := pad(k), pad(n)
					bRows, ldb := k, pad(n)
					if transB {
						bRows, ldb = n, pad(k)
					}
					a, A := devMatrix(t, d, ty.in, m, lda, r)
					b, B := devMatrix(t, d, ty.in, bRows, ldb, r)
					c, C := devMatrix(t, d, ty.out, m, ldc, r)
					alpha, beta := 1.5, 0.5
					want := append([]float64(nil), C...)
					rowMajorRef(false, transB, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, want, ldc, 0, 1)
					d.Gemm(transB, m, n, k, float32(alpha), d.Ptr(a), ty.in, lda, d.Ptr(b), ty.in, ldb, float32(beta), d.Ptr(c), ty.out, ldc)
					mustSync(t, d)
					what := fmt.Sprintf("Gemm %v→%v m=%d n=%d k=%d transB=%v lda=%d ldb=%d ldc=%d", ty.in, ty.out, m, n, k, transB, lda, ldb, ldc)
					compareGemm(t, what, readF64(t, d, c), want, C,
						absSums(false, transB, m, n, k, A, lda, 0, B, ldb, 0, ldc, 0, 1, alpha, beta, C), m, n, ldc, ty.out)
					d.Free(a)
					d.Free(b)
					d.Free(c)
				}
			}
		}
	}
}

func TestGemmBatches(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewSource(5))
	m, n, k, batch := 5, 7, 9, 3
	for _, transA := range []bool{false, true} {
		for _, transB := range []bool{false, true} {
			aRows, lda := m, k+2
			if transA {
				aRows, lda = k, m+2
			}
			bRows, ldb := k, n+1
			if transB {
				bRows, ldb = n, k+1
			}
			ldc := n + 3
			sA, sB, sC := aRows*lda+11, bRows*ldb+5, m*ldc+7
			a, A := devMatrix(t, d, kernels.BF16, batch, sA, r)
			b, B := devMatrix(t, d, kernels.BF16, batch, sB, r)
			c, C := devMatrix(t, d, kernels.F32, batch, sC, r)
			alpha, beta := 0.75, 2.0
			want := append([]float64(nil), C...)
			rowMajorRef(transA, transB, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, want, ldc, sC, batch)
			sums := absSums(transA, transB, m, n, k, A, lda, sA, B, ldb, sB, ldc, sC, batch, alpha, beta, C)
			what := fmt.Sprintf("transA=%v transB=%v", transA, transB)

			d.GemmStridedBatched(transA, transB, m, n, k, float32(alpha), d.Ptr(a), kernels.BF16, lda, int64(sA),
				d.Ptr(b), kernels.BF16, ldb, int64(sB), float32(beta), d.Ptr(c), kernels.F32, ldc, int64(sC), batch)
			got := readF64(t, d, c)
			for p := 0; p < batch; p++ {
				compareGemm(t, "GemmStridedBatched "+what, got[p*sC:], want[p*sC:], C[p*sC:], sums[p*sC:], m, n, ldc, kernels.F32)
			}

			// The same through pointer arrays.
			if err := d.Upload(c, f32Bytes(toF32(C)), kernels.F32); err != nil {
				t.Fatal(err)
			}
			ptrs := make([]uint64, 3*batch)
			for p := 0; p < batch; p++ {
				ptrs[p] = uint64(d.Ptr(a)) + uint64(p*sA*2)
				ptrs[batch+p] = uint64(d.Ptr(b)) + uint64(p*sB*2)
				ptrs[2*batch+p] = uint64(d.Ptr(c)) + uint64(p*sC*4)
			}
			pt := d.Alloc(kernels.I32, 6*batch)
			if err := d.Upload(pt, unsafe.Slice((*byte)(unsafe.Pointer(&ptrs[0])), len(ptrs)*8), kernels.I32); err != nil {
				t.Fatal(err)
			}
			d.GemmBatched(transA, transB, m, n, k, float32(alpha), d.Ptr(pt), kernels.BF16, lda,
				d.Ptr(pt)+uintptr(batch*8), kernels.BF16, ldb, float32(beta), d.Ptr(pt)+uintptr(2*batch*8), kernels.F32, ldc, batch)
			got = readF64(t, d, c)
			for p := 0; p < batch; p++ {
				compareGemm(t, "GemmBatched "+what, got[p*sC:], want[p*sC:], C[p*sC:], sums[p*sC:], m, n, ldc, kernels.F32)
			}
		}
	}
}

func toF32(v []float64) []float32 {
	o := make([]float32, len(v))
	for i, x := range v {
		o[i] = float32(x)
	}
	return o
}

// incKernel is incSrc's kernel inc, loaded on d.
func incKernel(t *testing.T, d *Device) *Func {
	t.Helper()
	m, err := d.Module("inc", incSrc)
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Func("inc")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestGraphReplay(t *testing.T) {
	d := openDevice(t)
	f := incKernel(t, d)
	const n = 4096
	buf := d.Alloc(kernels.I32, n)
	if err := d.WriteI32(buf, make([]int32, n)); err != nil {
		t.Fatal(err)
	}
	// A cuBLAS product in the graph too: cuBLAS must not allocate while captured.
	ga := d.Alloc(kernels.BF16, 256, 256)
	gc := d.Alloc(kernels.F32, 256, 256)
	d.Zero(ga)
	mustSync(t, d)

	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	d.Launch(f, Dim3{X: n / 256}, Dim3{X: 256}, 0, buf, int32(n))
	d.Gemm(true, 256, 256, 256, 1, d.Ptr(ga), kernels.BF16, 256, d.Ptr(ga), kernels.BF16, 256, 0, d.Ptr(gc), kernels.F32, 256)
	if err := d.Sync(); err == nil {
		t.Error("Sync during capture accepted")
	}
	if err := d.WriteI32(buf, make([]int32, n)); err == nil {
		t.Error("WriteI32 during capture accepted")
	}
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// Captured work did not run.
	v, err := d.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 0 {
		t.Fatalf("captured kernel ran: %d", v[0])
	}
	for i := 0; i < 3; i++ {
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
	}
	if v, err = d.ReadI32(buf); err != nil {
		t.Fatal(err)
	}
	for i, x := range v {
		if x != 3 {
			t.Fatalf("element %d is %d after 3 replays", i, x)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

// A graph is current until device memory is given back: an allocation
// leaves it so, a Free or a Scratch that grows does not, and a closed graph
// is not.
func TestGraphCurrent(t *testing.T) {
	d := openDevice(t)
	f := incKernel(t, d)
	const n = 256
	buf := d.Alloc(kernels.I32, n)
	d.Scratch("graph-current", 64)
	mustSync(t, d)
	record := func() kernels.Graph {
		t.Helper()
		if err := d.BeginCapture(); err != nil {
			t.Fatal(err)
		}
		d.Launch(f, Dim3{X: 1}, Dim3{X: n}, 0, buf, int32(n))
		g, err := d.EndCapture()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	current := func(g kernels.Graph) bool { return g.(kernels.CurrentGraph).Current() }

	g := record()
	other := d.Alloc(kernels.I32, n)
	if !current(g) {
		t.Error("an allocation made the graph stale")
	}
	d.Free(other)
	if current(g) {
		t.Error("the graph is current after a Free")
	}
	g.Close()

	g = record()
	d.Scratch("graph-current", 64)
	if !current(g) {
		t.Error("a Scratch that fits made the graph stale")
	}
	d.Scratch("graph-current", 1<<20)
	if current(g) {
		t.Error("the graph is current after its scratch grew")
	}
	g.Close()

	g = record()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, d)
	g.Close()
	if current(g) {
		t.Error("a closed graph is current")
	}
}

func TestEvents(t *testing.T) {
	d := openDevice(t)
	const s = 4096
	a := d.Alloc(kernels.BF16, s, s)
	c := d.Alloc(kernels.BF16, s, s)
	d.Zero(a)
	gemm := func() {
		d.Gemm(true, s, s, s, 1, d.Ptr(a), kernels.BF16, s, d.Ptr(a), kernels.BF16, s, 0, d.Ptr(c), kernels.BF16, s)
	}
	gemm() // warm up
	from := d.Mark()
	const reps = 10
	for i := 0; i < reps; i++ {
		gemm()
	}
	to := d.Mark()
	ms, err := d.Elapsed(from, to)
	if err != nil {
		t.Fatal(err)
	}
	if ms <= 0 {
		t.Fatalf("elapsed %g ms", ms)
	}
	t.Logf("%d bf16 GEMMs %d³ in %.3f ms: %.0f TFLOP/s (zeros)", reps, s, ms, 2*float64(s)*s*s*reps/ms/1e9)
	if _, err := d.Elapsed(from, &mark{d: d}); err == nil {
		t.Error("Elapsed of an empty mark accepted")
	}
	mustSync(t, d)
}

func TestStickyErrors(t *testing.T) {
	d := openDevice(t)
	// The allocator's error names the call and the driver's words.
	d.enter()
	_, _, err := d.alloc.alloc(1 << 50)
	d.leave()
	if want := "cuda: cuMemAlloc_v2(1125899906842624 bytes): CUDA_ERROR_OUT_OF_MEMORY: out of memory"; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	// An invalid launch is recorded, later work skipped, Sync reports it.
	m, err := d.Module("inc", incSrc)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.Func("inc")
	buf := d.Alloc(kernels.I32, 16)
	d.Launch(f, Dim3{X: 1}, Dim3{X: 4096}, 0, buf, int32(16))
	err = d.Sync()
	if err == nil || !strings.Contains(err.Error(), "cuLaunchKernel(inc, grid 1x1x1, block 4096x1x1, shared 0): CUDA_ERROR_INVALID_VALUE") {
		t.Errorf("Sync after a bad launch: %v", err)
	}
	if d.Err() != err {
		t.Error("Err differs from Sync")
	}
	if _, rerr := d.ReadI32(buf); rerr == nil {
		t.Error("read after an error accepted")
	}

	// A failed Alloc is sticky too, and reported as out of memory.
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	d2.Alloc(kernels.F32, 1<<48)
	if err := d2.Sync(); !IsOutOfMemory(err) {
		t.Errorf("Sync after a huge Alloc: %v", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	// Goroutines on any OS thread share the device: each call makes the
	// context current on its thread, and the stream orders the work.
	d := openDevice(t)
	m, err := d.Module("inc", incSrc)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.Func("inc")
	buf := d.Alloc(kernels.I32, 256)
	if err := d.WriteI32(buf, make([]int32, 256)); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 200
	done := make(chan struct{})
	for w := 0; w < workers; w++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < each; i++ {
				d.Launch(f, Dim3{X: 1}, Dim3{X: 256}, 0, buf, int32(256))
				if i%50 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	for w := 0; w < workers; w++ {
		<-done
	}
	v, err := d.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != workers*each || v[255] != workers*each {
		t.Fatalf("got %d and %d, want %d", v[0], v[255], workers*each)
	}
}

func TestLaunchOverhead(t *testing.T) {
	// Host time per call (informative): the cost a step pays without a graph.
	d := openDevice(t)
	m, err := d.Module("inc", incSrc)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.Func("inc")
	buf := d.Alloc(kernels.I32, 256)
	a := d.Alloc(kernels.BF16, 64, 64)
	c := d.Alloc(kernels.F32, 64, 64)
	mustSync(t, d)
	const n = 20000
	start := time.Now()
	for i := 0; i < n; i++ {
		d.Launch(f, Dim3{X: 1}, Dim3{X: 256}, 0, buf, int32(256))
	}
	launch := time.Since(start)
	mustSync(t, d)
	start = time.Now()
	for i := 0; i < n/10; i++ {
		d.Gemm(true, 64, 64, 64, 1, d.Ptr(a), kernels.BF16, 64, d.Ptr(a), kernels.BF16, 64, 0, d.Ptr(c), kernels.F32, 64)
	}
	gemm := time.Since(start)
	mustSync(t, d)
	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		d.Launch(f, Dim3{X: 1}, Dim3{X: 256}, 0, buf, int32(256))
	}
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Replay()
	mustSync(t, d)
	start = time.Now()
	for i := 0; i < 100; i++ {
		g.Replay()
	}
	mustSync(t, d)
	replay := time.Since(start)
	t.Logf("Launch %.2f µs each (host), Gemm %.2f µs each (host), a 100-kernel graph %.1f µs per replay (device)",
		launch.Seconds()*1e6/n, gemm.Seconds()*1e6/(n/10), replay.Seconds()*1e6/100)
}

func TestScratch(t *testing.T) {
	d := openDevice(t)
	p := d.Scratch("a", 100)
	if p == 0 || d.Scratch("a", 50) != p || d.Scratch("a", 512) != p {
		t.Fatal("a slot moved without growing")
	}
	q := d.Scratch("b", 100)
	if q == 0 || q == p {
		t.Fatal("two slots share memory")
	}
	if big := d.Scratch("a", 10<<20); big == 0 || big == p {
		t.Fatal("slot did not grow")
	}
	mustSync(t, d)
	// Growing while a graph is captured is an error.
	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if d.Scratch("a", 1<<20) == 0 {
		t.Error("a slot that fits returned nothing during capture")
	}
	if d.Scratch("a", 100<<20) != 0 {
		t.Error("a slot grew during capture")
	}
	if _, err := d.EndCapture(); err == nil || !strings.Contains(err.Error(), "size it before BeginCapture") {
		t.Errorf("EndCapture after growth: %v", err)
	}
}

// ReadI32Later returns the elements as the work queued before it left
// them, not as work queued after it changes them; reads in flight at once
// take buffers of their own, which their waits give back; a tensor it
// cannot read is refused with a reason.
func TestReadI32Later(t *testing.T) {
	d := openDevice(t)
	x := d.Alloc(kernels.I32, 6)
	var waits []func() ([]int32, error)
	var want [][]int32
	for round := range 3 {
		v := []int32{int32(round), 1, -2, 3, math.MaxInt32, math.MinInt32}
		if err := d.WriteI32(x, v); err != nil {
			t.Fatal(err)
		}
		wait, err := d.ReadI32Later(x)
		if err != nil {
			t.Fatal(err)
		}
		waits, want = append(waits, wait), append(want, v)
	}
	if n := len(d.later); n != 3 {
		t.Errorf("%d pinned buffers for three reads in flight, want 3", n)
	}
	for i, wait := range waits {
		got, err := wait()
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("read %d: %v, %v; want %v (the write queued before it, not those after)", i, got, err, want[i])
		}
	}
	if _, err := d.ReadI32Later(x); err != nil {
		t.Fatal(err)
	}
	if n := len(d.later); n != 3 {
		t.Errorf("%d pinned buffers after the waits gave theirs back, want 3", n)
	}
	for _, bad := range []*kernels.Tensor{d.Alloc(kernels.F32, 4), d.Alloc(kernels.I32, laterBytes/4+1)} {
		if _, err := d.ReadI32Later(bad); err == nil {
			t.Errorf("ReadI32Later(%v) queued a read, want a refusal", bad)
		}
	}
	mustSync(t, d)
}
