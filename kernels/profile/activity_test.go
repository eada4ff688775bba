package profile

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// k is a synthetic kernel record of name, running [start, end) µs.
func k(name string, start, end int64, id, node, graphNode uint64, source string) KernelRecord {
	return KernelRecord{Name: name, Start: start * 1000, End: end * 1000, ID: id, Node: node, GraphNode: graphNode, Source: source}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestBusyTime(t *testing.T) {
	for _, c := range []struct {
		recs       []KernelRecord
		busy, span float64 // ms
	}{
		{nil, 0, 0},
		{[]KernelRecord{k("a", 0, 10, 0, 0, 0, "")}, 0.010, 0.010},
		// a gap of 5 µs, then two overlapping kernels and one inside them
		{[]KernelRecord{k("a", 0, 10, 0, 0, 0, ""), k("c", 20, 30, 0, 0, 0, ""), k("b", 15, 25, 0, 0, 0, ""), k("d", 16, 17, 0, 0, 0, "")}, 0.025, 0.030},
		// back to back counts once; a kernel ending before the last end
		{[]KernelRecord{k("a", 0, 10, 0, 0, 0, ""), k("b", 10, 40, 0, 0, 0, ""), k("c", 12, 13, 0, 0, 0, "")}, 0.040, 0.040},
	} {
		busy, span := BusyTime(c.recs)
		if !near(busy, c.busy) || !near(span, c.span) {
			t.Errorf("%v: busy %g span %g, want %g %g", c.recs, busy, span, c.busy, c.span)
		}
	}
}

// A decode run as the model makes it: a prefill call, an eager decode
// step, a capture at step 2 and replays at steps 2 and 3. Kernels of
// replays are tied to the captured calls through their nodes; the
// replayed attention reads one more key per row each step.
func syntheticRun() ([]OpCall, []Replay, []KernelRecord) {
	calls := []OpCall{
		{ID: 1, Op: kernels.OpLinear, Set: "naive", Phase: "prefill", Step: 0, Layer: 0, Cost: kernels.Cost{FLOPs: 2e9, Bytes: 1e6}},
		{ID: 2, Op: kernels.OpAttnPrefill, Set: "fused", Phase: "prefill", Step: 0, Layer: 0, Cost: kernels.Cost{FLOPs: 4e9, Bytes: 2e6}, Scratch: 4096},
		{ID: 3, Op: kernels.OpLinear, Set: "naive", Phase: "decode", Step: 1, Layer: 0, Cost: kernels.Cost{FLOPs: 1e6, Bytes: 1e6}},
		{ID: 4, Op: kernels.OpAttnDecode, Set: "fused", Phase: "decode", Step: 1, Layer: 0, Cost: kernels.Cost{FLOPs: 1e6, Bytes: 1e6, StepFLOPs: 10, StepBytes: 100}, Scratch: 64},
		{ID: 5, Op: kernels.OpLinear, Set: "naive", Phase: "decode", Step: 2, Layer: 0, Graph: 1, Cost: kernels.Cost{FLOPs: 1e6, Bytes: 1e6}},
		{ID: 6, Op: kernels.OpAttnDecode, Set: "fused", Phase: "decode", Step: 2, Layer: 0, Graph: 1, Cost: kernels.Cost{FLOPs: 1e6, Bytes: 1e6, StepFLOPs: 10, StepBytes: 100}, Scratch: 64},
	}
	replays := []Replay{{ID: 7, Graph: 1, Step: 2}, {ID: 8, Graph: 1, Step: 3}}
	recs := []KernelRecord{
		k("gemm_cublas", 0, 100, 1, 0, 0, SourceCUBLAS),
		k("flash_fwd", 100, 300, 2, 0, 0, SourceOwn),
		k("gemv_cublas", 310, 320, 3, 0, 0, SourceCUBLAS),
		k("flash_decode", 320, 330, 4, 0, 0, SourceOwn),
		k("gemv_cublas", 340, 350, 7, 5, 91, SourceCUBLAS),
		k("flash_decode", 350, 361, 7, 6, 92, SourceOwn),
		k("gemv_cublas", 370, 380, 8, 5, 91, SourceCUBLAS),
		k("flash_decode", 380, 392, 8, 6, 92, SourceOwn),
		k("memset_thing", 400, 401, 0, 0, 0, SourceOther),
	}
	return calls, replays, recs
}

func TestKernelReport(t *testing.T) {
	calls, replays, recs := syntheticRun()
	got := attribute(recs, calls, replays)
	wantOps := []struct {
		op    kernels.Op
		step  int
		layer int
	}{
		{kernels.OpLinear, 0, 0}, {kernels.OpAttnPrefill, 0, 0}, {kernels.OpLinear, 1, 0}, {kernels.OpAttnDecode, 1, 0},
		{kernels.OpLinear, 2, 0}, {kernels.OpAttnDecode, 2, 0}, {kernels.OpLinear, 3, 0}, {kernels.OpAttnDecode, 3, 0}, {"", -1, -1},
	}
	for i, w := range wantOps {
		if got[i].Op != w.op || got[i].Step != w.step || got[i].Layer != w.layer {
			t.Errorf("kernel %d %s: op %q step %d layer %d, want %q %d %d", i, got[i].Name, got[i].Op, got[i].Step, got[i].Layer, w.op, w.step, w.layer)
		}
	}

	rep := kernelReport(got, calls, replays, []string{"CUPTI dropped 2 records"})
	if rep.Source != "cupti" || rep.Launches != 9 {
		t.Errorf("source %q, %d launches", rep.Source, rep.Launches)
	}
	// Two kernels in the prefill, six in steps 1 to 3 (two a step, two of
	// them replayed from graph nodes); the memset has no phase.
	if p, d := rep.PhaseLaunches["prefill"], rep.PhaseLaunches["decode"]; p != 2 || d != 6 || len(rep.PhaseLaunches) != 2 {
		t.Errorf("launches by phase %v, want prefill 2, decode 6", rep.PhaseLaunches)
	}
	// 100+200+10+10+10+11+10+12+1 µs
	if !near(rep.ComputeMs, 0.364) {
		t.Errorf("compute %g ms, want 0.364", rep.ComputeMs)
	}
	// busy: [0,300) [310,330) [340,361) [370,392) [400,401)
	if !near(rep.BusyMs, 0.364) || !near(rep.SpanMs, 0.401) {
		t.Errorf("busy %g span %g", rep.BusyMs, rep.SpanMs)
	}
	if !strings.Contains(rep.Note, "CUPTI dropped 2 records") || !strings.Contains(rep.Note, "1 of 9 kernels could not be tied to an op") {
		t.Errorf("note %q", rep.Note)
	}
	ops := map[kernels.Op]OpStat{}
	var share float64
	for _, r := range rep.Ops {
		ops[r.Op] = r
		share += r.Share
	}
	if !near(share, 1) {
		t.Errorf("shares add up to %g", share)
	}
	lin := ops[kernels.OpLinear]
	// Linear: 1 prefill + 1 eager decode + 2 replays of the captured one.
	if lin.Calls != 4 || lin.Kernels != 4 || !near(lin.Ms, 0.130) || !near(lin.PhaseMs["decode"], 0.030) || lin.Set != "naive" {
		t.Errorf("linear %+v", lin)
	}
	if !near(lin.FLOPs, 2e9+3e6) || !near(lin.TFLOPs, (2e9+3e6)/(0.130*1e9)) {
		t.Errorf("linear FLOPs %g, %g TFLOP/s", lin.FLOPs, lin.TFLOPs)
	}
	dec := ops[kernels.OpAttnDecode]
	// Eager step 1, then the captured call at steps 2 (as captured) and 3
	// (one more key per row).
	if dec.Calls != 3 || !near(dec.Bytes, 3e6+100) || !near(dec.Ms, 0.033) || dec.Scratch != 64 {
		t.Errorf("attn_decode %+v", dec)
	}
	if ops[kernels.OpAttnPrefill].Scratch != 4096 {
		t.Errorf("attn_prefill scratch %d", ops[kernels.OpAttnPrefill].Scratch)
	}
	if u := ops[OpUnattributed]; u.Kernels != 1 || u.Calls != 0 {
		t.Errorf("unattributed %+v", u)
	}
	if rep.Ops[0].Op != kernels.OpAttnPrefill {
		t.Errorf("largest op first: %v", rep.Ops[0].Op)
	}

	ks := map[string]KernelStat{}
	for _, s := range rep.Kernels {
		ks[s.Name+"/"+string(s.Op)] = s
	}
	if s := ks["flash_decode/attn_decode"]; s.Calls != 3 || !near(s.Us, 33) || !near(s.MaxUs, 12) || !near(s.AvgUs, 11) {
		t.Errorf("flash_decode %+v", s)
	}
	if s := ks["gemv_cublas/linear"]; s.Calls != 3 || s.Source != SourceCUBLAS {
		t.Errorf("gemv %+v", s)
	}

	cov := map[string]CoverageRow{}
	var ts, ls float64
	for _, c := range rep.Coverage {
		cov[c.Source+"/"+c.Set] = c
		ts += c.TimeShare
		ls += c.LaunchShare
	}
	if !near(ts, 1) || !near(ls, 1) {
		t.Errorf("coverage shares %g %g", ts, ls)
	}
	if c := cov["fuselm/fused"]; c.Launches != 4 || !near(c.Ms, 0.233) {
		t.Errorf("fuselm fused coverage %+v", c)
	}
	if c := cov["cublas/"]; c.Launches != 4 || !near(c.LaunchShare, 4.0/9) {
		t.Errorf("cublas coverage %+v", c)
	}
	if c := cov["other/"]; c.Launches != 1 {
		t.Errorf("other coverage %+v", c)
	}
}

// Replayed kernels whose graph nodes the tracer did not report are tied
// to calls by their position in the last eager decode step, when the names
// agree; when they do not, they stay unattributed.
func TestAttributeByPosition(t *testing.T) {
	calls, replays, recs := syntheticRun()
	for i := range recs {
		recs[i].Node = 0
	}
	got := attribute(recs, calls, replays)
	for i := 4; i < 8; i++ {
		want := kernels.OpLinear
		if i%2 == 1 {
			want = kernels.OpAttnDecode
		}
		if got[i].Op != want || got[i].Step != 2+(i-4)/2 {
			t.Errorf("kernel %d: %q at step %d", i, got[i].Op, got[i].Step)
		}
	}
	recs[5].Name = "something_else"
	got = attribute(recs, calls, replays)
	if got[4].Op != "" || got[5].Op != "" || got[5].Step != 2 || got[6].Op != kernels.OpLinear {
		t.Errorf("mismatched replay: %+v", got[4:7])
	}
}

func TestEventReport(t *testing.T) {
	calls := []OpCall{
		{ID: 1, Op: kernels.OpRMSNorm, Set: "fused", Phase: "prefill", Ms: 2, Cost: kernels.Cost{Bytes: 4e6}},
		{ID: 2, Op: kernels.OpRMSNorm, Set: "fused", Phase: "decode", Step: 1, Ms: 1, Cost: kernels.Cost{Bytes: 2e6}},
		{ID: 3, Op: kernels.OpRMSNorm, Set: "fused", Phase: "decode", Step: 2, Graph: 1},
	}
	replays := []Replay{{ID: 4, Graph: 1, Step: 2, Ms: 5}, {ID: 5, Graph: 1, Step: 3, Ms: 6}}
	rep := eventReport(calls, replays, errTest("no libcupti"))
	if rep.Source != "events" || !near(rep.ComputeMs, 14) || !near(rep.ReplayMs, 11) || rep.Replays != 2 {
		t.Errorf("report %+v", rep)
	}
	if len(rep.Ops) != 1 || rep.Ops[0].Calls != 2 || !near(rep.Ops[0].Ms, 3) || rep.Ops[0].Share != 1 || !near(rep.Ops[0].GBs, 2) {
		t.Errorf("ops %+v", rep.Ops)
	}
	for _, want := range []string{"kernels not traced (no libcupti)", "2 decode steps were CUDA graph replays, timed whole (11.0 ms"} {
		if !strings.Contains(rep.Note, want) {
			t.Errorf("note %q lacks %q", rep.Note, want)
		}
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// TestOwnNs holds overlapped kernels to their own time: a kernel that
// starts before the one ahead of it has ended counts from that end, on
// any stream (a layer's work queued aside runs on a second one), so that
// the times sum to the time the device was busy.
func TestOwnNs(t *testing.T) {
	recs := []KernelRecord{
		{Name: "a", Start: 100, End: 200, Stream: 1},
		{Name: "b", Start: 150, End: 260, Stream: 1}, // waited 50 ns on a
		{Name: "c", Start: 300, End: 350, Stream: 1}, // after a gap
		{Name: "x", Start: 120, End: 180, Stream: 2}, // another stream, wholly beside a
		{Name: "d", Start: 310, End: 340, Stream: 1}, // wholly inside c
	}
	ns, overlapped := OwnNs(recs)
	want := []int64{100, 60, 50, 0, 0}
	if !slices.Equal(ns, want) || overlapped != 3 {
		t.Errorf("OwnNs = %v, %d overlapped; want %v, 3", ns, overlapped, want)
	}
	var sum int64
	for _, n := range ns {
		sum += n
	}
	if busy, _ := BusyTime(recs); float64(sum)/1e6 != busy {
		t.Errorf("own times sum to %d ns, the busy time is %v ms", sum, busy)
	}

	// The kernels of a graph replay share one lane whatever streams CUPTI
	// names: a branched graph's chain moves between streams at a join.
	// Replay 7's p waits on o across streams; q, of the same stream as o
	// but replay 8, and r, launched directly on that stream, are apart.
	recs = []KernelRecord{
		{Name: "o", Start: 100, End: 200, Stream: 5, ID: 7, GraphNode: 1},
		{Name: "p", Start: 150, End: 230, Stream: 6, ID: 7, GraphNode: 2}, // waited 50 ns on o
		{Name: "s", Start: 160, End: 190, Stream: 5, ID: 7, GraphNode: 3}, // beside p, wholly under o
		{Name: "q", Start: 120, End: 170, Stream: 5, ID: 8, GraphNode: 1}, // another replay
		{Name: "r", Start: 130, End: 180, Stream: 5},                      // launched directly
	}
	ns, overlapped = OwnNs(recs)
	if want := []int64{100, 30, 0, 50, 50}; !slices.Equal(ns, want) || overlapped != 2 {
		t.Errorf("replays: OwnNs = %v, %d overlapped; want %v, 2", ns, overlapped, want)
	}
}

// TestNullForAbsent holds the profile's JSON to the project's rule: what
// was not measured is null, not left out, and what was keeps its value.
func TestNullForAbsent(t *testing.T) {
	rep := Report{Source: "events", ComputeMs: 2, Ops: []OpStat{
		{Op: kernels.OpEmbedding, Calls: 1, Ms: 1, PhaseMs: map[string]float64{}},
		{Op: kernels.OpLinear, Set: "fused", Calls: 2, Ms: 1, Kernels: 3, FLOPs: 4e9, Bytes: 2e6, TFLOPs: 4, GBs: 2,
			PhaseMs: map[string]float64{"decode": 1}, BesideMs: 0.5},
	}}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"note", "busy_ms", "span_ms", "kernel_launches", "replay_ms", "graph_replays", "kernels", "coverage"} {
		if v, ok := got[k]; !ok || v != nil {
			t.Errorf("report %q = %v (present %v), want null", k, v, ok)
		}
	}
	ops := got["ops"].([]any)
	emb, lin := ops[0].(map[string]any), ops[1].(map[string]any)
	for _, k := range []string{"set", "kernels", "flops", "bytes", "tflop_per_s", "gb_per_s", "beside_ms"} {
		if v, ok := emb[k]; !ok || v != nil {
			t.Errorf("embedding's %q = %v (present %v), want null", k, v, ok)
		}
	}
	if lin["set"] != "fused" || lin["kernels"] != 3.0 || lin["flops"] != 4e9 || lin["gb_per_s"] != 2.0 || lin["calls"] != 2.0 ||
		lin["beside_ms"] != 0.5 {
		t.Errorf("linear's row %v lost a measured value", lin)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Ops[1].FLOPs != 4e9 || back.Ops[0].FLOPs != 0 {
		t.Errorf("read back: %+v, %v", back, err)
	}
}
