package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// syntheticTrace is a run of two layers: a prefill, an eager decode step
// and two replayed ones, one kernel per op call and step, plus one kernel
// no call launched.
func syntheticTrace() profile.Recording {
	const ms = int64(1e6)
	t0 := int64(1_700_000_000) * 1e9
	d := profile.Recording{Host: []profile.HostSpan{{Name: "load", Start: t0, End: t0 + 50*ms}}}
	var id uint64
	captured := map[string]uint64{} // the captured call of each layer and op
	at := t0 + 100*ms
	for step := 0; step <= 3; step++ {
		phase := "decode"
		name := fmt.Sprintf("decode step %d", step)
		if step == 0 {
			phase, name = "prefill", "prefill"
		}
		d.Host = append(d.Host, profile.HostSpan{Name: name, Phase: phase, Step: step, Start: at, End: at + 10*ms})
		for layer := range 2 {
			for _, op := range []kernels.Op{kernels.OpLinear, kernels.OpAttnDecode} {
				key := fmt.Sprint(layer, op)
				call := captured[key]
				if step <= 2 {
					id++
					call = id
					c := profile.OpCall{ID: id, Op: op, Set: "fused", Phase: phase, Step: step, Layer: layer, Start: at, End: at + 100}
					if step == 2 {
						c.Graph = 1
						captured[key] = id
					}
					d.Calls = append(d.Calls, c)
				}
				src := profile.SourceOwn
				if op == kernels.OpLinear {
					src = profile.SourceCUBLAS
				}
				d.Kernels = append(d.Kernels, profile.KernelRecord{Name: string(op) + "_kernel", Start: at + ms, End: at + 2*ms,
					Stream: 7, Source: src, Call: call, Op: op, Set: "fused", Phase: phase, Step: step, Layer: layer, Grid: [3]uint32{4, 1, 1}, Block: [3]uint32{128, 1, 1}})
				at += 2 * ms
			}
		}
		if step >= 2 {
			d.Replays = append(d.Replays, profile.Replay{ID: 100 + uint64(step), Graph: 1, Step: step, Start: at, End: at + ms})
		}
		at += 20 * ms
	}
	d.Kernels = append(d.Kernels, profile.KernelRecord{Name: "stray", Start: at, End: at + ms, Stream: 7, Step: -1, Layer: -1, Source: profile.SourceOther})
	return d
}

// readTrace reads and parses the trace file at path.
func readTrace(t *testing.T, path string) *chromeTrace {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := parseTrace(b)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// kernelSteps checks a parsed trace: every decode step of the host phases
// has kernels on a GPU kernel track, the op track spans hold their
// kernels. It returns the decode steps seen.
func kernelSteps(t *testing.T, tr *chromeTrace) int {
	t.Helper()
	names := map[[2]int]string{}
	for _, e := range tr.TraceEvents {
		if e.Ph == "M" {
			names[[2]int{e.Pid, int(e.Tid)}] = e.Args["name"].(string)
		}
	}
	steps := map[int]bool{}
	kernelsAt := map[int]int{}
	gpuOps := 0
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		track := names[[2]int{e.Pid, int(e.Tid)}]
		step := int(e.Args["step"].(float64))
		switch {
		case track == "phases" && strings.HasPrefix(e.Name, "decode step "):
			steps[step] = true
		case strings.HasPrefix(track, "kernels (stream"):
			kernelsAt[step]++
			for _, k := range []string{"op", "set", "layer", "phase", "grid", "block", "source"} {
				if _, ok := e.Args[k]; !ok {
					t.Errorf("kernel %s lacks %s", e.Name, k)
				}
			}
		case e.Pid == pidGPU && track == "ops":
			gpuOps++
		}
	}
	if len(steps) == 0 {
		t.Fatal("no decode step in the host phases")
	}
	for s := range steps {
		if kernelsAt[s] == 0 {
			t.Errorf("decode step %d has no kernel on the kernel track", s)
		}
	}
	if gpuOps == 0 {
		t.Error("no op on the GPU's op track")
	}
	return len(steps)
}

func TestBuildTrace(t *testing.T) {
	d := syntheticTrace()
	b, err := buildTrace(d, "cuda:0 H200", map[string]any{"model": "m"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := parseTrace(b)
	if err != nil {
		t.Fatal(err)
	}
	if n := kernelSteps(t, tr); n != 3 {
		t.Errorf("%d decode steps, want 3", n)
	}
	var hostOps, kernelsSeen, replays int
	var loadTs float64 = -1
	for _, e := range tr.TraceEvents {
		switch {
		case e.Name == "load":
			loadTs = e.Ts
		case e.Name == "graph replay":
			replays++
		case e.Ph == "X" && e.Pid == pidHost && e.Tid == tidHostOps:
			hostOps++
		case e.Cat == "kernel":
			kernelsSeen++
		}
		if e.Ph == "X" && e.Name == "attn_decode L1" && e.Pid == pidGPU && e.Args["kernels"].(float64) != 1 {
			t.Errorf("GPU op span %+v", e)
		}
	}
	if loadTs != 0 || hostOps != len(d.Calls) || kernelsSeen != len(d.Kernels) || replays != 2 {
		t.Errorf("load at %g µs, %d host ops, %d kernels, %d replays", loadTs, hostOps, kernelsSeen, replays)
	}
	if tr.OtherData["model"] != "m" || tr.DisplayTimeUnit != "ms" {
		t.Errorf("otherData %v", tr.OtherData)
	}
	for _, bad := range []string{`{}`, `[1,2]`, `{"traceEvents":[{"name":"x","ph":"X","ts":1,"pid":1,"tid":1}]}`, `{"traceEvents":[{"name":"x","ph":"B","ts":1}]}`} {
		if _, err := parseTrace([]byte(bad)); err == nil {
			t.Errorf("parseTrace(%s): no error", bad)
		}
	}
}

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
	tr := readTrace(t, path)
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
	tr := readTrace(t, path)
	if tr.OtherData["profile_source"] != "cupti" {
		t.Errorf("profile source %v: the kernels were not traced", tr.OtherData["profile_source"])
	}
	steps := kernelSteps(t, tr)
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
