package cuda

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// kernelRecord writes a CONCURRENT_KERNEL record of size bytes with the
// fields this package reads.
func kernelRecord(size int, start, end uint64, grid, block [3]uint32, corr uint32, name uintptr, node uint64) []byte {
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b, actKindConcurrentKernel)
	le.PutUint64(b[kOffStart:], start)
	le.PutUint64(b[kOffEnd:], end)
	le.PutUint32(b[kOffStream:], 13)
	for i := range 3 {
		le.PutUint32(b[kOffGrid+4*i:], grid[i])
		le.PutUint32(b[kOffBlock+4*i:], block[i])
	}
	le.PutUint32(b[kOffCorrelation:], corr)
	le.PutUint64(b[kOffName:], uint64(name))
	le.PutUint64(b[kOffGraphNode:], node)
	le.PutUint32(b[kOffGraphID:], 7)
	return b
}

func externalRecord(kind uint32, id uint64, corr uint32) []byte {
	b := make([]byte, extSize)
	le := binary.LittleEndian
	le.PutUint32(b, actKindExternal)
	le.PutUint32(b[extOffKind:], kind)
	le.PutUint64(b[extOffID:], id)
	le.PutUint32(b[extOffCorrelation:], corr)
	return b
}

// Kernel records of CUDA 11.8, 12 and 13.0 (200, 208 and 216 bytes) read
// the same; a record that does not read as a kernel is refused.
func TestDecodeKernel(t *testing.T) {
	names := map[uintptr]string{0x1000: "flash_fwd_bf16"}
	name := func(p uintptr) string { return names[p] }
	for _, size := range []int{200, 208, 216} {
		rec := kernelRecord(size, 100, 250, [3]uint32{132, 2, 1}, [3]uint32{128, 1, 1}, 42, 0x1000, 9)
		k, err := decodeKernel(rec, name)
		if err != nil {
			t.Fatal(err)
		}
		want := rawKernel{name: "flash_fwd_bf16", start: 100, end: 250, grid: [3]uint32{132, 2, 1}, block: [3]uint32{128, 1, 1},
			stream: 13, correlation: 42, graphNode: 9, graphID: 7}
		if k != want {
			t.Errorf("%d-byte record: %+v, want %+v", size, k, want)
		}
	}
	if _, err := decodeKernel(make([]byte, 100), name); err == nil || !strings.Contains(err.Error(), "shorter than the 160") {
		t.Errorf("short record: %v", err)
	}
	bad := kernelRecord(216, 300, 200, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 1, 0x1000, 0)
	if _, err := decodeKernel(bad, name); err == nil || !strings.Contains(err.Error(), "not the one this build reads") {
		t.Errorf("end before start: %v", err)
	}
}

func TestJoinKernels(t *testing.T) {
	ext := map[uint32]extIDs{}
	for _, r := range [][]byte{
		externalRecord(extKindTraceID, 5, 100), // an op call's launch
		externalRecord(extKindTraceID, 6, 101), // a cuBLAS call inside op call 6
		externalRecord(extKindLibrary, cuptiBlasExternal, 101),
		externalRecord(extKindTraceID, 9, 102), // a graph replay
		externalRecord(2, 77, 103),             // OpenACC's: ignored
	} {
		if err := decodeExternal(r, ext); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint32]extIDs{100: {id: 5}, 101: {id: 6, blas: true}, 102: {id: 9}}
	if !reflect.DeepEqual(ext, want) {
		t.Fatalf("external ids %+v, want %+v", ext, want)
	}
	nodes := map[uint64]nodeInfo{71: {id: 3}, 72: {id: 4, blas: true}}
	own := func(n string) bool { return n == "rms_norm_v8" }
	raw := []rawKernel{
		{name: "rms_norm_v8", start: 10, end: 20, correlation: 100},
		{name: "sm90_xmma_gemm_bf16bf16_bf16f32", start: 20, end: 40, correlation: 101},
		{name: "rms_norm_v8", start: 50, end: 60, correlation: 102, graphNode: 71},
		{name: "nvjet_hsh_256x128", start: 60, end: 90, correlation: 102, graphNode: 72},
		{name: "mystery", start: 95, end: 96, correlation: 999},
	}
	got := joinKernels(raw, ext, nodes, own, 1000)
	type row struct {
		source   string
		id, node uint64
		start    int64
	}
	wantRows := []row{
		{profile.SourceOwn, 5, 0, 1010},
		{profile.SourceCUBLAS, 6, 0, 1020},
		{profile.SourceOwn, 9, 3, 1050},
		{profile.SourceCUBLAS, 9, 4, 1060},
		{profile.SourceOther, 0, 0, 1095},
	}
	for i, w := range wantRows {
		g := got[i]
		if (row{g.Source, g.ID, g.Node, g.Start}) != w || g.End-g.Start != int64(raw[i].end-raw[i].start) {
			t.Errorf("kernel %d %s: %+v, want %+v", i, g.Name, g, w)
		}
	}
	for name, want := range map[string]string{
		"gemv2T_kernel_val<int, int, float>": profile.SourceCUBLAS,
		"void cutlass::Kernel2<...>":         profile.SourceCUBLAS,
		"splitKreduce_kernel":                profile.SourceCUBLAS,
		"flash_decode":                       profile.SourceOther,
	} {
		if got := kernelSource(name, func(string) bool { return false }, false); got != want {
			t.Errorf("kernelSource(%q) = %s, want %s", name, got, want)
		}
	}
}

