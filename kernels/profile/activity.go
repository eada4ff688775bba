package profile

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// KernelTracer is implemented by devices that record every kernel they
// run with its device start and end: the CUDA device through CUPTI, which
// sees the kernels of graph replays and of libraries (cuBLAS) too.
type KernelTracer interface {
	// StartKernelTrace starts recording; it fails, saying why, when the
	// device cannot (CUPTI not found).
	StartKernelTrace() error
	// TraceID sets the id that the work queued from now on is attributed
	// to, 0 for none: the profile sets an op call's id around the call and
	// a replay's around the replay. A graph captured while id is set
	// remembers it for each kernel it records (KernelRecord.Node).
	TraceID(id uint64)
	// KernelRecords waits for the records of the kernels queued so far
	// (the device must have finished them: call it after Sync) and returns
	// them, with a note of what the tracer lost, if anything ("CUPTI
	// dropped 12 records"); the records are not returned again.
	KernelRecords() (recs []KernelRecord, note string, err error)
	// StopKernelTrace stops recording.
	StopKernelTrace() error
}

// Where a kernel comes from (KernelRecord.Source).
const (
	SourceOwn    = "fuselm" // a kernel of fuselm's kernel sets
	SourceCUBLAS = "cublas" // launched by cuBLAS
	SourceOther  = "other"  // anything else
)

// KernelRecord is one kernel the device ran: what the tracer recorded,
// then the op call that launched it, filled in by the profile.
type KernelRecord struct {
	Name string `json:"name"`
	// Start and End are the device's, in nanoseconds on the host's wall
	// clock.
	Start  int64     `json:"start_ns"`
	End    int64     `json:"end_ns"`
	Grid   [3]uint32 `json:"grid"`
	Block  [3]uint32 `json:"block"`
	Stream uint32    `json:"stream"`
	Source string    `json:"source"` // SourceOwn, SourceCUBLAS or SourceOther
	// ID is the trace id set when the kernel was launched (a call's or a
	// replay's; 0: none); Node, for a kernel of a graph replay, the id set
	// when its graph node was captured (0: unknown); GraphNode is the
	// device's id of that node (0: launched directly).
	ID        uint64 `json:"-"`
	Node      uint64 `json:"-"`
	GraphNode uint64 `json:"-"`

	// The op call it ran for; Op is "" when the profile could not tell.
	Call  uint64     `json:"call,omitempty"`
	Op    kernels.Op `json:"op,omitempty"`
	Set   string     `json:"set,omitempty"`
	Phase string     `json:"phase,omitempty"`
	Step  int        `json:"step"`
	Layer int        `json:"layer"`
}

// Ns is the kernel's device time in nanoseconds.
func (k *KernelRecord) Ns() int64 { return k.End - k.Start }

// OwnNs is each record's device time in nanoseconds counted from the later
// of its start and the end of the kernels before it on its lane, and how
// many records that moved. A kernel launched to overlap the one before it
// (programmatic dependent launch, cuda.Device.LaunchOverlapped) starts
// while that one runs and waits for it: the wait is the earlier kernel's
// time, and counting it twice would make the kernels' sum exceed the time
// the device was busy. The kernels of a graph replay are one lane, those
// launched directly another, whatever streams ran them: a layer's work
// queued aside (cuda.Device.Aside) runs on a second stream, a graph with
// such branches on streams the driver picks, and its chain of kernels
// moves between them at a join, so the kernel before a kernel on its
// CUPTI stream may be a layer earlier. Of two kernels of a lane that run
// at once, the time goes to the one that started first, so the lane's
// times sum to the time it kept the device busy.
func OwnNs(recs []KernelRecord) (ns []int64, overlapped int) {
	laneOf := func(k *KernelRecord) uint64 { // 0: launched directly
		if k.GraphNode != 0 {
			return k.ID
		}
		return 0
	}
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if c := cmp.Compare(laneOf(&recs[a]), laneOf(&recs[b])); c != 0 {
			return c
		}
		return cmp.Compare(recs[a].Start, recs[b].Start)
	})
	ns = make([]int64, len(recs))
	var cur uint64
	var end int64 // the latest end of the lane's kernels so far
	for n, i := range idx {
		k := &recs[i]
		if l := laneOf(k); n == 0 || l != cur {
			cur, end = l, k.Start
		}
		from := k.Start
		if end > from {
			from = end
			overlapped++
		}
		ns[i] = max(0, k.End-from)
		end = max(end, k.End)
	}
	return ns, overlapped
}

