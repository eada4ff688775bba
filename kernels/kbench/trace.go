package kbench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	"github.com/fuselm/fuselm/kernels/profile"
)

// Kernel times (Options.CUPTI): after every row is timed, each timed row's
// calls run again, a warm-up group then one group as time ran them
// (directly, or replayed from a graph), under the device's kernel trace,
// whose records give the device time of every kernel of a call. The
// timing itself never runs traced: the CUDA device keeps CUPTI's session
// up once started, so that a trace between two rows' timings could slow the
// second.

// KernelTime is one kernel of an op's call, as the device traced it.
type KernelTime struct {
	Name   string `json:"name"`
	Source string `json:"source"` // profile.SourceOwn ("fuselm"), SourceCUBLAS ("cublas") or SourceOther ("other")
	// Launches and Ms are per call: the kernel's launches, and the sum of
	// their device times, over the traced calls, divided by their number.
	Launches float64 `json:"launches_per_call"`
	Ms       float64 `json:"ms_per_call"`
	// Share is Ms over the row's Ms, the call's time between events.
	Share float64 `json:"share_of_ms"`
}

// appendKernel begins the name of the KV cache append the CUDA sets'
// attention runs before its attention kernel (cudaset's AppendKV, whose
// kernels are kv_append_v<vector width>).
const appendKernel = "kv_append"

// timedRow is a row that time measured, for the trace pass to run again.
type timedRow struct {
	index int // in Report.Rows
	c     *Case
	shape kernels.Shape
	group group // how time ran the calls
	dense bool  // the case's dense reference (denseRow), not a set's problem
}

// traceKernels fills in the kernels of every timed row, shape by shape in
// the order Run timed them, calling progress after each shape. A device
// that traces no kernels leaves the rows as they are, and the report's
// note says why.
func (r *runner) traceKernels(cs []*Case, progress func()) {
	tr, ok := r.dev.(profile.KernelTracer)
	var err error
	if !ok {
		err = fmt.Errorf("%s records no kernels", r.dev.Name())
	} else {
		err = tr.StartKernelTrace()
	}
	if err != nil {
		r.rep.Note = joinNote(r.rep.Note, fmt.Sprintf("kernels not traced: %v", err))
	}
	rest := r.timed
	for _, c := range cs {
		for _, s := range r.shapesOf(c) {
			n := 0
			for n < len(rest) && rest[n].c == c && rest[n].shape.String() == s.String() {
				n++
			}
			if err == nil {
				r.traceShape(tr, rest[:n])
			}
			rest = rest[n:]
			progress()
		}
	}
	if err == nil {
		if err := tr.StopKernelTrace(); err != nil {
			r.rep.Note = joinNote(r.rep.Note, fmt.Sprintf("stopping the kernel trace: %v", err))
		}
	}
}

// traceShape traces the timed rows of one shape: the sets' rows on the
// shape's problem, then its dense reference's row on the dense problem.
func (r *runner) traceShape(tr profile.KernelTracer, rows []timedRow) {
	var sets, dense []timedRow
	for _, t := range rows {
		if t.dense {
			dense = append(dense, t)
		} else {
			sets = append(sets, t)
		}
	}
	r.traceOn(tr, sets, buildBare)
	r.traceOn(tr, dense, buildDense)
}

// traceOn builds the problem of rows (all of one shape) again with mk, as
// time had it (the same seed), and traces every row on it.
func (r *runner) traceOn(tr profile.KernelTracer, rows []timedRow, mk func(*kerneltest.Builder, *Case, kernels.Shape) (*kerneltest.Problem, error)) {
	if len(rows) == 0 {
		return
	}
	b := kerneltest.NewBuilder(r.dev, r.opt.Seed, r.target.L2Bytes)
	defer r.release(b)
	p, perr := mk(b, rows[0].c, rows[0].shape)
	for _, t := range rows {
		row := &r.rep.Rows[t.index]
		if perr != nil {
			row.Note = joinNote(row.Note, fmt.Sprintf("kernels not traced: building the problem again: %v", perr))
			continue
		}
		o, restore, err := r.rowOps(t, row)
		if err != nil {
			row.Note = joinNote(row.Note, fmt.Sprintf("kernels not traced: %v", err))
			continue
		}
		r.traceRow(row, tr, t, p, o)
		restore()
	}
}

