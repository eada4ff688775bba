package loader

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
	"github.com/nlpodyssey/safetensors"
)

// stTestTensor is one tensor for stTestBuild.
type stTestTensor struct {
	name  string
	dtype string
	shape []int
}

// stTestSize is the data length of a test tensor.
func stTestSize(tt stTestTensor) int {
	n := int(stDTypeSizes[tt.dtype])
	for _, d := range tt.shape {
		n *= d
	}
	return n
}

// stTestData is the deterministic content of a test tensor.
func stTestData(tt stTestTensor) []byte {
	b := make([]byte, stTestSize(tt))
	for i := range b {
		b[i] = byte(len(tt.name)*31 + i*7)
	}
	return b
}

// stTestRaw assembles a safetensors file from a header and data:
// u64 little-endian length, header padded with spaces to 8 bytes, data.
func stTestRaw(header string, data []byte) []byte {
	h := []byte(header)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(out, h...)
	return append(out, data...)
}

// stTestBuild writes a valid safetensors file of tensors, in the given order.
func stTestBuild(tensors []stTestTensor) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, tt := range tensors {
		b := len(data)
		data = append(data, stTestData(tt)...)
		hdr[tt.name] = map[string]any{"dtype": tt.dtype, "shape": tt.shape, "data_offsets": []int{b, len(data)}}
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		panic(err)
	}
	return stTestRaw(string(h), data)
}

func stTestWrite(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// stTestIndex writes model.safetensors.index.json mapping tensors to files.
func stTestIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	if err != nil {
		t.Fatal(err)
	}
	stTestWrite(t, dir, WeightsIndexFile, data)
}

var stTestTensors = []stTestTensor{
	{"model.embed_tokens.weight", "BF16", []int{16, 8}},
	{"model.layers.0.self_attn.q_proj.weight", "F32", []int{8, 8}},
	{"model.layers.0.self_attn.q_proj.bias", "F16", []int{8}},
	{"model.norm.weight", "F32", []int{8}},
	{"position_ids", "I64", []int{1, 4}},
	{"mask", "BOOL", []int{3}},
	{"counts", "I32", []int{2}},
	{"scalar", "F32", []int{}},
	{"empty", "BF16", []int{0, 8}},
}

func stTestCheckTensors(t *testing.T, w *Weights, tensors []stTestTensor, file func(string) string) {
	t.Helper()
	var names []string
	total := int64(0)
	for _, tt := range tensors {
		names = append(names, tt.name)
		total += int64(stTestSize(tt))
		ti, ok := w.Get(tt.name)
		if !ok {
			t.Errorf("%s: missing", tt.name)
			continue
		}
		if ti.Name != tt.name || ti.SafeDType != tt.dtype || !reflect.DeepEqual(ti.Shape, tt.shape) || ti.File != file(tt.name) {
			t.Errorf("%s: got %s %s %v %s", tt.name, ti.Name, ti.SafeDType, ti.Shape, ti.File)
		}
		if want := stKernelDType(tt.dtype); ti.DType != want {
			t.Errorf("%s: DType %v, want %v", tt.name, ti.DType, want)
		}
		if !bytes.Equal(ti.Data, stTestData(tt)) {
			t.Errorf("%s: data differs", tt.name)
		}
		// Offset points at the data in the file.
		raw, err := os.ReadFile(filepath.Join(w.Dir(), ti.File))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw[ti.Offset:ti.Offset+int64(len(ti.Data))], ti.Data) {
			t.Errorf("%s: Offset %d does not point at the data", tt.name, ti.Offset)
		}
	}
	sort.Strings(names)
	if got := w.Names(); !reflect.DeepEqual(got, names) {
		t.Errorf("Names %v, want %v", got, names)
	}
	if w.TotalBytes() != total {
		t.Errorf("TotalBytes %d, want %d", w.TotalBytes(), total)
	}
	if _, ok := w.Get("nope"); ok {
		t.Error("Get(nope) found")
	}
}

