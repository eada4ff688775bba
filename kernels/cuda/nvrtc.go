package cuda

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"unsafe"

	"github.com/fuselm/fuselm/outfile"
)

// nvrtcAPI is libnvrtc's entry points.
type nvrtcAPI struct {
	lib          *library
	major, minor int
	archs        []int // nvrtcGetSupportedArchs: 75, 80, ... (nil when unknown)

	nvrtcVersion, nvrtcGetErrorString, nvrtcCreateProgram, nvrtcDestroyProgram uintptr
	nvrtcCompileProgram, nvrtcGetProgramLogSize, nvrtcGetProgramLog            uintptr
	nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcGetPTXSize, nvrtcGetPTX             uintptr
	nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs                          uintptr
}

var (
	nvrtcOnce sync.Once
	nvrtc     *nvrtcAPI
	nvrtcErr  error
)

// majorsFor is the order of CUDA major versions to try for the toolkit
// libraries: the driver's own first, as a newer toolkit's output may not
// load on an older driver.
func majorsFor(driverVersion int) []int {
	if driverVersion >= 13000 {
		return []int{13, 12}
	}
	return []int{12, 13}
}

// loadNVRTC opens libnvrtc once per process. A library opened by full path
// has its libnvrtc-builtins from the same directory loaded first, since
// NVRTC opens that by soname.
func loadNVRTC(driverVersion int) (*nvrtcAPI, error) {
	nvrtcOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				nvrtc, nvrtcErr = nil, fmt.Errorf("cuda: loading NVRTC: %v", r)
			}
		}()
		f := osFinder()
		var sonames []string
		for _, m := range majorsFor(driverVersion) {
			sonames = append(sonames, fmt.Sprintf("libnvrtc.so.%d", m))
		}
		preload := func(dir, soname string) {
			major := soname[len("libnvrtc.so."):]
			m, _ := f.glob(filepath.Join(dir, "libnvrtc-builtins.so."+major+"*"))
			sort.Slice(m, func(i, j int) bool { return len(m[i]) < len(m[j]) })
			for _, p := range m {
				if _, err := f.open(p); err == nil {
					return
				}
			}
		}
		lib, err := f.find("libnvrtc", sonames, preload)
		if err != nil {
			nvrtcErr = err
			return
		}
		nvrtc, nvrtcErr = openNVRTC(lib)
	})
	return nvrtc, nvrtcErr
}

