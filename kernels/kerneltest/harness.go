// Package kerneltest holds a kernel set against the cpu reference set: every
// op on fresh random inputs, at sizes that are multiples of no tile, with
// outputs poisoned by NaN so that an element left unwritten, or written where
// it must not be, shows.
//
// A kernel set's test calls Run with its device:
//
//	func TestOps(t *testing.T) {
//		dev := ... // the set's device
//		kerneltest.Run(t, dev, "naive", kerneltest.DefaultTolerances())
//	}
//
// Every case is a subtest named op/case, so `go test -run 'TestOps/attn_decode'`
// runs one op.
//
// Each op has one row in table (table.go), as each op has one test case in
// ggml's test-backend-ops serving its eval and perf modes: its checks
// (cases.go), which Run walks, and its benchmark (bench.go: shape names,
// default shapes, FLOP and byte counts, and the builder of its operands on
// a device with a Builder, builder.go), which kernels/kbench times.
package kerneltest

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/cuda"
)

// Tolerances are the largest relative errors ‖out − ref‖/‖ref‖ allowed,
// chosen by the activation dtype of the device under test.
type Tolerances struct {
	F32  float64
	BF16 float64
	F16  float64
}

// DefaultTolerances allow 1e-5 for f32 activations, 2e-2 for bf16 and 5e-3
// for f16.
func DefaultTolerances() Tolerances { return Tolerances{F32: 1e-5, BF16: 2e-2, F16: 5e-3} }

// For is the tolerance for a device whose activations are dt.
func (tol Tolerances) For(dt kernels.DType) float64 {
	switch dt {
	case kernels.BF16:
		return tol.BF16
	case kernels.F16:
		return tol.F16
	}
	return tol.F32
}

// Run checks every op the kernel set named set has a kernel of its own for
// (kernels.SetInfo.Own), built on dev, against the cpu set on a host device.
// Inputs are made on the host, uploaded to dev, and read back, so that both
// sets see exactly the values dev holds (rounded to its activation dtype).
// Ops that take weights run once with bf16 weights (as checkpoints ship
// them) and once with weights of dev's activation dtype when that differs.
// The long cases (attention over 16K keys and more) run on GPUs only: on a
// cpu device they would take minutes and hold the reference against itself.
// With -test.short they are left out on GPUs too (scripts/gpu_check.sh's
// quick tier: every kernel once, in seconds).
func Run(t *testing.T, dev kernels.Device, set string, tol Tolerances) {
	t.Helper()
	RunOps(t, dev, set, tol)
}

// RunOps is Run over the cases of ops only (all ops when none are named):
// for a test that changes how some ops run (a tiling, a variant, a size
// that picks a code path), so that the ops it does not touch, which Run
// checks already, are not run again.
func RunOps(t *testing.T, dev kernels.Device, set string, tol Tolerances, ops ...kernels.Op) {
	t.Helper()
	info := setInfo(t, set)
	o, err := info.New(dev)
	if err != nil {
		t.Fatalf("building kernel set %s on %s: %v", set, dev.Name(), err)
	}
	only := info.Owns
	if len(ops) > 0 {
		only = func(op kernels.Op) bool { return info.Owns(op) && slices.Contains(ops, op) }
	}
	_, onCPU := dev.(*cpu.Device)
	runOps(testingT{t}, dev, o, tol, only, !onCPU && !testing.Short())
}

// setInfo is the registered set named set.
func setInfo(t *testing.T, set string) kernels.SetInfo {
	t.Helper()
	for _, s := range kernels.Sets() {
		if s.Name == set {
			return s
		}
	}
	t.Fatalf("kernel set %q is not registered in this build", set)
	return kernels.SetInfo{}
}

// tester is the part of *testing.T the harness uses, so that its own test
// can watch it fail.
type tester interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Run(name string, f func(t tester)) bool
}

type testingT struct{ *testing.T }

func (t testingT) Run(name string, f func(t tester)) bool {
	return t.T.Run(name, func(t *testing.T) { f(testingT{t}) })
}

// runOps runs the cases of the ops that only accepts (and the long ones
// when long) on ops, built on dev, and on the cpu reference.
func runOps(t tester, dev kernels.Device, ops kernels.Ops, tol Tolerances, only func(kernels.Op) bool, long bool) {
	host := cpu.NewDevice()
	ref, err := cpu.New(host)
	if err != nil {
		t.Fatalf("%v", err)
	}
	wdts := []kernels.DType{kernels.BF16}
	if dev.ActDType() != kernels.BF16 {
		wdts = append(wdts, dev.ActDType())
	}
	covered := map[kernels.Op]bool{}
	for _, c := range cases(wdts) {
		covered[c.op] = true
		if !only(c.op) || c.long && !long {
			continue
		}
		name := string(c.op) + "/" + c.name
		t.Run(name, func(t tester) {
			h := fnv.New64a()
			h.Write([]byte(name))
			e := &env{
				t:          t,
				rng:        rand.New(rand.NewSource(int64(h.Sum64()))),
				devs:       [2]kernels.Device{host, dev},
				mem:        [2]kernels.Allocs{{Dev: host}, {Dev: dev}},
				ops:        [2]kernels.Ops{ref, ops},
				tol:        tol.For(dev.ActDType()),
				tols:       tol,
				wdt:        c.wdt,
				declinable: c.declinable,
			}
			defer e.free()
			c.run(e)
		})
	}
	for _, o := range kernels.AllOps {
		if !covered[o] {
			t.Errorf("kerneltest has no case for op %s", o)
		}
	}
}

