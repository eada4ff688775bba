package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kbench"
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
		{[]string{"bench", "--sets", "turbo"}, `kernel set "turbo" is not built`},
		{[]string{"bench", "--device", "tpu"}, "--device must be cpu or cuda"},
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
	for _, want := range []string{"dry run for sm_90a (132 SMs, 227 KiB", "fused  w4_m2", "shared=98304", "naive  default",
		"fused  skinny", "fused  latent_split"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run lacks %q:\n%s", want, stdout)
		}
	}
	_, stdout, _ = runInfer(t, "bench", "--dry-run", "--arch", "sm_80", "attn_prefill", "--shape", "B=1,H=8,KVH=8,D=48,N=64,causal=0", "--json")
	var doc struct {
		Offers []kbench.Offer `json:"offers"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	for _, o := range doc.Offers {
		for _, v := range o.Variants {
			if o.Set == "fused" && !strings.Contains(v.Why, "head dim 48") {
				t.Errorf("fused %s at D=48: %+v", v.Name, v)
			}
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
	for _, want := range []string{"\nrms_norm\n", "\nadd_rms_norm\n", "M=16,N=64", "is the reference", "copy not measured", "memory"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q:\n%s", want, stdout)
		}
	}
	_, stdout, _ = runInfer(t, append(args, "--csv")...)
	if lines := strings.Split(strings.TrimSpace(stdout), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[0], "op,shape,set,variant,ms") {
		t.Errorf("--csv: %q", stdout)
	}
	_, stdout, _ = runInfer(t, append(args, "--json")...)
	var rep kbench.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || len(rep.Rows) != 4 || rep.Rows[0].Ms <= 0 {
		t.Errorf("--json: %v, %+v", err, rep)
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
