package chrometrace_test

import (
	"fmt"
	"testing"

	"github.com/fuselm/fuselm/chrometrace"
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/report/reporttest"
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

func TestBuildTrace(t *testing.T) {
	d := syntheticTrace()
	d.Replays[len(d.Replays)-1].Graph = 0 // a graph an earlier generation kept
	b, err := chrometrace.Build(d, "cuda:0 H200", map[string]any{"model": "m"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := chrometrace.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if n := reporttest.KernelSteps(t, tr); n != 3 {
		t.Errorf("%d decode steps, want 3", n)
	}
	var hostOps, kernelsSeen, replays int
	var graphs []any
	var loadTs float64 = -1
	for _, e := range tr.TraceEvents {
		switch {
		case e.Name == "load":
			loadTs = e.Ts
		case e.Name == "graph replay":
			replays++
			graphs = append(graphs, e.Args["graph"])
		case e.Ph == "X" && e.Pid == chrometrace.PidHost && e.Tid == chrometrace.TidHostOps:
			hostOps++
		case e.Cat == "kernel":
			kernelsSeen++
		}
		if e.Ph == "X" && e.Name == "attn_decode L1" && e.Pid == chrometrace.PidGPU && e.Args["kernels"].(float64) != 1 {
			t.Errorf("GPU op span %+v", e)
		}
	}
	if loadTs != 0 || hostOps != len(d.Calls) || kernelsSeen != len(d.Kernels) || replays != 2 {
		t.Errorf("load at %g µs, %d host ops, %d kernels, %d replays", loadTs, hostOps, kernelsSeen, replays)
	}
	if len(graphs) != 2 || graphs[0] != float64(1) || graphs[1] != "kept from an earlier generation" {
		t.Errorf("replays' graphs %v, want 1 then the kept one", graphs)
	}
	if tr.OtherData["model"] != "m" || tr.DisplayTimeUnit != "ms" {
		t.Errorf("otherData %v", tr.OtherData)
	}
	for _, bad := range []string{`{}`, `[1,2]`, `{"traceEvents":[{"name":"x","ph":"X","ts":1,"pid":1,"tid":1}]}`, `{"traceEvents":[{"name":"x","ph":"B","ts":1}]}`} {
		if _, err := chrometrace.Parse([]byte(bad)); err == nil {
			t.Errorf("chrometrace.Parse(%s): no error", bad)
		}
	}
}
