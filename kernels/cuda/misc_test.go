package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

func ptrOfBytes(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func TestErrorFormat(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2(1073741824 bytes)", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"}
	if got, want := e.Error(), "cuda: cuMemAlloc_v2(1073741824 bytes): CUDA_ERROR_OUT_OF_MEMORY: out of memory"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if !IsOutOfMemory(fmt.Errorf("loading: %w", e)) {
		t.Error("IsOutOfMemory misses a wrapped OOM")
	}
	n := &Error{Call: "nvrtcCompileProgram(k.cu)", Code: 6, Name: "NVRTC_ERROR_COMPILATION", Log: "k.cu(3): error: identifier \"x\" is undefined\n\x00"}
	if got, want := n.Error(), "cuda: nvrtcCompileProgram(k.cu): NVRTC_ERROR_COMPILATION\nk.cu(3): error: identifier \"x\" is undefined"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if IsOutOfMemory(n) || IsOutOfMemory(errors.New("x")) {
		t.Error("IsOutOfMemory of other errors")
	}
}

func TestChooseArch(t *testing.T) {
	cu13 := []int{75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121}
	for _, c := range []struct {
		major, minor, nvrtc int
		archs               []int
		want                string
		cubin               bool
	}{
		{9, 0, 13, cu13, "sm_90a", true},
		{9, 0, 12, []int{50, 80, 90}, "sm_90a", true},
		{9, 0, 11, []int{50, 80, 90}, "sm_90", true},
		{10, 0, 13, cu13, "sm_100a", true},
		{10, 0, 12, []int{80, 90}, "compute_90", false}, // NVRTC older than the device: PTX
		{8, 0, 13, cu13, "sm_80", true},
		{8, 9, 13, cu13, "sm_89", true},
		{12, 0, 13, cu13, "sm_120", true},
		{7, 0, 13, cu13, "sm_70", true}, // below everything: let NVRTC say so
		{8, 6, 13, nil, "sm_86", true},
	} {
		got, cubin := chooseArch(c.major, c.minor, c.nvrtc, c.archs)
		if got != c.want || cubin != c.cubin {
			t.Errorf("chooseArch(%d.%d, NVRTC %d) = %s, %v; want %s, %v", c.major, c.minor, c.nvrtc, got, cubin, c.want, c.cubin)
		}
	}
}

func TestCacheKey(t *testing.T) {
	base := cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=1"}, "sm_90a", 13000)
	if len(base) != 64 {
		t.Fatalf("key %q is not sha256 hex", base)
	}
	if cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=1"}, "sm_90a", 13000) != base {
		t.Error("key not deterministic")
	}
	for i, k := range []string{
		cacheKey(Program{Name: "k", Src: "src"}, []string{"--include-path=/usr/include", "-DA=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k2", Src: "src"}, []string{"-DA=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src "}, []string{"-DA=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=2"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=1", ""}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src"}, nil, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=1"}, "sm_90", 13000),
		cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA=1"}, "sm_90a", 12080),
		cacheKey(Program{Name: "ks", Src: "rc"}, []string{"-DA=1"}, "sm_90a", 13000), // field boundaries count
		cacheKey(Program{Name: "k", Src: "src"}, []string{"-DA", "=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src", Headers: []Header{{"h.cuh", ""}}}, []string{"-DA=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src", Headers: []Header{{"h.cuh", "a"}}}, []string{"-DA=1"}, "sm_90a", 13000),
		cacheKey(Program{Name: "k", Src: "src", Headers: []Header{{"g.cuh", "a"}}}, []string{"-DA=1"}, "sm_90a", 13000),
	} {
		if k == base {
			t.Errorf("variant %d has the same key", i)
		}
	}
}

