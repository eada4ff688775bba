package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/report"
	"github.com/fuselm/fuselm/report/reporttest"
)

const tinyQwenBF16 = "../../testdata/models/qwen2-tiny-bf16"

// gpuReportJSON is the part of infer's --json the GPU tests read.
type gpuReportJSON struct {
	ProfileSource string           `json:"profile_source"`
	ProfileNote   string           `json:"profile_note"`
	Profile       []profile.OpStat `json:"profile"`
	GPU           *report.GPU      `json:"gpu"`
	Memory        *report.Memory   `json:"memory"`
	Timings       report.Timings   `json:"timings"`
}

func needGPU(t *testing.T) {
	t.Helper()
	if err := cuda.Probe(); err != nil {
		t.Skip("no CUDA device: " + err.Error())
	}
	t.Setenv("FUSELM_KERNEL_CACHE", t.TempDir())
}

// TestCUPTIGeneration generates on the GPU with each CUDA set, graphs on:
// the profile comes from CUPTI, every decode step (the replayed ones too)
// has kernels in the trace, fuselm's and cuBLAS's kernels are both seen,
// every kernel is tied to an op, and the kernel sum agrees with the busy
// time. Without --cupti, events time the ops and the note says what they
// leave out.
func TestCUPTIGeneration(t *testing.T) {
	needGPU(t)
	const newTokens = 12
	for _, set := range []string{"naive", "fused"} {
		trace := filepath.Join(t.TempDir(), "trace.json")
		args := []string{"--model", tinyQwenBF16, "--prompt-file", shortPrompt, "--max-new-tokens", "12", "--min-new-tokens", "12",
			"--batch", "3", "--kernels", set, "--json", "--quiet", "--trace", trace, "--cupti"}
		code, stdout, stderr := runInfer(t, args...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", set, code, stderr)
		}
		var rep gpuReportJSON
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.ProfileSource != "cupti" || rep.GPU == nil {
			t.Fatalf("%s: profile source %q (%s): CUPTI did not trace", set, rep.ProfileSource, rep.ProfileNote)
		}
		if rep.Timings.GraphSteps == 0 {
			t.Errorf("%s: no graph replays", set)
		}
		sources := map[string]bool{}
		for _, c := range rep.GPU.Coverage {
			sources[c.Source] = true
		}
		if !sources[profile.SourceOwn] || !sources[profile.SourceCUBLAS] {
			t.Errorf("%s: coverage %+v: want fuselm's and cuBLAS's kernels", set, rep.GPU.Coverage)
		}
		for _, o := range rep.Profile {
			if o.Op == profile.OpUnattributed {
				t.Errorf("%s: %d kernels not tied to an op (%s)", set, o.Kernels, rep.ProfileNote)
			}
			if o.Op == kernels.OpLinear && o.TFLOPs <= 0 {
				t.Errorf("%s: linear has no rate: %+v", set, o)
			}
		}
		if math.Abs(rep.GPU.SumOverBusy) > report.SumBusyTolerance {
			t.Errorf("%s: kernel sum %.3f ms, busy %.3f ms", set, rep.GPU.KernelMs, rep.GPU.BusyMs)
		}
		if rep.Memory == nil || rep.Memory.PeakBytes <= rep.Memory.Weights {
			t.Errorf("%s: memory %+v", set, rep.Memory)
		}
		tr := reporttest.ReadTrace(t, trace)
		if n := reporttest.KernelSteps(t, tr); n != newTokens-1 {
			t.Errorf("%s: kernels in %d decode steps, want %d", set, n, newTokens-1)
		}
		t.Logf("%s: %d kernels, %.3f ms CUDA, busy %.3f of %.3f ms wall; note %q", set, rep.GPU.Launches, rep.GPU.KernelMs,
			rep.GPU.BusyMs, rep.GPU.WallMs, rep.ProfileNote)
	}

	args := []string{"--model", tinyQwenBF16, "--prompt-file", shortPrompt, "--max-new-tokens", "6", "--kernels", "fused"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK || !strings.Contains(stdout, "ms compute") || !strings.Contains(stdout, "CUDA graph replays, timed whole") {
		t.Errorf("without --cupti: exit %d\n%s%s", code, stdout, stderr)
	}
}

// compare on the GPU: naive against fused and their ablations on the tiny
// checkpoint, every variant within the bf16 tolerance of naive. By default
// the per-op times of the two specs are traced by CUPTI (the ablations stay
// untraced), so that the ops hold nearly all the device time; with
// --cupti=false the graph replays of the decode steps are in (no op), said
// on the table, in the JSON and in the plot's title. Either way the op rows
// and the two closing rows hold the whole gain.
func TestCompareOnGPU(t *testing.T) {
	needGPU(t)
	dir := t.TempDir()
	for _, traced := range []bool{true, false} {
		args := []string{"compare", "--model", tinyQwenBF16, "--prompt-file", shortPrompt, "--max-new-tokens", "8", "--min-new-tokens", "8", "--batch", "2",
			"--json", "--plot", filepath.Join(dir, "c.png")}
		if !traced {
			args = append(args, "--cupti=false")
		}
		code, stdout, stderr := runInfer(t, args...)
		if code != exitOK {
			t.Fatalf("%q: exit %d: %s", args, code, stderr)
		}
		t.Log("\n" + stderr)
		checkDocument(t, stdout, true)
		var rep report.Compare
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Variants) < 4 {
			t.Errorf("%d variants", len(rep.Variants))
		}
		for i, v := range rep.Variants {
			want := "events"
			if traced && i < 2 {
				want = "cupti"
			}
			if v.Memory == nil || v.Memory.PeakBytes == 0 || v.ProfileSource != want {
				t.Errorf("traced %v: %s: memory %+v, source %s, want %s", traced, v.Spec, v.Memory, v.ProfileSource, want)
			}
			if i < 2 && traced && v.UnattributedMs > 0.05*v.ComputeMs {
				t.Errorf("%s: %.3f of %.3f ms of kernels charged to no op", v.Spec, v.UnattributedMs, v.ComputeMs)
			}
			if i < 2 && !traced && !(v.UnattributedMs > 0) {
				t.Errorf("%s under events: no graph replay time in (no op): %+v", v.Spec, v)
			}
		}
		if rep.GainMs != 0 {
			total := *rep.Unattributed.GainShare + *rep.Outside.GainShare
			for _, o := range rep.Ops {
				total += *o.GainShare
			}
			if math.Abs(total-1) > 1e-6 {
				t.Errorf("traced %v: the shares add up to %g", traced, total)
			}
		}
		if !strings.Contains(stderr, report.UnattributedName) || !strings.Contains(stderr, report.OutsideName) {
			t.Errorf("the table lacks its closing rows:\n%s", stderr)
		}
	}
}

