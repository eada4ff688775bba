package loader

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels"
)

// The weight files of a model directory.
const (
	SingleWeightsFile = "model.safetensors"
	WeightsIndexFile  = "model.safetensors.index.json"
)

// NoDType is TensorInfo.DType for a tensor whose safetensors dtype has no
// kernels.DType (I64, BOOL, F64, ...): see TensorInfo.SafeDType.
const NoDType kernels.DType = 0xff

// TensorInfo is one tensor of the checkpoint.
type TensorInfo struct {
	Name string
	// DType is the element type; NoDType when the file's dtype (SafeDType)
	// has no kernels.DType. Only BF16, F16 and F32 pass Weights.Check.
	DType kernels.DType
	// SafeDType is the dtype as the safetensors header spells it ("BF16",
	// "I64", ...).
	SafeDType string
	Shape     []int
	// Data is the little-endian, row-major tensor data, memory-mapped
	// read-only from File: writing to it faults, and it is invalid after
	// Weights.Close. Reading it faults too where the file has been cut
	// short since it was opened: read it through Weights.Read, which makes
	// that an error.
	Data   []byte
	File   string // the file, relative to the model directory
	Offset int64  // where Data starts in File
}

// Weights is the safetensors checkpoint of a model directory, memory-mapped.
// Its methods are safe for concurrent use, Close excepted.
type Weights struct {
	dir     string
	maps    []*stMapping // one per file
	tensors map[string]*TensorInfo
	names   []string
	total   int64
}

// Want is a tensor the model needs, with its expected shape.
type Want struct {
	Name  string
	Shape []int
}

// OpenWeights maps the checkpoint of dir: model.safetensors when present
// (as transformers does), else the shards named by
// model.safetensors.index.json (then exactly the tensors of its weight_map).
// Every header is validated before use; the errors name the file and, where
// there is one, the tensor.
func OpenWeights(dir string) (*Weights, error) {
	w := &Weights{dir: dir, tensors: map[string]*TensorInfo{}}
	single := filepath.Join(dir, SingleWeightsFile)
	var err error
	switch {
	case stIsFile(single):
		err = w.addFile(SingleWeightsFile, nil)
	case stExists(filepath.Join(dir, WeightsIndexFile)):
		err = w.openIndexed()
	case stExists(single):
		// A directory or a link to nothing, and no index: addFile says
		// what it is.
		err = w.addFile(SingleWeightsFile, nil)
	default:
		err = stNoWeightsError(dir)
	}
	if err != nil {
		w.Close()
		return nil, err
	}
	w.names = cfgSortedKeys(w.tensors)
	return w, nil
}

// stIsFile reports whether path names something other than a directory,
// following links: what transformers takes for a weights file.
func stIsFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}

// stExists reports whether there is an entry at path, be it a link to
// nothing.
func stExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func stNoWeightsError(dir string) error {
	msg := fmt.Sprintf("loader: %s: no %s or %s", dir, SingleWeightsFile, WeightsIndexFile)
	for _, pat := range []string{"*.safetensors", "pytorch_model*.bin", "*.gguf"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			msg += fmt.Sprintf(" (found %s: ", filepath.Base(m[0]))
			if pat == "*.safetensors" {
				msg += "other safetensors names are not supported)"
			} else {
				msg += "only safetensors checkpoints are supported)"
			}
			break
		}
	}
	return errors.New(msg)
}

// stIndex is model.safetensors.index.json.
type stIndex struct {
	WeightMap map[string]string `json:"weight_map"`
}