func TestCUPTIFinder(t *testing.T) {
	wheel := "/venv/lib/python3.12/site-packages"
	fs := &fakeFS{
		env:   map[string]string{"CUDA_HOME": "/c", "VIRTUAL_ENV": "/venv"},
		globs: map[string][]string{"/venv/lib/python3*/site-packages": {wheel}},
		files: map[string]bool{
			"/c/extras/CUPTI/lib64/libcupti.so.13":              true,
			wheel + "/nvidia/cuda_cupti/lib/libcupti.so.12":     true,
			"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.12": true,
		},
	}
	f := cuptiFinder(fs.finder())
	lib, err := f.find("libcupti", cuptiSonames(13000), nil)
	if err != nil || lib.path != "/c/extras/CUPTI/lib64/libcupti.so.13" {
		t.Fatalf("found %v, %v", lib, err)
	}
	delete(fs.files, "/c/extras/CUPTI/lib64/libcupti.so.13")
	if lib, err := f.find("libcupti", cuptiSonames(13000), nil); err != nil || lib.path != "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.12" {
		t.Errorf("found %v, %v; want /usr/local/cuda's extras", lib, err)
	}
	delete(fs.files, "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.12")
	if lib, err := f.find("libcupti", cuptiSonames(13000), nil); err != nil || lib.path != wheel+"/nvidia/cuda_cupti/lib/libcupti.so.12" {
		t.Errorf("found %v, %v; want the CUDA 12 wheel's", lib, err)
	}
	fs.files = nil
	_, err = f.find("libcupti", cuptiSonames(13000), nil)
	if err == nil || !strings.HasPrefix(err.Error(), "cuda: CUPTI (CUDA's profiling library) not found: libcupti.so.13 or libcupti.so.12 is in none of") ||
		!strings.Contains(err.Error(), "/c/lib64") {
		t.Errorf("error %v", err)
	}
	// The other libraries' searches are unchanged.
	if dirs := fs.finder().wheelDirs(); len(dirs) != len(wheelLibDirs) {
		t.Errorf("wheel dirs of the other libraries: %q", dirs)
	}
}

// systemCUPTI opens the CUPTI library installed on this machine, any
// version, or skips.
func systemCUPTI(t *testing.T) *cuptiAPI {
	t.Helper()
	names := append(cuptiSonames(13000), "libcupti.so.11.8", "libcupti.so")
	lib, err := cuptiFinder(osFinder()).find("libcupti", names, nil)
	if err != nil {
		t.Skipf("no CUPTI library here: %v", err)
	}
	api, err := bindCUPTI(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CUPTI %s from %s", api.versionString(), lib.path)
	return api
}

// testTrace is a trace over api, on as if a device traced.
func testTrace(api *cuptiAPI) *kernelTrace {
	return &kernelTrace{api: api, on: true, bufs: map[uintptr][]byte{}, ext: map[uint32]extIDs{},
		nodes: map[uint64]nodeInfo{}, names: map[uintptr]string{}}
}

// requestBuffer asks for a buffer through the C function pointer CUPTI
// calls.
func requestBuffer(t *testing.T) uintptr {
	t.Helper()
	var p, n, maxRecords uintptr
	purego.SyscallN(cbRequested, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&maxRecords)))
	if p == 0 || n != cuptiBufferBytes || p%cuptiBufferAlign != 0 {
		t.Fatalf("bufferRequested gave %#x, %d bytes", p, n)
	}
	return p
}

// poke writes b at the address p of a buffer handed to CUPTI. (Inlined
// twice into one function, it makes go1.26.8's compiler fail: "internal
// compiler error: disjointTypes: one of arguments is not a pointer".)
//
//go:noinline
func poke(p uintptr, b []byte) { copy(unsafe.Slice((*byte)(ptrOf(p)), len(b)), b) }

