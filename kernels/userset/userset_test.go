package userset

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	_ "github.com/fuselm/fuselm/kernels/naive" // the baseline the sets fall back to
)

// Every example's manifest reads, and the one written for another ABI is
// refused in one line.
func TestExampleManifests(t *testing.T) {
	for dir, ops := range map[string]string{
		"rms_norm_cuda": "rms_norm", "swiglu_ptx": "swiglu", "rope_simple": "rope",
		"attention_simple": "attn_decode attn_prefill",
	} {
		m, ks, err := ReadManifest(filepath.Join(examples, dir))
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		var got []string
		for _, k := range ks {
			got = append(got, string(k.op))
		}
		if strings.Join(got, " ") != ops || m.ABI != ABIVersion {
			t.Errorf("%s: ops %v, abi %d; want %s, %d", dir, got, m.ABI, ops, ABIVersion)
		}
	}
	_, _, err := ReadManifest(filepath.Join(examples, "broken", "wrong_abi"))
	want := "fuselm.json: kernels written for ABI 2; this fuselm calls kernels through ABI 1"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("wrong_abi: %v, want one line with %q", err, want)
	}
}

// A manifest's mistakes are each one line saying what and where.
func TestManifestErrors(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"k.cu", "k.ptx", "k.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	op := func(body string) string { return `{"abi": 1, "name": "mine", "ops": {` + body + `}}` }
	for _, c := range []struct{ manifest, want string }{
		{`{"name": "mine", "ops": {}}`, `states no "abi" (this fuselm calls kernels through ABI 1)`},
		{`{"abi": 3, "name": "mine"}`, "kernels written for ABI 3; this fuselm calls kernels through ABI 1"},
		{`{"abi": 1, "name": "My Set", "ops": {}}`, `"name" "My Set": want a set name`},
		{`{"abi": 1, "name": "mine", "ops": {}}`, `"ops" names no op`},
		{"{\"abi\": 1,\n \"name\": \"mine\",,\n}", "line 2: invalid character ','"},
		{op(`"rms_norm": {"file": "k.cu", "entry": "k", "blocks": 128}`), `unknown field "blocks"`},
		{op(`"linear": {"file": "k.cu", "entry": "k"}`), "ops.linear: not an op a kernel may replace in ABI 1 (rms_norm, add_rms_norm, rope, swiglu, attn_prefill, attn_decode)"},
		{op(`"rms_norm": {"file": "gone.cu", "entry": "k"}`), "ops.rms_norm: file " + filepath.Join(dir, "gone.cu") + ": no such file"},
		{op(`"rms_norm": {"file": "k.txt", "entry": "k"}`), "ops.rms_norm: file k.txt: want a .cu, .ptx or .cubin file"},
		{op(`"rms_norm": {"file": "k.cu"}`), `ops.rms_norm: needs "file" and "entry"`},
		{op(`"rms_norm": {"file": "k.cu", "entry": "k", "block": 2048}`), "ops.rms_norm: block 2048: want 1 to 1024 threads"},
		{op(`"rms_norm": {"file": "k.cu", "entry": "k", "grid": "tokens"}`), `ops.rms_norm: grid: "tokens" at column 1: unknown size "tokens" (this op's: rows, cols, block, sms)`},
		{op(`"rope": {"file": "k.cu", "entry": "k", "grid": "cdiv(pairs)"}`), "cdiv takes 2 arguments, got 1"},
		{op(`"swiglu": {"file": "k.cu", "entry": "k", "grid": "1, 2, 3, 4"}`), "4 expressions, at most 3"},
		{op(`"attn_decode": {"file": "k.cu", "entry": "k", "shared": "max_keys*4"}`), `shared: "max_keys*4" at column 1: unknown size "max_keys"`},
		{op(`"attn_decode": {"file": "k.cu", "entry": "k", "shared": true}`), "shared is true: want a number of bytes or an expression string"},
		{op(`"swiglu": {"file": "k.cu", "entry": "k", "weights": "f32"}`), `ops.swiglu: "weights": swiglu takes no weights`},
		{op(`"rms_norm": {"file": "k.cu", "entry": "k", "weights": "f8"}`), `"weights" "f8": want bf16, f16 or f32`},
		{op(`"swiglu": {"file": "k.ptx", "entry": "k", "options": ["-DX=1"]}`), `"options" are NVRTC's, for a .cu file`},
	} {
		if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte(c.manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := ReadManifest(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") ||
			!strings.HasPrefix(err.Error(), filepath.Join(dir, ManifestName)+": ") {
			t.Errorf("%s:\n got %v\nwant one line naming the manifest and %q", c.manifest, err, c.want)
		}
	}
	if _, _, err := ReadManifest(t.TempDir()); err == nil || !strings.Contains(err.Error(), "has no fuselm.json") {
		t.Errorf("a directory without a manifest: %v", err)
	}
}

// Grid and shared memory expressions: C's precedence, the three functions,
// and errors for what cannot be evaluated.
func TestExpr(t *testing.T) {
	env := map[string]int64{"rows": 7, "cols": 4096, "block": 256, "sms": 132}
	for src, want := range map[string][]int64{
		"rows":                      {7},
		"cdiv(rows*cols, block)":    {112},
		"1 + 2 * 3 - -4":            {11},
		"(1 + 2) * 3 % 5":           {4},
		"min(rows, 4), max(sms, 1)": {4, 132},
		"cols / block / 2, 1, rows": {8, 1, 7},
	} {
		es, err := parseExprs(src, 3, []string{"rows", "cols", "block", "sms"})
		if err != nil {
			t.Errorf("%q: %v", src, err)
			continue
		}
		for i, e := range es {
			if v, err := e.eval(env); err != nil || v != want[i] {
				t.Errorf("%q [%d] = %d, %v; want %d", src, i, v, err, want[i])
			}
		}
	}
	for src, want := range map[string]string{
		"rows / (cols - 4096)": "division by zero",
		"cdiv(rows, 0)":        "cdiv by 0",
	} {
		es, err := parseExprs(src, 1, []string{"rows", "cols"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := es[0].eval(env); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	for _, src := range []string{"", "rows +", "(rows", "rows rows", "exp(rows)", "99999999999", "rows; 1"} {
		if _, err := parseExprs(src, 3, []string{"rows"}); err == nil {
			t.Errorf("%q parses", src)
		}
	}
}

// nvrtcLog is NVRTC 12.4's log for examples/kernels/broken/compile_error,
// as TestExamplesCompile records it.
const nvrtcLog = `dir/rms_norm.cu(9): error: identifier "rstd" is undefined
  	out[blockIdx.x * out_pitch] = __float2bfloat16_rn(rstd);
  	                                                  ^

dir/rms_norm.cu(8): warning #177-D: variable "rsdt" was declared but never referenced
  	const float rsdt = 1.0f;
  	            ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

1 error detected in the compilation of "dir/rms_norm.cu".
`

// NVRTC's messages become file:line: text, with the source line and caret
// kept and the blank lines and the closing count dropped.
func TestFormatLog(t *testing.T) {
	want := `dir/rms_norm.cu:9: error: identifier "rstd" is undefined
  	out[blockIdx.x * out_pitch] = __float2bfloat16_rn(rstd);
  	                                                  ^
dir/rms_norm.cu:8: warning #177-D: variable "rsdt" was declared but never referenced
  	const float rsdt = 1.0f;
  	            ^
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"`
	if got := formatLog(nvrtcLog); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	e := &CompileError{Op: "rms_norm", File: "dir/rms_norm.cu", Log: formatLog(nvrtcLog)}
	if first := strings.SplitN(e.Error(), "\n", 2)[0]; first != "rms_norm: dir/rms_norm.cu does not compile:" {
		t.Errorf("first line %q", first)
	}
}

// A PTX file is checked before the driver sees it: its entry point, and
// its parameters against the op's ABI.
func TestCheckPTX(t *testing.T) {
	for dir, want := range map[string]string{
		"swiglu_ptx":             "",
		"broken/missing_entry":   `no entry point "swiglu_kernel" (the PTX defines swiglu_entry)`,
		"broken/wrong_signature": "entry swiglu_ptx takes 5 parameters; ABI 1's swiglu kernel takes 6",
	} {
		_, ks, err := ReadManifest(filepath.Join(examples, dir))
		if err != nil {
			t.Fatal(err)
		}
		img, err := os.ReadFile(ks[0].path)
		if err != nil {
			t.Fatal(err)
		}
		err = checkImage(ks[0], img)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", dir, err, want)
		}
	}
	k := kernel{op: kernels.OpSwiGLU, abi: abi[3], kind: "ptx", spec: KernelSpec{Entry: "k"}}
	ptx := ".visible .entry k(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 d, .param .u32 e, .param .u32 f)"
	if err := checkImage(k, []byte(ptx)); err == nil || !strings.Contains(err.Error(), "parameter 2 is .u64; ABI 1's swiglu kernel takes int out_pitch there") {
		t.Errorf("a parameter of the wrong size: %v", err)
	}
}

// A loaded directory is a kernel set like the built-in ones: a spec names
// it, it owns its manifest's ops and falls back to naive for the others;
// loading it again replaces it, and a built-in set's name is refused.
func TestLoad(t *testing.T) {
	name, err := Load(filepath.Join(examples, "rms_norm_cuda"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unload(name) })
	info, ok := kernels.Set(name)
	if name != "my_rms" || !ok || info.Device != "cuda" || !info.Owns(kernels.OpRMSNorm) || info.Owns(kernels.OpSwiGLU) {
		t.Fatalf("set %q: %+v", name, info)
	}
	spec, err := kernels.ParseSpec("naive,rms_norm=my_rms")
	if err != nil {
		t.Fatal(err)
	}
	if spec.Runner(kernels.OpRMSNorm) != "my_rms" || spec.Runner(kernels.OpSwiGLU) != "naive" || kernels.FallbackOf("my_rms") != "naive" {
		t.Errorf("runners: rms_norm %s, swiglu %s, fallback %s", spec.Runner(kernels.OpRMSNorm), spec.Runner(kernels.OpSwiGLU), kernels.FallbackOf("my_rms"))
	}
	if _, err := Load(filepath.Join(examples, "rms_norm_cuda")); err != nil {
		t.Errorf("loading again: %v", err)
	}
	// An rms_norm without an add_rms_norm runs at every norm: add_rms_norm
	// is fuselm's residual add, then the user's rms_norm.
	v := info.VariantsOf(kernels.OpRMSNorm, nil, kernels.Targets["sm_90a"])
	if len(v) != 1 || !v[0].Valid() || v[0].Params != `file=rms_norm.cu entry=rms_norm_rowwise block=256 grid="rows" shared="0"` {
		t.Errorf("rms_norm's variants %+v", v)
	}
	if got := Owned("my_rms"); len(got) != 2 || got[0] != kernels.OpRMSNorm || got[1] != kernels.OpAddRMSNorm {
		t.Errorf("Owned = %v", got)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "k.cu"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"abi": 1, "name": "naive", "ops": {"rms_norm": {"file": "k.cu", "entry": "k"}}}`), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), `"naive" is the name of a kernel set of this build`) {
		t.Errorf("a built-in set's name: %v", err)
	}
	os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"abi": 1, "name": "my_rms", "ops": {"rms_norm": {"file": "k.cu", "entry": "k"}}}`), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), `kernel set "my_rms" is loaded already, from `) {
		t.Errorf("a name another directory has: %v", err)
	}
	if _, err := info.New(cpu.NewDevice()); err == nil || !strings.Contains(err.Error(), "runs on CUDA devices, not cpu") {
		t.Errorf("built on the cpu device: %v", err)
	}
}

// A set whose check fails is refused in one line that names the op, its
// file and entry, the case and the failure.
func TestRefusal(t *testing.T) {
	ks := []kernel{
		{op: kernels.OpRMSNorm, path: "d/rms.cu", spec: KernelSpec{Entry: "rms"}},
		{op: kernels.OpSwiGLU, path: "d/swiglu.ptx", spec: KernelSpec{Entry: "sw"}},
	}
	rep := kerneltest.Report{Cases: 9, Failures: []kerneltest.Failure{
		{Case: "swiglu/N=3,I=17", Msg: "out: relative error 0.5 > 0.02 (largest difference 3 at [1,2]: got 1, want 4)"},
		{Case: "swiglu/N=64,I=8", Msg: "out: relative error 0.4 > 0.02"},
	}}
	want := "fails its check and is not timed: swiglu (d/swiglu.ptx, entry sw): case swiglu/N=3,I=17: out: relative error 0.5 > 0.02 (largest difference 3 at [1,2]: got 1, want 4) (and 1 more failure(s))"
	if err := refusal("mine", ks, rep); err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	rep.Failures = []kerneltest.Failure{{Case: "add_rms_norm/x", Msg: "out: relative error 1 > 0.02"}}
	want = "fails its check and is not timed: add_rms_norm (the residual add, then rms_norm's d/rms.cu, entry rms): case add_rms_norm/x: out: relative error 1 > 0.02"
	if err := refusal("mine", ks, rep); err == nil || err.Error() != want {
		t.Errorf("a composed add_rms_norm:\ngot  %v\nwant %s", err, want)
	}
	if err := refusal("mine", ks, kerneltest.Report{Cases: 3}); err != nil {
		t.Errorf("no failures: %v", err)
	}
}

// The watchdog's bound comes from FUSELM_WATCHDOG.
func TestWatchdogEnv(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	if d, err := watchdog(env("")); err != nil || d != DefaultWatchdog {
		t.Errorf("unset: %v, %v", d, err)
	}
	if d, err := watchdog(env("off")); err != nil || d != 0 {
		t.Errorf("off: %v, %v", d, err)
	}
	if d, err := watchdog(env("5s")); err != nil || d.Seconds() != 5 {
		t.Errorf("5s: %v, %v", d, err)
	}
	if _, err := watchdog(env("soon")); err == nil || !strings.Contains(err.Error(), `FUSELM_WATCHDOG="soon"`) {
		t.Errorf("soon: %v", err)
	}
}

// The ABI is written in three places that must agree: the launchers'
// table here, fuselm.cuh's macros, and docs/KERNEL_ABI.md.
func TestABIDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "KERNEL_ABI.md"))
	if err != nil {
		t.Fatal(err)
	}
	hdr := strings.Join(strings.Fields(strings.ReplaceAll(header, "\\\n", " ")), " ")
	if !strings.Contains(hdr, fmt.Sprintf("#define FUSELM_ABI_VERSION %d", ABIVersion)) {
		t.Errorf("fuselm.cuh does not define FUSELM_ABI_VERSION %d", ABIVersion)
	}
	for _, a := range abi {
		if sig := a.signature("kernel"); !strings.Contains(string(doc), "    "+sig+"\n") {
			t.Errorf("docs/KERNEL_ABI.md lacks %s's signature:\n%s", a.op, sig)
		}
		macro := "#define " + a.macro + "(name) " + a.signature("name")
		if !strings.Contains(hdr, macro) {
			t.Errorf("fuselm.cuh's %s is not\n%s", a.macro, macro)
		}
	}
}
