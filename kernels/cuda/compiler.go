package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Compiler is NVRTC without a device: it compiles programs for a named
// architecture with the options a device of it gets (CompileOptions), so
// that a set's modules can be checked where there is no GPU.
type Compiler struct {
	n    *nvrtcAPI
	arch string
	opts []string
	key  []string // opts as the kernel cache's key names them (compileOptions)
}

// NewCompiler opens the NVRTC library at path (after the libnvrtc-builtins
// beside it, which NVRTC opens by soname) to compile for arch, a real
// architecture such as sm_90a.
func NewCompiler(path, arch string) (*Compiler, error) {
	f := osFinder()
	dir, base := filepath.Split(path)
	if !strings.HasPrefix(base, "libnvrtc") {
		return nil, fmt.Errorf("cuda: %s is not NVRTC's library (libnvrtc.so.*)", path)
	}
	if m, _ := f.glob(filepath.Join(dir, "libnvrtc-builtins"+base[len("libnvrtc"):]+"*")); len(m) > 0 {
		sort.Slice(m, func(i, j int) bool { return len(m[i]) < len(m[j]) })
		for _, p := range m {
			if _, err := f.open(p); err == nil {
				break
			}
		}
	}
	h, err := f.open(path)
	if err != nil {
		return nil, fmt.Errorf("cuda: libnvrtc %s does not load (%v)", path, err)
	}
	n, err := openNVRTC(&library{name: "libnvrtc", path: path, handle: h})
	if err != nil {
		return nil, err
	}
	opts, key := compileOptions(arch, path)
	return &Compiler{n: n, arch: arch, opts: opts, key: key}, nil
}

// compileOptions are the NVRTC options every module gets for arch, with
// the include path of the CUDA headers found for the NVRTC at libPath; and
// the same as the kernel cache's key names them (key), the headers by their
// contents (headersDigest) rather than where they are, so that a module
// compiled on one machine (infer kernels, without a GPU) is found on
// another whose headers lie elsewhere.
func compileOptions(arch, libPath string) (opts, key []string) {
	opts = []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	key = slices.Clone(opts)
	if inc := includeDirFor(libPath, os.Getenv, osFinder().isFile); inc != "" {
		opts = append(opts, includeOption+inc)
		key = append(key, "cuda headers "+headersDigest(inc))
	}
	return opts, key
}

// cudaHeaders are the CUDA headers the sets' sources include, directly or
// through each other: what a module compiled against them depends on.
var cudaHeaders = []string{"cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp16.h", "cuda_fp16.hpp"}

// headersDigest is sha256 of the names and contents of the cudaHeaders in
// dir (those that are there).
func headersDigest(dir string) string {
	h := sha256.New()
	for _, name := range cudaHeaders {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Version is NVRTC's version as 1000*major + 10*minor.
func (c *Compiler) Version() int { return c.n.version() }

// Options are the options every compile gets before its own.
func (c *Compiler) Options() []string { return append([]string(nil), c.opts...) }

// Compile compiles p with Options, then opts, to a cubin, and returns it
// with NVRTC's log (with "--ptxas-options=-v", ptxas's registers and
// spills per kernel).
func (c *Compiler) Compile(p Program, opts ...string) (img []byte, log string, err error) {
	return c.n.compileLog(p, append(c.Options(), opts...), true)
}

// CacheModule compiles p as a device of the compiler's architecture would
// (Options, then opts; a cubin) into the kernel cache dir, as the file
// (path) such a device's ProgramModule looks for, so that a run there loads
// it instead of compiling it; a module the cache holds already is left as
// it is (compiled false).
func (c *Compiler) CacheModule(dir string, p Program, opts ...string) (path string, compiled bool, err error) {
	all := append(c.Options(), opts...)
	path = cachePath(dir, cacheKey(p, append(slices.Clone(c.key), opts...), c.arch, c.Version()), true)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		return path, false, nil
	}
	img, err := c.n.compile(p, all, true)
	if err != nil {
		return path, false, err
	}
	if err := writeFileAtomic(path, img); err != nil {
		return path, false, fmt.Errorf("cuda: kernel cache: %w", err)
	}
	return path, true, nil
}

// IsCacheFile reports whether name is a kernel cache file's name (a
// module's cubin or PTX under its key).
func IsCacheFile(name string) bool {
	key, ext, _ := strings.Cut(name, ".")
	return (ext == "cubin" || ext == "ptx") && len(key) == sha256.Size*2 && strings.Trim(key, "0123456789abcdef") == ""
}

// CacheDir is where devices keep compiled kernels (FUSELM_KERNEL_CACHE, or
// fuselm/kernels in the user's cache directory); "" when it is off.
func CacheDir() string { return cacheDirFrom(os.Getenv, os.UserCacheDir) }

// FindNVRTC is the NVRTC library a device would open (CUDA's directories,
// the system loader, then Python wheels; NVRTC 13 before 12), for a
// Compiler where there is no GPU.
func FindNVRTC() (string, error) {
	lib, err := osFinder().find("libnvrtc", []string{"libnvrtc.so.13", "libnvrtc.so.12"}, nil)
	if err != nil {
		return "", err
	}
	return lib.path, nil
}

// DeviceArch is the target a device of compute capability major.minor
// compiles its modules for with this NVRTC (a real sm_XY[a] when cubin),
// as the device chooses it: what a cache for that device must be built for.
func (c *Compiler) DeviceArch(major, minor int) (arch string, cubin bool) {
	return chooseArch(major, minor, c.n.major, c.n.archs)
}

// Archs are the compute capabilities (10·major + minor) NVRTC compiles for,
// nil where it does not say.
func (c *Compiler) Archs() []int { return slices.Clone(c.n.archs) }
