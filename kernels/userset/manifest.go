package userset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels"
)

// ManifestName is the manifest's file name in a kernel directory.
const ManifestName = "fuselm.json"

// Manifest is a kernel directory's fuselm.json: the ABI its kernels were
// written for, the set's name, and each op's kernel.
type Manifest struct {
	ABI  int                   `json:"abi"`
	Name string                `json:"name"`
	Ops  map[string]KernelSpec `json:"ops"`
}

// KernelSpec is one op's kernel as the manifest gives it.
type KernelSpec struct {
	File    string   `json:"file"`    // .cu, .ptx or .cubin, relative to the directory
	Entry   string   `json:"entry"`   // the kernel's name (extern "C")
	Block   int      `json:"block"`   // threads per block (1-D); 0 for the op's default
	Grid    string   `json:"grid"`    // "x[, y[, z]]" in the op's sizes; "" for the op's default
	Shared  sizeExpr `json:"shared"`  // dynamic shared memory bytes: a number or an expression
	Weights string   `json:"weights"` // the weight dtype rms_norm and add_rms_norm take: bf16 (default), f16 or f32
	Options []string `json:"options"` // NVRTC options for a .cu file (-D..., -I...)
}

// sizeExpr is a number or an expression string in the manifest.
type sizeExpr string

func (s *sizeExpr) UnmarshalJSON(b []byte) error {
	if n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 32); err == nil {
		*s = sizeExpr(strconv.FormatInt(n, 10))
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("shared is %s: want a number of bytes or an expression string", b)
	}
	*s = sizeExpr(str)
	return nil
}

// kernel is one op's kernel, checked: its file's path and kind, its
// parsed grid and shared memory, and its ABI.
type kernel struct {
	op     kernels.Op
	abi    opABI
	spec   KernelSpec
	path   string // the file, joined to the directory
	kind   string // "cu", "ptx" or "cubin"
	grid   []expr
	shared expr
	wdt    kernels.DType
}

// setName is what a user set may be called: what a spec can name.
var setName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// ReadManifest reads and checks dir's manifest: its ABI, its name, and
// every op's kernel (the op is one the ABI has, the file exists and is a
// .cu, .ptx or .cubin, the grid and shared memory parse over the op's
// sizes). Every error is one line that names the manifest.
func ReadManifest(dir string) (*Manifest, []kernel, error) {
	path := filepath.Join(dir, ManifestName)
	raw, err := infile.Read(path, maxSourceBytes)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("kernel directory %s has no %s (the manifest: docs/KERNEL_ABI.md)", dir, ManifestName)
		}
		return nil, nil, err
	}
	m, ks, err := parseManifest(raw, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, ks, nil
}

// parseManifest parses a manifest's text, with files relative to dir.
func parseManifest(raw []byte, dir string) (*Manifest, []kernel, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line := 1 + bytes.Count(raw[:min(int(se.Offset), len(raw))], []byte("\n"))
			return nil, nil, fmt.Errorf("line %d: %v", line, err)
		}
		return nil, nil, fmt.Errorf("%v", strings.TrimPrefix(err.Error(), "json: "))
	}
	switch {
	case m.ABI == 0:
		return nil, nil, fmt.Errorf(`states no "abi" (this fuselm calls kernels through ABI %d)`, ABIVersion)
	case m.ABI != ABIVersion:
		return nil, nil, fmt.Errorf("kernels written for ABI %d; this fuselm calls kernels through ABI %d (docs/KERNEL_ABI.md says what changed): refused", m.ABI, ABIVersion)
	case !setName.MatchString(m.Name):
		return nil, nil, fmt.Errorf(`"name" %q: want a set name of lower-case letters, digits and _, starting with a letter`, m.Name)
	case len(m.Ops) == 0:
		return nil, nil, fmt.Errorf(`"ops" names no op (ops a kernel may replace: %s)`, opNames())
	}
	names := make([]string, 0, len(m.Ops))
	for name := range m.Ops {
		names = append(names, name)
	}
	sort.Strings(names)
	var ks []kernel
	for _, name := range names {
		k, err := checkKernel(kernels.Op(name), m.Ops[name], dir)
		if err != nil {
			return nil, nil, fmt.Errorf("ops.%s: %w", name, err)
		}
		ks = append(ks, k)
	}
	return &m, ks, nil
}

func opNames() string {
	var s []string
	for _, a := range abi {
		s = append(s, string(a.op))
	}
	return strings.Join(s, ", ")
}

// checkKernel checks one op's entry of the manifest.
func checkKernel(op kernels.Op, s KernelSpec, dir string) (kernel, error) {
	a, ok := abiOf(op)
	if !ok {
		return kernel{}, fmt.Errorf("not an op a kernel may replace in ABI %d (%s)", ABIVersion, opNames())
	}
	k := kernel{op: op, abi: a, spec: s, wdt: kernels.BF16}
	if s.File == "" || s.Entry == "" {
		return kernel{}, fmt.Errorf(`needs "file" and "entry"`)
	}
	k.kind = strings.TrimPrefix(filepath.Ext(s.File), ".")
	if k.kind != "cu" && k.kind != "ptx" && k.kind != "cubin" {
		return kernel{}, fmt.Errorf("file %s: want a .cu, .ptx or .cubin file", s.File)
	}
	k.path = s.File
	if !filepath.IsAbs(k.path) {
		k.path = filepath.Join(dir, s.File)
	}
	if st, err := os.Stat(k.path); err != nil || !st.Mode().IsRegular() {
		return kernel{}, fmt.Errorf("file %s: no such file", k.path)
	}
	if len(s.Options) > 0 && k.kind != "cu" {
		return kernel{}, fmt.Errorf(`"options" are NVRTC's, for a .cu file; %s is compiled already`, s.File)
	}
	if s.Block == 0 {
		k.spec.Block = a.block
	}
	if k.spec.Block < 1 || k.spec.Block > 1024 {
		return kernel{}, fmt.Errorf("block %d: want 1 to 1024 threads", s.Block)
	}
	grid := s.Grid
	if grid == "" {
		grid = a.grid
	}
	var err error
	if k.grid, err = parseExprs(grid, 3, a.vars()); err != nil {
		return kernel{}, fmt.Errorf("grid: %w", err)
	}
	shared := string(s.Shared)
	if shared == "" {
		shared = "0"
	}
	sh, err := parseExprs(shared, 1, a.vars())
	if err != nil {
		return kernel{}, fmt.Errorf("shared: %w", err)
	}
	k.shared = sh[0]
	switch {
	case s.Weights == "" || s.Weights == "bf16":
	case op != kernels.OpRMSNorm && op != kernels.OpAddRMSNorm:
		return kernel{}, fmt.Errorf(`"weights": %s takes no weights`, op)
	case s.Weights == "f16":
		k.wdt = kernels.F16
	case s.Weights == "f32":
		k.wdt = kernels.F32
	default:
		return kernel{}, fmt.Errorf(`"weights" %q: want bf16, f16 or f32`, s.Weights)
	}
	return k, nil
}