// OpUnattributed is the op name of the profile row of kernels no op call
// is known to have launched.
const OpUnattributed kernels.Op = "(unattributed)"

// attribute fills in the op call of every kernel: a kernel launched while
// an op call's id was set ran for that call; a kernel of a graph replay
// ran for the call whose id was set when its node was captured, at the
// replay's step. Replayed kernels whose nodes were not reported are
// matched by position with the kernels of the last eager decode step
// before the capture, when the two run the same kernels in the same order.
func attribute(recs []KernelRecord, calls []OpCall, replays []Replay) []KernelRecord {
	byID := make(map[uint64]*OpCall, len(calls))
	for i := range calls {
		byID[calls[i].ID] = &calls[i]
	}
	replayByID := make(map[uint64]*Replay, len(replays))
	for i := range replays {
		replayByID[replays[i].ID] = &replays[i]
	}
	out := make([]KernelRecord, len(recs))
	unmatched := map[uint64][]int{} // replay id → its kernels with no node
	for i, r := range recs {
		r.Step, r.Layer = -1, -1
		if c := byID[r.ID]; c != nil && c.Graph == 0 {
			r.setCall(c, c.Step)
		} else if rp := replayByID[r.ID]; rp != nil {
			r.Phase, r.Step = "decode", rp.Step
			if c := byID[r.Node]; c != nil && c.Graph == rp.Graph {
				r.setCall(c, rp.Step)
			} else {
				unmatched[rp.ID] = append(unmatched[rp.ID], i)
			}
		}
		out[i] = r
	}
	for id, idx := range unmatched {
		matchByPosition(out, idx, replayByID[id], calls, byID)
	}
	return out
}

func (k *KernelRecord) setCall(c *OpCall, step int) {
	k.Call, k.Op, k.Set, k.Phase, k.Step, k.Layer = c.ID, c.Op, c.Set, c.Phase, step, c.Layer
}

// matchByPosition attributes the kernels idx of replay rp, in start order,
// to the calls of the kernels of the last eager decode step before the
// replay's graph was captured, when both are the same kernel names in the
// same order.
func matchByPosition(recs []KernelRecord, idx []int, rp *Replay, calls []OpCall, byID map[uint64]*OpCall) {
	capStep := -1
	for _, c := range calls {
		if c.Graph == rp.Graph {
			capStep = c.Step
			break
		}
	}
	tmplStep := -1
	for _, c := range calls {
		if c.Graph == 0 && c.Phase == "decode" && c.Step < capStep {
			tmplStep = max(tmplStep, c.Step)
		}
	}
	var tmpl []KernelRecord
	for _, r := range recs {
		if r.Call != 0 && r.GraphNode == 0 && r.Phase == "decode" && r.Step == tmplStep {
			tmpl = append(tmpl, r)
		}
	}
	if tmplStep < 0 || len(tmpl) != len(idx) {
		return
	}
	slices.SortFunc(tmpl, func(a, b KernelRecord) int { return cmp.Compare(a.Start, b.Start) })
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(recs[a].Start, recs[b].Start) })
	for i, j := range idx {
		if recs[j].Name != tmpl[i].Name {
			return
		}
	}
	for i, j := range idx {
		recs[j].setCall(byID[tmpl[i].Call], rp.Step)
	}
}

// Report is what a profile sums up: the device time of the run, per
// op and per kernel, where the kernels come from, and how busy the device
// was.
type Report struct {
	// Source is "cupti" (the device's record of every kernel) or "events"
	// (marks around each op call, and around each graph replay).
	Source string `json:"source"`
	// Note says, in one line, what the times leave out or why the kernels
	// were not traced; "" when nothing is missing.
	Note string `json:"note,omitempty"`
	// ComputeMs is the summed device time: of every kernel (cupti, TileGym's
	// "ms CUDA"), or of every timed op call and graph replay (events).
	ComputeMs float64 `json:"compute_ms"`
	// BusyMs is the union of the kernels' intervals, SpanMs the time from
	// the first kernel's start to the last one's end (cupti only).
	BusyMs   float64 `json:"busy_ms,omitempty"`
	SpanMs   float64 `json:"span_ms,omitempty"`
	Launches int     `json:"kernel_launches,omitempty"`
	// PhaseLaunches counts the kernels by the phase they ran in
	// ("prefill", "decode"; cupti only).
	PhaseLaunches map[string]int `json:"phase_launches,omitempty"`
	// ReplayMs is the device time of the graph replays, timed whole
	// (events only: their ops are not in Ops).
	ReplayMs float64 `json:"replay_ms,omitempty"`
	Replays  int     `json:"graph_replays,omitempty"`

	Ops      []OpStat      `json:"ops"`
	Kernels  []KernelStat  `json:"kernels,omitempty"`
	Coverage []CoverageRow `json:"coverage,omitempty"`
}