// opCase is one table entry: an op on inputs of one shape.
type opCase struct {
	op   kernels.Op
	name string
	long bool          // minutes on a cpu device: run on GPUs only
	wdt  kernels.DType // the weights' dtype, for ops that take weights
	// declinable cases are ones a set may decline (kernels.Unsupported: the
	// dispatch then runs its fallback's kernel), such as attention on f16
	// operands, which only some kernels take: the case is skipped.
	declinable bool
	run        func(e *env)
}

// Sides of a pair: the reference (cpu set on the host) and the device under
// test.
const (
	ref = 0
	dut = 1
)

var sideName = [2]string{"reference cpu set", "set under test"}

// pair is one tensor made on both sides.
type pair [2]*kernels.Tensor

// cols is the column slice [c0, c1) of both tensors.
func (p pair) cols(c0, c1 int) pair { return pair{p[0].ColSlice(c0, c1), p[1].ColSlice(c0, c1)} }

// kind says a tensor's dtype on each side.
type kind int

const (
	actK    kind = iota // the device's activation dtype; f32 on the reference
	f16K                // f16 on the set under test, f32 on the reference
	f32K                // f32 on both
	i32K                // i32 on both
	weightK             // the case's weight dtype on both
)

// env is the state of one case.
type env struct {
	t          tester
	rng        *rand.Rand
	devs       [2]kernels.Device
	ops        [2]kernels.Ops
	tol        float64    // the case's tolerance: the device's activations', or (f16K) set from tols
	tols       Tolerances // every type's, for a case on operands of another type
	wdt        kernels.DType
	declinable bool              // see opCase
	mem        [2]kernels.Allocs // every tensor of the case, by side
}

func (e *env) dtype(k kind, side int) kernels.DType {
	switch k {
	case actK:
		return e.devs[side].ActDType()
	case f16K:
		if side == ref {
			return kernels.F32
		}
		return kernels.F16
	case f32K:
		return kernels.F32
	case i32K:
		return kernels.I32
	}
	return e.wdt
}

// alloc makes a packed tensor on both sides.
func (e *env) alloc(k kind, shape ...int) pair {
	var p pair
	for s := range 2 {
		p[s] = e.mem[s].Alloc(e.dtype(k, s), shape...)
	}
	return p
}

func (e *env) free() {
	for s := range e.mem {
		e.mem[s].Free()
	}
}

// set uploads vals to the device, reads back what it holds and gives the
// reference exactly that.
func (e *env) set(p pair, vals []float32) {
	e.t.Helper()
	if err := e.devs[dut].Upload(p[dut], f32Bytes(vals), kernels.F32); err != nil {
		e.t.Fatalf("upload to %v: %v", p[dut], err)
	}
	held, err := e.devs[dut].ReadF32(p[dut])
	if err != nil {
		e.t.Fatalf("reading back %v: %v", p[dut], err)
	}
	if err := e.devs[ref].Upload(p[ref], f32Bytes(held), kernels.F32); err != nil {
		e.t.Fatalf("upload to the reference %v: %v", p[ref], err)
	}
}

// tensor is a tensor holding vals on both sides.
func (e *env) tensor(k kind, vals []float32, shape ...int) pair {
	e.t.Helper()
	p := e.alloc(k, shape...)
	e.set(p, vals)
	return p
}

// random is a tensor of N(0, scale²) values.
func (e *env) random(k kind, scale float64, shape ...int) pair {
	e.t.Helper()
	return e.tensor(k, e.normal(numel(shape), scale), shape...)
}

// patternBlock is the most values patterned draws: an odd length, so that
// the rows of a large tensor (expert weights of 1 GB) start at ever other
// places of the block and no two experts hold the same values.
const patternBlock = 1<<20 + 7

// patterned is random for tensors too large to draw every value of: a
// block of at most patternBlock N(0, scale²) values repeated over it.
func (e *env) patterned(k kind, scale float64, shape ...int) pair {
	e.t.Helper()
	n := numel(shape)
	if n <= patternBlock {
		return e.random(k, scale, shape...)
	}
	block := e.normal(patternBlock, scale)
	vals := make([]float32, n)
	for at := 0; at < n; at += patternBlock {
		copy(vals[at:], block)
	}
	return e.tensor(k, vals, shape...)
}

