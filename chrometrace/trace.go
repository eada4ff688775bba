// Package chrometrace lays a run's recording out as a Chrome trace, the file
// of --trace, and reads one back.
package chrometrace

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// A --trace file is in the Chrome trace event format (the JSON object form,
// which Perfetto and chrome://tracing open): complete ("X") events with
// times in microseconds from the first one, on two processes. The host
// process has the phases (loading, the prefill, each decode step) and the
// op calls as the host queued them; the GPU process has, per stream, every
// kernel the device ran, and the ops as the GPU ran them (from their first
// kernel's start to their last one's end), with their layer and phase.

// Event is one event of the Chrome trace format.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`            // µs
	Dur  *float64       `json:"dur,omitempty"` // µs, for complete events
	Pid  int            `json:"pid"`
	Tid  uint32         `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// Trace is the trace file of the run d describes; meta goes in its
// otherData.
type Trace struct {
	TraceEvents     []Event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	OtherData       map[string]any `json:"otherData"`
}

// The processes and threads of a trace.
const (
	PidHost = 1
	PidGPU  = 2

	TidPhases  = 1
	TidHostOps = 2
	TidGPUOps  = 1 // kernel tracks are tid 100 + the stream id
	TidStream0 = 100
)

// Build lays d out as a Chrome trace; device names the GPU process.
func Build(d profile.Recording, device string, meta map[string]any) ([]byte, error) {
	t0 := int64(-1)
	first := func(ns int64) {
		if ns > 0 && (t0 < 0 || ns < t0) {
			t0 = ns
		}
	}
	for _, h := range d.Host {
		first(h.Start)
	}
	for _, c := range d.Calls {
		first(c.Start)
	}
	for _, r := range d.Replays {
		first(r.Start)
	}
	for _, k := range d.Kernels {
		first(k.Start)
	}
	us := func(ns int64) float64 { return float64(ns-t0) / 1e3 }
	var ev []Event
	span := func(name, cat string, pid int, tid uint32, start, end int64, args map[string]any) {
		dur := max(0, float64(end-start)/1e3)
		ev = append(ev, Event{Name: name, Cat: cat, Ph: "X", Ts: us(start), Dur: &dur, Pid: pid, Tid: tid, Args: args})
	}
	meta1 := func(name string, pid int, tid uint32, value string) {
		ev = append(ev, Event{Name: name, Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"name": value}})
	}
	meta1("process_name", PidHost, 0, "host")
	meta1("thread_name", PidHost, TidPhases, "phases")
	meta1("thread_name", PidHost, TidHostOps, "op calls (queued)")
	meta1("process_name", PidGPU, 0, "GPU "+device)
	meta1("thread_name", PidGPU, TidGPUOps, "ops")

	for _, h := range d.Host {
		span(h.Name, "phase", PidHost, TidPhases, h.Start, h.End, map[string]any{"phase": h.Phase, "step": h.Step})
	}
	for _, c := range d.Calls {
		args := opArgs(c.Op, c.Set, c.Phase, c.Step, c.Layer)
		if c.Graph != 0 {
			args["captured_in_graph"] = c.Graph
		}
		if c.Ms > 0 {
			args["device_ms"] = c.Ms
		}
		span(opLabel(c.Op, c.Layer), "op", PidHost, TidHostOps, c.Start, c.End, args)
	}
	for _, r := range d.Replays {
		args := map[string]any{"step": r.Step, "graph": r.Graph}
		if r.Graph == 0 {
			args["graph"] = "kept from an earlier generation"
		}
		span("graph replay", "op", PidHost, TidHostOps, r.Start, r.End, args)
	}

	streams := map[uint32]bool{}
	type opRun struct {
		call       uint64
		step       int
		start, end int64
		k          profile.KernelRecord
		kernels    int
	}
	runs := map[[2]int64]*opRun{}
	for _, k := range d.Kernels {
		tid := TidStream0 + k.Stream
		if !streams[k.Stream] {
			streams[k.Stream] = true
			meta1("thread_name", PidGPU, tid, fmt.Sprintf("kernels (stream %d)", k.Stream))
		}
		args := opArgs(k.Op, k.Set, k.Phase, k.Step, k.Layer)
		args["source"] = k.Source
		args["grid"] = k.Grid
		args["block"] = k.Block
		span(k.Name, "kernel", PidGPU, tid, k.Start, k.End, args)
		if k.Call == 0 {
			continue
		}
		key := [2]int64{int64(k.Call), int64(k.Step)}
		r := runs[key]
		if r == nil {
			r = &opRun{call: k.Call, step: k.Step, start: k.Start, end: k.End, k: k}
			runs[key] = r
		}
		r.start, r.end = min(r.start, k.Start), max(r.end, k.End)
		r.kernels++
	}
	ops := make([]*opRun, 0, len(runs))
	for _, r := range runs {
		ops = append(ops, r)
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].start < ops[j].start })
	for _, r := range ops {
		args := opArgs(r.k.Op, r.k.Set, r.k.Phase, r.step, r.k.Layer)
		args["kernels"] = r.kernels
		span(opLabel(r.k.Op, r.k.Layer), "op", PidGPU, TidGPUOps, r.start, r.end, args)
	}
	b, err := json.MarshalIndent(Trace{TraceEvents: ev, DisplayTimeUnit: "ms", OtherData: meta}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// opLabel names an op call on a track: "attn_prefill L3", or the op alone
// outside the decoder layers.
func opLabel(op kernels.Op, layer int) string {
	if layer < 0 {
		return string(op)
	}
	return fmt.Sprintf("%s L%d", op, layer)
}

func opArgs(op kernels.Op, set, phase string, step, layer int) map[string]any {
	a := map[string]any{"op": string(op), "set": set, "phase": phase, "step": step, "layer": layer}
	if op == "" {
		a["op"] = string(profile.OpUnattributed)
	}
	return a
}

// Parse reads a trace file back: its events, and an error when it is
// not the Chrome trace format's JSON object form.
func Parse(b []byte) (*Trace, error) {
	var t Trace
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if t.TraceEvents == nil {
		return nil, fmt.Errorf("trace: no traceEvents")
	}
	for i, e := range t.TraceEvents {
		switch {
		case e.Ph == "X" && (e.Dur == nil || *e.Dur < 0 || e.Ts < 0):
			return nil, fmt.Errorf("trace: event %d (%s) has no duration or a negative time", i, e.Name)
		case e.Ph != "X" && e.Ph != "M":
			return nil, fmt.Errorf("trace: event %d (%s) of phase %q", i, e.Name, e.Ph)
		case e.Name == "":
			return nil, fmt.Errorf("trace: event %d has no name", i)
		}
	}
	return &t, nil
}