// The kernel cache's key names the CUDA headers by their contents, not by
// where they are, so that a module compiled on another machine (infer
// kernels) is found; NVRTC itself is told where they are.
func TestCompileOptionsKey(t *testing.T) {
	dirs := [2]string{}
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), "include")
		if err := os.MkdirAll(dirs[i], 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dirs[i], "cuda_bf16.h"), []byte("// bf16"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A library name no test loads: where another test of the package has
	// loaded libnvrtc.so.13, its directory's headers would come before
	// CUDA_HOME's (includeDirFor), and both calls would find those.
	const lib = "libnvrtc-not-loaded.so"
	t.Setenv("CUDA_HOME", filepath.Dir(dirs[0]))
	opts0, key0 := compileOptions("sm_90a", lib)
	t.Setenv("CUDA_HOME", filepath.Dir(dirs[1]))
	opts1, key1 := compileOptions("sm_90a", lib)
	if !slices.Contains(opts0, "--include-path="+dirs[0]) || !slices.Contains(opts1, "--include-path="+dirs[1]) {
		t.Fatalf("options %q, %q name no headers' directory", opts0, opts1)
	}
	if !slices.Equal(key0, key1) {
		t.Errorf("the same headers in two places key apart: %q, %q", key0, key1)
	}
	if err := os.WriteFile(filepath.Join(dirs[1], "cuda_bf16.h"), []byte("// bf16, another version"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, key2 := compileOptions("sm_90a", lib); slices.Equal(key1, key2) {
		t.Errorf("other headers key alike: %q", key2)
	}
}

func TestCacheDir(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	user := func() (string, error) { return "/home/u/.cache", nil }
	if got := cacheDirFrom(getenv, user); got != "/home/u/.cache/fuselm/kernels" {
		t.Errorf("default cache dir %q", got)
	}
	env["FUSELM_KERNEL_CACHE"] = "/tmp/k"
	if got := cacheDirFrom(getenv, user); got != "/tmp/k" {
		t.Errorf("override %q", got)
	}
	env["FUSELM_KERNEL_CACHE"] = "off"
	if got := cacheDirFrom(getenv, user); got != "" {
		t.Errorf("off gives %q", got)
	}
	delete(env, "FUSELM_KERNEL_CACHE")
	if got := cacheDirFrom(getenv, func() (string, error) { return "", errors.New("no home") }); got != filepath.Join(os.TempDir(), "fuselm", "kernels") {
		t.Errorf("no user cache dir: %q", got)
	}
	if got := cachePath("/d", "abc", true); got != "/d/abc.cubin" {
		t.Error(got)
	}
	if got := cachePath("/d", "abc", false); got != "/d/abc.ptx" {
		t.Error(got)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	p := filepath.Join(dir, "k.cubin")
	for _, data := range []string{"first", "second, longer"} {
		if err := writeFileAtomic(p, []byte(data)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != data {
			t.Fatalf("read back %q, %v; want %q", got, err, data)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

func TestIncludeDirFor(t *testing.T) {
	files := map[string]bool{
		"/usr/local/cuda/targets/x86_64-linux/include/cuda_bf16.h":    true,
		"/venv/site-packages/nvidia/cu13/include/cuda_bf16.h":         true,
		"/venv/site-packages/nvidia/cuda_runtime/include/cuda_bf16.h": true,
		"/usr/local/cuda/include/cuda_bf16.h":                         true,
	}
	isFile := func(p string) bool { return files[p] }
	getenv := func(string) string { return "" }
	for lib, want := range map[string]string{
		"/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13":  "/usr/local/cuda/targets/x86_64-linux/include",
		"/venv/site-packages/nvidia/cu13/lib/libnvrtc.so.13":       "/venv/site-packages/nvidia/cu13/include",
		"/venv/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12": "/venv/site-packages/nvidia/cuda_runtime/include",
		"/somewhere/lib/libnvrtc.so.12":                            "/usr/local/cuda/include",
	} {
		if got := includeDirFor(lib, getenv, isFile); got != want {
			t.Errorf("includeDirFor(%s) = %q, want %q", lib, got, want)
		}
	}
}

func TestArgBits(t *testing.T) {
	d := &Device{}
	for _, c := range []struct {
		v    any
		want uint64
	}{
		{uintptr(0xdeadbeef00), 0xdeadbeef00},
		{int32(-1), 0xffffffff},
		{uint32(7), 7},
		{int64(-2), 0xfffffffffffffffe},
		{float32(1), uint64(math.Float32bits(1))},
		{float64(1), math.Float64bits(1)},
		{-3, 0xfffffffd},
		{true, 1},
	} {
		got, ok := d.argBits(c.v)
		if !ok || got != c.want {
			t.Errorf("argBits(%T %v) = %#x, %v; want %#x", c.v, c.v, got, ok, c.want)
		}
	}
	for _, v := range []any{1 << 40, "s", int16(1)} {
		if _, ok := d.argBits(v); ok {
			t.Errorf("argBits(%T %v) accepted", v, v)
		}
	}
}

func TestProbeAndDescribe(t *testing.T) {
	// On a machine with a GPU this only checks that nothing panics.
	err := Probe()
	if Available() != (err == nil) {
		t.Error("Available disagrees with Probe")
	}
	if err != nil && !strings.Contains(err.Error(), "cuda:") {
		t.Errorf("Probe error lacks its prefix: %v", err)
	}
	t.Logf("Probe: %v", err)
	t.Logf("Describe:\n%s", Describe())
	if err != nil {
		if _, oerr := Open(0); oerr == nil {
			t.Error("Open succeeded where Probe failed")
		}
	}
}

func TestDTypeTable(t *testing.T) {
	for _, c := range []struct {
		src, dst kernels.DType
		ok       bool
	}{
		{kernels.F32, kernels.BF16, true}, {kernels.BF16, kernels.BF16, true}, {kernels.F16, kernels.BF16, true},
		{kernels.F32, kernels.F32, true}, {kernels.BF16, kernels.F32, true}, {kernels.F16, kernels.F32, true},
		{kernels.I32, kernels.I32, true}, {kernels.F16, kernels.F16, true}, {kernels.F32, kernels.F16, true},
		{kernels.BF16, kernels.F16, true},
		{kernels.F32, kernels.I32, false}, {kernels.I32, kernels.F32, false}, {kernels.I32, kernels.F16, false},
	} {
		if got := convertible(c.src, c.dst); got != c.ok {
			t.Errorf("convertible(%v, %v) = %v", c.src, c.dst, got)
		}
	}
}

// The watchdog's wait returns the stream's answer once it is ready (or
// failed), and gives up past its bound on work that never finishes.
func TestPollUntil(t *testing.T) {
	calls := 0
	code, hung := pollUntil(func() uint32 {
		if calls++; calls < 5 {
			return cudaErrorNotReady
		}
		return 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	}, time.Second)
	if code != 700 || hung || calls != 5 {
		t.Errorf("failing work: code %d, hung %v after %d queries", code, hung, calls)
	}
	start := time.Now()
	_, hung = pollUntil(func() uint32 { return cudaErrorNotReady }, 20*time.Millisecond)
	if took := time.Since(start); !hung || took < 20*time.Millisecond || took > 5*time.Second {
		t.Errorf("endless work: hung %v after %v", hung, took)
	}
	if err := (&Hung{Limit: 3 * time.Second}).Error(); !strings.Contains(err, "did not finish within 3s") {
		t.Errorf("Hung says %q", err)
	}
}