// poisoned is a tensor of NaNs.
func (e *env) poisoned(k kind, shape ...int) pair {
	e.t.Helper()
	vals := make([]float32, numel(shape))
	for i := range vals {
		vals[i] = nan
	}
	return e.tensor(k, vals, shape...)
}

// ints is an i32 tensor holding vals on both sides.
func (e *env) ints(vals []int32, shape ...int) pair {
	e.t.Helper()
	p := e.alloc(i32K, shape...)
	for s := range 2 {
		if err := e.devs[s].WriteI32(p[s], vals); err != nil {
			e.t.Fatalf("%s: writing %v: %v", sideName[s], p[s], err)
		}
	}
	return p
}

// normal is n values drawn from N(0, scale²), none closer to 0 than
// scale/1000.
func (e *env) normal(n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		x := e.rng.NormFloat64()
		for math.Abs(x) < 1e-3 {
			x = e.rng.NormFloat64()
		}
		v[i] = float32(x * scale)
	}
	return v
}

// normWeight is an RMSNorm weight of d elements near one (1 + N(0, 0.2)),
// as a trained model's are.
func (e *env) normWeight(d int) pair {
	g := e.normal(d, 0.2)
	for i := range g {
		g[i]++
	}
	return e.tensor(weightK, g, d)
}

// run calls the op on both sides and fails the case on an error either
// device reports; it skips a declinable case the set under test declines.
func (e *env) run(f func(o kernels.Ops, side int)) {
	e.t.Helper()
	for s := range 2 {
		if s == dut && e.declinable {
			if u, declined := kernels.Declined(func() { f(e.ops[s], s) }); declined {
				e.t.Skipf("the set declines it (the dispatch would run its fallback's kernel): %v", u)
			}
		} else {
			f(e.ops[s], s)
		}
		if err := e.devs[s].Sync(); err != nil {
			e.t.Fatalf("%s: %v", sideName[s], err)
		}
	}
}

// all is the mask of a tensor every element of which an op must write.
func all(r, c int) bool { return true }

// check compares tensor p of both sides (see compare).
func (e *env) check(what string, p pair, written func(r, c int) bool) {
	e.t.Helper()
	want, err := e.devs[ref].ReadF32(p[ref])
	if err != nil {
		e.t.Fatalf("%s: reading the reference: %v", what, err)
	}
	got, err := e.devs[dut].ReadF32(p[dut])
	if err != nil {
		e.t.Fatalf("%s: reading %v: %v", what, p[dut], err)
	}
	e.compare(what, want, got, p[ref].Cols(), written)
}

// compare holds got against want, both rows of cols values. Where want holds
// NaN (the poison an op must not overwrite) got must too; elsewhere got must
// hold a number, and all those numbers together must be within the
// tolerance of want. written(r, c) marks the elements the op must have
// written; want leaving one of them NaN is an error of the reference.
func (e *env) compare(what string, want, got []float32, cols int, written func(r, c int) bool) {
	e.t.Helper()
	if len(got) != len(want) {
		e.t.Fatalf("%s: read %d elements, want %d", what, len(got), len(want))
	}
	d := kernels.Compare(got, want)
	if d.Poison > 0 {
		for i, w := range want {
			if isNaN(w) && written(i/cols, i%cols) {
				e.t.Fatalf("%s: the reference left [%d,%d] unwritten", what, i/cols, i%cols)
			}
		}
	}
	at := func(i int) string { return fmt.Sprintf("[%d,%d]", i/cols, i%cols) }
	if d.Unwritten > 0 {
		e.t.Errorf("%s: %d elements left unwritten or NaN, first at %s (want %g)", what, d.Unwritten, at(d.FirstUnwritten), want[d.FirstUnwritten])
	}
	if d.Overwritten > 0 {
		e.t.Errorf("%s: %d elements written that must stay untouched, first at %s (got %g)", what, d.Overwritten, at(d.FirstOverwritten), got[d.FirstOverwritten])
	}
	if d.MaxAt < 0 {
		return
	}
	if !(d.Rel <= e.tol) {
		e.t.Errorf("%s: relative error %.3g > %.3g (largest difference %.3g at %s: got %g, want %g)",
			what, d.Rel, e.tol, d.Max, at(d.MaxAt), got[d.MaxAt], want[d.MaxAt])
	}
}

// readInts reads an i32 tensor of both sides.
func (e *env) readInts(p pair) [2][]int32 {
	e.t.Helper()
	var out [2][]int32
	for s := range 2 {
		v, err := e.devs[s].ReadI32(p[s])
		if err != nil {
			e.t.Fatalf("%s: reading %v: %v", sideName[s], p[s], err)
		}
		out[s] = v
	}
	return out
}

var nan = math.Float32frombits(0x7fc00000) // the quiet NaN every converter keeps

func isNaN(f float32) bool { return f != f }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// OpenCUDA opens GPU 0 for a test, closed when the test ends, or skips the
// test, saying why, where no CUDA device can be used.
func OpenCUDA(t testing.TB) *cuda.Device {
	t.Helper()
	if err := cuda.Probe(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}
