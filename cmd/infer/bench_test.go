package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kbench"
	"github.com/fuselm/fuselm/report"
)

// TestBenchUsage: every bad command line of infer bench is one line and
// exit 2, before any device is opened.
func TestBenchUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "flash"}, `no benchmark for op "flash"`},
		{[]string{"bench", "--shape", "N=4"}, "--shape needs the op(s)"},
		{[]string{"bench", "rms_norm", "--shape", "M=4"}, "lacks N"},
		{[]string{"bench", "rms_norm", "--shape", "M=4,N=x"}, "not a whole number"},
		{[]string{"bench", "rms_norm", "attn_decode", "--shape", "M=4,N=8"}, "attn_decode: shape M=4,N=8 lacks B"},
		{[]string{"bench", "--json", "--csv"}, "at most one of --json and --csv"},
		{[]string{"bench", "--arch", "sm_90a"}, "--arch names the target of a --dry-run"},
		{[]string{"bench", "--dry-run", "--arch", "sm_99"}, `--arch "sm_99": known targets are`},
		{[]string{"bench", "--dry-run", "--optimize"}, "cannot --optimize"},
		{[]string{"bench", "--dry-run", "--cupti", "--arch", "sm_90a"}, "no kernels for --cupti"},
		{[]string{"bench", "--sets", "turbo"}, `kernel set "turbo" is not built`},
		{[]string{"bench", "--device", "tpu"}, "--device must be cpu or cuda"},
		{[]string{"bench", "--groups", "0"}, "--groups must be at least 1, not 0"},
		{[]string{"bench", "--dry-run", "--arch", "sm_90a", "--groups", "20"}, "no --groups to time"},
		{[]string{"bench", "--variants", "wgmma,"}, `--variants: an empty name in "wgmma,"`},
		{[]string{"bench", "--dry-run", "--arch", "sm_90a", "attn_prefill", "--variants", "w9_m9"}, `no set offers a variant "w9_m9"`},
		{[]string{"bench", "--dry-run", "--arch", "sm_90a", "rms_norm", "--variants", "wgmma"}, "no set offers a choice of variants"},
		{[]string{"bench", "--device", "cpu", "rms_norm"}, "--device cpu needs --shape"},
		{[]string{"bench", "--device", "cpu", "--sets", "naive", "rms_norm", "--shape", "M=4,N=8"}, "naive runs on cuda, not on the cpu device"},
		{[]string{"bench", "--device", "cpu", "--optimize", "rms_norm", "--shape", "M=4,N=8", "--quiet"}, "--optimize keeps choices for a CUDA device"},
	} {
		code, stdout, stderr := runInfer(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("infer %s: exit %d, stderr %q, want exit 2 and one line with %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
		if strings.Contains(strings.Join(c.args, " "), "--optimize") {
			continue // it runs the benchmark first, then refuses to keep it
		}
		if stdout != "" {
			t.Errorf("infer %s: stdout %q", strings.Join(c.args, " "), stdout)
		}
	}
}

// TestBenchDryRun lists the CUDA sets' variants on sm_90a with no GPU.
func TestBenchDryRun(t *testing.T) {
	code, stdout, stderr := runInfer(t, "bench", "--dry-run", "--arch", "sm_90a", "attn_prefill",
		"--shape", "B=1,H=28,KVH=4,D=128,N=4096,causal=1", "--sets", "fused,naive")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// Every op with a benchmark has a fused kernel now: the rows of a set
	// that falls back are kernels/kbench's to test.
	_, linear, _ := runInfer(t, "bench", "--dry-run", "--arch", "sm_90a", "linear")
	_, mla, _ := runInfer(t, "bench", "--dry-run", "--arch", "sm_90a", "mla_decode")
	stdout += linear + mla
	for _, want := range []string{"dry run for sm_90a (132 SMs, 227 KiB", "fused  w4_m1", " w4_m2    yes", "shared=98304", "naive  default",
		"fused  skinny", "fused  latent_split"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run lacks %q:\n%s", want, stdout)
		}
	}
	// --variants leaves out the other tilings of a set that has several,
	// and nothing of a set that has one.
	_, picked, _ := runInfer(t, "bench", "--dry-run", "--arch", "sm_90a", "attn_prefill",
		"--shape", "B=1,H=28,KVH=4,D=128,N=4096,causal=1", "--sets", "fused,naive", "--variants", "wgmma")
	if !strings.Contains(picked, "fused  wgmma") || !strings.Contains(picked, "naive  default") || strings.Contains(picked, "w4_m2") {
		t.Errorf("--variants wgmma:\n%s", picked)
	}
	_, stdout, _ = runInfer(t, "bench", "--dry-run", "--arch", "sm_80", "attn_prefill", "--shape", "B=1,H=8,KVH=8,D=48,N=64,causal=0", "--json")
	m := checkDocument(t, stdout, false) // --arch names no device
	if tg, _ := m["target"].(map[string]any); tg["arch"] != "sm_80" || tg["sms"] != 108.0 {
		t.Errorf("target %v", m["target"])
	}
	var doc report.DryRun
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	fusedRows := 0
	for _, o := range doc.Offers {
		for _, v := range o.Variants {
			if o.Set == "fused" {
				fusedRows++
				if v.Valid || v.Reason == nil || !strings.Contains(*v.Reason, "head dim 48") || v.Params == "" {
					t.Errorf("fused %s at D=48: %+v", v.Name, v)
				}
			}
			if o.Set == "naive" && (!v.Valid || v.Reason != nil) {
				t.Errorf("naive at D=48: %+v", v)
			}
		}
	}
	if fusedRows == 0 {
		t.Errorf("no fused rows: %+v", doc)
	}
	// CSV: valid and the reason apart.
	_, stdout, _ = runInfer(t, "bench", "--dry-run", "--arch", "sm_80", "attn_prefill", "--shape", "B=1,H=8,KVH=8,D=48,N=64,causal=0", "--csv")
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if err != nil || strings.Join(recs[0], ",") != "op,shape,set,variant,params,valid,reason" {
		t.Fatalf("--csv: %v %q", err, stdout)
	}
	for _, r := range recs[1:] {
		if (r[2] == "fused") != (r[5] == "false" && strings.Contains(r[6], "head dim 48")) || (r[2] == "naive" && (r[5] != "true" || r[6] != "")) {
			t.Errorf("--csv row %q", r)
		}
	}
}