// rowOps is the ops a timed row ran: its set's, in the row's variant where
// the set offers several for the shape (as shape chose them), with what
// puts back the variant the set ran before.
func (r *runner) rowOps(t timedRow, row *Row) (kernels.Ops, func(), error) {
	o, err := r.ops(row.Set)
	if err != nil {
		return nil, nil, err
	}
	none := func() {}
	if t.dense {
		return o, none, nil
	}
	info, _ := kernels.Set(row.Set)
	tuner, tunable := o.TunerOf(t.c.Op)
	if !tunable || len(info.VariantsOf(t.c.Op, t.shape, r.target)) < 2 {
		return o, none, nil
	}
	key := tuner.TuningKey(t.c.Op, t.shape)
	was := tuner.VariantFor(t.c.Op, key)
	if err := tuner.UseVariant(t.c.Op, key, row.Variant); err != nil {
		return nil, nil, err
	}
	return o, func() {
		if was != "" {
			tuner.UseVariant(t.c.Op, key, was)
		}
	}, nil
}

// traceRow runs t's calls of p with o under the trace and fills in row's
// kernels from what the device recorded; the tracer's note (records it
// lost) goes into the row's.
func (r *runner) traceRow(row *Row, tr profile.KernelTracer, t timedRow, p *kerneltest.Problem, o kernels.Ops) {
	recs, note, err := r.traceGroup(tr, p, o, t.group, uint64(t.index)+1)
	row.Note = joinNote(row.Note, note)
	if err != nil {
		row.Note = joinNote(row.Note, fmt.Sprintf("kernels not traced: %v", err))
		return
	}
	if len(recs) == 0 {
		row.Note = joinNote(row.Note, "the device recorded no kernels")
		return
	}
	row.Kernels = kernelTimes(recs, t.group.size, row.Ms)
	bytes := t.c.Bytes(t.shape)
	if p.Bytes > 0 {
		bytes = p.Bytes
	}
	row.NoAppendMs, row.NoAppendTFLOPS, row.NoAppendGBs = withoutAppend(row.Kernels, t.c.FLOPs(t.shape), bytes)
}

// traceGroup runs one call, a warm-up group and a group g of calls of p's
// op with o under the trace id id (which ties cuBLAS's graph nodes to
// cuBLAS), and returns the records of the last group.
func (r *runner) traceGroup(tr profile.KernelTracer, p *kerneltest.Problem, o kernels.Ops, g group, id uint64) ([]profile.KernelRecord, string, error) {
	tr.TraceID(id)
	defer tr.TraceID(0)
	next := rotate(p, o)
	if err := call(r.dev, next); err != nil {
		return nil, "", err
	}
	run, release, err := r.grouped(next, g)
	if err != nil {
		return nil, "", err
	}
	defer release()
	once := func() error {
		var rerr error
		if err := call(r.dev, func() { rerr = run() }); err != nil {
			return err
		}
		return rerr
	}
	if err := once(); err != nil {
		return nil, "", err
	}
	if _, _, err := tr.KernelRecords(); err != nil { // the warm-up's
		return nil, "", err
	}
	if err := once(); err != nil {
		return nil, "", err
	}
	return tr.KernelRecords()
}

// kernelTimes sums recs, the kernels of calls calls of an op, per kernel
// name into the launches and device time of one call, each with its share
// of ms (the call's time between events), the longest first.
func kernelTimes(recs []profile.KernelRecord, calls int, ms float64) []KernelTime {
	type sum struct {
		source   string
		launches int
		ns       int64
	}
	byName := map[string]*sum{}
	own, _ := profile.OwnNs(recs) // an overlapped kernel's wait is the kernel ahead's time
	for i, k := range recs {
		s := byName[k.Name]
		if s == nil {
			s = &sum{source: k.Source}
			byName[k.Name] = s
		}
		s.launches++
		s.ns += own[i]
	}
	out := make([]KernelTime, 0, len(byName))
	for name, s := range byName {
		kt := KernelTime{Name: name, Source: s.source, Launches: float64(s.launches) / float64(calls),
			Ms: float64(s.ns) / (1e6 * float64(calls))} // one rounding: the ns are whole
		if ms > 0 {
			kt.Share = kt.Ms / ms
		}
		out = append(out, kt)
	}
	slices.SortFunc(out, func(a, b KernelTime) int {
		if c := cmp.Compare(b.Ms, a.Ms); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// withoutAppend is the device time of a call's kernels ks but the KV cache
// append, and the rates the op's flops and bytes give over it; all 0 where
// the call ran no append, or nothing beside it.
func withoutAppend(ks []KernelTime, flops, bytes float64) (ms, tflops, gbs float64) {
	appended := false
	for _, k := range ks {
		if k.Source == profile.SourceOwn && strings.HasPrefix(k.Name, appendKernel) {
			appended = true
			continue
		}
		ms += k.Ms
	}
	if !appended || ms <= 0 {
		return 0, 0, 0
	}
	return ms, flops / ms / 1e9, bytes / ms / 1e6
}

// joinNote joins two notes with "; ", either of which may be empty.
func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
