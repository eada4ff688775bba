package kbench

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/profile"
)

// traceDevice is the cpu device as a GPU's kernel trace sees it: the ops
// of tracedOps launch synthetic kernels of fixed durations, each after a
// launch gap, on a clock of the device's own that its marks read; while
// tracing it records them. It captures graphs, whose replays launch the
// captured kernels again.
type traceDevice struct {
	*cpu.Device
	clock     int64 // ns
	tracing   bool
	capturing bool
	captured  []fakeKernel
	recs      []profile.KernelRecord
	note      string // what KernelRecords says it lost
	startErr  error  // what StartKernelTrace fails with
	ids       map[uint64]bool
	starts    int
	stops     int
	replays   int // graph replays while tracing
}

type fakeKernel struct {
	name, source string
	ns           int64
}

// launchGap is the device time between two fake kernels.
const launchGap = 2000

func (d *traceDevice) launch(ks ...fakeKernel) {
	if d.capturing {
		d.captured = append(d.captured, ks...)
		return
	}
	for _, k := range ks {
		d.clock += launchGap
		if d.tracing {
			d.recs = append(d.recs, profile.KernelRecord{Name: k.name, Source: k.source, Start: d.clock, End: d.clock + k.ns})
		}
		d.clock += k.ns
	}
}

func (d *traceDevice) Mark() kernels.Mark { return d.clock }

func (d *traceDevice) Elapsed(from, to kernels.Mark) (float64, error) {
	return float64(to.(int64)-from.(int64)) / 1e6, nil
}

func (d *traceDevice) StartKernelTrace() error {
	if d.startErr != nil {
		return d.startErr
	}
	d.tracing = true
	d.starts++
	return nil
}

func (d *traceDevice) StopKernelTrace() error {
	d.tracing = false
	d.stops++
	return nil
}

func (d *traceDevice) TraceID(id uint64) {
	if d.ids == nil {
		d.ids = map[uint64]bool{}
	}
	d.ids[id] = true
}

func (d *traceDevice) KernelRecords() ([]profile.KernelRecord, string, error) {
	if !d.tracing {
		return nil, "", errors.New("not tracing")
	}
	r := d.recs
	d.recs = nil
	return r, d.note, nil
}

func (d *traceDevice) BeginCapture() error {
	d.capturing, d.captured = true, nil
	return nil
}

func (d *traceDevice) EndCapture() (kernels.Graph, error) {
	d.capturing = false
	return &fakeGraph{d: d, ks: d.captured}, nil
}

type fakeGraph struct {
	d  *traceDevice
	ks []fakeKernel
}

func (g *fakeGraph) Replay() error {
	if g.d.tracing {
		g.d.replays++
	}
	g.d.launch(g.ks...)
	return nil
}

func (g *fakeGraph) Close() error { return nil }

// The kernels tracedOps launches: attention's cache append and attention
// kernel (one call: 10 + 90 µs and two gaps), cuBLAS's GEMM in two halves
// and its split-K reduction (51 µs), and a norm short enough that time
// replays it from a graph (8 µs).
var (
	fakeAppend = fakeKernel{"kv_append_v8", profile.SourceOwn, 10_000}
	fakeFlash  = fakeKernel{"flash_hopper_d16_s2", profile.SourceOwn, 90_000}
	fakeGemm   = fakeKernel{"sm90_xmma_gemm_bf16bf16_bf16f32", profile.SourceCUBLAS, 20_000}
	fakeReduce = fakeKernel{"splitKreduce_kernel", profile.SourceCUBLAS, 5_000}
	fakeNorm   = fakeKernel{"rms_norm_v8", profile.SourceOwn, 8_000}
)

// tracedOps is the cpu set, launching fake kernels on d for the ops it
// computes.
type tracedOps struct {
	*kernels.Dispatch
	d *traceDevice
}

func (o tracedOps) AttentionPrefill(a *kernels.AttnArgs) {
	o.Dispatch.AttentionPrefill(a)
	o.d.launch(fakeAppend, fakeFlash)
}

