package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Compiler is NVRTC without a device: it compiles programs for a named
// architecture with the options a device of it gets, so that kernels can
// be checked where there is no GPU.
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
	if suffix, ok := strings.CutPrefix(base, "libnvrtc"); ok {
		m, _ := f.glob(filepath.Join(dir, "libnvrtc-builtins"+suffix+"*"))
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
	opts := []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	if inc := includeDirFor(path, os.Getenv, osFinder().isFile); inc != "" {
		opts = append(opts, "--include-path="+inc)
	}
	return &Compiler{n: n, opts: opts}, nil
}

// Version is NVRTC's version as 1000*major + 10*minor.
func (c *Compiler) Version() int { return c.n.version() }

// Options are the options every compile gets before its own.
func (c *Compiler) Options() []string { return append([]string(nil), c.opts...) }

// Compile compiles src, named name, with Options, then opts, to a cubin,
// and returns it with NVRTC's log.
func (c *Compiler) Compile(name, src string, opts ...string) (img []byte, log string, err error) {
	return c.n.compileLog(name, src, append(c.Options(), opts...), true)
}
