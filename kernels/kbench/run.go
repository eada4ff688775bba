package kbench

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/spread"
)

// Options say what Run measures.
type Options struct {
	Ops    []kernels.Op    // the cases to run; nil: all
	Shapes []kernels.Shape // shapes for every case named; nil: each case's defaults
	Sets   []string        // the sets side by side, each on its own kernels
	// Variants, when set, leaves out every variant of a set that offers
	// several for an op but those named (CheckVariants says whether each
	// name is offered); a set with one variant runs it as always.
	Variants []string
	// Optimize times every valid variant of a set that has several (it
	// always does) and returns the fastest per tuning key in Report.Tuned.
	Optimize bool
	// CUPTI traces, after every row is timed, the kernels of each timed
	// row's calls through the device's kernel trace (Row.Kernels).
	CUPTI bool
	// Groups is how many groups of calls each row's time is the median of
	// (DefaultGroups when 0): more narrow the spread (Row.Spread).
	Groups int
	Seed   uint64
	// Progress, when set, is called after each shape with the shapes done
	// and in all.
	Progress func(done, total int)
}

// Row is one set (and variant) on one shape of one op.
type Row struct {
	Op      kernels.Op `json:"op"`
	Shape   string     `json:"shape"`
	Set     string     `json:"set"`
	Variant string     `json:"variant"`
	Bound   string     `json:"bound"`
	Ms      float64    `json:"ms"`
	// Spread is the spread of one call's time over the groups timed, in
	// ms; Ms is its median.
	Spread  spread.Summary `json:"ms_spread"`
	TFLOPS  float64        `json:"tflop_s"`
	GBs     float64        `json:"gb_s"`
	FloorMs float64        `json:"floor_ms"`       // bytes / copy rate or FLOPs / matrix rate: 0 when not measured
	OfFloor float64        `json:"share_of_floor"` // FloorMs / Ms
	Checked string         `json:"checked"`        // what the result was held against, and its relative error
	Note    string         `json:"note,omitempty"`
	Err     string         `json:"error,omitempty"`

	// Kernels are the kernels of one call, the longest first, as the
	// device traced them (Options.CUPTI) in a pass after the timing, which
	// the trace does not slow: graph replays and cuBLAS's kernels included.
	// Their times add up to Ms less the gaps between and around them.
	Kernels []KernelTime `json:"kernels,omitempty"`
	// NoAppendMs is the traced device time of one call without its KV
	// cache append (kv_append), where the call ran one: the attention
	// alone, which is what cuDNN's and FlashAttention's attention run (they
	// append to no cache). NoAppendTFLOPS and NoAppendGBs are the op's
	// FLOPs and bytes over it: the append does none of the op's arithmetic
	// and moves none of the bytes it counts, so that for fused's
	// attn_prefill they are flash_hopper's own rates.
	NoAppendMs     float64 `json:"ms_without_kv_append,omitempty"`
	NoAppendTFLOPS float64 `json:"tflop_s_without_kv_append,omitempty"`
	NoAppendGBs    float64 `json:"gb_s_without_kv_append,omitempty"`
}

// MarshalJSON writes every field of a row, null where nothing was
// measured: the times, rates and spread of a row that did not run, the
// floor where the device's rates were not measured, the kernels where they
// were not traced; a note or an error is null when there is none.
func (r Row) MarshalJSON() ([]byte, error) {
	type fields Row // Row's fields and tags, without this method
	null := profile.NonZero[float64]
	var sp *spread.Summary
	if r.Ms > 0 {
		sp = &r.Spread
	}
	return json.Marshal(struct {
		fields
		Ms             *float64        `json:"ms"`
		Spread         *spread.Summary `json:"ms_spread"`
		TFLOPS         *float64        `json:"tflop_s"`
		GBs            *float64        `json:"gb_s"`
		FloorMs        *float64        `json:"floor_ms"`
		OfFloor        *float64        `json:"share_of_floor"`
		Note           *string         `json:"note"`
		Err            *string         `json:"error"`
		Kernels        []KernelTime    `json:"kernels"`
		NoAppendMs     *float64        `json:"ms_without_kv_append"`
		NoAppendTFLOPS *float64        `json:"tflop_s_without_kv_append"`
		NoAppendGBs    *float64        `json:"gb_s_without_kv_append"`
	}{fields(r), null(r.Ms), sp, null(r.TFLOPS), null(r.GBs), null(r.FloorMs), null(r.OfFloor),
		profile.NonZero(r.Note), profile.NonZero(r.Err), r.Kernels, null(r.NoAppendMs), null(r.NoAppendTFLOPS), null(r.NoAppendGBs)})
}

