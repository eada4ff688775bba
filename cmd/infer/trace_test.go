package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/report/reporttest"
)

// --trace on the CPU writes the host phases, from loading to the last
// decode step, and every op call; a path that cannot be written fails
// before anything is loaded.
func TestTraceFlag(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "trace.json")
	args := []string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "4", "--min-new-tokens", "4", "--quiet", "--trace", path}
	if code, _, stderr := runInfer(t, args...); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr := reporttest.ReadTrace(t, path)
	phases := map[string]bool{}
	ops := 0
	for _, e := range tr.TraceEvents {
		if e.Ph == "X" && e.Cat == "phase" {
			phases[e.Name] = true
		}
		if e.Cat == "op" {
			ops++
		}
	}
	for _, want := range []string{"load", "prefill", "decode step 1", "decode step 3"} {
		if !phases[want] {
			t.Errorf("no phase %q in %v", want, phases)
		}
	}
	if ops == 0 {
		t.Error("no op calls in the trace")
	}
	bad := append(args[:len(args)-1:len(args)-1], filepath.Join(dir, "missing", "t.json"))
	code, stdout, stderr := runInfer(t, bad...)
	if code != exitError || stdout != "" {
		t.Errorf("--trace into a missing directory: exit %d", code)
	}
	oneLine(t, bad, stderr, "--trace ")
}

// TestTraceFile checks a trace written on the GPU machine
// ($FUSELM_TRACE_CHECK, scripts/gpu_check.sh's W1 run): it is a Chrome
// trace, its kernel track holds kernels of every decode step, and it
// traced kernels (CUPTI), cuBLAS's among them.
func TestTraceFile(t *testing.T) {
	path := os.Getenv("FUSELM_TRACE_CHECK")
	if path == "" {
		t.Skip("FUSELM_TRACE_CHECK is unset (a --trace file of a GPU run)")
	}
	tr := reporttest.ReadTrace(t, path)
	if tr.OtherData["profile_source"] != "cupti" {
		t.Errorf("profile source %v: the kernels were not traced", tr.OtherData["profile_source"])
	}
	steps := reporttest.KernelSteps(t, tr)
	sources := map[string]int{}
	unattributed := 0
	for _, e := range tr.TraceEvents {
		if e.Cat == "kernel" {
			sources[e.Args["source"].(string)]++
			if e.Args["op"] == string(profile.OpUnattributed) {
				unattributed++
			}
		}
	}
	if sources[profile.SourceCUBLAS] == 0 || sources[profile.SourceOwn] == 0 {
		t.Errorf("kernels by source %v: want fuselm's and cuBLAS's", sources)
	}
	t.Logf("%s: %d decode steps, %d events, kernels by source %v, %d not tied to an op; %v",
		path, steps, len(tr.TraceEvents), sources, unattributed, tr.OtherData["summary"])
}
