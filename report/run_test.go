package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// A run whose kernels were traced says "ms CUDA", lists coverage and
// kernels, and says whether the kernel sum agrees with the busy time.
func TestProfileText(t *testing.T) {
	p := &profile.Report{
		Source: "cupti", ComputeMs: 103, BusyMs: 100, SpanMs: 120, Launches: 3,
		Ops: []profile.OpStat{
			{Op: kernels.OpLinear, Set: "naive", Calls: 2, Ms: 80, Share: 80.0 / 103, PhaseMs: map[string]float64{"prefill": 70, "decode": 10},
				FLOPs: 8e13, TFLOPs: 1000, Bytes: 1e9, GBs: 12.5},
			{Op: kernels.OpAttnPrefill, Set: "fused", Calls: 1, Ms: 23, Share: 23.0 / 103, PhaseMs: map[string]float64{"prefill": 23}, Scratch: 3 << 20},
		},
		Kernels: []profile.KernelStat{
			{Name: "nvjet_hsh_" + strings.Repeat("x", 80), Op: kernels.OpLinear, Source: profile.SourceCUBLAS, Calls: 2, Us: 80000, AvgUs: 40000, MaxUs: 41000, Share: 0.78},
			{Name: "flash_fwd", Op: kernels.OpAttnPrefill, Source: profile.SourceOwn, Calls: 1, Us: 23000, AvgUs: 23000, MaxUs: 23000, Share: 0.22},
		},
		Coverage: []profile.CoverageRow{
			{Source: profile.SourceCUBLAS, Launches: 2, Ms: 80, TimeShare: 0.78, LaunchShare: 2.0 / 3},
			{Source: profile.SourceOwn, Set: "fused", Launches: 1, Ms: 23, TimeShare: 0.22, LaunchShare: 1.0 / 3},
		},
	}
	rep := &Run{Model: "Qwen2-7B", Kernels: "fused", DType: "bf16", Profile: p.Ops,
		Timings: Timings{TokensPerSec: 153.4, WallS: 0.125, ComputeMs: p.ComputeMs}}
	rep.ProfileSource = p.Source
	rep.GPU = NewGPU(p, 125, 0)
	rep.Memory = &Memory{PeakBytes: 20 << 30, Weights: 15 << 30, KVCache: 4 << 30, Work: 512 << 20, Scratch: 3 << 20,
		Libraries: 32 << 20, Other: 477 << 20, WorkingSets: map[kernels.Op]int64{kernels.OpAttnPrefill: 3 << 20}}
	var b bytes.Buffer
	rep.WriteProfile(&b)
	out := b.String()
	for _, want := range []string{
		"Qwen2-7B_fused_bfloat16 | 153.40 tokens/s | 0.125 s | 103.0 ms CUDA",
		"TFLOP/s", "1000", "12.5",
		"busy 100.0 ms of 125.0 ms wall (80.0%)", "within 5% of the busy time",
		"fuselm fused", "cuBLAS", "66.7%",
		"nvjet_hsh_xxx", "...", "flash_fwd",
		"memory: peak 20.00 GiB = weights 15.00 GiB, KV cache 4.00 GiB, work 512.00 MiB, scratch 3.00 MiB, cuBLAS workspace 32.00 MiB",
		"working sets (scratch per call): attn_prefill 3.00 MiB",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("profile text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "a decode step") || strings.Contains(out, "in the prefill") {
		t.Errorf("launches by phase said where the kernels have no phase:\n%s", out)
	}
	p.PhaseLaunches = map[string]int{"prefill": 1, "decode": 2}
	rep.GPU = NewGPU(p, 125, 4)
	b.Reset()
	rep.WriteProfile(&b)
	if g := rep.GPU; g.PrefillLaunches != 1 || g.DecodeLaunches != 2 || g.DecodeLaunchesPerStep != 0.5 ||
		!strings.Contains(b.String(), "GPU: 3 kernels (1 in the prefill, 0.5 a decode step), ") {
		t.Errorf("launches by phase: %+v\n%s", g, b.String())
	}
	p.BusyMs = 90
	rep.GPU = NewGPU(p, 125, 0)
	b.Reset()
	rep.WriteProfile(&b)
	if !strings.Contains(b.String(), "the kernel sum is 14.4% above the busy time") {
		t.Errorf("no disagreement said:\n%s", b.String())
	}
}

// A composite op's row says which ops its time covers, in the JSON
// (parts) and under the table; a run without one says nothing of them.
func TestProfileComposites(t *testing.T) {
	rows := []profile.OpStat{
		{Op: kernels.OpNormSwiGLU, Set: "fused", Calls: 28, Ms: 2, Parts: kernels.PartsOf(kernels.OpNormSwiGLU)},
		{Op: kernels.OpLinear, Set: "fused", Calls: 56, Ms: 1},
	}
	var b bytes.Buffer
	writeOpTable(&b, rows)
	want := "composite ops, each a group's time as its kernels ran it, not split among its parts: " +
		"add_rms_norm_linear_swiglu = add_rms_norm + linear + swiglu"
	if !strings.Contains(b.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	writeOpTable(&b, rows[1:])
	if strings.Contains(b.String(), "composite") {
		t.Errorf("a table without composites names them:\n%s", b.String())
	}
	if p := kernels.PartsOf(kernels.OpLinear); p != nil {
		t.Errorf("linear's parts: %v", p)
	}
}

// Ops whose calls ran beside the second stream's work say how much of
// their time did, under the table; a run without such calls says nothing.
func TestProfileBesideLine(t *testing.T) {
	rows := []profile.OpStat{
		{Op: kernels.OpMoERoute, Set: "fused", Calls: 26, Ms: 1.9, BesideMs: 1.9},
		{Op: kernels.OpLinear, Set: "fused", Calls: 135, Ms: 6.4, BesideMs: 0.25},
		{Op: kernels.OpRMSNorm, Set: "fused", Calls: 1, Ms: 0.03},
	}
	var b bytes.Buffer
	writeOpTable(&b, rows)
	want := "ms that ran beside the second stream's work, each op's events time with what ran beside it (so the rows overlap): moe_route 1.900, linear 0.250\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	writeOpTable(&b, rows[2:])
	if strings.Contains(b.String(), "beside") {
		t.Errorf("a table without calls beside names them:\n%s", b.String())
	}
}
