package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/measure"
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/report"
)

// withTestSets registers, until the test ends, two kernel sets of the cpu
// device for compare's tests: cpu_slow owns rope and swiglu and sleeps in
// swiglu (so that cpu runs faster), cpu_wrong owns rms_norm and
// add_rms_norm and doubles their output (a kernel that is fast and wrong).
// Both run the cpu set's kernels otherwise.
func withTestSets(t *testing.T) {
	t.Helper()
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "cpu_slow", Device: "cpu", Own: []kernels.Op{kernels.OpRoPE, kernels.OpSwiGLU}, Fallback: "cpu",
		New: func(dev kernels.Device) (kernels.Ops, error) {
			ops, err := cpuSet.New(dev)
			return slowOps{ops}, err
		}})
	kernels.Register(kernels.SetInfo{Name: "cpu_wrong", Device: "cpu", Own: []kernels.Op{kernels.OpRMSNorm, kernels.OpAddRMSNorm}, Fallback: "cpu",
		New: func(dev kernels.Device) (kernels.Ops, error) {
			ops, err := cpuSet.New(dev)
			return wrongOps{Ops: ops, dev: dev}, err
		}})
	t.Cleanup(func() {
		kernels.Unregister("cpu_slow")
		kernels.Unregister("cpu_wrong")
	})
}

type slowOps struct{ kernels.Ops }

func (o slowOps) SwiGLU(out, gateUp *kernels.Tensor) {
	time.Sleep(200 * time.Microsecond)
	o.Ops.SwiGLU(out, gateUp)
}

type wrongOps struct {
	kernels.Ops
	dev kernels.Device
}

func (o wrongOps) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	o.Ops.RMSNorm(out, x, w, eps)
	o.Ops.Add(out, out, out)
}

func (o wrongOps) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	o.Ops.AddRMSNorm(out, resid, x, w, eps)
	o.Ops.Add(out, out, out)
}

func compareArgs(extra ...string) []string {
	return append([]string{"compare", "--model", tinyQwen, "--prompt", "hello there", "--max-new-tokens", "4", "--min-new-tokens", "4",
		"--batch", "2", "--quiet"}, extra...)
}

// compare runs the baseline, the candidate and both ablations of each op
// that differs on weights loaded once; every variant passes the check; the
// text, the JSON and the plot are written.
func TestCompareOnCPU(t *testing.T) {
	withTestSets(t)
	dir := t.TempDir()
	plotPath := filepath.Join(dir, "c.png")
	args := compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--plot", plotPath, "--repeat", "2")
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, stderr, stdout)
	}
	code, jsonOut, stderr := runInfer(t, append(args, "--json")...)
	if code != exitOK || stderr != "" {
		t.Fatalf("--json --quiet: exit %d, stderr %q", code, stderr)
	}
	checkDocument(t, jsonOut, true)
	var rep report.Compare
	if err := json.Unmarshal([]byte(jsonOut), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v", err)
	}
	var roles []string
	for _, v := range rep.Variants {
		roles = append(roles, v.Role)
		if !v.OK || v.SameTokens != 4 || v.LogitsRelErr != 0 || v.Memory == nil || len(v.RunsWallS) != 2 || v.WallSpread.N != 2 ||
			v.WallSpread.Min > v.WallSpread.Max || v.PromptTokens == 0 || v.TPOTMs == nil || v.ProfileSource != "events" {
			t.Errorf("variant %s: %+v", v.Spec, v)
		}
	}
	want := []string{"baseline", "candidate", "candidate, rope on baseline", "baseline, rope on candidate",
		"candidate, swiglu on baseline", "baseline, swiglu on candidate"}
	if strings.Join(roles, "|") != strings.Join(want, "|") {
		t.Errorf("variants %q, want %q", roles, want)
	}
	if rep.Variants[2].Spec != "cpu,rope=cpu_slow" || rep.Variants[5].Spec != "cpu_slow,swiglu=cpu" {
		t.Errorf("ablation specs %s, %s", rep.Variants[2].Spec, rep.Variants[5].Spec)
	}
	var swiglu *report.OpComparison
	for i := range rep.Ops {
		if rep.Ops[i].Op == kernels.OpSwiGLU {
			swiglu = &rep.Ops[i]
		}
	}
	if swiglu == nil || swiglu.BaselineSet != "cpu_slow" || swiglu.CandidateSet != "cpu" || swiglu.Speedup == nil || *swiglu.Speedup <= 1 ||
		swiglu.AloneTokensPerSec == nil || swiglu.WithoutTokensPerSec == nil {
		t.Errorf("swiglu row %+v", swiglu)
	}
	// The op rows and the two closing rows hold the whole gain.
	total := 0.0
	for _, o := range rep.Ops {
		total += *o.GainShare
	}
	total += *rep.Unattributed.GainShare + *rep.Outside.GainShare
	if math.Abs(total-1) > 1e-6 {
		t.Errorf("the shares of the gain add up to %g", total)
	}
	for _, w := range []string{"qwen2-tiny_cpu_slow_float32 | ", "[baseline: same first 4 tokens]", "share of gain", "end to end: cpu_slow",
		"peak memory", report.UnattributedName, report.OutsideName, "cpu_slow: prefill ", "cpu: 2 runs: wall median", "the median of --repeat 2 runs"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("stdout lacks %q:\n%s", w, stdout)
		}
	}
	img, err := png.Decode(bytesReader(t, plotPath))
	if err != nil {
		t.Fatalf("the plot is not a PNG: %v", err)
	}
	if img.Bounds().Dx() < 1000 {
		t.Errorf("plot %v", img.Bounds())
	}

	// --ops limits the ablations; without --quiet, --json leaves the
	// tables on stderr.
	args = []string{"compare", "--model", tinyQwen, "--prompt", "hello there", "--max-new-tokens", "4", "--min-new-tokens", "4",
		"--baseline", "cpu_slow", "--candidate", "cpu", "--ops", "swiglu", "--json", "--cupti", "--no-graphs"}
	code, jsonOut, stderr = runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("--ops swiglu: exit %d: %s", code, stderr)
	}
	rep = report.Compare{}
	if err := json.Unmarshal([]byte(jsonOut), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Variants) != 4 || rep.Variants[3].Ablated == nil || *rep.Variants[3].Ablated != "swiglu" {
		t.Errorf("--ops swiglu: %d variants", len(rep.Variants))
	}
	for _, w := range []string{"share of gain", "--cupti is ignored on the cpu device", "--no-graphs is ignored on the cpu device"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
}