func TestOpenWeightsSingle(t *testing.T) {
	dir := t.TempDir()
	stTestWrite(t, dir, SingleWeightsFile, stTestBuild(stTestTensors))
	w, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	stTestCheckTensors(t, w, stTestTensors, func(string) string { return SingleWeightsFile })
	w.Prefetch()
	if ti, _ := w.Get("model.norm.weight"); ti.DType != kernels.F32 {
		t.Errorf("norm dtype %v", ti.DType)
	}
	if ti, _ := w.Get("position_ids"); ti.DType != NoDType {
		t.Errorf("I64 dtype %v, want NoDType", ti.DType)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, ok := w.Get("model.norm.weight"); ok {
		t.Error("Get after Close found a tensor")
	}
}

// TestOpenWeightsLibraryFile reads a file written by the safetensors
// library's own serializer (its layout: tensors sorted by descending dtype
// alignment, header padded to 8 bytes).
func TestOpenWeightsLibraryFile(t *testing.T) {
	views := map[string]safetensors.TensorView{}
	tensors := []stTestTensor{
		{"a", "BF16", []int{3, 5}}, {"b", "F32", []int{7}}, {"c", "F16", []int{2, 2, 2}}, {"d", "I64", []int{2}},
	}
	for _, tt := range tensors {
		dt, err := safetensors.ParseDType(tt.dtype)
		if err != nil {
			t.Fatal(err)
		}
		shape := make([]uint64, len(tt.shape))
		for i, d := range tt.shape {
			shape[i] = uint64(d)
		}
		v, err := safetensors.NewTensorView(dt, shape, stTestData(tt))
		if err != nil {
			t.Fatal(err)
		}
		views[tt.name] = v
	}
	data, err := safetensors.Serialize(views, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stTestWrite(t, dir, SingleWeightsFile, data)
	w, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	stTestCheckTensors(t, w, tensors, func(string) string { return SingleWeightsFile })
}

func TestOpenWeightsSharded(t *testing.T) {
	dir := t.TempDir()
	shard1 := "model-00001-of-00002.safetensors"
	shard2 := "model-00002-of-00002.safetensors"
	a, b := stTestTensors[:4], stTestTensors[4:]
	// A tensor the index does not name is left out, as transformers does.
	stTestWrite(t, dir, shard1, stTestBuild(append(append([]stTestTensor(nil), a...), stTestTensor{"unlisted", "F32", []int{2}})))
	stTestWrite(t, dir, shard2, stTestBuild(b))
	wm := map[string]string{}
	for _, tt := range a {
		wm[tt.name] = shard1
	}
	for _, tt := range b {
		wm[tt.name] = shard2
	}
	stTestIndex(t, dir, wm)
	w, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	stTestCheckTensors(t, w, stTestTensors, func(name string) string { return wm[name] })

	// model.safetensors wins over the index, as in transformers.
	stTestWrite(t, dir, SingleWeightsFile, stTestBuild(a[:1]))
	w2, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if got := w2.Names(); len(got) != 1 {
		t.Errorf("with model.safetensors: %v", got)
	}
}

func TestWeightsCheck(t *testing.T) {
	dir := t.TempDir()
	stTestWrite(t, dir, SingleWeightsFile, stTestBuild(stTestTensors))
	w, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	good := []Want{
		{"model.embed_tokens.weight", []int{16, 8}},
		{"model.layers.0.self_attn.q_proj.weight", []int{8, 8}},
		{"model.layers.0.self_attn.q_proj.bias", []int{8}},
		{"scalar", []int{}},
	}
	if err := w.Check(good); err != nil {
		t.Errorf("good: %v", err)
	}
	if err := w.Check(nil); err != nil {
		t.Errorf("nothing wanted: %v", err)
	}

	bad := []Want{
		{"model.norm.weight", []int{8}},             // fine
		{"model.embed_tokens.weight", []int{8, 16}}, // shape
		{"lm_head.weight", []int{16, 8}},            // missing
		{"position_ids", []int{1, 4}},               // I64
		{"counts", []int{3}},                        // I32 and shape
	}
	err = w.Check(bad)
	var ce *CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("bad: %v", err)
	}
	want := []string{
		`tensor "model.embed_tokens.weight" (model.safetensors): shape [16 8], want [8 16]`,
		`tensor "lm_head.weight": missing`,
		`tensor "position_ids" (model.safetensors): dtype I64 not supported (want BF16, F16 or F32)`,
		`tensor "counts" (model.safetensors): dtype I32 not supported (want BF16, F16 or F32)`,
		`tensor "counts" (model.safetensors): shape [2], want [3]`,
	}
	if !reflect.DeepEqual(ce.Problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(ce.Problems, "\n"), strings.Join(want, "\n"))
	}
	first := "loader: weights in " + dir + ": " + want[0] + " (and 4 more problems)\n\t" + want[1] + "\n"
	if msg := err.Error(); !strings.HasPrefix(msg, first) || strings.Count(msg, "\n") != 4 || strings.Contains(msg, "and 0 more") {
		t.Errorf("message %q", msg)
	}

	var many []Want
	for i := range 25 {
		many = append(many, Want{fmt.Sprintf("missing.%02d", i), []int{1}})
	}
	msg := w.Check(many).Error()
	if !strings.Contains(msg, "(and 24 more problems)") || !strings.Contains(msg, "missing.09") ||
		strings.Contains(msg, "missing.10") || !strings.HasSuffix(msg, "and 15 more") {
		t.Errorf("many: %q", msg)
	}

	// A million problems: the first few are kept, the rest counted, at once.
	many = make([]Want, 1_000_000)
	for i := range many {
		many[i] = Want{"model.layers.0.self_attn.q_proj.weight.missing", []int{1}}
	}
	start := time.Now()
	err = w.Check(many)
	if !errors.As(err, &ce) || ce.Count != len(many) || len(ce.Problems) != checkErrorShown {
		t.Errorf("a million problems: %d counted, %d kept", ce.Count, len(ce.Problems))
	}
	if msg := err.Error(); len(msg) > 2000 || !strings.HasSuffix(msg, fmt.Sprintf("and %d more", len(many)-checkErrorShown)) {
		t.Errorf("a million problems: a %d-byte message ending %q", len(msg), msg[max(0, len(msg)-40):])
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a million problems took %v", d)
	}
}