// TestProfileAgreement holds the "ms CUDA" of a run with CUPTI against the
// events of a --no-graphs run (no --cupti) of the same workload (both
// --profile files, written by scripts/gpu_check.sh on W1): within 5%.
func TestProfileAgreement(t *testing.T) {
	cuptiPath, eventsPath := os.Getenv("FUSELM_PROFILE_CUPTI"), os.Getenv("FUSELM_PROFILE_EVENTS")
	if cuptiPath == "" || eventsPath == "" {
		t.Skip("FUSELM_PROFILE_CUPTI and FUSELM_PROFILE_EVENTS are unset (--profile files of a GPU run with --cupti and one with --no-graphs)")
	}
	read := func(path string) gpuReportJSON {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var r gpuReportJSON
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	c, e := read(cuptiPath), read(eventsPath)
	if c.ProfileSource != "cupti" || c.GPU == nil || e.ProfileSource != "events" {
		t.Fatalf("sources %q and %q", c.ProfileSource, e.ProfileSource)
	}
	off := (c.GPU.KernelMs - e.Timings.ComputeMs) / e.Timings.ComputeMs
	t.Logf("ms CUDA %.1f (busy %.1f, wall %.1f) against the events of every op of a --no-graphs run %.1f: %+.2f%%",
		c.GPU.KernelMs, c.GPU.BusyMs, c.GPU.WallMs, e.Timings.ComputeMs, 100*off)
	if math.Abs(off) > 0.05 {
		t.Errorf("ms CUDA is %.1f%% off the events' sum", 100*off)
	}
	if math.Abs(c.GPU.SumOverBusy) > report.SumBusyTolerance {
		t.Errorf("the kernel sum is %.1f%% off the busy time", 100*c.GPU.SumOverBusy)
	}
}