// The dry run at the default shapes fits a wide terminal: a table per op,
// every column headed, no line over 160 columns, every variant and
// parameter there (wrapped).
func TestBenchDryRunWidth(t *testing.T) {
	for _, arch := range targetNames() {
		code, stdout, stderr := runInfer(t, "bench", "--dry-run", "--arch", arch)
		if code != exitOK {
			t.Fatalf("--arch %s: exit %d: %s", arch, code, stderr)
		}
		lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
		for i, l := range lines {
			if n := utf8.RuneCountInString(l); n > 160 {
				t.Errorf("--arch %s: line %d is %d columns wide: %q", arch, i+1, n, l)
			}
		}
		for _, op := range benchOps() {
			if strings.Count(stdout, "\n"+op+"\n") != 1 {
				t.Errorf("--arch %s: op %s has not one table", arch, op)
			}
		}
		if heads := strings.Count(stdout, "  shape "); heads != len(benchOps()) ||
			strings.Count(stdout, "set    variant") != heads || strings.Count(stdout, "valid  parameters, or why not valid") != heads {
			t.Errorf("--arch %s: %d tables headed shape, set, variant, valid, parameters:\n%.2000s", arch, heads, stdout)
		}
		// Every word of every parameter list is in the table.
		_, js, _ := runInfer(t, "bench", "--dry-run", "--arch", arch, "--json")
		var doc report.DryRun
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(stdout), " ")
		for _, o := range doc.Offers {
			for _, v := range o.Variants {
				if v.Valid && !strings.Contains(text, strings.Join(strings.Fields(v.Params), " ")) {
					t.Errorf("--arch %s: %s %s %s: params %q not in the table", arch, o.Op, o.Set, v.Name, v.Params)
				}
			}
		}
	}
	// Not a terminal: the full width; a narrower width wraps more.
	if w := tableWidth(&bytes.Buffer{}); w != dryRunWidth {
		t.Errorf("table width %d off a terminal", w)
	}
	var narrow bytes.Buffer
	_, js, _ := runInfer(t, "bench", "--dry-run", "--arch", "sm_90a", "attn_prefill", "--json")
	var doc report.DryRun
	json.Unmarshal([]byte(js), &doc)
	if err := doc.Write(&narrow, report.AsTables, minTableWidth); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimRight(narrow.String(), "\n"), "\n") {
		if n := utf8.RuneCountInString(l); n > 110 { // the prefix, and 30 columns of parameters at least
			t.Errorf("at %d columns, a line of %d: %q", minTableWidth, n, l)
		}
	}
}

