package cuda

import (
	"fmt"
	"os"
	"path/filepath"
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
	return &Compiler{n: n, arch: arch, opts: compileOptions(arch, path)}, nil
}

// compileOptions are the NVRTC options every module gets for arch, with
// the include path of the CUDA headers found for the NVRTC at libPath.
func compileOptions(arch, libPath string) []string {
	opts := []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	if inc := includeDirFor(libPath, os.Getenv, osFinder().isFile); inc != "" {
		opts = append(opts, includeOption+inc)
	}
	return opts
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
// (Options, then opts; a cubin) into the kernel cache dir, under the name
// such a device's ProgramModule looks for, so that a run there loads it
// instead of compiling it; a module the cache holds already is left as it
// is (compiled false).
func (c *Compiler) CacheModule(dir string, p Program, opts ...string) (compiled bool, err error) {
	all := append(c.Options(), opts...)
	path := cachePath(dir, cacheKey(p, all, c.arch, c.Version()), true)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		return false, nil
	}
	img, err := c.n.compile(p, all, true)
	if err != nil {
		return false, err
	}
	if err := writeFileAtomic(path, img); err != nil {
		return false, fmt.Errorf("cuda: kernel cache: %w", err)
	}
	return true, nil
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