// OpStat is what a profile knows about one op.
type OpStat struct {
	Op      kernels.Op         `json:"op"`
	Set     string             `json:"set,omitempty"`
	Calls   int                `json:"calls"`
	Ms      float64            `json:"total_ms"`
	Share   float64            `json:"share"`
	PhaseMs map[string]float64 `json:"phase_ms"`
	// Kernels is the number of kernel launches (cupti only).
	Kernels int `json:"kernels,omitempty"`
	// FLOPs and Bytes are the calls' summed Cost; TFLOPs and GBs the
	// rates they give over Ms (0 when the op counts none).
	FLOPs  float64 `json:"flops,omitempty"`
	Bytes  float64 `json:"bytes,omitempty"`
	TFLOPs float64 `json:"tflop_per_s,omitempty"`
	GBs    float64 `json:"gb_per_s,omitempty"`
	// Scratch is the most scratch memory one call asked for: the op's
	// working set beyond its inputs and outputs.
	Scratch int64 `json:"scratch_bytes,omitempty"`
	// BesideMs is the part of Ms from calls that ran beside the second
	// stream's work (OpCall.Beside; events only): those times overlap it.
	BesideMs float64 `json:"beside_ms"`
	// Parts are the ops a composite op's row computes (kernels.PartsOf):
	// its time is theirs together, as its kernels ran them, not split
	// among them; where a call ran as its parts, they have rows of their
	// own instead.
	Parts []kernels.Op `json:"parts,omitempty"`
}

// KernelStat is one kernel's line of a profile: every launch of Name for Op.
type KernelStat struct {
	Name   string     `json:"name"`
	Op     kernels.Op `json:"op"`
	Source string     `json:"source"`
	Calls  int        `json:"calls"`
	Us     float64    `json:"total_us"`
	AvgUs  float64    `json:"avg_us"`
	MaxUs  float64    `json:"max_us"`
	Share  float64    `json:"share"`
}

// CoverageRow is the share of device time and of launches in the kernels
// of one origin (TileGym's --report_kernel_coverage): fuselm's own kernels
// per set that launched them, cuBLAS's, and the rest.
type CoverageRow struct {
	Source      string  `json:"source"`
	Set         string  `json:"set,omitempty"`
	Launches    int     `json:"launches"`
	Ms          float64 `json:"ms"`
	TimeShare   float64 `json:"time_share"`
	LaunchShare float64 `json:"launch_share"`
}

// opAccum gathers one op's row.
type opAccum map[kernels.Op]*OpStat

func (a opAccum) row(op kernels.Op, set string) *OpStat {
	st := a[op]
	if st == nil {
		st = &OpStat{Op: op, Set: set, PhaseMs: map[string]float64{}, Parts: kernels.PartsOf(op)}
		a[op] = st
	}
	switch {
	case st.Set == "":
		st.Set = set
	case set != "" && !slices.Contains(strings.Split(st.Set, "+"), set):
		st.Set += "+" + set // some calls ran on a fallback (see Unsupported)
	}
	return st
}

func (a opAccum) addCall(c *OpCall, cost kernels.Cost) {
	st := a.row(c.Op, c.Set)
	st.Calls++
	st.FLOPs += cost.FLOPs
	st.Bytes += cost.Bytes
	st.Scratch = max(st.Scratch, c.Scratch)
}

// rows returns the ops largest first, with shares of total and rates.
func (a opAccum) rows(total float64) []OpStat {
	rows := make([]OpStat, 0, len(a))
	for _, st := range a {
		r := *st
		if total > 0 {
			r.Share = r.Ms / total
		}
		if r.Ms > 0 {
			r.TFLOPs = r.FLOPs / (r.Ms * 1e9)
			r.GBs = r.Bytes / (r.Ms * 1e6)
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Ms != rows[j].Ms {
			return rows[i].Ms > rows[j].Ms
		}
		return opOrder(rows[i].Op) < opOrder(rows[j].Op)
	})
	return rows
}