func (o tracedOps) Linear(out, x, w, bias *kernels.Tensor) {
	o.Dispatch.Linear(out, x, w, bias)
	o.d.launch(fakeGemm, fakeGemm, fakeReduce)
}

func (o tracedOps) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	o.Dispatch.RMSNorm(out, x, w, eps)
	o.d.launch(fakeNorm)
}

// traceRun times then traces small shapes of attn_prefill, linear and
// rms_norm on d with tracedOps, as Run would with Options.CUPTI.
func traceRun(t *testing.T, d *traceDevice) *runner {
	t.Helper()
	ops, err := kernels.Spec{Base: "cpu"}.Build(d.Device, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{dev: d, built: map[string]setOps{"cpu": tracedOps{ops, d}}, rep: &Report{},
		opt: Options{Sets: []string{"cpu"}, CUPTI: true, Seed: 5}}
	var cs []*Case
	for op, shape := range map[kernels.Op]string{
		kernels.OpAttnPrefill: "B=1,H=2,KVH=1,D=16,N=8,causal=1",
		kernels.OpLinear:      "M=3,N=16,K=32",
		kernels.OpRMSNorm:     "M=2,N=32",
	} {
		c := *CaseFor(op)
		s, _ := kernels.ParseShape(shape)
		c.Shapes = []kernels.Shape{s}
		cs = append(cs, &c)
	}
	for _, c := range cs {
		r.shape(c, c.Shapes[0], func() {})
	}
	if d.starts != 0 || len(d.recs) != 0 {
		t.Fatalf("the timing traced: %d starts, %d records", d.starts, len(d.recs))
	}
	shapes := 0
	r.traceKernels(cs, func() { shapes++ })
	if shapes != len(cs) {
		t.Errorf("progress after %d shapes of the trace pass, want %d", shapes, len(cs))
	}
	if len(r.rep.Rows) != len(cs) {
		t.Fatalf("%d rows: %+v", len(r.rep.Rows), r.rep.Rows)
	}
	return r
}

// rowOf is the report's row of op.
func rowOf(t *testing.T, rep *Report, op kernels.Op) Row {
	t.Helper()
	for _, row := range rep.Rows {
		if row.Op == op {
			return row
		}
	}
	t.Fatalf("no %s row", op)
	return Row{}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// The trace pass gives each timed row the kernels of one call: launches
// and time per call, the longest first, shares of the event-timed ms, and
// attention's time and rates without the cache append; a short call's
// kernels come from its graph's replay.
func TestTraceKernels(t *testing.T) {
	d := &traceDevice{Device: cpu.NewDevice()}
	r := traceRun(t, d)
	if d.starts != 1 || d.stops != 1 || d.tracing {
		t.Errorf("trace started %d times, stopped %d, still on %v: want once each", d.starts, d.stops, d.tracing)
	}
	if r.rep.Note != "" {
		t.Errorf("report note %q", r.rep.Note)
	}

	prefill := rowOf(t, r.rep, kernels.OpAttnPrefill)
	if prefill.Err != "" || prefill.Note != "" || !near(prefill.Ms, 0.104) {
		t.Fatalf("attn_prefill row: %+v, want 0.104 ms (two kernels, two gaps) and no note", prefill)
	}
	want := []KernelTime{
		{Name: fakeFlash.name, Source: profile.SourceOwn, Launches: 1, Ms: 0.09, Share: 0.09 / 0.104},
		{Name: fakeAppend.name, Source: profile.SourceOwn, Launches: 1, Ms: 0.01, Share: 0.01 / 0.104},
	}
	sameKernels(t, "attn_prefill", prefill.Kernels, want)
	c := CaseFor(kernels.OpAttnPrefill)
	s, _ := kernels.ParseShape("B=1,H=2,KVH=1,D=16,N=8,causal=1")
	if !near(prefill.NoAppendMs, 0.09) || !near(prefill.NoAppendTFLOPS, c.FLOPs(s)/0.09/1e9) || !near(prefill.NoAppendGBs, c.Bytes(s)/0.09/1e6) {
		t.Errorf("attn_prefill without kv_append: %g ms, %g TFLOP/s, %g GB/s; want 0.09 ms, %g, %g", prefill.NoAppendMs,
			prefill.NoAppendTFLOPS, prefill.NoAppendGBs, c.FLOPs(s)/0.09/1e9, c.Bytes(s)/0.09/1e6)
	}
	// The TFLOP/s without the append is the attention kernel's alone:
	// above the op's by the append's and the gaps' share.
	if !(prefill.NoAppendTFLOPS > prefill.TFLOPS) || !near(prefill.NoAppendTFLOPS/prefill.TFLOPS, 0.104/0.09) {
		t.Errorf("TFLOP/s %g through the op, %g without kv_append", prefill.TFLOPS, prefill.NoAppendTFLOPS)
	}

	linear := rowOf(t, r.rep, kernels.OpLinear)
	sameKernels(t, "linear", linear.Kernels, []KernelTime{
		{Name: fakeGemm.name, Source: profile.SourceCUBLAS, Launches: 2, Ms: 0.04, Share: 0.04 / 0.051},
		{Name: fakeReduce.name, Source: profile.SourceCUBLAS, Launches: 1, Ms: 0.005, Share: 0.005 / 0.051},
	})
	if linear.NoAppendMs != 0 || linear.NoAppendTFLOPS != 0 || linear.NoAppendGBs != 0 {
		t.Errorf("linear ran no append, yet: %+v", linear)
	}

	norm := rowOf(t, r.rep, kernels.OpRMSNorm)
	sameKernels(t, "rms_norm", norm.Kernels, []KernelTime{
		{Name: fakeNorm.name, Source: profile.SourceOwn, Launches: 1, Ms: 0.008, Share: 0.8},
	})
	for _, tr := range r.timed {
		if g := tr.group; r.rep.Rows[tr.index].Op == kernels.OpRMSNorm && (!g.graph || g.size != maxGroupSize) {
			t.Errorf("rms_norm (10 µs a call) timed in %+v, want a graph of %d calls", g, maxGroupSize)
		}
		if g := tr.group; r.rep.Rows[tr.index].Op == kernels.OpAttnPrefill && g.graph {
			t.Errorf("attn_prefill (104 µs a call) timed in a graph")
		}
	}
	if d.replays != 2 {
		t.Errorf("%d graph replays traced, want rms_norm's warm-up group and its traced one", d.replays)
	}
	if len(d.ids) != 4 || !d.ids[0] { // each row's id, then none
		t.Errorf("trace ids set: %v, want one a row and 0", d.ids)
	}
}

func sameKernels(t *testing.T, what string, got, want []KernelTime) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		g, w := got[i], want[i]
		ok = g.Name == w.Name && g.Source == w.Source && near(g.Launches, w.Launches) && near(g.Ms, w.Ms) && near(g.Share, w.Share)
	}
	if !ok {
		t.Errorf("%s kernels:\n got %+v\nwant %+v", what, got, want)
	}
}