// TestOpenWeightsCorrupt: every malformed checkpoint gives an error (never a
// panic) naming the file and, where there is one, the tensor.
func TestOpenWeightsCorrupt(t *testing.T) {
	good := stTestBuild(stTestTensors[:4])
	goodHdrLen := binary.LittleEndian.Uint64(good[:8])
	const shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	abData := make([]byte, 48) // a: F32 [2,3] = 24 bytes, b: F32 [6] = 24 bytes
	single := func(data []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) { stTestWrite(t, dir, SingleWeightsFile, data) }
	}
	header := func(h string, n int) func(t *testing.T, dir string) {
		return single(stTestRaw(h, abData[:n]))
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  []string // substrings of the error, besides "loader: "
	}{
		{"truncated", single(good[:len(good)-3]),
			[]string{SingleWeightsFile, `tensor "model.norm.weight"`, "beyond end of file", "truncated?"}},
		{"truncated in header", single(good[:20]),
			[]string{SingleWeightsFile, "header length", "beyond end of file"}},
		{"shorter than 8 bytes", single([]byte{1, 2, 3}),
			[]string{SingleWeightsFile, "too short"}},
		{"empty file", single(nil),
			[]string{SingleWeightsFile, "too short"}},
		{"header length beyond file", single(append(binary.LittleEndian.AppendUint64(nil, goodHdrLen+1<<40), good[8:]...)),
			[]string{SingleWeightsFile, "header length", "beyond end of file"}},
		{"header length huge", single(append(binary.LittleEndian.AppendUint64(nil, ^uint64(0)), good[8:]...)),
			[]string{SingleWeightsFile, "header length"}},
		{"bad JSON", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]`, 24),
			[]string{SingleWeightsFile, "bad JSON header"}},
		{"not JSON", single(append(binary.LittleEndian.AppendUint64(nil, 8), []byte("PK\x03\x04abcdXXXX")...)),
			[]string{SingleWeightsFile, "not a safetensors file"}},
		{"header not an object", header(`[1, 2]`, 0),
			[]string{SingleWeightsFile, "not an object"}},
		{"offsets lie", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,20]}, "b": {"dtype": "F32", "shape": [6], "data_offsets": [20,48]}}`, 48),
			[]string{SingleWeightsFile, `tensor "a"`, "hold 20 bytes", "needs 24"}},
		{"offsets overlap", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}, "b": {"dtype": "F32", "shape": [6], "data_offsets": [16,40]}}`, 48),
			[]string{SingleWeightsFile, `tensor "b"`, `overlap tensor "a"'s`}},
		{"same offsets", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}, "b": {"dtype": "F32", "shape": [6], "data_offsets": [0,24]}}`, 24),
			[]string{SingleWeightsFile, `tensor "b"`, `overlap tensor "a"'s`}},
		{"begin after end", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [24,0]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "begin after end"}},
		{"hole", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}, "b": {"dtype": "F16", "shape": [6], "data_offsets": [36,48]}}`, 48),
			[]string{SingleWeightsFile, `tensor "b"`, "hole"}},
		{"hole at start", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [8,32]}}`, 32),
			[]string{SingleWeightsFile, `tensor "a"`, "hole"}},
		{"trailing bytes", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}}`, 32),
			[]string{SingleWeightsFile, `tensor "a"`, "8 bytes after"}},
		{"wrong dtype size", header(`{"a": {"dtype": "BF16", "shape": [2,3], "data_offsets": [0,24]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "hold 24 bytes", "BF16 [2 3] needs 12"}},
		{"unknown dtype", header(`{"a": {"dtype": "F8_E4M3", "shape": [2,3], "data_offsets": [0,6]}}`, 6),
			[]string{SingleWeightsFile, `tensor "a"`, "unknown dtype"}},
		{"negative shape", header(`{"a": {"dtype": "F32", "shape": [-2,3], "data_offsets": [0,24]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "bad shape"}},
		{"shape overflow", header(`{"a": {"dtype": "F32", "shape": [4294967296,4294967296], "data_offsets": [0,24]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "overflows"}},
		{"missing offsets", header(`{"a": {"dtype": "F32", "shape": [2,3]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "data_offsets"}},
		{"three offsets", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,12,24]}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, "data_offsets"}},
		{"extra key", header(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24], "x": 1}}`, 24),
			[]string{SingleWeightsFile, `tensor "a"`, `unknown key "x"`}},
		{"entry not object", header(`{"a": 7}`, 0),
			[]string{SingleWeightsFile, `tensor "a"`, "want an object"}},
		{"bad metadata", header(`{"__metadata__": {"n": 1}, "a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}}`, 24),
			[]string{SingleWeightsFile, "__metadata__"}},
		{"in index, not in shard", func(t *testing.T, dir string) {
			stTestWrite(t, dir, shard1, stTestBuild(stTestTensors[:2]))
			stTestWrite(t, dir, shard2, stTestBuild(stTestTensors[2:3]))
			stTestIndex(t, dir, map[string]string{
				stTestTensors[0].name: shard1, stTestTensors[1].name: shard1,
				stTestTensors[2].name: shard2, "model.layers.3.mlp.up_proj.weight": shard2})
		}, []string{shard2, `tensor "model.layers.3.mlp.up_proj.weight"`, "listed in model.safetensors.index.json but not in this file"}},
		{"shard missing", func(t *testing.T, dir string) {
			stTestWrite(t, dir, shard1, stTestBuild(stTestTensors[:2]))
			stTestIndex(t, dir, map[string]string{
				stTestTensors[0].name: shard1, stTestTensors[1].name: shard1,
				stTestTensors[2].name: shard2, stTestTensors[3].name: shard2})
		}, []string{shard2, "shard missing", `tensor "` + stTestTensors[2].name + `"`, "and 1 more"}},
		{"corrupt shard", func(t *testing.T, dir string) {
			stTestWrite(t, dir, shard1, stTestBuild(stTestTensors[:2]))
			b := stTestBuild(stTestTensors[2:4])
			stTestWrite(t, dir, shard2, b[:len(b)-1])
			stTestIndex(t, dir, map[string]string{
				stTestTensors[0].name: shard1, stTestTensors[1].name: shard1,
				stTestTensors[2].name: shard2, stTestTensors[3].name: shard2})
		}, []string{shard2, `tensor "` + stTestTensors[3].name + `"`, "truncated?"}},
		{"shard is a directory", func(t *testing.T, dir string) {
			stTestWrite(t, dir, shard1, stTestBuild(stTestTensors[:2]))
			os.Mkdir(filepath.Join(dir, shard2), 0o755)
			stTestIndex(t, dir, map[string]string{
				stTestTensors[0].name: shard1, stTestTensors[1].name: shard1,
				stTestTensors[2].name: shard2, stTestTensors[3].name: shard2})
		}, []string{shard2, "a directory, not a regular file"}},
		{"shard a link to nothing", func(t *testing.T, dir string) {
			stTestWrite(t, dir, shard1, stTestBuild(stTestTensors[:2]))
			os.Symlink("blobs/gone", filepath.Join(dir, shard2))
			stTestIndex(t, dir, map[string]string{
				stTestTensors[0].name: shard1, stTestTensors[1].name: shard1,
				stTestTensors[2].name: shard2, stTestTensors[3].name: shard2})
		}, []string{shard2, "a symbolic link to blobs/gone, which leads to no file"}},
		{"weights file is a directory", func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, SingleWeightsFile), 0o755)
		}, []string{SingleWeightsFile, "a directory, not a regular file"}},
		{"weights file a link to nothing", func(t *testing.T, dir string) {
			os.Symlink("blobs/gone", filepath.Join(dir, SingleWeightsFile))
		}, []string{SingleWeightsFile, "a symbolic link to blobs/gone, which leads to no file"}},
		{"index is a directory", func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, WeightsIndexFile), 0o755)
		}, []string{WeightsIndexFile, "a directory, not a regular file"}},
		{"index bad JSON", func(t *testing.T, dir string) {
			stTestWrite(t, dir, WeightsIndexFile, []byte(`{"weight_map": {`))
		}, []string{WeightsIndexFile, "bad JSON"}},
		{"index empty", func(t *testing.T, dir string) {
			stTestWrite(t, dir, WeightsIndexFile, []byte(`{"metadata": {}}`))
		}, []string{WeightsIndexFile, "weight_map"}},
		{"index escapes", func(t *testing.T, dir string) {
			stTestIndex(t, dir, map[string]string{"a": "../model.safetensors"})
		}, []string{WeightsIndexFile, `tensor "a"`, "../model.safetensors"}},
		{"no weights", func(t *testing.T, dir string) {}, []string{SingleWeightsFile, WeightsIndexFile}},
		{"only .bin", func(t *testing.T, dir string) {
			stTestWrite(t, dir, "pytorch_model.bin", []byte("x"))
		}, []string{"pytorch_model.bin", "only safetensors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			w, err := OpenWeights(dir)
			if err == nil {
				w.Close()
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "loader: ") || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line starting with loader:", msg)
			}
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q: want %q in it", msg, want)
				}
			}
			t.Log(msg)
		})
	}
}

