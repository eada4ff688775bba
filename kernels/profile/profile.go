// Package profile records what kernel sets did: every op call of a
// kernels.Dispatch (as its Observer), graph replays and host spans, timed by
// marks on the device or by the device's own record of every kernel it ran
// (KernelTracer, CUPTI on CUDA), and sums them up per op, per kernel and per
// origin (Report).
package profile

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fuselm/fuselm/kernels"
)

// Profile records every op call of the kernels.Dispatch it observes (give
// it to kernels.Spec.Build): the op, the set that ran it, the phase, decode
// step and decoder layer it belongs to, its cost (FLOPs and bytes) and the
// scratch memory it asked for; and host spans (loading, the prefill, each
// decode step).
//
// Device time comes from one of two sources. By default (events) it is the
// time between marks queued around each call (wall time on the CPU, CUDA
// events on a GPU), resolved by Flush; calls recorded into a CUDA graph are
// not timed, and each replay of the graph is timed as a whole. After
// TraceKernels succeeds (cupti) it is the device's record of every kernel
// it ran, graph replays and library kernels (cuBLAS) included, each
// attributed to the op call that launched it.
type Profile struct {
	dev      kernels.Device
	tracer   KernelTracer // nil: times come from marks
	traceErr error        // why TraceKernels failed, for the report's note
	meter    ScratchMeter // the device's, or nil

	mu        sync.Mutex
	on        bool
	capturing bool
	phase     string
	step      int
	layer     int
	graphs    int // captures begun
	nextID    uint64
	calls     []OpCall
	replays   []Replay
	host      []HostSpan
	marks     map[uint64][2]kernels.Mark // events: the marks around a call or replay, until Flush
	records   []KernelRecord             // cupti: attributed by Flush
	notes     []string                   // what the tracer said when flushed (dropped records)
}

// OpCall is one call of an op through the dispatch.
type OpCall struct {
	ID    uint64     `json:"id"`
	Op    kernels.Op `json:"op"`
	Set   string     `json:"set"`
	Phase string     `json:"phase"`
	// Step is 0 for the prefill and k for the k-th decode step (of the
	// call itself; a captured call runs at the steps of its replays).
	Step int `json:"step"`
	// Layer is the decoder layer the call belongs to, -1 outside them
	// (embedding, the final norm, lm_head, argmax).
	Layer int `json:"layer"`
	// Graph is the capture the call was recorded into (1 for the first),
	// 0 for a call that ran when made.
	Graph int `json:"graph,omitempty"`
	// Start and End are the host's wall clock around the call, in
	// nanoseconds since the Unix epoch: when its work was queued.
	Start int64 `json:"start_ns"`
	End   int64 `json:"end_ns"`
	// Ms is the device time between the marks around the call (events
	// only; 0 for captured calls and under cupti).
	Ms float64 `json:"ms,omitempty"`
	// Beside is set for a call queued on the device's second stream, or
	// on the first while work queued on the second is not yet joined
	// (kernels.Brancher: DeepSeek-V2's shared experts beside the router and
	// the routed experts): its events time then includes what ran beside
	// it, so the two streams' calls overlap.
	Beside  bool         `json:"beside,omitempty"`
	Cost    kernels.Cost `json:"-"`
	Scratch int64        `json:"scratch_bytes,omitempty"`
}

// Replay is one replay of a captured graph. Graph numbers the captures of
// the generation (1 for its first); 0 is a graph an earlier generation
// captured and kept (model's Generate), none of whose calls are in this
// profile.
type Replay struct {
	ID    uint64  `json:"id"`
	Graph int     `json:"graph"`
	Step  int     `json:"step"`
	Start int64   `json:"start_ns"`
	End   int64   `json:"end_ns"`
	Ms    float64 `json:"ms,omitempty"` // events only: the device time of the whole replay
}

// HostSpan is a stretch of host time: loading, the prefill, a decode step.
type HostSpan struct {
	Name  string `json:"name"`
	Phase string `json:"phase,omitempty"`
	Step  int    `json:"step"`
	Start int64  `json:"start_ns"`
	End   int64  `json:"end_ns"`
}

// besider is implemented by devices that run work beside the stream
// (kernels.Brancher): Beside reports whether work queued now runs beside
// other work of the step (see OpCall.Beside).
type besider interface{ Beside() bool }

// ScratchMeter is implemented by devices that hand out scratch memory to
// kernels (the CUDA device): the profile asks it, around each op call, how
// much the call asked for.
type ScratchMeter interface {
	// TakeScratch returns the bytes of scratch asked for since the last
	// call, counting each buffer once at its largest ask, and starts
	// counting anew.
	TakeScratch() int64
}

