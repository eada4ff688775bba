package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// library is one shared library opened with dlopen.
type library struct {
	name   string // what messages call it: "libcuda", "libnvrtc", "libcublas"
	path   string // the file opened, or the bare soname the system loader resolved
	handle uintptr
}

// symbol names a function to resolve: the first of names the library
// exports is stored in *ptr and its name in *used (when not nil).
type symbol struct {
	ptr      *uintptr
	names    []string
	optional bool
	used     *string
}

func sym(ptr *uintptr, names ...string) symbol { return symbol{ptr: ptr, names: names} }

func optSym(ptr *uintptr, names ...string) symbol {
	return symbol{ptr: ptr, names: names, optional: true}
}

// resolve looks every symbol up and fails naming all the required ones that
// are missing.
func (l *library) resolve(syms []symbol) error {
	var missing []string
	for _, s := range syms {
		*s.ptr = 0
		for _, n := range s.names {
			if p, err := purego.Dlsym(l.handle, n); err == nil && p != 0 {
				*s.ptr = p
				if s.used != nil {
					*s.used = n
				}
				break
			}
		}
		if *s.ptr == 0 && !s.optional {
			missing = append(missing, strings.Join(s.names, " or "))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cuda: %s (%s) lacks %s", l.name, l.path, strings.Join(missing, ", "))
	}
	return nil
}

// ccall calls the C function fn with integer and pointer arguments and
// returns its integer result. Every CUDA, NVRTC and cuBLAS entry point this
// package uses takes only such arguments (floats go by pointer), which is
// what purego.SyscallN passes correctly.
//
// go:uintptrescapes makes Go memory whose address is converted to uintptr in
// a call's argument list live on the heap, where it neither moves nor is
// freed until the call returns (unsafe.Pointer rule 4), as in
// ccall(f, uintptr(unsafe.Pointer(&out))).
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// ptrOf turns an address owned by C (pinned host memory, a static string)
// into a pointer.
func ptrOf(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// cString copies the NUL-terminated C string at p.
func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(ptrOf(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(ptrOf(p)), n))
}

// cStr returns s as a NUL-terminated byte slice for C.
func cStr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// finder searches for CUDA's shared libraries. Its fields are the outside
// world, replaced in tests.
type finder struct {
	getenv func(string) string
	glob   func(string) ([]string, error)
	isFile func(string) bool
	open   func(string) (uintptr, error)
	home   string
	goarch string
	// extraDirs are searched after the CUDA directories (CUPTI's
	// extras/CUPTI/lib64); wheelSubdirs replace wheelLibDirs when set.
	extraDirs    []string
	wheelSubdirs []string
}

func osFinder() finder {
	home, _ := os.UserHomeDir()
	return finder{
		getenv: os.Getenv,
		glob:   filepath.Glob,
		isFile: func(p string) bool {
			st, err := os.Stat(p)
			return err == nil && !st.IsDir()
		},
		open: func(p string) (uintptr, error) {
			return purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		},
		home:   home,
		goarch: runtime.GOARCH,
	}
}

// cudaDirs are the directories searched before the system loader:
// LD_LIBRARY_PATH, then CUDA_HOME and CUDA_PATH, then /usr/local/cuda, each
// install as lib64 and targets/<arch>-linux/lib.
func (f finder) cudaDirs() []string {
	var dirs []string
	for _, d := range strings.Split(f.getenv("LD_LIBRARY_PATH"), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	target := "x86_64-linux"
	if f.goarch == "arm64" {
		target = "sbsa-linux"
	}
	for _, root := range f.cudaRoots() {
		dirs = append(dirs, filepath.Join(root, "lib64"), filepath.Join(root, "targets", target, "lib"))
	}
	return dedup(dirs)
}

// cudaRoots are the CUDA installs searched: CUDA_HOME, CUDA_PATH, then
// /usr/local/cuda.
func (f finder) cudaRoots() []string {
	var roots []string
	for _, root := range []string{f.getenv("CUDA_HOME"), f.getenv("CUDA_PATH"), "/usr/local/cuda"} {
		if root != "" {
			roots = append(roots, root)
		}
	}
	return roots
}

// sitePackages are the Python package directories where NVIDIA's wheels
// may be installed.
func (f finder) sitePackages() []string {
	var pats []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if v := f.getenv(env); v != "" {
			pats = append(pats, filepath.Join(v, "lib", "python3*", "site-packages"))
		}
	}
	if f.home != "" {
		pats = append(pats, filepath.Join(f.home, ".local", "lib", "python3*", "site-packages"))
	}
	pats = append(pats,
		"/usr/local/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages",
		"/usr/lib/python3*/dist-packages",
		"/usr/lib/python3*/site-packages",
		"/opt/*/.venv/lib/python3*/site-packages",
		"/opt/*/venv/lib/python3*/site-packages",
		"/opt/*/lib/python3*/site-packages",
		"/opt/conda/envs/*/lib/python3*/site-packages",
	)
	var dirs []string
	for _, p := range pats {
		m, _ := f.glob(p)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // python3.12 before python3.10
		dirs = append(dirs, m...)
	}
	return dedup(dirs)
}

// wheelLibDirs are the library folders of NVIDIA's wheels: CUDA 13 puts
// every library in nvidia/cu13/lib, CUDA 12 one folder per package.
var wheelLibDirs = []string{"nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"}

// wheelDirs are the wheel library folders that exist.
func (f finder) wheelDirs() []string {
	subdirs := wheelLibDirs
	if f.wheelSubdirs != nil {
		subdirs = f.wheelSubdirs
	}
	var dirs []string
	for _, sp := range f.sitePackages() {
		for _, w := range subdirs {
			dirs = append(dirs, filepath.Join(sp, w))
		}
	}
	return dedup(dirs)
}

// libraryRoles say what a missing library means to someone running a
// model, for the first words of find's error.
var libraryRoles = map[string]string{
	"libcuda":   "no CUDA driver found",
	"libnvrtc":  "CUDA's run-time compiler (NVRTC) not found",
	"libcublas": "cuBLAS not found",
	"libcupti":  "CUPTI (CUDA's profiling library) not found",
}

// placesShown is how many of the places searched find's error names.
const placesShown = 3

// find opens the first of sonames it can, in this order for each soname in
// turn: the CUDA directories, the system loader (the bare soname), the
// Python wheels. preload, when set, is called with the directory and soname
// before a file is opened by full path (to load what the library opens by
// soname itself: cuBLAS's libcublasLt, NVRTC's builtins). The error says
// first what is missing, then, short, where it looked and what failed.
func (f finder) find(name string, sonames []string, preload func(dir, soname string)) (*library, error) {
	cuda, wheels := dedup(append(f.cudaDirs(), f.extraDirs...)), f.wheelDirs()
	var failed []string // files found that did not load
	tryFile := func(dir, so string) *library {
		p := filepath.Join(dir, so)
		if !f.isFile(p) {
			return nil
		}
		if preload != nil {
			preload(dir, so)
		}
		h, err := f.open(p)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s does not load (%v)", p, err))
			return nil
		}
		return &library{name: name, path: p, handle: h}
	}
	for _, so := range sonames {
		for _, d := range cuda {
			if l := tryFile(d, so); l != nil {
				return l, nil
			}
		}
		if h, err := f.open(so); err == nil {
			return &library{name: name, path: so, handle: h}, nil
		} else if !strings.HasPrefix(err.Error(), so+": cannot open shared object file") {
			// Found, but it or a library it needs did not load.
			failed = append(failed, fmt.Sprintf("the system loader's %s does not load (%v)", so, err))
		}
		for _, d := range wheels {
			if l := tryFile(d, so); l != nil {
				return l, nil
			}
		}
	}
	role := libraryRoles[name]
	if role == "" {
		role = name + " not found"
	}
	places := append(append(append([]string(nil), cuda...), "the system loader's path"), wheels...)
	msg := fmt.Sprintf("cuda: %s: %s is in none of %d places searched (%s)",
		role, strings.Join(sonames, " or "), len(places), shortList(places, placesShown))
	if len(failed) > 0 {
		msg += "; " + shortList(failed, 1)
	}
	return nil, fmt.Errorf("%s; set LD_LIBRARY_PATH or CUDA_HOME to the directory that holds it", msg)
}

// shortList joins the first n items and counts the rest.
func shortList(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}

func dedup(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		s = filepath.Clean(s)
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// loadedPath finds the file a library loaded by bare soname came from, in
// /proc/self/maps; it returns soname when it cannot tell.
func loadedPath(soname string) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return soname
	}
	stem := soname
	if i := strings.Index(stem, ".so"); i >= 0 {
		stem = stem[:i+3]
	}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.Index(line, "/")
		if i < 0 {
			continue
		}
		p := line[i:]
		if strings.HasPrefix(filepath.Base(p), stem) {
			return p
		}
	}
	return soname
}