// Report is what Run measured.
type Report struct {
	Device     string          `json:"device"`
	Target     kernels.Target  `json:"target"`
	CopyRate   float64         `json:"copy_bytes_per_s"`  // device-to-device, bytes read + written
	MatrixRate float64         `json:"matrix_flop_per_s"` // bf16 GEMM through the naive set's cuBLAS
	Groups     int             `json:"groups"`            // the groups each row's time is the median of
	Rows       []Row           `json:"rows"`
	Tuned      []kernels.Tuned `json:"tuned,omitempty"`
	// Note says what the run could not do for every row: why no kernels
	// were traced (Options.CUPTI on a device that records none).
	Note string `json:"note,omitempty"`
}

// Checks: where a problem is this cheap, the cpu set (bf16 activations)
// computes its reference; beyond it naive does, on the same device.
const (
	cpuRefFLOPs = 1e10
	cpuRefBytes = 256 << 20
	// tolerance is the largest relative error from the reference: bf16's,
	// as kernels/kerneltest allows; f16Tolerance is kerneltest's f16 one,
	// for shapes that name f16 (attn_prefill's fp16 rows).
	tolerance    = 2e-2
	f16Tolerance = 5e-3
)

// Run measures the cases and shapes opt names for every set in opt.Sets on
// dev, whose limits are target.
func Run(dev kernels.Device, target kernels.Target, opt Options) (*Report, error) {
	cs, err := selectCases(opt.Ops, opt.Shapes)
	if err != nil {
		return nil, err
	}
	r := &runner{dev: dev, target: target, opt: opt, built: map[string]setOps{},
		rep: &Report{Device: dev.Name(), Target: target, Groups: opt.groups()}}
	for _, set := range opt.Sets {
		info, ok := kernels.Set(set)
		if !ok {
			return nil, fmt.Errorf("kernel set %q is not built into this binary", set)
		}
		if _, err := r.ops(info.Name); err != nil {
			return nil, err
		}
	}
	r.ceilings()
	// Progress counts a shape's steps: its problem built, then each row
	// checked and timed (at W1's prefill shapes a row takes a minute), and
	// with CUPTI each shape's trace pass.
	total, done := 0, 0
	for _, c := range cs {
		for _, s := range r.shapesOf(c) {
			total += r.unitsOf(c, s)
			if opt.CUPTI {
				total++
			}
		}
	}
	tick := func() {
		done++
		if opt.Progress != nil {
			opt.Progress(done, total)
		}
	}
	for _, c := range cs {
		for _, s := range r.shapesOf(c) {
			end := done + r.unitsOf(c, s)
			r.shape(c, s, tick)
			for done < end { // the steps a failed build left out
				tick()
			}
		}
	}
	if opt.CUPTI {
		r.traceKernels(cs, tick)
	}
	if opt.Optimize {
		r.rep.Tuned = best(r.rep.Rows, r.keys)
	}
	return r.rep, nil
}