// New returns an enabled profile of work on dev, in phase "prefill",
// timing op calls with marks (see TraceKernels).
func New(dev kernels.Device) *Profile {
	p := &Profile{dev: dev, on: true, phase: "prefill", layer: -1, marks: map[uint64][2]kernels.Mark{}}
	p.meter, _ = dev.(ScratchMeter)
	return p
}

// TraceKernels makes the profile time the device's kernels as the device
// records them (see KernelTracer) instead of marks around each call. When
// the device cannot, the profile keeps its marks and the error, which the
// report's note states.
func (p *Profile) TraceKernels() error {
	t, ok := p.dev.(KernelTracer)
	if !ok {
		p.traceErr = fmt.Errorf("%s records no kernels", p.dev.Name())
		return p.traceErr
	}
	if err := t.StartKernelTrace(); err != nil {
		p.traceErr = err
		return err
	}
	p.tracer, p.traceErr = t, nil
	return nil
}

// Source says where device times come from: "cupti" (every kernel, as the
// device recorded it) or "events" (marks around each call).
func (p *Profile) Source() string {
	if p.tracer != nil {
		return "cupti"
	}
	return "events"
}

// Close stops the device's kernel trace, if the profile started one.
func (p *Profile) Close() error {
	if p.tracer == nil {
		return nil
	}
	t := p.tracer
	p.tracer = nil
	return t.StopKernelTrace()
}

// SetEnabled turns recording on or off (off for warm-up runs).
func (p *Profile) SetEnabled(on bool) {
	p.mu.Lock()
	p.on = on
	p.mu.Unlock()
}

// SetPhase names the phase later calls are counted under ("prefill", "decode").
func (p *Profile) SetPhase(phase string) {
	p.mu.Lock()
	p.phase = phase
	p.mu.Unlock()
}

// SetStep numbers the step later calls belong to: 0 for the prefill, k for
// the k-th decode step.
func (p *Profile) SetStep(step int) {
	p.mu.Lock()
	p.step = step
	p.mu.Unlock()
}

// SetLayer says which decoder layer the calls that follow belong to; -1
// means none (kernels.Observer's layer mark, told by the Dispatch).
func (p *Profile) SetLayer(layer int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.layer = layer
	p.mu.Unlock()
}

// BeginCapture marks the calls that follow, until EndCapture, as recorded
// into a graph: they run at its replays, not when made, so no marks are
// queued around them.
func (p *Profile) BeginCapture() {
	p.mu.Lock()
	p.capturing = true
	p.graphs++
	p.mu.Unlock()
}

// EndCapture ends what BeginCapture began.
func (p *Profile) EndCapture() {
	p.mu.Lock()
	p.capturing = false
	p.mu.Unlock()
}

// Replay runs replay, which queues a replay of the last graph captured, as
// decode step step: its kernels are attributed to the step (and, through
// the graph, to the captured calls), or under events it is timed whole.
func (p *Profile) Replay(step int, replay func() error) error {
	if p == nil {
		return replay()
	}
	p.mu.Lock()
	on := p.on
	p.nextID++
	r := Replay{ID: p.nextID, Graph: p.graphs, Step: step}
	p.mu.Unlock()
	if !on {
		return replay()
	}
	r.Start = time.Now().UnixNano()
	var from kernels.Mark
	if p.tracer != nil {
		p.tracer.TraceID(r.ID)
	} else {
		from = p.dev.Mark()
	}
	err := replay()
	if p.tracer != nil {
		p.tracer.TraceID(0)
	} else {
		p.mu.Lock()
		p.marks[r.ID] = [2]kernels.Mark{from, p.dev.Mark()}
		p.mu.Unlock()
	}
	r.End = time.Now().UnixNano()
	p.mu.Lock()
	p.replays = append(p.replays, r)
	p.mu.Unlock()
	return err
}

// AddHostSpan records a stretch of host time.
func (p *Profile) AddHostSpan(name, phase string, step int, start, end time.Time) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on {
		p.host = append(p.host, HostSpan{Name: name, Phase: phase, Step: step, Start: start.UnixNano(), End: end.UnixNano()})
	}
}

// pendingCall is a call under way: begin made it, end records it.
type pendingCall struct {
	p    *Profile
	call OpCall
	from kernels.Mark
}

// EndOp records the call, run on set at cost (the Observer's end).
func (c *pendingCall) EndOp(set string, cost kernels.Cost) {
	c.call.Set = set
	c.p.end(c, cost)
}

