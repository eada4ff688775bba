package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// side is the device's second stream, which Aside queues work on: made at
// the first Aside, with a cuBLAS handle and workspace of its own
// (openBlas) and the two events that order it against the first stream.
type side struct {
	stream    uintptr
	blasH     uintptr
	workspace uintptr
	fork      uintptr // recorded on the first stream, waited on by the side
	join      uintptr // recorded on the side, waited on by the first stream
	pending   bool    // join is recorded and the first stream has not waited on it yet
}

// asideKey is the prefix of the scratch buffers of work queued through
// Aside: the kernels running beside the first stream's must not share its
// temporaries (split-K partials, counters).
const asideKey = "aside/"

// Aside queues the work f queues on the device's second stream, which
// starts when the work queued before Aside is done and runs beside the
// work queued after it; the work queued after join waits for f's as well.
// Inside f, kernels, cuBLAS calls, copies and marks go to the second
// stream, and Scratch hands out buffers of their own (under "aside/" and
// the key). Within a graph capture the branch is captured with the rest.
// With FUSELM_ASIDE=off, inside another Aside, on a failed device, or in
// a graph capture before any Aside made the second stream (its cuBLAS
// handle is not made while capturing), f's work is queued in order on the
// first stream and join does nothing. Where the second stream cannot be
// made, that error fails the device as a failed launch would.
// Sync, reads, transfers and EndCapture join first, so that no work is
// left behind on the side.
func (d *Device) Aside(f func()) (join func()) {
	d.enter()
	if !d.aside || !d.usable() || d.onSide || d.side == nil && d.capturing {
		d.leave()
		f()
		return func() {}
	}
	if err := d.forkLocked(); err != nil {
		d.failLocked(err)
		d.leave()
		f()
		return func() {}
	}
	first, firstH := d.stream, d.blasH
	d.stream, d.blasH, d.onSide = d.side.stream, d.side.blasH, true
	d.leave()
	defer func() {
		d.enter()
		defer d.leave()
		d.stream, d.blasH, d.onSide = first, firstH, false
		if err := d.drv.check(ccall(d.drv.cuEventRecord, d.side.join, d.side.stream), "cuEventRecord(aside join)"); err != nil {
			d.failLocked(err)
			return
		}
		d.side.pending = true
	}()
	f()
	return func() {
		d.enter()
		defer d.leave()
		if err := d.joinLocked(); err != nil {
			d.failLocked(err)
		}
	}
}

// Beside reports whether work queued now runs beside other work of the
// step: it goes to the second stream (inside Aside), or to the first while
// work queued on the second is not yet joined.
func (d *Device) Beside() bool {
	d.enter()
	defer d.leave()
	return d.onSide || d.side != nil && d.side.pending
}

// asideFrom is FUSELM_ASIDE's value: "" or "on" lets Aside run work on the
// second stream, "off" queues it in order on the first (to measure what
// the branch buys).
func asideFrom(env string) (bool, error) {
	switch env {
	case "", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("cuda: FUSELM_ASIDE=%q: want on or off", env)
}

// forkLocked makes the second stream if there is none, joins work left on
// it, and makes it wait for the work queued so far on the first; the lock
// is held.
func (d *Device) forkLocked() error {
	if d.side == nil {
		s, err := d.openSide()
		if err != nil {
			return err
		}
		d.side = s
	}
	if err := d.joinLocked(); err != nil {
		return err
	}
	if err := d.drv.check(ccall(d.drv.cuEventRecord, d.side.fork, d.stream), "cuEventRecord(aside fork)"); err != nil {
		return err
	}
	return d.drv.check(ccall(d.drv.cuStreamWaitEvent, d.side.stream, d.side.fork, 0), "cuStreamWaitEvent(aside fork)")
}

// joinLocked makes the first stream wait for the work queued on the side
// since the last join; the lock is held.
func (d *Device) joinLocked() error {
	if d.side == nil || !d.side.pending {
		return nil
	}
	d.side.pending = false
	return d.drv.check(ccall(d.drv.cuStreamWaitEvent, d.stream, d.side.join, 0), "cuStreamWaitEvent(aside join)")
}

// openSide makes the second stream, its cuBLAS handle and workspace and
// the two events; what it made is released where a later step fails.
func (d *Device) openSide() (s *side, err error) {
	if d.drv.cuStreamWaitEvent == 0 {
		return nil, fmt.Errorf("cuda: the driver has no cuStreamWaitEvent, so work cannot run beside the stream")
	}
	s = &side{}
	defer func() {
		if err != nil {
			d.closeSide(s)
		}
	}()
	if err = d.drv.check(ccall(d.drv.cuStreamCreate, uintptr(unsafe.Pointer(&s.stream)), cuStreamNonBlocking), "cuStreamCreate(aside)"); err != nil {
		return s, err
	}
	for _, ev := range []*uintptr{&s.fork, &s.join} {
		if err = d.drv.check(ccall(d.drv.cuEventCreate, uintptr(unsafe.Pointer(ev)), cuEventDisableTiming), "cuEventCreate(aside)"); err != nil {
			return s, err
		}
	}
	s.blasH, s.workspace, err = d.openBlas(s.stream, "(aside)")
	return s, err
}

// closeSide releases what openSide made (the stream after its work).
func (d *Device) closeSide(s *side) error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	drv := d.drv
	if s.stream != 0 {
		keep(drv.check(ccall(drv.cuStreamSynchronize, s.stream), "cuStreamSynchronize(aside)"))
	}
	d.closeBlas(s.blasH, s.workspace, "(aside)", keep)
	for _, ev := range []uintptr{s.fork, s.join} {
		if ev != 0 {
			keep(drv.check(ccall(drv.cuEventDestroy, ev), "cuEventDestroy_v2(aside)"))
		}
	}
	if s.stream != 0 {
		keep(drv.check(ccall(drv.cuStreamDestroy, s.stream), "cuStreamDestroy_v2(aside)"))
	}
	return errors.Join(errs...)
}

// scratchKey is key as Scratch files it: under asideKey inside Aside.
func (d *Device) scratchKey(key string) string {
	if d.onSide {
		return asideKey + key
	}
	return key
}