func (w *Weights) openIndexed() error {
	data, err := ReadJSONFile(filepath.Join(w.dir, WeightsIndexFile))
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	var idx stIndex
	if err := json.Unmarshal(data, &idx); err != nil {
		return fmt.Errorf("loader: %s: bad JSON: %v", WeightsIndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("loader: %s: empty or missing weight_map", WeightsIndexFile)
	}
	byFile := map[string][]string{}
	for _, name := range cfgSortedKeys(idx.WeightMap) {
		file := idx.WeightMap[name]
		if file == "" || !filepath.IsLocal(file) {
			return fmt.Errorf("loader: %s: tensor %q: shard %q is not a file inside the model directory", WeightsIndexFile, name, file)
		}
		byFile[file] = append(byFile[file], name)
	}
	files := cfgSortedKeys(byFile)
	// Every shard first, so that a missing one is reported before the
	// mapping work; one that is there but no file (a directory, a link to
	// nothing) is reported by addFile, which says what it is.
	for _, file := range files {
		if _, err := os.Lstat(filepath.Join(w.dir, file)); errors.Is(err, fs.ErrNotExist) {
			names := byFile[file]
			more := ""
			if len(names) > 1 {
				more = fmt.Sprintf(" and %d more", len(names)-1)
			}
			return fmt.Errorf("loader: %s: shard missing (%s lists it for tensor %q%s)", file, WeightsIndexFile, names[0], more)
		}
	}
	for _, file := range files {
		if err := w.addFile(file, byFile[file]); err != nil {
			return err
		}
	}
	return nil
}

// addFile maps file and adds its tensors named in names (all when nil).
func (w *Weights) addFile(file string, names []string) error {
	f, err := infile.Open(filepath.Join(w.dir, file))
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	m := &stMapping{file: file, f: f}
	w.maps = append(w.maps, m) // Close closes f and unmaps data
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	size := fi.Size()
	if size < 8 {
		return fmt.Errorf("loader: %s: file too short (%d bytes) for a safetensors header: truncated?", file, size)
	}
	if size > math.MaxInt {
		return fmt.Errorf("loader: %s: file too large to map (%d bytes)", file, size)
	}
	data, err := stMap(f, size)
	if err != nil {
		return fmt.Errorf("loader: %s: mmap: %v", file, err)
	}
	m.data, m.size = data, size

	// The header is parsed once, here; the tests hold these checks and the
	// views below to what the safetensors library makes of the same files.
	// The file may be cut short under its mapping meanwhile, as while the
	// tensors are read: guard turns the fault into an error.
	var hdr *stHeader
	if err := w.guard("header", func() (err error) {
		if hdr, err = stParseHeader(data); err != nil {
			return fmt.Errorf("loader: %s: %w", file, err)
		}
		return nil
	}); err != nil {
		return err
	}
	if names == nil {
		names = cfgSortedKeys(hdr.entries)
	}
	for _, name := range names {
		e, ok := hdr.entries[name]
		if !ok {
			return fmt.Errorf("loader: %s: tensor %q: listed in %s but not in this file", file, name, WeightsIndexFile)
		}
		if _, dup := w.tensors[name]; dup {
			return fmt.Errorf("loader: %s: tensor %q: already loaded from %s", file, name, w.tensors[name].File)
		}
		start, end := hdr.dataStart+e.begin, hdr.dataStart+e.end
		w.tensors[name] = &TensorInfo{
			Name:      name,
			DType:     stKernelDType(e.dtype),
			SafeDType: e.dtype,
			Shape:     e.shape,
			Data:      data[start:end:end],
			File:      file,
			Offset:    start,
		}
		w.total += e.end - e.begin
	}
	return nil
}

func stKernelDType(s string) kernels.DType {
	switch s {
	case "BF16":
		return kernels.BF16
	case "F16":
		return kernels.F16
	case "F32":
		return kernels.F32
	case "I32":
		return kernels.I32
	}
	return NoDType
}

// stDTypeSizes are the element sizes of the dtypes safetensors knows.
var stDTypeSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"F64": 8, "I64": 8, "U64": 8,
}

// stMaxHeader is the largest header the safetensors library accepts.
const stMaxHeader = 100_000_000

// stHeader is a validated safetensors header.
type stHeader struct {
	dataStart int64 // 8 + header length
	entries   map[string]*stEntry
}

// stEntry is one tensor of a header; begin and end are relative to the data
// section.
type stEntry struct {
	name       string
	dtype      string
	shape      []int
	begin, end int64
}

