package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

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
	var rep compareReport
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
	var swiglu *opComparison
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
		"peak memory", unattributedName, outsideName, "cpu_slow: prefill ", "cpu: 2 runs: wall median", "the median of --repeat 2 runs"} {
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
	rep = compareReport{}
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
	var rep compareReport
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

// syntheticCompare is a report of known values for the plot.
func syntheticCompare() *compareReport {
	r := &compareReport{Provenance: newProvenance("cuda:0 NVIDIA H200"), Model: "Qwen2-7B", DType: "bf16", Batch: 16, MaxNew: 50, Baseline: "naive", Candidate: "fused"}
	r.Ops = []opComparison{
		{Op: kernels.OpLinear, BaselineMs: 3000, CandidateMs: 3000},
		{Op: kernels.OpAttnPrefill, BaselineMs: 4000, CandidateMs: 1000},
		{Op: kernels.OpRoPE, BaselineMs: 1000, CandidateMs: 500},
		{Op: kernels.OpArgmax},
	}
	r.Variants = []variantReport{
		{Spec: "naive", Role: "baseline", OK: true, TokensPerSec: 90},
		{Spec: "fused", Role: "candidate", OK: true, TokensPerSec: 150},
		{Spec: "fused,attn=naive", Role: "candidate, attn on baseline", Ablated: report.NullString("attn"), OK: true, TokensPerSec: 100},
		{Spec: "naive,attn=fused", Role: "baseline, attn on candidate", Ablated: report.NullString("attn"), OK: false, TokensPerSec: 140},
	}
	return r
}

// count is the number of pixels of exactly color c.
func count(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B && uint8(a>>8) == c.A {
				n++
			}
		}
	}
	return n
}

// The plot renders the right bars: each series' painted area is in
// proportion to its values (bars of one width; the legend's swatches are
// small), ops without time are left out, and each variant has its colour.
func TestComparePlot(t *testing.T) {
	r := syntheticCompare()
	names, b, c := r.opTimes()
	if strings.Join(names, ",") != "linear,attn_prefill,rope" || b[1] != 4000 || c[2] != 500 {
		t.Errorf("op bars %v %v %v", names, b, c)
	}
	render := func(draw func() ([]byte, error)) image.Image {
		t.Helper()
		out, err := draw()
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.08*want {
			t.Errorf("%s: %.3f, want %.3f", what, got, want)
		}
	}
	ops := render(func() ([]byte, error) {
		p, err := r.opTimePlot()
		if err != nil {
			return nil, err
		}
		return renderPNG(6*vg.Inch, p)
	})
	nb, nc := count(ops, baselineColor), count(ops, candidateColor)
	if nb == 0 || nc == 0 {
		t.Fatalf("no bars drawn: %d baseline pixels, %d candidate", nb, nc)
	}
	near("candidate/baseline area", float64(nc)/float64(nb), 4500.0/8000)

	rates := render(func() ([]byte, error) {
		p, err := r.ratePlot()
		if err != nil {
			return nil, err
		}
		return renderPNG(6*vg.Inch, p)
	})
	pb, pc, pa, pw := count(rates, baselineColor), count(rates, candidateColor), count(rates, ablationColor), count(rates, wrongColor)
	if pb == 0 {
		t.Fatal("no baseline bar")
	}
	near("candidate/baseline", float64(pc)/float64(pb), 150.0/90)
	near("passing ablation/baseline", float64(pa)/float64(pb), 100.0/90)
	near("failed ablation/baseline", float64(pw)/float64(pb), 140.0/90)

	all := render(func() ([]byte, error) { return comparePlot(r) })
	if all.Bounds().Dx() <= ops.Bounds().Dx() {
		t.Errorf("the two panels are %d pixels wide, one is %d", all.Bounds().Dx(), ops.Bounds().Dx())
	}
}

// Under events, the decode steps replayed from a graph are charged to no
// op: the table, the JSON and the plot say how much of the gain that is,
// and the op rows with the two closing rows hold the whole gain.
func TestCompareUnattributed(t *testing.T) {
	naive, fused := kernels.Spec{Base: "naive"}, kernels.Spec{Base: "fused"}
	r := &compareReport{Provenance: newProvenance("cuda:0 NVIDIA H200"), Model: "Qwen2-7B", DType: "bf16", Batch: 1, MaxNew: 100,
		Baseline: "naive", Candidate: "fused"}
	r.Variants = []variantReport{
		{Spec: "naive", Role: "baseline", OK: true, WallS: 0.500, ComputeMs: 480, UnattributedMs: 400, ProfileSource: "events",
			Ops: []profile.OpStat{{Op: kernels.OpLinear, Ms: 50}, {Op: kernels.OpAttnPrefill, Ms: 30}}},
		{Spec: "fused", Role: "candidate", OK: true, WallS: 0.450, ComputeMs: 435, UnattributedMs: 360, ProfileSource: "events",
			Ops: []profile.OpStat{{Op: kernels.OpLinear, Ms: 50}, {Op: kernels.OpAttnPrefill, Ms: 25}}},
	}
	r.compareOps(naive, fused, nil)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(r.GainMs, 50) || !near(*r.Unattributed.GainShare, 0.8) || !near(r.Outside.BaselineMs, 20) || !near(r.Outside.CandidateMs, 15) {
		t.Errorf("gain %v ms, unattributed %+v (share %v), outside %+v", r.GainMs, r.Unattributed, *r.Unattributed.GainShare, r.Outside)
	}
	total := *r.Unattributed.GainShare + *r.Outside.GainShare
	for _, o := range r.Ops {
		total += *o.GainShare
	}
	if math.Abs(total-1) > 1e-9 {
		t.Errorf("the shares add up to %g", total)
	}
	var text bytes.Buffer
	r.writeText(&text)
	for _, w := range []string{`\(no op\)\s+400\.000\s+360\.000\s+80\.0%`, `\(not device\)\s+20\.000\s+15\.000\s+10\.0%`, "the CUDA graph replays of decode steps"} {
		if !regexp.MustCompile(w).MatchString(text.String()) {
			t.Errorf("the table lacks %q:\n%s", w, text.String())
		}
	}
	names, b, c := r.opTimes()
	if names[len(names)-1] != unattributedName || b[len(b)-1] != 400 || c[len(c)-1] != 360 {
		t.Errorf("plot rows %v %v %v", names, b, c)
	}
	if a := r.timeAxis(); !strings.Contains(a, "events") || !strings.Contains(a, unattributedName) {
		t.Errorf("axis %q", a)
	}
	p, err := r.opTimePlot()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Title.Text, "80% of the gain in (no op)") {
		t.Errorf("title %q", p.Title.Text)
	}
	doc, err := report.JSON(r)
	if err != nil {
		t.Fatal(err)
	}
	m := checkDocument(t, string(doc), true)
	if u, _ := m["unattributed_device"].(map[string]any); u == nil || !near(u["gain_share"].(float64), 0.8) {
		t.Errorf("unattributed_device %v", m["unattributed_device"])
	}

	// Traced by CUPTI, the axis says so.
	r.Variants[0].ProfileSource, r.Variants[1].ProfileSource = "cupti", "cupti"
	if a := r.timeAxis(); !strings.Contains(a, "CUPTI") {
		t.Errorf("traced axis %q", a)
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
