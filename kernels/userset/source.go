package userset

import (
	"bytes"
	"debug/elf"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels/cuda"
)

//go:embed fuselm.cuh
var header string

// HeaderName is the public header a user's .cu file includes.
const HeaderName = "fuselm.cuh"

// Header is fuselm.cuh's text, for a user who compiles elsewhere.
func Header() string { return header }

// headerExts are the files beside a user's .cu file that go to NVRTC with
// it as headers (and so into the kernel cache's key: an edited header
// recompiles).
var headerExts = []string{".cuh", ".h", ".hpp"}

// maxSourceBytes bounds a user's source or header file.
const maxSourceBytes = 16 << 20

// program is what NVRTC compiles for k's .cu file, src: the file under its
// path (so that NVRTC's messages name it), with fuselm.cuh and every header
// beside it (headerExts) by name, for the #includes that name them.
func program(k kernel, src string) (cuda.Program, error) {
	p := cuda.Program{Name: k.path, Src: src, Headers: []cuda.Header{{Name: HeaderName, Src: header}}}
	dir := filepath.Dir(k.path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return p, fmt.Errorf("%s: %w", k.op, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || name == HeaderName || !slices.Contains(headerExts, filepath.Ext(name)) {
			continue
		}
		b, err := infile.Read(filepath.Join(dir, name), maxSourceBytes)
		if err != nil {
			return p, fmt.Errorf("%s: header %w", k.op, err)
		}
		p.Headers = append(p.Headers, cuda.Header{Name: name, Src: string(b)})
	}
	return p, nil
}

// compileOptions are the NVRTC options of k's .cu file: its own directory
// on the include path (headers in folders below it), then the manifest's.
func compileOptions(k kernel) []string {
	return append([]string{"--include-path=" + filepath.Dir(k.path)}, k.spec.Options...)
}

// nvrtcLine is a message of NVRTC's log: file(line): text.
var nvrtcLine = regexp.MustCompile(`^(.+?)\((\d+)\): (.*)$`)

// CompileError is a user's .cu file that NVRTC did not compile: the op, the
// file, and NVRTC's log with each message as file:line: text.
type CompileError struct {
	Op, File, Log string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("%s: %s does not compile:\n%s", e.Op, e.File, e.Log)
}

// formatLog rewrites NVRTC's "file(line): text" as "file:line: text", the
// form editors jump to, drops the blank lines and the trailing count of
// errors ("1 error detected in the compilation of ...").
func formatLog(log string) string {
	var out []string
	for _, line := range strings.Split(strings.TrimRight(log, "\x00\n "), "\n") {
		line = strings.TrimRight(line, "\r ")
		if line == "" || strings.Contains(line, "detected in the compilation of") {
			continue
		}
		if m := nvrtcLine.FindStringSubmatch(line); m != nil {
			line = m[1] + ":" + m[2] + ": " + m[3]
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// compileError is err, a failed NVRTC compile, as a CompileError.
func compileError(k kernel, err error) error {
	var ce *cuda.Error
	if errors.As(err, &ce) && ce.Log != "" {
		return &CompileError{Op: string(k.op), File: k.path, Log: formatLog(ce.Log)}
	}
	return fmt.Errorf("%s: %s: %w", k.op, k.path, err)
}

// ptxEntry finds .entry name in PTX text and counts its parameters.
var ptxEntry = regexp.MustCompile(`\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)`)

// checkImage checks, before the driver loads it, that a PTX or cubin image
// defines the kernel's entry point, and (PTX, whose parameters it lists)
// that the entry takes the ABI's parameters: their number and sizes.
func checkImage(k kernel, img []byte) error {
	if k.kind == "ptx" {
		var names []string
		for _, m := range ptxEntry.FindAllSubmatch(img, -1) {
			name := string(m[1])
			if name != k.spec.Entry {
				names = append(names, name)
				continue
			}
			return checkPTXParams(k, string(m[2]))
		}
		return fmt.Errorf("no entry point %q (the PTX defines %s)", k.spec.Entry, listOrNone(names))
	}
	// NVRTC's and nvcc's cubins carry their own ELF version, which
	// debug/elf refuses: read a copy that says EV_CURRENT.
	elfImg := append([]byte(nil), img...)
	if len(elfImg) >= 0x18 {
		elfImg[elf.EI_VERSION] = byte(elf.EV_CURRENT)
		binary.LittleEndian.PutUint32(elfImg[0x14:], uint32(elf.EV_CURRENT))
	}
	f, err := elf.NewFile(bytes.NewReader(elfImg))
	if err != nil {
		return fmt.Errorf("not a cubin (an ELF file): %v", err)
	}
	syms, err := f.Symbols()
	if err != nil {
		return fmt.Errorf("cubin without a symbol table: %v", err)
	}
	var names []string
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		if s.Name == k.spec.Entry {
			return nil
		}
		names = append(names, s.Name)
	}
	return fmt.Errorf("no entry point %q (the cubin defines %s)", k.spec.Entry, listOrNone(names))
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// ptxParam is one parameter of a PTX entry: .param .u64 name, .param .f32 name, ...
var ptxParam = regexp.MustCompile(`\.param\s+(?:\.align\s+\d+\s+)?\.([busf])(8|16|32|64)\b`)

// checkPTXParams checks an entry's parameter list against the op's ABI.
func checkPTXParams(k kernel, list string) error {
	ps := ptxParam.FindAllStringSubmatch(list, -1)
	want := k.abi.params
	if len(ps) != len(want) {
		return fmt.Errorf("entry %s takes %d parameters; ABI %d's %s kernel takes %d: %s",
			k.spec.Entry, len(ps), ABIVersion, k.op, len(want), k.abi.signature(k.spec.Entry))
	}
	for i, p := range ps {
		bits := 0
		fmt.Sscan(p[2], &bits)
		if bits/8 != want[i].size {
			return fmt.Errorf("entry %s: parameter %d is .%s%s; ABI %d's %s kernel takes %s there: %s",
				k.spec.Entry, i+1, p[1], p[2], ABIVersion, k.op, want[i].C, k.abi.signature(k.spec.Entry))
		}
	}
	return nil
}