// opOrder sorts ops as the op table does, unknown ones last.
func opOrder(op kernels.Op) int {
	if i := slices.Index(kernels.AllOps, op); i >= 0 {
		return i
	}
	return len(kernels.AllOps)
}

// eventReport is the report of a profile timed by marks.
func eventReport(calls []OpCall, replays []Replay, traceErr error) *Report {
	rep := &Report{Source: "events"}
	acc := opAccum{}
	for i := range calls {
		c := &calls[i]
		if c.Graph != 0 {
			continue
		}
		acc.addCall(c, c.Cost)
		st := acc[c.Op]
		st.Ms += c.Ms
		st.PhaseMs[c.Phase] += c.Ms
		if c.Beside {
			st.BesideMs += c.Ms
		}
		rep.ComputeMs += c.Ms
	}
	for _, r := range replays {
		rep.ReplayMs += r.Ms
	}
	rep.Replays = len(replays)
	rep.ComputeMs += rep.ReplayMs
	rep.Ops = acc.rows(rep.ComputeMs - rep.ReplayMs)
	var why string
	if traceErr != nil {
		why = fmt.Sprintf("kernels not traced (%v): times are events around each op", traceErr)
	}
	if len(replays) > 0 {
		replayed := fmt.Sprintf("%d decode steps were CUDA graph replays, timed whole (%.1f ms in the total): their ops are not in the table (--no-graphs times every step)",
			len(replays), rep.ReplayMs)
		why = joinNote(why, replayed)
	}
	rep.Note = why
	return rep
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// kernelReport is the report of a profile timed by the device's kernel
// records.
func kernelReport(recs []KernelRecord, calls []OpCall, replays []Replay, notes []string) *Report {
	rep := &Report{Source: "cupti", Launches: len(recs)}
	acc := opAccum{}
	byGraph := map[int][]*OpCall{}
	for i := range calls {
		c := &calls[i]
		if c.Graph != 0 {
			byGraph[c.Graph] = append(byGraph[c.Graph], c)
			continue
		}
		acc.addCall(c, c.Cost)
	}
	for _, r := range replays {
		for _, c := range byGraph[r.Graph] {
			acc.addCall(c, c.Cost.At(r.Step-c.Step))
		}
	}
	type kkey struct {
		name string
		op   kernels.Op
	}
	kstats := map[kkey]*KernelStat{}
	type ckey struct{ source, set string }
	cov := map[ckey]*CoverageRow{}
	unattributed := 0
	own, overlapped := OwnNs(recs)
	for i := range recs {
		k := &recs[i]
		ms := float64(own[i]) / 1e6
		rep.ComputeMs += ms
		op := k.Op
		if op == "" {
			op, unattributed = OpUnattributed, unattributed+1
		}
		st := acc.row(op, k.Set)
		st.Ms += ms
		st.Kernels++
		if k.Phase != "" {
			st.PhaseMs[k.Phase] += ms
			if rep.PhaseLaunches == nil {
				rep.PhaseLaunches = map[string]int{}
			}
			rep.PhaseLaunches[k.Phase]++
		}
		ks := kstats[kkey{k.Name, op}]
		if ks == nil {
			ks = &KernelStat{Name: k.Name, Op: op, Source: k.Source}
			kstats[kkey{k.Name, op}] = ks
		}
		us := ms * 1e3
		ks.Calls++
		ks.Us += us
		ks.MaxUs = max(ks.MaxUs, us)
		set := ""
		if k.Source == SourceOwn {
			set = k.Set
		}
		cr := cov[ckey{k.Source, set}]
		if cr == nil {
			cr = &CoverageRow{Source: k.Source, Set: set}
			cov[ckey{k.Source, set}] = cr
		}
		cr.Launches++
		cr.Ms += ms
	}
	rep.Ops = acc.rows(rep.ComputeMs)
	for _, ks := range kstats {
		ks.AvgUs = ks.Us / float64(ks.Calls)
		if rep.ComputeMs > 0 {
			ks.Share = ks.Us / 1e3 / rep.ComputeMs
		}
		rep.Kernels = append(rep.Kernels, *ks)
	}
	sort.Slice(rep.Kernels, func(i, j int) bool {
		a, b := rep.Kernels[i], rep.Kernels[j]
		if a.Us != b.Us {
			return a.Us > b.Us
		}
		return a.Name+string(a.Op) < b.Name+string(b.Op)
	})
	for _, cr := range cov {
		if rep.ComputeMs > 0 {
			cr.TimeShare = cr.Ms / rep.ComputeMs
		}
		cr.LaunchShare = float64(cr.Launches) / float64(len(recs))
		rep.Coverage = append(rep.Coverage, *cr)
	}
	sort.Slice(rep.Coverage, func(i, j int) bool { return rep.Coverage[i].Ms > rep.Coverage[j].Ms })
	rep.BusyMs, rep.SpanMs = BusyTime(recs)
	var note string
	for _, n := range notes {
		note = joinNote(note, n)
	}
	if unattributed > 0 {
		note = joinNote(note, fmt.Sprintf("%d of %d kernels could not be tied to an op", unattributed, len(recs)))
	}
	if overlapped > 0 {
		note = joinNote(note, fmt.Sprintf("%d of %d kernels started before the kernel ahead of them (in their graph replay, or among those launched directly) ended "+
			"(overlapped launches): each counts from that kernel's end", overlapped, len(recs)))
	}
	if len(recs) == 0 && len(calls) > 0 {
		note = joinNote(note, "the device recorded no kernels")
	}
	rep.Note = note
	return rep
}

// BusyTime is the time the device ran at least one of the kernels (the
// union of their intervals) and the time from the first one's start to the
// last one's end, in milliseconds.
func BusyTime(recs []KernelRecord) (busyMs, spanMs float64) {
	if len(recs) == 0 {
		return 0, 0
	}
	iv := make([][2]int64, len(recs))
	for i, k := range recs {
		iv[i] = [2]int64{k.Start, k.End}
	}
	slices.SortFunc(iv, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var busy int64
	from, to := iv[0][0], iv[0][1]
	last := to
	for _, x := range iv[1:] {
		last = max(last, x[1])
		if x[0] > to {
			busy += to - from
			from, to = x[0], x[1]
			continue
		}
		to = max(to, x[1])
	}
	busy += to - from
	return float64(busy) / 1e6, float64(last-iv[0][0]) / 1e6
}

// NonZero is &v, or nil (JSON null) when v is its type's zero: a figure
// not measured, the one rule of every JSON document fuselm writes.
func NonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// MarshalJSON writes what the profile did not measure as null rather than
// leaving it out: the set where none is known, the launches of an events
// profile, the FLOPs, bytes and rates of an op that counts none, the time
// beside the second stream where none ran there or the kernels were traced.
func (s OpStat) MarshalJSON() ([]byte, error) {
	type plain OpStat // OpStat without this method
	return json.Marshal(struct {
		plain
		Set     *string  `json:"set"`
		Kernels *int     `json:"kernels"`
		FLOPs   *float64 `json:"flops"`
		Bytes   *float64 `json:"bytes"`
		TFLOPs  *float64 `json:"tflop_per_s"`
		GBs     *float64 `json:"gb_per_s"`
		Beside  *float64 `json:"beside_ms"`
	}{plain(s), NonZero(s.Set), NonZero(s.Kernels), NonZero(s.FLOPs), NonZero(s.Bytes), NonZero(s.TFLOPs), NonZero(s.GBs),
		NonZero(s.BesideMs)})
}

// MarshalJSON writes what the report's source does not measure as null:
// the busy time, span and launches of an events report, the graph replays
// timed whole of a cupti one, the kernel and coverage tables without a
// trace, and the note when nothing is missing.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // Report without this method
	return json.Marshal(struct {
		plain
		Note     *string       `json:"note"`
		BusyMs   *float64      `json:"busy_ms"`
		SpanMs   *float64      `json:"span_ms"`
		Launches *int          `json:"kernel_launches"`
		ReplayMs *float64      `json:"replay_ms"`
		Replays  *int          `json:"graph_replays"`
		Kernels  []KernelStat  `json:"kernels"`
		Coverage []CoverageRow `json:"coverage"`
	}{plain(r), NonZero(r.Note), NonZero(r.BusyMs), NonZero(r.SpanMs), NonZero(r.Launches), NonZero(r.ReplayMs),
		NonZero(r.Replays), r.Kernels, r.Coverage})
}