// The buffer callbacks, called through their C function pointers as CUPTI
// calls them, hand out a buffer and read back the records written into
// it, walked by the installed CUPTI library itself (which needs no GPU for
// that). The kernel record size is found as the one CUPTI's walk agrees
// with: the fields read must sit in its prefix.
func TestCUPTIBuffersAgainstLibrary(t *testing.T) {
	api := systemCUPTI(t)
	makeCallbacks()
	tr := testTrace(api)
	saved := trace
	trace = tr
	defer func() { trace = saved }()

	name := cStr("my_kernel")
	np := uintptr(unsafe.Pointer(&name[0]))
	found := 0
	for size := kPrefix; size <= 512; size += 8 {
		p := requestBuffer(t)
		var recs []byte
		recs = append(recs, kernelRecord(size, 1000, 1500, [3]uint32{4, 1, 1}, [3]uint32{256, 1, 1}, 11, np, 0)...)
		recs = append(recs, externalRecord(extKindTraceID, 77, 11)...)
		recs = append(recs, kernelRecord(size, 2000, 2600, [3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, 12, np, 5)...)
		poke(p, recs)
		purego.SyscallN(cbCompleted, 0, 0, p, cuptiBufferBytes, uintptr(len(recs)))
		raw, ext, err := tr.raw, tr.ext, tr.err
		tr.raw, tr.ext, tr.err = nil, map[uint32]extIDs{}, nil
		if err != nil || len(raw) != 2 || raw[1].correlation != 12 {
			continue // CUPTI walks records of another size
		}
		found++
		want := rawKernel{name: "my_kernel", start: 2000, end: 2600, grid: [3]uint32{8, 2, 1}, block: [3]uint32{128, 1, 1}, stream: 13, correlation: 12, graphNode: 5, graphID: 7}
		if raw[1] != want || raw[0].end != 1500 || ext[11].id != 77 || tr.recSize != size {
			t.Errorf("%d-byte records: %+v, ext %+v, record size %d", size, raw, ext, tr.recSize)
		}
		t.Logf("CUPTI %s walks kernel records of %d bytes", api.versionString(), size)
	}
	if found != 1 {
		t.Errorf("CUPTI's walk agreed with %d record sizes, want exactly one", found)
	}
	if len(tr.bufs) != 0 || len(tr.spare) != 1 {
		t.Errorf("buffers: %d held, %d spare; want every buffer back and reused", len(tr.bufs), len(tr.spare))
	}
	// What CUPTI records while no device traces is dropped.
	tr.on = false
	p := requestBuffer(t)
	rec := externalRecord(extKindTraceID, 5, 1)
	poke(p, rec)
	purego.SyscallN(cbCompleted, 0, 0, p, cuptiBufferBytes, uintptr(len(rec)))
	if len(tr.ext) != 0 || len(tr.spare) != 1 {
		t.Errorf("untraced records kept: %v, %d spare buffers", tr.ext, len(tr.spare))
	}
	// A buffer CUPTI never got is ignored.
	purego.SyscallN(cbCompleted, 0, 0, 0x1234, 16, 16)
	if tr.err != nil || len(tr.raw) != 0 {
		t.Errorf("foreign buffer: %v, %d kernels", tr.err, len(tr.raw))
	}
	if ts, err := api.timestamp(); err != nil || ts == 0 {
		t.Errorf("cuptiGetTimestamp: %d, %v", ts, err)
	}
}

// cuptiHeaderDir is where this machine keeps cupti_activity.h, or "".
func cuptiHeaderDir() string {
	var dirs []string
	for _, root := range osFinder().cudaRoots() {
		dirs = append(dirs, filepath.Join(root, "extras", "CUPTI", "include"), filepath.Join(root, "include"))
	}
	for _, d := range append(dirs, "/usr/include") {
		if _, err := os.Stat(filepath.Join(d, "cupti_activity.h")); err == nil {
			return d
		}
	}
	return ""
}

// The offsets read are those of the newest kernel record the installed
// CUPTI header defines (compiled with the C compiler, when there is one).
func TestKernelLayoutMatchesHeader(t *testing.T) {
	dir := cuptiHeaderDir()
	cc, err := exec.LookPath("cc")
	if dir == "" || err != nil {
		t.Skipf("no CUPTI header (%q) or C compiler (%v) here", dir, err)
	}
	src := filepath.Join(t.TempDir(), "layout.c")
	bin := strings.TrimSuffix(src, ".c")
	var newest string
	for v := 20; v >= 4; v-- {
		probe := "#include <cupti.h>\nint main(void){return (int)sizeof(CUpti_ActivityKernel" + strconv.Itoa(v) + ");}\n"
		os.WriteFile(src, []byte(probe), 0o644)
		if exec.Command(cc, "-I"+dir, "-I/usr/local/cuda/include", "-o", bin, src).Run() == nil {
			newest = "CUpti_ActivityKernel" + strconv.Itoa(v)
			break
		}
	}
	if newest == "" {
		t.Skipf("%s/cupti.h does not compile here", dir)
	}
	prog := `#include <stdio.h>
#include <stddef.h>
#include <cupti.h>
#define O(f) printf("%zu ", offsetof(K, f))
typedef ` + newest + ` K;
typedef CUpti_ActivityExternalCorrelation E;
int main(void) {
	O(start); O(end); O(streamId); O(gridX); O(blockX); O(correlationId); O(name); O(graphNodeId); O(graphId);
	printf("%zu %zu %zu %zu %zu\n", offsetof(E, externalKind), offsetof(E, externalId), offsetof(E, correlationId), sizeof(E), sizeof(K));
	return 0;
}
`
	os.WriteFile(src, []byte(prog), 0o644)
	if out, err := exec.Command(cc, "-I"+dir, "-I/usr/local/cuda/include", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, f := range strings.Fields(string(out)) {
		n, _ := strconv.Atoi(f)
		got = append(got, n)
	}
	want := []int{kOffStart, kOffEnd, kOffStream, kOffGrid, kOffBlock, kOffCorrelation, kOffName, kOffGraphNode, kOffGraphID,
		extOffKind, extOffID, extOffCorrelation, extSize}
	if len(got) != len(want)+1 || !reflect.DeepEqual(got[:len(want)], want) || got[len(want)] < kPrefix {
		t.Errorf("%s in %s: offsets %v, this build reads %v (record of %v bytes, at least %d)", newest, dir, got, want, got[len(got)-1], kPrefix)
	}
	t.Logf("%s (%s): %d bytes, offsets as read", newest, dir, got[len(got)-1])
}

// TestCUPTITrace runs kernels of fuselm and of cuBLAS, eagerly and replayed
// from a graph, under the trace: every kernel comes back with its GPU times,
// the id it was launched under, the node it was captured as, and where it
// comes from. Needs a GPU and CUPTI.
func TestCUPTITrace(t *testing.T) {
	d := openDevice(t)
	if err := d.StartKernelTrace(); err != nil {
		t.Fatalf("CUPTI: %v", err)
	}
	f := incKernel(t, d)
	const n = 4096
	buf := d.Alloc(kernels.I32, n)
	a := d.Alloc(kernels.BF16, 256, 256)
	c := d.Alloc(kernels.F32, 256, 256)
	d.Zero(a)
	mustSync(t, d)
	if _, _, err := d.KernelRecords(); err != nil { // drop what came before
		t.Fatal(err)
	}
	inc := func(id uint64) {
		d.TraceID(id)
		d.Launch(f, Dim3{X: n / 256}, Dim3{X: 256}, 0, buf, int32(n))
	}
	gemm := func(id uint64) {
		d.TraceID(id)
		d.Gemm(true, 256, 256, 256, 1, d.Ptr(a), kernels.BF16, 256, d.Ptr(a), kernels.BF16, 256, 0, d.Ptr(c), kernels.F32, 256)
	}
	t0 := time.Now().UnixNano()
	inc(1)
	gemm(2)
	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	inc(3)
	gemm(4)
	d.TraceID(0)
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, id := range []uint64{5, 6} {
		d.TraceID(id)
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
	}
	d.TraceID(0)
	mustSync(t, d)
	t1 := time.Now().UnixNano()
	recs, note, err := d.KernelRecords()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d kernels; note %q; %s", len(recs), note, strings.TrimSpace(describeCUPTI(d.drv.version)))
	type key struct {
		id, node uint64
		source   string
	}
	seen := map[key]int{}
	for _, r := range recs {
		t.Logf("%-60.60s id %d node %d graph node %d %s %v×%v %.1f µs", r.Name, r.ID, r.Node, r.GraphNode, r.Source, r.Grid, r.Block, float64(r.Ns())/1e3)
		seen[key{r.ID, r.Node, r.Source}]++
		if r.End < r.Start || r.Start < t0-int64(time.Second) || r.End > t1+int64(time.Second) {
			t.Errorf("%s: [%d, %d] outside the host's [%d, %d]", r.Name, r.Start, r.End, t0, t1)
		}
		if r.ID >= 5 && r.GraphNode == 0 {
			t.Errorf("%s replayed with no graph node id", r.Name)
		}
	}
	for _, k := range []key{
		{1, 0, profile.SourceOwn}, {2, 0, profile.SourceCUBLAS},
		{5, 3, profile.SourceOwn}, {5, 4, profile.SourceCUBLAS},
		{6, 3, profile.SourceOwn}, {6, 4, profile.SourceCUBLAS},
	} {
		if seen[k] == 0 {
			t.Errorf("no kernel with trace id %d, captured under %d, from %s", k.id, k.node, k.source)
		}
	}
	if err := d.StopKernelTrace(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.KernelRecords(); err == nil {
		t.Error("KernelRecords after StopKernelTrace: no error")
	}
}