func bytesReader(t *testing.T, path string) *bytes.Reader {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// A candidate whose kernels are wrong fails the check: compare writes its
// files, names it, and exits 1.
func TestCompareCatchesWrongResults(t *testing.T) {
	withTestSets(t)
	args := compareArgs("--baseline", "cpu", "--candidate", "cpu_wrong", "--ops", "rms_norm", "--json")
	code, stdout, stderr := runInfer(t, args...)
	if code != exitError {
		t.Fatalf("exit %d: %s", code, stdout)
	}
	// Every variant but the baseline runs a wrong norm.
	oneLine(t, args, stderr, "compare: cpu_wrong; cpu_wrong,rms_norm=cpu; cpu,rms_norm=cpu_wrong: tokens and prefill logits differ from the baseline's (cpu)")
	var rep report.Compare
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Variants {
		wrong := v.Spec != "cpu"
		if v.OK == wrong || wrong && !(v.LogitsRelErr > 0.1) {
			t.Errorf("%s: ok %v, logits off by %g", v.Spec, v.OK, v.LogitsRelErr)
		}
	}
}

func TestCompareUsage(t *testing.T) {
	withTestSets(t)
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--ops", "warp"), exitUsage, `--ops: unknown op "warp"`},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--ops", "linear"), exitUsage, "--ops: linear runs on cpu under both cpu_slow and cpu"},
		{compareArgs("--baseline", "cpu", "--candidate", "cpu"), exitUsage, "the same spec"},
		{compareArgs("--baseline", "cpu", "--candidate", "fused"), exitUsage, "compare needs one device"},
		{compareArgs("--baseline", "cpu", "--candidate", "bogus"), exitUsage, `--candidate: kernel spec "bogus"`},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--check-tokens", "-1"), exitUsage, "--check-tokens must not be negative"},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--tolerance", "NaN"), exitUsage, "--tolerance must be a finite number"},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--plot", filepath.Join(dir, "no", "p.png")), exitError, "--plot " + filepath.Join(dir, "no", "p.png")},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "stray"), exitUsage, `unexpected argument "stray"`},
		{compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--json", "c.json"), exitUsage, `--json takes no file name: stdout is the JSON document (redirect it: --json > c.json)`},
	} {
		code, stdout, stderr := runInfer(t, c.args...)
		if code != c.code || stdout != "" {
			t.Errorf("infer %q: exit %d, stdout %q", c.args, code, stdout)
		}
		oneLine(t, c.args, stderr, c.want)
	}
}

// noCUPTI is a device with a kernel trace that cannot start, as a GPU
// machine without CUPTI's library.
type noCUPTI struct{ kernels.Device }

func (noCUPTI) StartKernelTrace() error { return errors.New("libcupti.so is in none of 3 places") }
func (noCUPTI) TraceID(uint64)          {}
func (noCUPTI) KernelRecords() ([]profile.KernelRecord, string, error) {
	return nil, "", nil
}
func (noCUPTI) StopKernelTrace() error { return nil }

// Where the kernel trace cannot start, compare keeps the events' times and
// its op table's note says why, for the first variant too; it tries once.
func TestCompareTracerFallback(t *testing.T) {
	cpuDev := cpuDevice()
	if newVariantTracer(cpuDev, profile.New(cpuDev), true) != nil {
		t.Error("a tracer for a device with no kernel trace")
	}
	dev := noCUPTI{cpuDev}
	prof := profile.New(dev)
	if newVariantTracer(dev, prof, false) != nil {
		t.Error("a tracer with --cupti=false")
	}
	tr := newVariantTracer(dev, prof, true)
	if tr == nil {
		t.Fatal("no tracer for a device with a kernel trace")
	}
	steps := 0
	progress := func(int, bool) (func(model.StepEvent), func()) { return func(model.StepEvent) {}, func() { steps++ } }
	timed := measure.Run{Report: &profile.Report{Source: "events", Note: "7 decode steps were CUDA graph replays"}}
	for i := range 2 {
		got, err := tr.run(nil, nil, model.GenerateOptions{}, progress, timed)
		if err != nil {
			t.Fatal(err)
		}
		if got.Report.Source != "events" || !strings.HasPrefix(got.Report.Note, "kernels not traced (libcupti.so is in none of 3 places)") ||
			!strings.HasSuffix(got.Report.Note, "; 7 decode steps were CUDA graph replays") || steps != i+1 {
			t.Errorf("run %d: %+v, %d steps of progress", i, got.Report, steps)
		}
	}
	if timed.Report.Note != "7 decode steps were CUDA graph replays" {
		t.Errorf("the timed run's own report changed: %q", timed.Report.Note)
	}
}
