package kerneltest

import (
	"fmt"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// Failure is one case a set failed outside `go test`: the case, op/case as
// the tests name it, and what went wrong in it (by how much, for a result
// off the reference).
type Failure struct {
	Case string
	Msg  string
}

func (f Failure) String() string { return f.Case + ": " + f.Msg }

// Report is what Check found: the cases run and the ones failed.
type Report struct {
	Cases    int
	Skipped  int // cases the set declined (its fallback runs them)
	Failures []Failure
}

// Err is nil when every case passed, else one line naming the first
// failed case, how it failed and how many more did.
func (r Report) Err() error {
	if len(r.Failures) == 0 {
		return nil
	}
	msg := "kerneltest case " + r.Failures[0].String()
	if n := len(r.Failures) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more failure(s))", n)
	}
	return fmt.Errorf("%s", strings.ReplaceAll(msg, "\n", " "))
}

// Check runs, outside `go test`, the cases of the ops that owns reports on
// ops (a set built on dev) against the cpu reference, and then, where dev
// records graphs, the decode graph of those ops (case "graph/decode"). The
// long cases are left out: Check is the gate before a set is timed, and its
// cases hold odd sizes, NaN-poisoned outputs and ragged batches. A device
// error (a kernel that faults or never ends) stops it: the device is not
// usable after one.
func Check(dev kernels.Device, ops kernels.Ops, owns func(kernels.Op) bool, tol Tolerances) Report {
	var rep Report
	top := &reporter{rep: &rep, dev: dev}
	top.guard("setup", func(t tester) {
		runOps(t, dev, ops, tol, owns, false)
	})
	if gr, ok := dev.(kernels.Grapher); ok && !top.stopped {
		top.Run("graph/decode", func(t tester) {
			decodeGraph(t, gr, dev, "", owns, ops)
		})
	}
	return rep
}

// reporter is the tester of Check: it notes failures instead of failing,
// and ends a case at Fatalf or Skipf by a panic its Run recovers.
type reporter struct {
	rep     *Report
	dev     kernels.Device
	name    string
	failed  bool
	stopped bool // a device error: no more cases
}

// endCase is the panic that ends a case early.
type endCase struct{ skipped bool }

func (r *reporter) Helper() {}

func (r *reporter) Errorf(format string, args ...any) {
	r.failed = true
	r.rep.Failures = append(r.rep.Failures, Failure{Case: r.name, Msg: fmt.Sprintf(format, args...)})
}

func (r *reporter) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(endCase{})
}

func (r *reporter) Skipf(format string, args ...any) { panic(endCase{skipped: true}) }

func (r *reporter) Run(name string, f func(t tester)) bool {
	if r.stopped {
		return false
	}
	if r.name != "" {
		name = r.name + "/" + name
	}
	child := &reporter{rep: r.rep, dev: r.dev, name: name}
	r.rep.Cases++
	child.guard(name, f)
	if d, ok := r.dev.(interface{ Err() error }); child.stopped || ok && d.Err() != nil {
		r.stopped = true
	}
	return !child.failed
}

// guard runs f, recovering the end of a case and any other panic (a
// launcher's, a contract's), which fails the case.
func (r *reporter) guard(name string, f func(t tester)) {
	defer func() {
		switch p := recover().(type) {
		case nil:
		case endCase:
			if p.skipped {
				r.rep.Skipped++
			}
		default:
			r.name = name
			r.Errorf("panic: %v", p)
		}
	}()
	f(r)
}