// selectCases is the cases of ops (all when none), each shape checked
// against each.
func selectCases(ops []kernels.Op, shapes []kernels.Shape) ([]*Case, error) {
	var cs []*Case
	if len(ops) == 0 {
		cs = Cases()
	}
	for _, op := range ops {
		c := CaseFor(op)
		if c == nil {
			var names []string
			for _, c := range Cases() {
				names = append(names, string(c.Op))
			}
			return nil, fmt.Errorf("no benchmark for op %q (there are: %v)", op, names)
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		for _, s := range shapes {
			if err := c.Check(s); err != nil {
				return nil, err
			}
		}
	}
	return cs, nil
}

type runner struct {
	dev    kernels.Device
	target kernels.Target
	opt    Options
	built  map[string]setOps
	rep    *Report
	keys   map[int]string // row index → its tuning key, for Optimize
	timed  []timedRow     // the rows timed, in order, for the trace pass
}

func (r *runner) shapesOf(c *Case) []kernels.Shape {
	if len(r.opt.Shapes) > 0 {
		return r.opt.Shapes
	}
	return c.Shapes
}

// setOps is a set's ops as the runner builds them (a kernels.Dispatch of
// the set alone): the ops, and the variants of the set's kernels.
type setOps interface {
	kernels.Ops
	TunerOf(op kernels.Op) (kernels.Tunable, bool)
}

// ops is set's Ops on the device, built once.
func (r *runner) ops(set string) (setOps, error) {
	if o, ok := r.built[set]; ok {
		return o, nil
	}
	o, err := kernels.Spec{Base: set}.Build(r.dev, nil)
	if err != nil {
		return nil, fmt.Errorf("building kernel set %s on %s: %w", set, r.dev.Name(), err)
	}
	r.built[set] = o
	return o, nil
}

// unitsOf is the steps shape tells progress of for s: its problem built,
// each variant row of every set that owns c's op, and the dense reference
// row where c has one.
func (r *runner) unitsOf(c *Case, s kernels.Shape) int {
	n := 1
	for _, set := range r.opt.Sets {
		if info, _ := kernels.Set(set); info.Owns(c.Op) {
			n += len(r.opt.pick(info.VariantsOf(c.Op, s, r.target)))
		}
	}
	if c.Dense != nil && r.rep.MatrixRate > 0 {
		n++
	}
	return n
}

// shape measures c at s on every set, calling tick after each of the steps
// unitsOf counts.
func (r *runner) shape(c *Case, s kernels.Shape, tick func()) {
	b := kerneltest.NewBuilder(r.dev, r.opt.Seed, r.target.L2Bytes)
	defer r.release(b)
	p, err := build(b, c, s)
	if err != nil {
		r.rep.Rows = append(r.rep.Rows, Row{Op: c.Op, Shape: s.String(), Bound: c.Bound, Err: err.Error()})
		return
	}
	tick()
	ref := &reference{}
	for _, set := range r.opt.Sets {
		info, _ := kernels.Set(set)
		row := Row{Op: c.Op, Shape: s.String(), Set: set, Bound: c.Bound}
		if !info.Owns(c.Op) {
			row.Note = fmt.Sprintf("no kernel of its own: runs %s's", kernels.Spec{Base: set}.Runner(c.Op))
			r.rep.Rows = append(r.rep.Rows, row)
			continue
		}
		o, _ := r.ops(set)
		vs := info.VariantsOf(c.Op, s, r.target)
		several := len(vs) > 1 // a choice the tuner makes, before Variants narrows it
		vs = r.opt.pick(vs)
		tuner, tunable := o.TunerOf(c.Op)
		var key, was string
		if tunable {
			key = tuner.TuningKey(c.Op, s)
			was = tuner.VariantFor(c.Op, key)
		}
		for _, v := range vs {
			row := row
			row.Variant = v.Name
			if !v.Valid() {
				row.Err = "not valid here: " + v.Why
				r.rep.Rows = append(r.rep.Rows, row)
				tick()
				continue
			}
			if tunable && several {
				if err := tuner.UseVariant(c.Op, key, v.Name); err != nil {
					row.Err = err.Error()
					r.rep.Rows = append(r.rep.Rows, row)
					tick()
					continue
				}
			}
			g := r.measure(&row, c, s, p, o, set, ref)
			tick()
			if row.Err == "" {
				r.timed = append(r.timed, timedRow{index: len(r.rep.Rows), c: c, shape: s, group: g})
			}
			if tunable && several && row.Err == "" {
				if r.keys == nil {
					r.keys = map[int]string{}
				}
				r.keys[len(r.rep.Rows)] = key
			}
			r.rep.Rows = append(r.rep.Rows, row)
		}
		if tunable && was != "" && several {
			tuner.UseVariant(c.Op, key, was)
		}
	}
	if c.Dense != nil && r.rep.MatrixRate > 0 {
		r.denseRow(c, s)
		tick()
	}
}

// denseVariant names the row of a case's dense reference (Case.Dense).
const denseVariant = "dense cuBLAS, same M,N,K"

// denseRow times the dense problem of c at s with naive (cuBLAS), as a
// reference row: not checked, since it computes another product.
func (r *runner) denseRow(c *Case, s kernels.Shape) {
	row := Row{Op: c.Op, Shape: s.String(), Set: "naive", Variant: denseVariant, Bound: c.Bound,
		Checked: "not checked: the dense reference"}
	defer func() { r.rep.Rows = append(r.rep.Rows, row) }()
	o, err := r.ops("naive")
	if err != nil {
		row.Err = err.Error()
		return
	}
	b := kerneltest.NewBuilder(r.dev, r.opt.Seed, r.target.L2Bytes)
	defer r.release(b)
	p, err := buildDense(b, c, s)
	var g group
	if err == nil {
		row.Spread, g, err = r.time(p, o)
		row.Ms = row.Spread.Median
	}
	if err != nil {
		row.Err = err.Error()
		return
	}
	r.timed = append(r.timed, timedRow{index: len(r.rep.Rows), c: c, shape: s, group: g, dense: true})
	flops := c.FLOPs(s)
	row.TFLOPS, row.GBs = flops/row.Ms/1e9, p.Bytes/row.Ms/1e6
	row.Bound, row.FloorMs = bound(flops, p.Bytes, r.rep.MatrixRate, r.rep.CopyRate)
	if row.FloorMs > 0 {
		row.OfFloor = row.FloorMs / row.Ms
	}
}

// buildDense builds the dense problem of c at s (Case.Dense), turning a
// device error into an error.
func buildDense(b *kerneltest.Builder, c *Case, s kernels.Shape) (p *kerneltest.Problem, err error) {
	err = call(b.Dev(), func() { p = c.Dense(b, s) })
	return p, err
}

// problem is a built problem with its in-place inputs (State) as built,
// kept on the host in their own type (hostCopy), which a check puts back
// before and after its run.
type problem struct {
	*kerneltest.Problem
	built []*hostCopy // State[i]'s elements as built
}

// build builds a problem and keeps its in-place inputs as built, read a
// chunk at a time (readChunks).
func build(b *kerneltest.Builder, c *Case, s kernels.Shape) (*problem, error) {
	bare, err := buildBare(b, c, s)
	if err != nil {
		return nil, err
	}
	p := &problem{Problem: bare}
	for _, t := range p.State {
		h := newHostCopy(t)
		if err := readChunks(b.Dev(), t, h.append); err != nil {
			return nil, err
		}
		p.built = append(p.built, h)
	}
	return p, nil
}

// buildBare builds a problem without keeping its in-place inputs (what the
// trace pass, which puts nothing back, runs), turning a device error into
// an error.
func buildBare(b *kerneltest.Builder, c *Case, s kernels.Shape) (p *kerneltest.Problem, err error) {
	defer func() {
		if v := recover(); v != nil {
			be, ok := v.(kerneltest.BuildError)
			if !ok {
				panic(v)
			}
			p, err = nil, be.Unwrap()
		}
	}()
	p = c.Build(b, c, s)
	if err := b.Dev().Sync(); err != nil {
		return nil, err
	}
	return p, nil
}

// release frees a shape's tensors and hands the memory back to the driver.
func (r *runner) release(b *kerneltest.Builder) {
	b.Free()
	if t, ok := r.dev.(interface{ TrimCache() error }); ok {
		t.TrimCache()
	}
}

// measure checks then times one set (in its current variant) on p, and
// returns how it ran the calls it timed.
func (r *runner) measure(row *Row, c *Case, s kernels.Shape, p *problem, o kernels.Ops, set string, ref *reference) group {
	checked, err := r.check(c, s, p, o, set, ref)
	row.Checked = checked
	if err != nil {
		row.Err = err.Error()
		return group{}
	}
	sp, g, err := r.time(p.Problem, o)
	if f, ok := o.(kernels.Faulter); ok && err == nil {
		// A kernel that gave up on a wait while timed leaves garbage its
		// check above did not see: no time for it.
		err = f.Faults()
	}
	if err != nil {
		row.Err = err.Error()
		return group{}
	}
	ms := sp.Median
	row.Ms, row.Spread = ms, sp
	flops, bytes := c.FLOPs(s), c.Bytes(s)
	if p.Bytes > 0 {
		bytes = p.Bytes
	}
	row.TFLOPS = flops / ms / 1e9
	row.GBs = bytes / ms / 1e6
	row.Bound, row.FloorMs = bound(flops, bytes, r.rep.MatrixRate, r.rep.CopyRate)
	if row.FloorMs > 0 {
		row.OfFloor = row.FloorMs / ms
	}
	return g
}

// The H200's rates (DESIGN.md), which say what bounds a problem where the
// device's own were not measured.
const (
	h200MatrixRate = 790e12
	h200CopyRate   = 4.23e12
)

// bound is what bounds a problem of flops and bytes (the larger of its two
// floors: FLOPs over the matrix rate, bytes over the copy rate) and that
// floor in ms; the floor is 0 where the rates were not measured.
func bound(flops, bytes, matrixRate, copyRate float64) (string, float64) {
	measured := matrixRate > 0 && copyRate > 0
	if !measured {
		matrixRate, copyRate = h200MatrixRate, h200CopyRate
	}
	byFlops, byBytes := flops/matrixRate*1e3, bytes/copyRate*1e3
	b, floor := "memory", byBytes
	if byFlops > byBytes {
		b, floor = "compute", byFlops
	}
	if !measured {
		floor = 0
	}
	return b, floor
}

// reference is a shape's reference outputs, computed once and kept on
// the host (hostCopy).
type reference struct {
	by   string // "cpu", "naive", or "" before the first check
	outs []*hostCopy
	err  error
}

// check runs set's op once on copy 0 and holds its outputs against the
// reference: the cpu set where the problem is cheap, else naive on the
// same device (a naive row then is the reference itself). It reads the
// outputs a chunk at a time (readChunks), so that it holds on the host the
// reference, the in-place inputs as built (problem) and a chunk, whatever
// the outputs' size; a large chunk is widened and compared by several
// goroutines (kernels.Parallel, DiffAcc.AddParallel), with the same verdict.
func (r *runner) check(c *Case, s kernels.Shape, p *problem, o kernels.Ops, set string, ref *reference) (string, error) {
	cheap := c.FLOPs(s) <= cpuRefFLOPs && c.Bytes(s) <= cpuRefBytes
	if ref.by == "" {
		ref.by = "naive"
		if cheap {
			ref.by = "cpu"
		}
		ref.outs, ref.err = r.reference(c, s, p, ref.by)
	}
	if ref.err != nil {
		return ref.by, fmt.Errorf("the %s reference failed: %w", ref.by, ref.err)
	}
	if ref.by == set {
		if err := r.runOnce(p, o, nil); err != nil {
			return ref.by, err
		}
		return "is the reference", nil
	}
	diffs := make([]kernels.DiffAcc, len(p.Outs))
	read := make([]int, len(p.Outs)) // elements of each output read
	var want []float32               // a chunk of the reference, widened
	err := r.runOnce(p, o, func(i int, got []float32) {
		at := read[i]
		read[i] += len(got)
		if read[i] <= ref.outs[i].len() {
			want = slices.Grow(want[:0], len(got))[:len(got)]
			ref.outs[i].widen(want, at)
			diffs[i].AddParallel(got, want)
		}
	})
	if err != nil {
		return ref.by, err
	}
	tol := tolerance
	if s.DType(r.dev.ActDType()) == kernels.F16 {
		tol = f16Tolerance
	}
	worst := 0.0
	for i := range diffs {
		e := diffs[i].Diff().RelErr()
		if read[i] != ref.outs[i].len() {
			e = math.NaN() // as RelErr of two lengths
		}
		if !(e <= tol) {
			return fmt.Sprintf("%s %.2g", ref.by, e), fmt.Errorf("output %d is %.3g from %s's (tolerance %g): not timed", i, e, ref.by, tol)
		}
		worst = max(worst, e)
	}
	return fmt.Sprintf("%s %.1e", ref.by, worst), nil
}

// reference computes p's outputs with set by and keeps them on the host:
// the cpu set on the same problem built on a host device, or naive on p
// itself.
func (r *runner) reference(c *Case, s kernels.Shape, p *problem, by string) ([]*hostCopy, error) {
	if by == "naive" {
		o, err := r.ops("naive")
		if err != nil {
			return nil, err
		}
		return r.keep(r.dev, p, o)
	}
	host, err := cpu.NewDeviceAct(r.dev.ActDType())
	if err != nil {
		return nil, err
	}
	ops, err := kernels.Spec{Base: "cpu"}.Build(host, nil)
	if err != nil {
		return nil, err
	}
	hb := kerneltest.NewBuilder(host, r.opt.Seed, 0)
	defer hb.Free()
	hp, err := build(hb, c, s)
	if err != nil {
		return nil, err
	}
	return r.keep(host, hp, ops)
}

// keep runs p's op once on copy 0 of dev with o and returns its outputs
// kept on the host (hostCopy).
func (r *runner) keep(dev kernels.Device, p *problem, o kernels.Ops) ([]*hostCopy, error) {
	outs := make([]*hostCopy, len(p.Outs))
	for i, t := range p.Outs {
		outs[i] = newHostCopy(t)
	}
	err := r.runOnceOn(dev, p, o, func(i int, v []float32) { outs[i].append(v) })
	if err != nil {
		return nil, err
	}
	return outs, nil
}

// runOnce runs p's op once on copy 0 with o and reads its outputs (see
// runOnceOn).
func (r *runner) runOnce(p *problem, o kernels.Ops, each func(out int, v []float32)) error {
	return r.runOnceOn(r.dev, p, o, each)
}

// runOnceOn runs p's op once on copy 0 of dev with o, copy 0's in-place
// inputs put back as built before and after (writeChunks), and calls each
// with every chunk of its outputs in turn (readChunks): output i's
// elements, in order. With each nil it reads nothing.
func (r *runner) runOnceOn(dev kernels.Device, p *problem, o kernels.Ops, each func(out int, v []float32)) error {
	restore := func() error {
		for i, t := range p.State {
			if err := writeChunks(dev, t, p.built[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if err := restore(); err != nil {
		return err
	}
	if err := call(dev, func() { p.Run(o, 0) }); err != nil {
		return err
	}
	if each != nil {
		for i, t := range p.Outs {
			err := readChunks(dev, t, func(v []float32) { each(i, v) })
			if err != nil {
				return err
			}
		}
	}
	if err := restore(); err != nil {
		return err
	}
	return dev.Sync()
}

// checkChunk is the most elements of a tensor the check reads from the
// device, or puts back into it, at a time, unless one row is more: a
// variable for the tests to cut small tensors into several chunks.
var checkChunk = 64 << 20

// rowChunks calls f with views of t's rows a chunk at a time, in order,
// each with the index of its first element in t: whole rows, at most
// checkChunk elements (one row when a row is more, or when packed is asked
// of a pitched t, whose chunks of several rows would be pitched too); a
// tensor of one dimension whole.
func rowChunks(t *kernels.Tensor, packed bool, f func(c *kernels.Tensor, at int) error) error {
	if len(t.Shape) < 2 {
		return f(t, 0)
	}
	rows := t.Reshape(t.Rows(), t.Cols()) // row after row, as ReadF32 reads them
	per := max(1, checkChunk/max(1, t.Cols()))
	if packed && !t.Packed() {
		per = 1
	}
	for r0 := 0; r0 < rows.Shape[0]; r0 += per {
		if err := f(rows.Slice(r0, min(r0+per, rows.Shape[0])), r0*t.Cols()); err != nil {
			return err
		}
	}
	return nil
}

// readChunks reads t from dev a chunk of rows at a time (rowChunks) and
// calls f with each chunk's elements in turn, as float32; f must not keep
// them.
func readChunks(dev kernels.Device, t *kernels.Tensor, f func(v []float32)) error {
	return rowChunks(t, false, func(c *kernels.Tensor, _ int) error {
		v, err := dev.ReadF32(c)
		if err != nil {
			return err
		}
		f(v)
		return nil
	})
}

// writeChunks sets t on dev to h's elements (a copy of t's, as readChunks
// read them) a chunk of rows at a time, packed ones (rowChunks: Upload
// writes packed tensors only), each uploaded as raw elements of h's own
// type: the kept bits of a 16-bit tensor, which Upload copies as they are.
func writeChunks(dev kernels.Device, t *kernels.Tensor, h *hostCopy) error {
	if h.len() != t.Numel() {
		return fmt.Errorf("putting back %v: %d elements kept", t, h.len())
	}
	var raw []byte
	return rowChunks(t, true, func(c *kernels.Tensor, at int) error {
		raw = h.raw(raw[:0], at, c.Numel())
		return dev.Upload(c, raw, h.src())
	})
}

// hostCopy is a tensor's elements kept on the host in its own type (a
// reference's outputs, a problem's in-place inputs as built): the bits of
// a BF16 or F16 tensor's elements, half the size of their float32 values,
// else the float32 values.
type hostCopy struct {
	dt   kernels.DType
	bits []uint16
	f32  []float32
}

// newHostCopy is an empty copy of t's elements, room made for all of them.
func newHostCopy(t *kernels.Tensor) *hostCopy {
	h := &hostCopy{dt: t.DType}
	if h.half() {
		h.bits = make([]uint16, 0, t.Numel())
	} else {
		h.f32 = make([]float32, 0, t.Numel())
	}
	return h
}

// half reports whether the copy keeps 16-bit elements.
func (h *hostCopy) half() bool { return h.dt == kernels.BF16 || h.dt == kernels.F16 }

// len is the number of elements kept.
func (h *hostCopy) len() int { return len(h.bits) + len(h.f32) }

// append keeps v, elements read as float32 from a tensor of the copy's
// type: narrowing them back to it is exact (a bf16 is the top half of its
// float32; kernels.F32ToF16 returns the f16 a value came from, a NaN as a
// NaN). A large v is narrowed by several goroutines (kernels.Parallel).
func (h *hostCopy) append(v []float32) { h.appendOn(v, hostGrain) }

// appendOn is append in chunks of at least grain elements, each on the
// goroutine kernels.Parallel gives it, writing its own range.
func (h *hostCopy) appendOn(v []float32, grain int) {
	if !h.half() {
		at := len(h.f32)
		h.f32 = slices.Grow(h.f32, len(v))[:at+len(v)]
		kernels.Parallel(len(v), grain, func(lo, hi int) { copy(h.f32[at+lo:at+hi], v[lo:hi]) })
		return
	}
	at := len(h.bits)
	h.bits = slices.Grow(h.bits, len(v))[:at+len(v)]
	kernels.Parallel(len(v), grain, func(lo, hi int) {
		dst := h.bits[at+lo : at+hi]
		switch h.dt {
		case kernels.BF16:
			for i, x := range v[lo:hi] {
				dst[i] = uint16(math.Float32bits(x) >> 16)
			}
		case kernels.F16:
			for i, x := range v[lo:hi] {
				dst[i] = kernels.F32ToF16(x)
			}
		}
	})
}

// widen writes elements [at, at+len(dst)) into dst as float32, a large
// dst by several goroutines (kernels.Parallel).
func (h *hostCopy) widen(dst []float32, at int) { h.widenOn(dst, at, hostGrain) }

// widenOn is widen in chunks of at least grain elements, each writing its
// own range of dst.
func (h *hostCopy) widenOn(dst []float32, at int, grain int) {
	kernels.Parallel(len(dst), grain, func(lo, hi int) {
		out := dst[lo:hi]
		switch h.dt {
		case kernels.BF16:
			for i, b := range h.bits[at+lo : at+hi] {
				out[i] = math.Float32frombits(uint32(b) << 16)
			}
		case kernels.F16:
			for i, b := range h.bits[at+lo : at+hi] {
				out[i] = kernels.F16ToF32(b)
			}
		default:
			copy(out, h.f32[at+lo:at+hi])
		}
	})
}

// hostGrain is the fewest elements a goroutine of hostCopy's narrowing or
// widening gets: a smaller chunk is converted on the caller's goroutine,
// so that small checks start none.
const hostGrain = 256 << 10

// src is the type of the elements raw writes: the copy's own where it
// keeps 16-bit elements, else F32.
func (h *hostCopy) src() kernels.DType {
	if h.half() {
		return h.dt
	}
	return kernels.F32
}

// raw appends elements [at, at+n) to dst as little-endian bytes of type
// src, and returns it.
func (h *hostCopy) raw(dst []byte, at, n int) []byte {
	dst = slices.Grow(dst, n*h.src().Size())
	if h.half() {
		for _, b := range h.bits[at : at+n] {
			dst = binary.LittleEndian.AppendUint16(dst, b)
		}
		return dst
	}
	for _, x := range h.f32[at : at+n] {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

// call runs f, turning a panic of a kernel set's shape checks into an
// error, then waits for the device.
func call(dev kernels.Device, f func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	f()
	return dev.Sync()
}

// best picks, per set, op and tuning key, the variant of least total time
// over the shapes of that key.
func best(rows []Row, keys map[int]string) []kernels.Tuned {
	type group struct {
		set string
		op  kernels.Op
		key string
	}
	total := map[group]map[string]float64{}
	count := map[group]map[string]int{}
	for i, row := range rows {
		key, ok := keys[i]
		if !ok {
			continue
		}
		g := group{row.Set, row.Op, key}
		if total[g] == nil {
			total[g], count[g] = map[string]float64{}, map[string]int{}
		}
		total[g][row.Variant] += row.Ms
		count[g][row.Variant]++
	}
	var out []kernels.Tuned
	for g, byVariant := range total {
		most := 0
		for _, n := range count[g] {
			most = max(most, n)
		}
		bestV, bestMs := "", math.Inf(1)
		for v, ms := range byVariant {
			if count[g][v] == most && ms < bestMs { // only variants that ran every shape of the key
				bestV, bestMs = v, ms
			}
		}
		out = append(out, kernels.Tuned{Set: g.set, Op: g.op, Key: g.key, Variant: bestV})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return fmt.Sprint(a.Set, a.Op, a.Key) < fmt.Sprint(b.Set, b.Op, b.Key)
	})
	return out
}
