package profile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/profile"
)

// tracingDevice is the cpu device with a kernel tracer that records one
// "kernel" per traced id, from TraceID(id) to TraceID(0).
type tracingDevice struct {
	*cpu.Device
	cur     uint64
	start   int64
	recs    []profile.KernelRecord
	stopped bool
}

func (d *tracingDevice) StartKernelTrace() error { return nil }
func (d *tracingDevice) StopKernelTrace() error  { d.stopped = true; return nil }

func (d *tracingDevice) TraceID(id uint64) {
	now := time.Now().UnixNano()
	if id != 0 {
		d.cur, d.start = id, now
		return
	}
	d.recs = append(d.recs, profile.KernelRecord{Name: "cpu_kernel", Start: d.start, End: now + 1000, ID: d.cur, Source: profile.SourceOwn})
}

func (d *tracingDevice) KernelRecords() ([]profile.KernelRecord, string, error) {
	r := d.recs
	d.recs = nil
	return r, "", nil
}

// Calls through the ops of a spec are tied to the kernels the device
// traced, with their phase, step and layer; Reset drops what the tracer
// still holds.
func TestProfileTracesKernels(t *testing.T) {
	dev := &tracingDevice{Device: cpu.NewDevice()}
	prof := profile.New(dev)
	if err := prof.TraceKernels(); err != nil || prof.Source() != "cupti" {
		t.Fatalf("TraceKernels: %v, source %s", err, prof.Source())
	}
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev.Device, prof) // the cpu set runs on the cpu device itself
	if err != nil {
		t.Fatal(err)
	}
	a := dev.Alloc(kernels.F32, 4, 8)
	if err := dev.Upload(a, make([]byte, 4*a.Numel()), kernels.F32); err != nil {
		t.Fatal(err)
	}
	ops.Add(a, a, a) // before Reset: dropped
	if err := prof.Reset(); err != nil {
		t.Fatal(err)
	}
	ops.SetLayer(3)
	ops.Add(a, a, a)
	prof.SetPhase("decode")
	prof.SetStep(1)
	ops.SetLayer(-1)
	ops.RMSNorm(a, a, dev.Alloc(kernels.F32, 8), 1e-6)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	rep := prof.Report()
	if rep.Launches != 2 || len(rep.Ops) != 2 || rep.Note != "" {
		t.Fatalf("report %+v", rep)
	}
	ks := prof.Recording().Kernels
	if ks[0].Op != kernels.OpAdd || ks[0].Layer != 3 || ks[0].Phase != "prefill" || ks[1].Op != kernels.OpRMSNorm || ks[1].Step != 1 || ks[1].Layer != -1 {
		t.Errorf("kernels %+v", ks)
	}
	for _, r := range rep.Ops {
		if r.Calls != 1 || r.Kernels != 1 || r.Set != "cpu" || r.Bytes == 0 {
			t.Errorf("op row %+v", r)
		}
	}
	if calls := prof.Recording().Calls; len(calls) != 2 || calls[0].Layer != 3 || calls[1].Phase != "decode" {
		t.Errorf("calls %+v", calls)
	}
	if err := prof.Close(); err != nil || !dev.stopped {
		t.Errorf("Close: %v, trace stopped %v", err, dev.stopped)
	}
}

// A device that records no kernels keeps the marks, and the report says
// why.
func TestProfileWithoutTracer(t *testing.T) {
	dev, prof, ops := profiledCPU(t)
	if err := prof.TraceKernels(); err == nil || !strings.Contains(err.Error(), "records no kernels") {
		t.Fatalf("TraceKernels on the cpu: %v", err)
	}
	a := dev.Alloc(kernels.F32, 2, 2)
	if err := dev.Upload(a, make([]byte, 4*a.Numel()), kernels.F32); err != nil {
		t.Fatal(err)
	}
	ops.Add(a, a, a)
	prof.BeginCapture()
	ops.Add(a, a, a) // recorded, not timed
	prof.EndCapture()
	if err := prof.Replay(2, func() error { ops.Add(a, a, a); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	rep := prof.Report()
	if rep.Source != "events" || !strings.Contains(rep.Note, "records no kernels") || !strings.Contains(rep.Note, "1 decode steps were CUDA graph replays") {
		t.Errorf("report %+v", rep)
	}
	// The replay's own Add is a call too (the cpu graph is a stand-in).
	if len(rep.Ops) != 1 || rep.Ops[0].Calls != 2 || rep.Replays != 1 || rep.ComputeMs < rep.ReplayMs {
		t.Errorf("ops %+v, replays %d", rep.Ops, rep.Replays)
	}
	if calls := prof.Recording().Calls; len(calls) != 3 || calls[1].Graph != 1 || calls[1].Ms != 0 {
		t.Errorf("calls %+v", calls)
	}
}

// profiledCPU is the cpu set's ops on a cpu device, with their profile.
func profiledCPU(t *testing.T) (*cpu.Device, *profile.Profile, *kernels.Dispatch) {
	t.Helper()
	dev := cpu.NewDevice()
	prof := profile.New(dev)
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	return dev, prof, ops
}

// besideDevice is the cpu device, saying that the work queued now runs
// beside other work while beside is set.
type besideDevice struct {
	*cpu.Device
	beside bool
}

func (d *besideDevice) Beside() bool { return d.beside }

// Calls queued beside the second stream's work are marked, and their
// events time is counted apart in their op's row (beside_ms).
func TestProfileBeside(t *testing.T) {
	dev := &besideDevice{Device: cpu.NewDevice()}
	prof := profile.New(dev) // the profile asks dev; the set runs on its cpu device
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev.Device, prof)
	if err != nil {
		t.Fatal(err)
	}
	a := dev.Alloc(kernels.F32, 2, 2)
	if err := dev.Upload(a, make([]byte, 4*a.Numel()), kernels.F32); err != nil {
		t.Fatal(err)
	}
	ops.Add(a, a, a)
	dev.beside = true
	ops.Add(a, a, a)
	ops.RMSNorm(a, a, dev.Alloc(kernels.F32, 2), 1e-6)
	dev.beside = false
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	calls := prof.Recording().Calls
	if len(calls) != 3 || calls[0].Beside || !calls[1].Beside || !calls[2].Beside {
		t.Fatalf("calls %+v", calls)
	}
	for _, r := range prof.Report().Ops {
		switch r.Op {
		case kernels.OpAdd:
			if r.Calls != 2 || r.BesideMs != calls[1].Ms || r.Ms != calls[0].Ms+calls[1].Ms {
				t.Errorf("add's row %+v, calls %+v", r, calls)
			}
		case kernels.OpRMSNorm:
			if r.BesideMs != r.Ms {
				t.Errorf("rms_norm's row %+v", r)
			}
		}
	}
}
