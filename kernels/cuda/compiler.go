package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Compiler is NVRTC without a device: it compiles programs for a named
// architecture with the options a device of it gets (CompileOptions), so
// that a set's modules can be checked where there is no GPU.
type Compiler struct {
	n    *nvrtcAPI
	opts []string
}

// NewCompiler opens the NVRTC library at path (after the libnvrtc-builtins
// beside it, which NVRTC opens by soname) to compile for arch, a real
// architecture such as sm_90a.
func NewCompiler(path, arch string) (*Compiler, error) {
	f := osFinder()
	dir, base := filepath.Split(path)
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
	return &Compiler{n: n, opts: compileOptions(arch, path)}, nil
}

// compileOptions are the NVRTC options every module gets for arch, with
// the include path of the CUDA headers found for the NVRTC at libPath.
func compileOptions(arch, libPath string) []string {
	opts := []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	if inc := includeDirFor(libPath, os.Getenv, osFinder().isFile); inc != "" {
		opts = append(opts, "--include-path="+inc)
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
