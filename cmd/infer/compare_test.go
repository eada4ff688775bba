package main

import (
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/fuselm/fuselm/kernels"
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
// JSON and the plot are written.
func TestCompareOnCPU(t *testing.T) {
	withTestSets(t)
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "c.json"), filepath.Join(dir, "c.png")
	args := compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--json", jsonPath, "--plot", plotPath)
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, stderr, stdout)
	}
	var rep compareReport
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, v := range rep.Variants {
		roles = append(roles, v.Role)
		if !v.OK || v.SameTokens != 4 || v.LogitsRelErr != 0 || v.Memory == nil || len(v.RunsWallS) != 1 {
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
	if swiglu == nil || swiglu.BaselineSet != "cpu_slow" || swiglu.CandidateSet != "cpu" || swiglu.Speedup <= 1 ||
		swiglu.AloneTokensPerSec == 0 || swiglu.WithoutTokensPerSec == 0 {
		t.Errorf("swiglu row %+v", swiglu)
	}
	for _, w := range []string{"qwen2-tiny_cpu_slow_float32 | ", "[baseline: same first 4 tokens]", "share of gain", "end to end: cpu_slow", "peak memory"} {
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

	// --ops limits the ablations.
	code, _, stderr = runInfer(t, compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--ops", "swiglu", "--json", jsonPath)...)
	if code != exitOK {
		t.Fatalf("--ops swiglu: exit %d: %s", code, stderr)
	}
	b, _ = os.ReadFile(jsonPath)
	rep = compareReport{}
	json.Unmarshal(b, &rep)
	if len(rep.Variants) != 4 || rep.Variants[3].Ablated != "swiglu" {
		t.Errorf("--ops swiglu: %d variants", len(rep.Variants))
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
	jsonPath := filepath.Join(t.TempDir(), "c.json")
	args := compareArgs("--baseline", "cpu", "--candidate", "cpu_wrong", "--ops", "rms_norm", "--json", jsonPath)
	code, stdout, stderr := runInfer(t, args...)
	if code != exitError {
		t.Fatalf("exit %d: %s", code, stdout)
	}
	// Every variant but the baseline runs a wrong norm.
	oneLine(t, args, stderr, "compare: cpu_wrong; cpu_wrong,rms_norm=cpu; cpu,rms_norm=cpu_wrong: tokens and prefill logits differ from the baseline's (cpu)")
	var rep compareReport
	b, _ := os.ReadFile(jsonPath)
	if err := json.Unmarshal(b, &rep); err != nil {
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
	r := &compareReport{Model: "Qwen2-7B", Device: "cuda:0 NVIDIA H200", DType: "bf16", Batch: 16, MaxNew: 50, Baseline: "naive", Candidate: "fused"}
	r.Ops = []opComparison{
		{Op: kernels.OpLinear, BaselineMs: 3000, CandidateMs: 3000},
		{Op: kernels.OpAttnPrefill, BaselineMs: 4000, CandidateMs: 1000},
		{Op: kernels.OpRoPE, BaselineMs: 1000, CandidateMs: 500},
		{Op: kernels.OpArgmax},
	}
	r.Variants = []variantReport{
		{Spec: "naive", Role: "baseline", OK: true, TokensPerSec: 90},
		{Spec: "fused", Role: "candidate", OK: true, TokensPerSec: 150},
		{Spec: "fused,attn=naive", Role: "candidate, attn on baseline", Ablated: "attn", OK: true, TokensPerSec: 100},
		{Spec: "naive,attn=fused", Role: "baseline, attn on candidate", Ablated: "attn", OK: false, TokensPerSec: 140},
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