// What the tracer says it lost goes into every row's note, the numbers
// staying.
func TestTraceKernelsNote(t *testing.T) {
	d := &traceDevice{Device: cpu.NewDevice(), note: "CUPTI dropped 3 records: kernel times miss some kernels"}
	r := traceRun(t, d)
	for _, row := range r.rep.Rows {
		if row.Note != d.note || len(row.Kernels) == 0 || !(row.Ms > 0) {
			t.Errorf("%s: note %q, %d kernels, %g ms", row.Op, row.Note, len(row.Kernels), row.Ms)
		}
	}
}

// A device that cannot trace leaves the rows timed and untraced, and the
// report says why, once.
func TestTraceKernelsUnavailable(t *testing.T) {
	d := &traceDevice{Device: cpu.NewDevice(), startErr: errors.New("cuda: libcupti not found")}
	r := traceRun(t, d)
	if r.rep.Note != "kernels not traced: cuda: libcupti not found" || d.stops != 0 {
		t.Errorf("report note %q, %d stops", r.rep.Note, d.stops)
	}
	for _, row := range r.rep.Rows {
		if row.Kernels != nil || row.Note != "" || row.Err != "" || !(row.Ms > 0) {
			t.Errorf("%s: %+v", row.Op, row)
		}
	}

	// The cpu device is no tracer: Run goes on, the note names the device,
	// and progress counts the trace pass's shapes too.
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	s, _ := kernels.ParseShape("M=4,N=32")
	var done, total, calls int
	rep, err := Run(dev, kernels.Target{}, Options{Ops: []kernels.Op{kernels.OpRMSNorm}, Shapes: []kernels.Shape{s, s},
		Sets: []string{"cpu"}, CUPTI: true, Progress: func(d, n int) {
			calls++
			if d != done+1 || total != 0 && n != total {
				t.Errorf("progress went from %d of %d to %d of %d", done, total, d, n)
			}
			done, total = d, n
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rep.Note, "kernels not traced: cpu ") || !strings.HasSuffix(rep.Note, "records no kernels") {
		t.Errorf("report note %q", rep.Note)
	}
	if len(rep.Rows) != 2 || rep.Rows[0].Kernels != nil || !(rep.Rows[0].Ms > 0) {
		t.Errorf("rows %+v", rep.Rows)
	}
	if done != 6 || total != 6 || calls != 6 {
		t.Errorf("progress ended at %d of %d after %d calls, want 6 of 6 (two shapes, each built, its row timed, then traced)", done, total, calls)
	}
}

// kernelTimes sums records per name into one call's, longest first (ties
// by name); withoutAppend leaves out fuselm's kv_append only.
func TestKernelTimes(t *testing.T) {
	clock := int64(1000) // one stream: each kernel after the one before
	rec := func(name, source string, ns int64) profile.KernelRecord {
		clock += 100
		k := profile.KernelRecord{Name: name, Source: source, Start: clock, End: clock + ns}
		clock += ns
		return k
	}
	var recs []profile.KernelRecord
	for range 4 { // four calls
		recs = append(recs, rec("b", profile.SourceOwn, 3000), rec("gemm", profile.SourceCUBLAS, 5000),
			rec("gemm", profile.SourceCUBLAS, 7000), rec("a", profile.SourceOwn, 3000), rec("kv_append_v4", profile.SourceOwn, 1000))
	}
	recs = append(recs, rec("memset", profile.SourceOther, 2000)) // once in four calls
	got := kernelTimes(recs, 4, 0.025)
	sameKernels(t, "four calls", got, []KernelTime{
		{Name: "gemm", Source: profile.SourceCUBLAS, Launches: 2, Ms: 0.012, Share: 0.48},
		{Name: "a", Source: profile.SourceOwn, Launches: 1, Ms: 0.003, Share: 0.12},
		{Name: "b", Source: profile.SourceOwn, Launches: 1, Ms: 0.003, Share: 0.12},
		{Name: "kv_append_v4", Source: profile.SourceOwn, Launches: 1, Ms: 0.001, Share: 0.04},
		{Name: "memset", Source: profile.SourceOther, Launches: 0.25, Ms: 0.0005, Share: 0.02},
	})
	ms, tflops, gbs := withoutAppend(got, 1e9, 2e6)
	if !near(ms, 0.0185) || !near(tflops, 1e9/0.0185/1e9) || !near(gbs, 2e6/0.0185/1e6) {
		t.Errorf("without kv_append: %g ms, %g TFLOP/s, %g GB/s", ms, tflops, gbs)
	}
	if ms, _, _ := withoutAppend(got[:3], 1e9, 1); ms != 0 {
		t.Errorf("no append, yet %g ms without it", ms)
	}
	if ms, _, _ := withoutAppend(got[3:4], 1e9, 1); ms != 0 {
		t.Errorf("the append alone, yet %g ms without it", ms)
	}
	other := []KernelTime{{Name: "kv_append_lookalike", Source: profile.SourceOther, Ms: 1}, {Name: "x", Source: profile.SourceOwn, Ms: 1}}
	if ms, _, _ := withoutAppend(other, 1, 1); ms != 0 {
		t.Errorf("a kernel not fuselm's taken for the append: %g ms", ms)
	}
	if ks := kernelTimes(nil, 3, 1); len(ks) != 0 {
		t.Errorf("no records: %+v", ks)
	}
}