// openNVRTC resolves NVRTC's entry points in lib and reads its version and
// supported architectures.
func openNVRTC(lib *library) (*nvrtcAPI, error) {
	n := &nvrtcAPI{lib: lib}
	err := lib.resolve([]symbol{
		sym(&n.nvrtcVersion, "nvrtcVersion"),
		sym(&n.nvrtcGetErrorString, "nvrtcGetErrorString"),
		sym(&n.nvrtcCreateProgram, "nvrtcCreateProgram"),
		sym(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"),
		sym(&n.nvrtcCompileProgram, "nvrtcCompileProgram"),
		sym(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
		sym(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"),
		sym(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
		sym(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"),
		sym(&n.nvrtcGetPTXSize, "nvrtcGetPTXSize"),
		sym(&n.nvrtcGetPTX, "nvrtcGetPTX"),
		optSym(&n.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs"),
		optSym(&n.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs"),
	})
	if err != nil {
		return nil, err
	}
	var major, minor int32
	if err := n.check(ccall(n.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor))), "nvrtcVersion", ""); err != nil {
		return nil, err
	}
	n.major, n.minor = int(major), int(minor)
	if n.nvrtcGetNumSupportedArchs != 0 && n.nvrtcGetSupportedArchs != 0 {
		var cnt int32
		if ccall(n.nvrtcGetNumSupportedArchs, uintptr(unsafe.Pointer(&cnt))) == 0 && cnt > 0 && cnt < 1024 {
			a := make([]int32, cnt)
			if uint32(ccall(n.nvrtcGetSupportedArchs, uintptr(unsafe.Pointer(&a[0])))) == 0 {
				for _, v := range a {
					n.archs = append(n.archs, int(v))
				}
			}
		}
	}
	return n, nil
}

// version is NVRTC's version as 1000*major + 10*minor.
func (n *nvrtcAPI) version() int { return n.major*1000 + n.minor*10 }

func (n *nvrtcAPI) check(r uintptr, call, log string) error {
	code := uint32(r)
	if code == 0 {
		return nil
	}
	name := cString(ccall(n.nvrtcGetErrorString, uintptr(code)))
	if name == "" {
		name = fmt.Sprintf("NVRTC_ERROR_%d", code)
	}
	return &Error{Call: call, Code: int(code), Name: name, Log: log}
}

// chooseArch picks NVRTC's target for a device of compute capability
// major.minor: the exact SASS (sm_XY, with the "a" suffix on 9.0 and 10.0,
// whose architecture-specific instructions need it) when NVRTC supports the
// device, else PTX for the newest architecture it supports below it, which
// the driver compiles at load. supported is NVRTC's list (nil: unknown,
// assume the device is supported).
func chooseArch(major, minor, nvrtcMajor int, supported []int) (arch string, cubin bool) {
	cc := major*10 + minor
	has := supported == nil
	best := 0
	for _, s := range supported {
		if s == cc {
			has = true
		}
		if s <= cc && s > best {
			best = s
		}
	}
	if has || best == 0 {
		suffix := ""
		if (cc == 90 && nvrtcMajor >= 12) || (cc == 100 && (nvrtcMajor >= 13 || supported != nil)) {
			suffix = "a"
		}
		return fmt.Sprintf("sm_%d%s", cc, suffix), true
	}
	return fmt.Sprintf("compute_%d", best), false
}

// includeDirFor finds a directory holding cuda_bf16.h for NVRTC: the
// toolkit's include directory beside the loaded libnvrtc (lib64/../include,
// targets/<arch>/lib/../include, a wheel's nvidia/cu13/lib/../include), the
// CUDA runtime wheel of CUDA 12, then CUDA_HOME, CUDA_PATH, /usr/local/cuda.
func includeDirFor(libPath string, getenv func(string) string, isFile func(string) bool) string {
	var cands []string
	if filepath.IsAbs(libPath) {
		dir := filepath.Dir(libPath)
		cands = append(cands, filepath.Join(dir, "..", "include"),
			filepath.Join(dir, "..", "..", "cuda_runtime", "include"))
	} else {
		p := loadedPath(libPath)
		if filepath.IsAbs(p) {
			cands = append(cands, filepath.Join(filepath.Dir(p), "..", "include"))
		}
	}
	for _, root := range []string{getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"} {
		if root != "" {
			cands = append(cands, filepath.Join(root, "include"))
		}
	}
	for _, c := range cands {
		if isFile(filepath.Join(c, "cuda_bf16.h")) {
			return filepath.Clean(c)
		}
	}
	return ""
}

// cacheFormat changes when what the disk cache stores, or how it is keyed,
// changes.
const cacheFormat = "fuselm-kernel-cache-v2"

// includeOption is the NVRTC option that names the CUDA headers' directory.
const includeOption = "--include-path="

// cacheKey names a compiled module: sha256 of the program (its name, its
// source, and every header's name and source), every option given to NVRTC
// (the CUDA headers' include path as compileOptions's key names it), the
// target architecture and NVRTC's version.
func cacheKey(p Program, opts []string, arch string, nvrtcVersion int) string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(cacheFormat)
	field(p.Name)
	field(p.Src)
	field(fmt.Sprint(len(p.Headers)))
	for _, hd := range p.Headers {
		field(hd.Name)
		field(hd.Src)
	}
	field(fmt.Sprint(len(opts)))
	for _, o := range opts {
		field(o)
	}
	field(arch)
	field(fmt.Sprint(nvrtcVersion))
	return hex.EncodeToString(h.Sum(nil))
}

// cacheDirFrom is where compiled kernels are kept: FUSELM_KERNEL_CACHE
// ("off" for nowhere), else fuselm/kernels in the user's cache directory
// (falling back to the temporary directory).
func cacheDirFrom(getenv func(string) string, userCacheDir func() (string, error)) string {
	if v := getenv("FUSELM_KERNEL_CACHE"); v != "" {
		if v == "off" {
			return ""
		}
		return v
	}
	base, err := userCacheDir()
	if err != nil || base == "" {
		base = os.TempDir()
	}
	return filepath.Join(base, "fuselm", "kernels")
}

// cachePath is the file of key in dir; cubins and PTX differ in extension.
func cachePath(dir, key string, cubin bool) string {
	ext := ".ptx"
	if cubin {
		ext = ".cubin"
	}
	return filepath.Join(dir, key+ext)
}

// writeFileAtomic writes a kernel cache file: its directory made, then
// outfile's way (a whole file or none, never replacing what is not a
// regular file of ours).
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return outfile.Write(path, data)
}

// Program is what NVRTC compiles: a main source file and the headers its
// #include "..." lines may name, each given to NVRTC by name so that
// neither is read from disk (<...> includes are looked for on the include
// path, as cuda_bf16.h is).
type Program struct {
	Name    string   // the main file's name, for NVRTC's messages
	Src     string   // its source
	Headers []Header // what its #includes may name
}

// Header is a file a Program's sources may #include.
type Header struct{ Name, Src string }

// compile runs NVRTC on p with opts and returns the cubin (or PTX when
// cubin is false). A failed compile's error carries NVRTC's log.
func (n *nvrtcAPI) compile(p Program, opts []string, cubin bool) ([]byte, error) {
	img, _, err := n.compileLog(p, opts, cubin)
	return img, err
}

// compileLog is compile that also returns NVRTC's log when the compile
// succeeds (warnings, and ptxas's report when opts ask for it).
func (n *nvrtcAPI) compileLog(p Program, opts []string, cubin bool) (img []byte, log string, err error) {
	name := p.Name
	csrc, cname := cStr(p.Src), cStr(name)
	hsrc := make([][]byte, len(p.Headers))
	hname := make([][]byte, len(p.Headers))
	hsrcPtrs := make([]unsafe.Pointer, len(p.Headers)+1) // +1: never empty
	hnamePtrs := make([]unsafe.Pointer, len(p.Headers)+1)
	for i, hd := range p.Headers {
		hsrc[i], hname[i] = cStr(hd.Src), cStr(hd.Name)
		hsrcPtrs[i], hnamePtrs[i] = unsafe.Pointer(&hsrc[i][0]), unsafe.Pointer(&hname[i][0])
	}
	var prog uintptr
	created := ccall(n.nvrtcCreateProgram, uintptr(unsafe.Pointer(&prog)),
		uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), uintptr(len(p.Headers)),
		uintptr(unsafe.Pointer(&hsrcPtrs[0])), uintptr(unsafe.Pointer(&hnamePtrs[0])))
	runtime.KeepAlive(hsrc)
	runtime.KeepAlive(hname)
	runtime.KeepAlive(hsrcPtrs)
	runtime.KeepAlive(hnamePtrs)
	if err := n.check(created, fmt.Sprintf("nvrtcCreateProgram(%s)", name), ""); err != nil {
		return nil, "", err
	}
	defer func() { ccall(n.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog))) }()

	copts := make([][]byte, len(opts))
	ptrs := make([]unsafe.Pointer, len(opts)+1) // +1: never empty
	for i, o := range opts {
		copts[i] = cStr(o)
		ptrs[i] = unsafe.Pointer(&copts[i][0])
	}
	r := ccall(n.nvrtcCompileProgram, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&ptrs[0])))
	runtime.KeepAlive(copts)
	runtime.KeepAlive(ptrs)
	log = n.log(prog)
	if uint32(r) != 0 {
		return nil, log, n.check(r, fmt.Sprintf("nvrtcCompileProgram(%s, %v)", name, opts), log)
	}
	sizeFn, getFn, what := n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "CUBIN"
	if !cubin {
		sizeFn, getFn, what = n.nvrtcGetPTXSize, n.nvrtcGetPTX, "PTX"
	}
	var size uint64
	if err := n.check(ccall(sizeFn, prog, uintptr(unsafe.Pointer(&size))), "nvrtcGet"+what+"Size("+name+")", ""); err != nil {
		return nil, log, err
	}
	if size == 0 {
		return nil, log, fmt.Errorf("cuda: nvrtcGet%sSize(%s): empty output (is --gpu-architecture a real sm_XY?)", what, name)
	}
	img = make([]byte, size)
	if err := n.check(ccall(getFn, prog, uintptr(unsafe.Pointer(&img[0]))), "nvrtcGet"+what+"("+name+")", ""); err != nil {
		return nil, log, err
	}
	return img, log, nil
}

// log returns the program's compile log.
func (n *nvrtcAPI) log(prog uintptr) string {
	var size uint64
	if ccall(n.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&size))) != 0 || size <= 1 || size > 64<<20 {
		return ""
	}
	b := make([]byte, size)
	if ccall(n.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&b[0]))) != 0 {
		return ""
	}
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}
