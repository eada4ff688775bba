package kbench

import (
	"math"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	"github.com/fuselm/fuselm/spread"
)

// Timing: device time between marks (CUDA events on a GPU) around groups of
// calls after warm-up calls, the median of several groups (Options.Groups,
// DefaultGroups when 0). A call shorter than graphBelowMs is timed inside a
// recorded graph of many calls, where the device can record one, so that
// launch gaps do not count.
const (
	DefaultGroups = 7
	groupMs       = 5.0  // the time one group of calls aims at
	maxGroupSize  = 200  // the most calls in one group
	graphBelowMs  = 0.05 // calls this short are replayed from a graph
)

// group is how time ran an op's calls: size calls a group, launched one by
// one or replayed from a graph of them. The kernel trace (--cupti) runs a
// group as time did.
type group struct {
	size  int
	graph bool
}

// time is the spread over the groups of the device time of one call of p's
// op with o, rotating over p's copies, in ms (its median is the row's time),
// and how it ran them.
func (r *runner) time(p *kerneltest.Problem, o kernels.Ops) (spread.Summary, group, error) {
	next := rotate(p, o)
	// Warm-up: kernel loading, scratch buffers, cuBLAS's first calls.
	if err := call(r.dev, func() { next(); next() }); err != nil {
		return spread.Summary{}, group{}, err
	}
	one, err := r.elapsed(1, next)
	if err != nil {
		return spread.Summary{}, group{}, err
	}
	g := group{size: max(1, min(maxGroupSize, int(groupMs/math.Max(one, 1e-4))))}
	_, canGraph := r.dev.(kernels.Grapher)
	g.graph = canGraph && one < graphBelowMs
	run, release, err := r.grouped(next, g)
	if err != nil {
		return spread.Summary{}, group{}, err
	}
	defer release()
	var ms []float64
	for range r.opt.groups() {
		var rerr error
		t, err := r.elapsed(1, func() { rerr = run() })
		if err == nil {
			err = rerr
		}
		if err != nil {
			return spread.Summary{}, group{}, err
		}
		ms = append(ms, t/float64(g.size))
	}
	return spread.Of(ms), g, nil
}

// groups is the number of groups a row's time is the median of.
func (opt Options) groups() int {
	if opt.Groups > 0 {
		return opt.Groups
	}
	return DefaultGroups
}

// rotate is a function that runs p's op with o once, on the next of p's
// copies each time.
func rotate(p *kerneltest.Problem, o kernels.Ops) func() {
	i := 0
	return func() { p.Run(o, i%p.Copies); i++ }
}

// grouped is what runs one group g of calls of next: g.size calls, or a
// replay of a graph of them captured here (g.graph); release frees the
// graph.
func (r *runner) grouped(next func(), g group) (run func() error, release func(), err error) {
	if !g.graph {
		return func() error {
			for range g.size {
				next()
			}
			return nil
		}, func() {}, nil
	}
	gr := r.dev.(kernels.Grapher)
	if err := gr.BeginCapture(); err != nil {
		return nil, nil, err
	}
	for range g.size {
		next()
	}
	graph, err := gr.EndCapture()
	if err != nil {
		return nil, nil, err
	}
	return graph.Replay, func() { graph.Close() }, nil
}

// elapsed is the device time of n calls of f, in ms.
func (r *runner) elapsed(n int, f func()) (float64, error) {
	var ms float64
	err := call(r.dev, func() {
		m0 := r.dev.Mark()
		for range n {
			f()
		}
		m1 := r.dev.Mark()
		var err error
		if ms, err = r.dev.Elapsed(m0, m1); err != nil {
			panic(err)
		}
	})
	return ms, err
}

// copier is implemented by devices that copy between device addresses
// (kernels/cuda), whose copy rate is a floor's.
type copier interface {
	Memcpy(dst, src uintptr, n int)
	Ptr(t *kernels.Tensor) uintptr
}

// ceilings measures the device's two rates the floors divide by: a large
// device-to-device copy (bytes read and written), and a large bf16 GEMM
// through the naive set's cuBLAS. A device that cannot copy, or a build
// without naive, leaves a rate at 0 (no floor is shown).
func (r *runner) ceilings() {
	c, ok := r.dev.(copier)
	if !ok {
		return
	}
	b := kerneltest.NewBuilder(r.dev, 1, 0)
	defer r.release(b)
	const copyBytes = 1 << 30
	src, dst := b.Alloc(kernels.BF16, copyBytes/2), b.Alloc(kernels.BF16, copyBytes/2)
	if ms, err := r.median(func() { c.Memcpy(c.Ptr(dst), c.Ptr(src), copyBytes) }); err == nil {
		r.rep.CopyRate = 2 * copyBytes / ms * 1e3
	}
	o, err := r.ops("naive")
	if err != nil {
		return
	}
	const n = 8192
	x, w, out := b.Random(b.Act(n, n), 1), b.Random(b.Alloc(kernels.BF16, n, n), 0.01), b.Act(n, n)
	if ms, err := r.median(func() { o.Linear(out, x, w, nil) }); err == nil {
		r.rep.MatrixRate = 2 * n * n * n / ms * 1e3
	}
}

// median is the median time of 5 calls of f after one warm-up, in ms.
func (r *runner) median(f func()) (float64, error) {
	if err := call(r.dev, f); err != nil {
		return 0, err
	}
	var ms []float64
	for range 5 {
		t, err := r.elapsed(1, f)
		if err != nil {
			return 0, err
		}
		ms = append(ms, t)
	}
	slices.Sort(ms)
	return ms[2], nil
}
