// Package kbench is fuselm's kernel benchmarks, TileGym's bench_* scripts
// for every kernel set at once: for each op a table over shapes of every
// set side by side (and each variant of a set where it has several), with
// the metric the op is bound by, its floor and the share of it reached;
// every result checked against the cpu set (or naive, where the cpu would
// take too long) before it is timed. It also lists what each set offers for
// a shape on a device or an --arch without running anything, picks the
// fastest variant (--optimize) and keeps the choice in a tuning cache that
// infer applies, and traces the kernels of every row's calls (--cupti).
// The benchmarks themselves (an op's shapes, counts and how to build its
// operands) are kerneltest's, beside the op's checks.
package kbench

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// Case is one op's benchmark, defined beside the op's checks in
// kerneltest's table (kerneltest.Bench): kbench runs it.
type Case = kerneltest.Bench

// Cases lists every benchmark, in the op table's order.
func Cases() []*Case { return kerneltest.Benches() }

// CaseFor is the benchmark of op, or nil.
func CaseFor(op kernels.Op) *Case { return kerneltest.BenchFor(op) }