// BeginOp starts recording a call of op on set (kernels.Observer's
// begin, told by the Dispatch); nil when the profile is off.
func (p *Profile) BeginOp(op kernels.Op, set string) kernels.OpEnd {
	if c := p.begin(op, set); c != nil {
		return c
	}
	return nil
}

func (p *Profile) begin(op kernels.Op, set string) *pendingCall {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if !p.on {
		p.mu.Unlock()
		return nil
	}
	p.nextID++
	c := &pendingCall{p: p, call: OpCall{ID: p.nextID, Op: op, Set: set, Phase: p.phase, Step: p.step, Layer: p.layer}}
	if b, ok := p.dev.(besider); ok {
		c.call.Beside = b.Beside()
	}
	if p.capturing {
		c.call.Graph = p.graphs
	}
	p.mu.Unlock()
	if p.meter != nil {
		p.meter.TakeScratch()
	}
	c.call.Start = time.Now().UnixNano()
	switch {
	case p.tracer != nil:
		p.tracer.TraceID(c.call.ID)
	case c.call.Graph == 0:
		c.from = p.dev.Mark()
	}
	return c
}

func (p *Profile) end(c *pendingCall, cost kernels.Cost) {
	var to kernels.Mark
	switch {
	case p.tracer != nil:
		p.tracer.TraceID(0)
	case c.call.Graph == 0:
		to = p.dev.Mark()
	}
	c.call.End = time.Now().UnixNano()
	c.call.Cost = cost
	if p.meter != nil {
		c.call.Scratch = p.meter.TakeScratch()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, c.call)
	if c.from != nil {
		p.marks[c.call.ID] = [2]kernels.Mark{c.from, to}
	}
}

// Reset forgets every recorded call, replay, span and kernel, so that the
// next run is counted alone. The device must have finished the work queued
// so far (kernels the trace still holds are dropped).
func (p *Profile) Reset() error {
	p.mu.Lock()
	p.calls, p.replays, p.host, p.records, p.notes = nil, nil, nil, nil, nil
	p.marks = map[uint64][2]kernels.Mark{}
	p.step, p.layer, p.graphs = 0, -1, 0
	p.mu.Unlock()
	if p.tracer != nil {
		_, _, err := p.tracer.KernelRecords()
		return err
	}
	return nil
}

// Flush resolves the device times of all recorded work: the marks' times,
// or the device's kernel records, attributed to calls and replays. Call it
// after Device.Sync.
func (p *Profile) Flush() error {
	if p.tracer != nil {
		recs, note, err := p.tracer.KernelRecords()
		if err != nil {
			return fmt.Errorf("profile: kernel records: %w", err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.on {
			return nil
		}
		if note != "" {
			p.notes = append(p.notes, note)
		}
		p.records = append(p.records, attribute(recs, p.calls, p.replays)...)
		return nil
	}
	p.mu.Lock()
	marks := p.marks
	p.marks = map[uint64][2]kernels.Mark{}
	p.mu.Unlock()
	times := make(map[uint64]float64, len(marks))
	for id, m := range marks {
		ms, err := p.dev.Elapsed(m[0], m[1])
		if err != nil {
			return fmt.Errorf("profile: timing call %d: %w", id, err)
		}
		times[id] = ms
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.calls {
		if ms, ok := times[p.calls[i].ID]; ok {
			p.calls[i].Ms = ms
		}
	}
	for i := range p.replays {
		if ms, ok := times[p.replays[i].ID]; ok {
			p.replays[i].Ms = ms
		}
	}
	return nil
}

// Recording is what a profile recorded since its last Reset: every op
// call and graph replay in order, the host spans, and (cupti, after Flush)
// every kernel with the op call that launched it.
type Recording struct {
	Calls   []OpCall
	Replays []Replay
	Host    []HostSpan
	Kernels []KernelRecord
}

// Recording returns a copy of what the profile recorded.
func (p *Profile) Recording() Recording {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Recording{
		Calls:   slices.Clone(p.calls),
		Replays: slices.Clone(p.replays),
		Host:    slices.Clone(p.host),
		Kernels: slices.Clone(p.records),
	}
}

// Report sums up what the profile recorded: per op, per kernel, coverage
// and busy time.
func (p *Profile) Report() *Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tracer != nil {
		return kernelReport(p.records, p.calls, p.replays, p.notes)
	}
	return eventReport(p.calls, p.replays, p.traceErr)
}

// Table returns one row per op that ran, largest total first, with each
// op's share of the summed time (Report's Ops).
func (p *Profile) Table() []OpStat { return p.Report().Ops }

// TotalMs is the summed device time of the run (Report's ComputeMs).
func (p *Profile) TotalMs() float64 { return p.Report().ComputeMs }
