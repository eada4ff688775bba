package main

import (
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/report"
	"github.com/fuselm/fuselm/report/reporttest"
)

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

// checkDocument parses doc as one of infer's JSON documents, made by this
// build, and fails unless it is one (reporttest.CheckDocument).
func checkDocument(t *testing.T, doc string, device bool) map[string]any {
	t.Helper()
	ver, rev := buildVersion()
	return reporttest.CheckDocument(t, doc, ver, rev, device)
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
	var rep report.Run
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	tm := rep.Timings
	if tm.PromptTokens != 2*len(rep.Rows[0].PromptIDs) || tm.DecodeSteps != 4 || tm.TTFTMs != tm.PrefillMs || tm.TTFTMs <= 0 {
		t.Errorf("phases %+v", tm.Phases)
	}
	if tm.DecodeTokensPerSec == nil || tm.TPOTMs == nil ||
		math.Abs(*tm.DecodeTokensPerSec-8/(tm.DecodeMs/1000)) > 1e-6**tm.DecodeTokensPerSec ||
		math.Abs(*tm.TPOTMs-tm.DecodeMs/4) > 1e-9 ||
		math.Abs(tm.PrefillTokensPerSec-float64(tm.PromptTokens)/(tm.PrefillMs/1000)) > 1e-6*tm.PrefillTokensPerSec {
		t.Errorf("rates: decode %v tokens/s, TPOT %v ms, prefill %v tokens/s from %+v", tm.DecodeTokensPerSec, tm.TPOTMs, tm.PrefillTokensPerSec, tm.Phases)
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
