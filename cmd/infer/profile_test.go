package main

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

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
	rep := &runReport{Model: "Qwen2-7B", Kernels: "fused", DType: "bf16", Profile: p.Ops,
		Timings: timings{TokensPerSec: 153.4, WallS: 0.125, ComputeMs: p.ComputeMs}}
	rep.ProfileSource = p.Source
	rep.GPU = newGPUReport(p, 125)
	rep.Memory = &memoryReport{PeakBytes: 20 << 30, Weights: 15 << 30, KVCache: 4 << 30, Work: 512 << 20, Scratch: 3 << 20,
		Libraries: 32 << 20, Other: 477 << 20, WorkingSets: map[kernels.Op]int64{kernels.OpAttnPrefill: 3 << 20}}
	var b bytes.Buffer
	rep.writeProfile(&b)
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
	p.BusyMs = 90
	rep.GPU = newGPUReport(p, 125)
	b.Reset()
	rep.writeProfile(&b)
	if !strings.Contains(b.String(), "the kernel sum is 14.4% above the busy time") {
		t.Errorf("no disagreement said:\n%s", b.String())
	}
}

// On the CPU the times are events, the line says "ms compute", and --json
// keeps stdout JSON while the profile goes to stderr.
func TestProfileJSONOnCPU(t *testing.T) {
	args := []string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "3", "--json"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rep := checkDocument(t, stdout, true)
	if rep["profile_source"] != "events" || rep["memory"] == nil || rep["gpu"] != nil {
		t.Errorf("profile_source %v, memory %v, gpu %v", rep["profile_source"], rep["memory"], rep["gpu"])
	}
	// Absent figures are null, not missing.
	for _, k := range []string{"gpu", "profile_note", "tuning"} {
		if v, ok := rep[k]; !ok || v != nil {
			t.Errorf("%s: %v (present %v), want null", k, v, ok)
		}
	}
	if !strings.Contains(stderr, "qwen2-tiny_cpu_float32 | ") || !strings.Contains(stderr, "ms compute") || !strings.Contains(stderr, "op  set  calls") {
		t.Errorf("stderr lacks the summary line and table:\n%s", stderr)
	}
	_, _, stderr = runInfer(t, append(args, "--quiet")...)
	if stderr != "" {
		t.Errorf("--quiet --json: stderr %q", stderr)
	}
	// The cpu device ignores --cupti and --no-graphs, and says so.
	_, _, stderr = runInfer(t, append(args, "--cupti", "--no-graphs")...)
	for _, w := range []string{"infer: --cupti is ignored on the cpu device", "infer: --no-graphs is ignored on the cpu device"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if _, _, stderr = runInfer(t, args...); strings.Contains(stderr, "ignored") {
		t.Errorf("without the flags, stderr says %q", stderr)
	}
}

// snakeKey is the form of every key of infer's JSON documents.
var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// checkDocument parses doc as one of infer's JSON documents and fails
// unless it opens with the build, the date and the device (device says
// whether one is named), and every key, at every depth, is snake_case.
func checkDocument(t *testing.T, doc string, device bool) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("not one JSON document: %v\n%.400s", err, doc)
	}
	ver, rev := buildVersion()
	if m["version"] != ver {
		t.Errorf("version %v, want %q", m["version"], ver)
	}
	if c, ok := m["commit"]; !ok || (rev == "" && c != nil) || (rev != "" && c != rev) {
		t.Errorf("commit %v (present %v), want %q or null", c, ok, rev)
	}
	if d, _ := m["date"].(string); d == "" {
		t.Errorf("date %v", m["date"])
	} else if tm, err := time.Parse(time.RFC3339, d); err != nil || time.Since(tm) > time.Hour || tm.Location() != time.UTC {
		t.Errorf("date %q: %v", d, err)
	}
	if d, ok := m["device"]; !ok || (d != nil) != device {
		t.Errorf("device %v (present %v), want named: %v", d, ok, device)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if !snakeKey.MatchString(k) {
					t.Errorf("key %q at %s is not snake_case", k, path)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		}
	}
	walk("", m)
	return m
}

// The phases and the spread of the timed runs are in the JSON and under
// the summary line.
func TestPhasesAndSpread(t *testing.T) {
	args := []string{"--model", tinyQwen, "--prompt", "hello there", "--max-new-tokens", "5", "--min-new-tokens", "5", "--batch", "2",
		"--repeat", "3", "--json", "--quiet"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	checkDocument(t, stdout, true)
	var rep runReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	tm := rep.Timings
	if tm.PromptTokens != 2*len(rep.Rows[0].PromptIDs) || tm.DecodeSteps != 4 || tm.TTFTMs != tm.PrefillMs || tm.TTFTMs <= 0 {
		t.Errorf("phases %+v", tm.phases)
	}
	if tm.DecodeTokensPerSec == nil || tm.TPOTMs == nil ||
		math.Abs(*tm.DecodeTokensPerSec-8/(tm.DecodeMs/1000)) > 1e-6**tm.DecodeTokensPerSec ||
		math.Abs(*tm.TPOTMs-tm.DecodeMs/4) > 1e-9 ||
		math.Abs(tm.PrefillTokensPerSec-float64(tm.PromptTokens)/(tm.PrefillMs/1000)) > 1e-6*tm.PrefillTokensPerSec {
		t.Errorf("rates: decode %v tokens/s, TPOT %v ms, prefill %v tokens/s from %+v", tm.DecodeTokensPerSec, tm.TPOTMs, tm.PrefillTokensPerSec, tm.phases)
	}
	sp := tm.WallSpread
	if sp.N != 3 || sp.Median != tm.WallS || sp.Min > sp.Median || sp.Max < sp.Median || sp.StdDev == nil || len(tm.RunsWallS) != 3 {
		t.Errorf("spread %+v of %v, reported %v", sp, tm.RunsWallS, tm.WallS)
	}

	// One new token: no decode step, so the decode figures are null.
	code, stdout, stderr = runInfer(t, "--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "1", "--min-new-tokens", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "| decode: no step (one new token)") || strings.Contains(stdout, "runs: wall median") {
		t.Errorf("one token, one run:\n%s", stdout)
	}
	code, stdout, _ = runInfer(t, "--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "3", "--repeat", "2")
	if code != exitOK || !regexp.MustCompile(`(?m)^prefill \d+ tokens: TTFT [0-9.]+ ms, [0-9.]+ tokens/s \| decode 2 steps × 1 row: TPOT [0-9.]+ ms, [0-9.]+ tokens/s\n2 runs: wall median `).MatchString(stdout) {
		t.Errorf("the lines under the summary line:\n%s", stdout)
	}
}

// --version names the build; a JSON document names the same.
func TestVersion(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v9.9.9", "0123abc"
	code, stdout, stderr := runInfer(t, "--version")
	if code != exitOK || stdout != "infer (fuselm) v9.9.9, commit 0123abc\n" || stderr != "" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	p := newProvenance("")
	if p.Version != "v9.9.9" || p.Commit == nil || *p.Commit != "0123abc" || p.Device != nil {
		t.Errorf("provenance %+v", p)
	}
	version, commit = "", ""
	if ver, _ := buildVersion(); ver == "" {
		t.Error("no version at all")
	}
}