// stParseHeader parses and validates the header of a whole safetensors
// file: u64 little-endian header length, the JSON header, then the data,
// every tensor's [begin, end) inside it, its length dtype size × elements,
// tensors neither overlapping nor leaving holes, and no bytes after the last
// (the rules of the reference implementation).
func stParseHeader(data []byte) (*stHeader, error) {
	size := int64(len(data))
	n := binary.LittleEndian.Uint64(data[:8])
	if n > uint64(size-8) {
		return nil, fmt.Errorf("header length %d beyond end of file (%d bytes): truncated, or not a safetensors file?", n, size)
	}
	if n > stMaxHeader {
		return nil, fmt.Errorf("header length %d too large (limit %d)", n, stMaxHeader)
	}
	raw := data[8 : 8+n]
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("bad JSON header: not an object: not a safetensors file?")
	}
	// encoding/json would turn bytes that are not UTF-8, and escapes of
	// lone surrogates, into U+FFFD, renaming tensors; the reference parser
	// refuses both.
	if !utf8.Valid(raw) {
		return nil, fmt.Errorf("bad JSON header: not valid UTF-8 (byte %d)", 8+invalidUTF8At(raw))
	}
	if at := loneSurrogateAt(raw); at >= 0 {
		return nil, fmt.Errorf("bad JSON header: %s at byte %d escapes half a UTF-16 surrogate pair, which is no character", raw[at:at+6], 8+at)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("bad JSON header: %v", err)
	}
	h := &stHeader{dataStart: 8 + int64(n), entries: map[string]*stEntry{}}
	dataLen := size - h.dataStart
	sorted := make([]*stEntry, 0, len(top))
	for _, name := range cfgSortedKeys(top) {
		if name == "__metadata__" {
			var md map[string]string
			if err := json.Unmarshal(top[name], &md); err != nil {
				return nil, fmt.Errorf("bad JSON header: __metadata__: want an object of strings: %v", err)
			}
			continue
		}
		e, err := stParseEntry(name, top[name])
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		h.entries[name] = e
		sorted = append(sorted, e)
	}
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.begin != b.begin {
			return a.begin < b.begin
		}
		if a.end != b.end {
			return a.end < b.end
		}
		return a.name < b.name
	})
	abs := func(off int64) int64 { return h.dataStart + off }
	var prev *stEntry
	for _, e := range sorted {
		if e.begin > e.end {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d,%d): begin after end", e.name, e.begin, e.end)
		}
		if e.end > dataLen {
			return nil, fmt.Errorf("tensor %q: data [%d,%d) beyond end of file (%d bytes): truncated?", e.name, abs(e.begin), abs(e.end), size)
		}
		need, ok := stByteLen(e)
		if !ok {
			return nil, fmt.Errorf("tensor %q: shape %v overflows", e.name, e.shape)
		}
		if got := e.end - e.begin; got != need {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d,%d) hold %d bytes, but %s %v needs %d", e.name, e.begin, e.end, got, e.dtype, e.shape, need)
		}
		switch {
		case prev == nil && e.begin != 0:
			return nil, fmt.Errorf("tensor %q: data starts at offset %d, leaving a hole at the start of the data", e.name, e.begin)
		case prev != nil && e.begin < prev.end:
			return nil, fmt.Errorf("tensor %q: data_offsets [%d,%d) overlap tensor %q's [%d,%d)", e.name, e.begin, e.end, prev.name, prev.begin, prev.end)
		case prev != nil && e.begin > prev.end:
			return nil, fmt.Errorf("tensor %q: data starts at offset %d, leaving a hole after tensor %q (ends at %d)", e.name, e.begin, prev.name, prev.end)
		}
		prev = e
	}
	end := int64(0)
	if prev != nil {
		end = prev.end
	}
	if end != dataLen {
		last := ""
		if prev != nil {
			last = fmt.Sprintf(" (tensor %q)", prev.name)
		}
		return nil, fmt.Errorf("%d bytes after the last tensor's data%s: file size %d, expected %d", dataLen-end, last, size, h.dataStart+end)
	}
	return h, nil
}

// invalidUTF8At is the offset of the first byte of b that does not start a
// valid UTF-8 sequence.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// loneSurrogateAt is the offset of the first \uXXXX escape in the JSON
// text b that is a UTF-16 surrogate without its other half, or -1.
func loneSurrogateAt(b []byte) int {
	hex := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			continue
		}
		if b[i+1] != 'u' {
			i++ // an escape of one character: \\, \", \n...
			continue
		}
		r, ok := hex(i)
		switch {
		case !ok:
			continue // the JSON decoder will say
		case 0xD800 <= r && r < 0xDC00:
			if lo, ok := hex(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i
			}
			i += 11
		case 0xDC00 <= r && r <= 0xDFFF:
			return i
		default:
			i += 5
		}
	}
	return -1
}

// stParseEntry parses {"dtype", "shape", "data_offsets"} of one tensor.
func stParseEntry(name string, raw json.RawMessage) (*stEntry, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("bad header entry %s: want an object", cfgShort(raw))
	}
	for k := range fields {
		if k != "dtype" && k != "shape" && k != "data_offsets" {
			return nil, fmt.Errorf("bad header entry: unknown key %q", k)
		}
	}
	e := &stEntry{name: name}
	if err := json.Unmarshal(fields["dtype"], &e.dtype); err != nil || e.dtype == "" {
		return nil, fmt.Errorf("bad or missing dtype %s", cfgShort(fields["dtype"]))
	}
	if _, ok := stDTypeSizes[e.dtype]; !ok {
		return nil, fmt.Errorf("unknown dtype %q", e.dtype)
	}
	var shape, offs []json.Number
	if err := json.Unmarshal(fields["shape"], &shape); err != nil || shape == nil {
		return nil, fmt.Errorf("bad or missing shape %s", cfgShort(fields["shape"]))
	}
	e.shape = make([]int, len(shape))
	for i, s := range shape {
		v, err := strconv.ParseInt(s.String(), 10, 64)
		if err != nil || v < 0 || v > math.MaxInt {
			return nil, fmt.Errorf("bad shape %s", cfgShort(fields["shape"]))
		}
		e.shape[i] = int(v)
	}
	if err := json.Unmarshal(fields["data_offsets"], &offs); err != nil || len(offs) != 2 {
		return nil, fmt.Errorf("bad or missing data_offsets %s: want [begin, end]", cfgShort(fields["data_offsets"]))
	}
	for i, o := range offs {
		v, err := strconv.ParseInt(o.String(), 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad data_offsets %s", cfgShort(fields["data_offsets"]))
		}
		if i == 0 {
			e.begin = v
		} else {
			e.end = v
		}
	}
	return e, nil
}

