package report

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"regexp"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/report/reporttest"
)

// syntheticCompare is a report of known values for the plot.
func syntheticCompare() *Compare {
	r := &Compare{Provenance: NewProvenance("v1.2.3", "0123abc", "cuda:0 NVIDIA H200"), Model: "Qwen2-7B", DType: "bf16", Batch: 16, MaxNew: 50, Baseline: "naive", Candidate: "fused"}
	r.Ops = []OpComparison{
		{Op: kernels.OpLinear, BaselineMs: 3000, CandidateMs: 3000},
		{Op: kernels.OpAttnPrefill, BaselineMs: 4000, CandidateMs: 1000},
		{Op: kernels.OpRoPE, BaselineMs: 1000, CandidateMs: 500},
		{Op: kernels.OpArgmax},
	}
	r.Variants = []Variant{
		{Spec: "naive", Role: "baseline", OK: true, TokensPerSec: 90},
		{Spec: "fused", Role: "candidate", OK: true, TokensPerSec: 150},
		{Spec: "fused,attn=naive", Role: "candidate, attn on baseline", Ablated: profile.NonZero("attn"), OK: true, TokensPerSec: 100},
		{Spec: "naive,attn=fused", Role: "baseline, attn on candidate", Ablated: profile.NonZero("attn"), OK: false, TokensPerSec: 140},
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

	all := render(func() ([]byte, error) { return ComparePlot(r) })
	if all.Bounds().Dx() <= ops.Bounds().Dx() {
		t.Errorf("the two panels are %d pixels wide, one is %d", all.Bounds().Dx(), ops.Bounds().Dx())
	}
}

// Under events, the decode steps replayed from a graph are charged to no
// op: the table, the JSON and the plot say how much of the gain that is,
// and the op rows with the two closing rows hold the whole gain.
func TestCompareUnattributed(t *testing.T) {
	naive, fused := kernels.Spec{Base: "naive"}, kernels.Spec{Base: "fused"}
	r := &Compare{Provenance: NewProvenance("v1.2.3", "0123abc", "cuda:0 NVIDIA H200"), Model: "Qwen2-7B", DType: "bf16", Batch: 1, MaxNew: 100,
		Baseline: "naive", Candidate: "fused"}
	r.Variants = []Variant{
		{Spec: "naive", Role: "baseline", OK: true, WallS: 0.500, ComputeMs: 480, UnattributedMs: 400, ProfileSource: "events",
			Ops: []profile.OpStat{{Op: kernels.OpLinear, Ms: 50}, {Op: kernels.OpAttnPrefill, Ms: 30}}},
		{Spec: "fused", Role: "candidate", OK: true, WallS: 0.450, ComputeMs: 435, UnattributedMs: 360, ProfileSource: "events",
			Ops: []profile.OpStat{{Op: kernels.OpLinear, Ms: 50}, {Op: kernels.OpAttnPrefill, Ms: 25}}},
	}
	r.CompareOps(naive, fused, nil)
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
	r.WriteText(&text)
	for _, w := range []string{`\(no op\)\s+400\.000\s+360\.000\s+80\.0%`, `\(not device\)\s+20\.000\s+15\.000\s+10\.0%`, "the CUDA graph replays of decode steps"} {
		if !regexp.MustCompile(w).MatchString(text.String()) {
			t.Errorf("the table lacks %q:\n%s", w, text.String())
		}
	}
	names, b, c := r.opTimes()
	if names[len(names)-1] != UnattributedName || b[len(b)-1] != 400 || c[len(c)-1] != 360 {
		t.Errorf("plot rows %v %v %v", names, b, c)
	}
	if a := r.timeAxis(); !strings.Contains(a, "events") || !strings.Contains(a, UnattributedName) {
		t.Errorf("axis %q", a)
	}
	p, err := r.opTimePlot()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Title.Text, "80% of the gain in (no op)") {
		t.Errorf("title %q", p.Title.Text)
	}
	doc, err := JSON(r)
	if err != nil {
		t.Fatal(err)
	}
	m := reporttest.CheckDocument(t, string(doc), "v1.2.3", "0123abc", true)
	if u, _ := m["unattributed_device"].(map[string]any); u == nil || !near(u["gain_share"].(float64), 0.8) {
		t.Errorf("unattributed_device %v", m["unattributed_device"])
	}

	// Traced by CUPTI, the axis says so.
	r.Variants[0].ProfileSource, r.Variants[1].ProfileSource = "cupti", "cupti"
	if a := r.timeAxis(); !strings.Contains(a, "CUPTI") {
		t.Errorf("traced axis %q", a)
	}
}