// TestBenchOnCPU runs two ops on the cpu device: a table per op, CSV, JSON
// and a plot.
func TestBenchOnCPU(t *testing.T) {
	args := []string{"bench", "--device", "cpu", "--quiet", "rms_norm", "add_rms_norm", "--shape", "M=8,N=64", "--shape", "M=16,N=64"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"\nrms_norm\n", "\nadd_rms_norm\n", "M=16,N=64", "is the reference", "copy not measured", "memory",
		"the median of 7 groups of calls", "  ±  "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q:\n%s", want, stdout)
		}
	}
	_, stdout, _ = runInfer(t, append(args, "--csv")...)
	if lines := strings.Split(strings.TrimSpace(stdout), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[0], "op,shape,set,variant,ms,ms_min,ms_max,ms_rel_stddev,") {
		t.Errorf("--csv: %q", stdout)
	}
	_, stdout, _ = runInfer(t, append(args, "--json", "--groups", "4")...)
	m := checkDocument(t, stdout, true)
	// Not measured on the cpu: null, not 0.
	for _, k := range []string{"copy_bytes_per_s", "matrix_flop_per_s", "note", "tuned"} {
		if v, ok := m[k]; !ok || v != nil {
			t.Errorf("%s: %v (present %v), want null", k, v, ok)
		}
	}
	row0 := m["rows"].([]any)[0].(map[string]any)
	for _, k := range []string{"floor_ms", "share_of_floor", "kernels", "error", "ms_without_kv_append"} {
		if v, ok := row0[k]; !ok || v != nil {
			t.Errorf("row %s: %v (present %v), want null", k, v, ok)
		}
	}
	var rep kbench.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || len(rep.Rows) != 4 || rep.Rows[0].Ms <= 0 || rep.Groups != 4 {
		t.Errorf("--json: %v, %+v", err, rep)
	}
	for _, r := range rep.Rows {
		if sp := r.Spread; sp.N != 4 || sp.Median != r.Ms || sp.Min > sp.Median || sp.Max < sp.Median || sp.StdDev == nil {
			t.Errorf("%s %s: spread %+v, ms %v", r.Op, r.Shape, sp, r.Ms)
		}
	}
	plot := filepath.Join(t.TempDir(), "bench.png")
	if code, _, stderr := runInfer(t, append(args, "--plot", plot)...); code != exitOK {
		t.Fatalf("--plot: exit %d: %s", code, stderr)
	}
	data, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil || img.Bounds().Dx() < 500 {
		t.Errorf("the plot is not a PNG of two panels: %v", err)
	}
	if code, _, stderr := runInfer(t, append(args, "--plot", t.TempDir())...); code != exitError || !strings.Contains(stderr, "directory") {
		t.Errorf("--plot at a directory: exit %d, %q", code, stderr)
	}
	// With no GPU and no --device, bench says so (an error of the machine,
	// not of the command line).
	if cuda.Probe() == nil {
		return
	}
	if code, _, stderr := runInfer(t, "bench", "rms_norm", "--quiet"); code != exitError || !strings.Contains(stderr, "finds no GPU") {
		t.Errorf("bench without a GPU: exit %d, %q", code, stderr)
	}
}

// With --cupti on the cpu device, which traces no kernels, bench times the
// rows and says once, in the table and in the JSON, that it traced none.
func TestBenchCUPTIOnCPU(t *testing.T) {
	args := []string{"bench", "--device", "cpu", "--quiet", "--cupti", "rms_norm", "--shape", "M=8,N=64"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if strings.Count(stdout, "kernels not traced: cpu") != 1 || strings.Contains(stdout, "top kernel") || !strings.Contains(stdout, "is the reference") {
		t.Errorf("tables:\n%s", stdout)
	}
	// CSV has no place for the note: it goes to stderr, unless --quiet.
	loud := []string{"bench", "--device", "cpu", "--cupti", "--csv", "rms_norm", "--shape", "M=8,N=64"}
	if _, stdout, stderr := runInfer(t, loud...); !strings.Contains(stderr, "bench: kernels not traced: cpu") || strings.Contains(stdout, "not traced") {
		t.Errorf("--csv: stdout %q, stderr %q", stdout, stderr)
	}
	_, stdout, _ = runInfer(t, append(args, "--json")...)
	var rep kbench.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || !strings.Contains(rep.Note, "records no kernels") ||
		len(rep.Rows) != 1 || rep.Rows[0].Kernels != nil || !(rep.Rows[0].Ms > 0) {
		t.Errorf("--json: %v, %+v", err, rep)
	}
}