// stByteLen is the data length of e from its dtype and shape; false on
// overflow.
func stByteLen(e *stEntry) (int64, bool) {
	n := uint64(stDTypeSizes[e.dtype])
	for _, d := range e.shape {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = lo
	}
	return int64(n), true
}

// Get returns the tensor called name. The TensorInfo is shared: do not
// modify it.
func (w *Weights) Get(name string) (*TensorInfo, bool) {
	t, ok := w.tensors[name]
	return t, ok
}

// Names returns the names of all tensors, sorted.
func (w *Weights) Names() []string {
	return append([]string(nil), w.names...)
}

// TotalBytes is the size of all tensors' data.
func (w *Weights) TotalBytes() int64 { return w.total }

// Dir is the model directory the weights come from.
func (w *Weights) Dir() string { return w.dir }

// CheckError is what Weights.Check returns: how many problems it found and
// the first few, one line each.
type CheckError struct {
	Dir      string
	Problems []string // the first checkErrorShown problems
	Count    int      // every problem found
}

// checkErrorShown is how many problems CheckError keeps and lists: a
// config that asks for a million layers of a two-layer checkpoint has
// millions, which would take seconds to write out and pages to print.
const checkErrorShown = 10

// Prepend puts problem first, standing for n problems the check did not
// list one by one, and keeps the first checkErrorShown.
func (e *CheckError) Prepend(problem string, n int) {
	e.Problems = append([]string{problem}, e.Problems...)
	e.Problems = e.Problems[:min(len(e.Problems), checkErrorShown)]
	e.Count += n
}

// Error is one line that says the first problem and how many there are,
// then the next problems kept, one a line.
func (e *CheckError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "loader: weights in %s: ", e.Dir)
	if len(e.Problems) > 0 {
		b.WriteString(e.Problems[0])
	}
	if e.Count > 1 {
		fmt.Fprintf(&b, " (and %d more problems)", e.Count-1)
	}
	for _, p := range e.Problems[min(1, len(e.Problems)):] {
		b.WriteString("\n\t")
		b.WriteString(p)
	}
	if more := e.Count - len(e.Problems); more > 0 {
		fmt.Fprintf(&b, "\n\tand %d more", more)
	}
	return b.String()
}

// add records a problem, formatting it only when it is one of the first
// kept.
func (e *CheckError) add(format string, a ...any) {
	if len(e.Problems) < checkErrorShown {
		e.Problems = append(e.Problems, fmt.Sprintf(format, a...))
	}
	e.Count++
}

// Check verifies that every wanted tensor is there, with its shape and a
// BF16, F16 or F32 dtype. It reports the problems in one *CheckError (nil
// when there are none). Tensors not wanted are no problem.
func (w *Weights) Check(want []Want) error {
	e := &CheckError{Dir: w.dir}
	for _, wt := range want {
		t, ok := w.tensors[wt.Name]
		if !ok {
			e.add("tensor %q: missing", wt.Name)
			continue
		}
		switch t.DType {
		case kernels.BF16, kernels.F16, kernels.F32:
		default:
			e.add("tensor %q (%s): dtype %s not supported (want BF16, F16 or F32)", wt.Name, t.File, t.SafeDType)
		}
		if !stSameShape(t.Shape, wt.Shape) {
			e.add("tensor %q (%s): shape %v, want %v", wt.Name, t.File, t.Shape, wt.Shape)
		}
	}
	if e.Count == 0 {
		return nil
	}
	return e
}

func stSameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Prefetch asks the kernel to start reading every file in (madvise
// WILLNEED); it does not wait.
func (w *Weights) Prefetch() {
	for _, m := range w.maps {
		if m.data != nil {
			stWillNeed(m.data)
		}
	}
}

// Close unmaps and closes the files; every TensorInfo.Data becomes invalid.
// Calling it again does nothing.
func (w *Weights) Close() error {
	var first error
	for _, m := range w.maps {
		if m.data != nil {
			if err := stUnmap(m.data); err != nil && first == nil {
				first = fmt.Errorf("loader: munmap: %w", err)
			}
		}
		m.f.Close() // opened read-only: nothing to lose
	}
	w.maps = nil
	w.tensors = map[string]*TensorInfo{}
	w.names = nil
	w.total = 0
	return first
}