// stDeserialize runs the safetensors library over a whole file, turning a
// panic into an error: the reference the header checks are held to.
func stDeserialize(data []byte) (st safetensors.SafeTensors, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return safetensors.Deserialize(data)
}

// stLibraryAgrees fails unless the safetensors library accepts a file the
// header checks accepted as hdr, with the same tensors at the same bytes.
func stLibraryAgrees(t *testing.T, data []byte, hdr *stHeader) {
	t.Helper()
	st, err := stDeserialize(data)
	if err != nil {
		t.Fatalf("header checks pass but the library fails: %v", err)
	}
	if st.Len() != len(hdr.entries) {
		t.Fatalf("the library sees %d tensors, the header checks %d", st.Len(), len(hdr.entries))
	}
	for name, e := range hdr.entries {
		view, ok := st.Tensor(name)
		start := hdr.dataStart + e.begin
		if !ok || int64(len(view.Data())) != e.end-e.begin ||
			(len(view.Data()) > 0 && unsafe.SliceData(view.Data()) != &data[start]) {
			t.Fatalf("tensor %q: the library disagrees with the header checks", name)
		}
	}
}

// TestStParseHeaderNeverPanics throws every prefix and many byte flips of
// a valid file at the header checks and the library behind them.
func TestStParseHeaderNeverPanics(t *testing.T) {
	good := stTestBuild(stTestTensors)
	try := func(b []byte) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic on %q: %v", b, r)
			}
		}()
		if len(b) < 8 {
			return
		}
		if hdr, err := stParseHeader(b); err == nil {
			stLibraryAgrees(t, b, hdr)
		}
	}
	for n := 0; n <= len(good); n++ {
		try(good[:n])
	}
	hdrEnd := 8 + int(binary.LittleEndian.Uint64(good[:8]))
	for i := 0; i < hdrEnd; i++ {
		for _, x := range []byte{'0', '9', '-', '"', '}', 0xff, 0} {
			b := bytes.Clone(good)
			b[i] = x
			try(b)
		}
	}
}

// FuzzStParseHeader: no input makes the header checks or the library panic,
// and the library accepts every file the checks accept, with the same
// tensors at the same bytes.
func FuzzStParseHeader(f *testing.F) {
	f.Add(stTestBuild(stTestTensors))
	f.Add(stTestBuild(stTestTensors[:1]))
	f.Add(stTestRaw(`{"a": {"dtype": "F32", "shape": [2,3], "data_offsets": [0,24]}}`, make([]byte, 24)))
	f.Add(stTestRaw(`{}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 8 {
			return
		}
		if hdr, err := stParseHeader(b); err == nil {
			stLibraryAgrees(t, b, hdr)
		}
	})
}

// The header checks and the views OpenWeights slices agree with the
// safetensors library on every bundled checkpoint file.
func TestStLibraryAgreesOnFixtures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "models", "*", "*.safetensors"))
	if len(files) == 0 {
		t.Skip("no bundled checkpoints")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		hdr, err := stParseHeader(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		stLibraryAgrees(t, b, hdr)
	}
}
