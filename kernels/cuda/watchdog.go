package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"time"
)

// Hung is the device's error when its queued work did not finish within
// the watchdog's bound (SetWatchdog): a kernel that never ends. The device
// is unusable afterwards, and Close leaves the work to the process's exit.
type Hung struct{ Limit time.Duration }

func (e *Hung) Error() string {
	return fmt.Sprintf("cuda: queued work did not finish within %v (a kernel that never ends?): stopped waiting", e.Limit)
}

// SetWatchdog bounds how long Sync waits for queued work: past limit, Sync
// records a *Hung error and returns it instead of waiting on. Zero (the
// default) waits for as long as the work takes. The bound is for kernels
// not written here (a user's kernel set).
func (d *Device) SetWatchdog(limit time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.watchdog = limit
}

// ModuleImage loads a compiled image, PTX text or a cubin, as the module
// named name (for messages); PTX is compiled by the driver for the device.
func (d *Device) ModuleImage(name string, img []byte) (*Module, error) {
	if len(img) == 0 {
		return nil, fmt.Errorf("cuda: module %s: empty image", name)
	}
	sum := sha256.Sum256(img)
	key := "image:" + hex.EncodeToString(sum[:])
	img = append(append([]byte(nil), img...), 0) // PTX is read as a C string; a cubin ignores the byte
	d.enter()
	defer d.leave()
	if d.closed {
		return nil, errClosed
	}
	if m := d.modules[key]; m != nil {
		return m, nil
	}
	return d.load(name, key, img)
}

// syncStream waits for the stream's work, within the watchdog's bound when
// one is set; the lock is held.
func (d *Device) syncStream() error {
	if d.hung {
		return &Hung{Limit: d.watchdog}
	}
	if err := d.joinLocked(); err != nil {
		return err
	}
	if d.watchdog <= 0 || d.drv.cuStreamQuery == 0 {
		return d.drv.check(ccall(d.drv.cuStreamSynchronize, d.stream), "cuStreamSynchronize")
	}
	code, hung := pollUntil(func() uint32 { return uint32(ccall(d.drv.cuStreamQuery, d.stream)) }, d.watchdog)
	if hung {
		d.hung = true
		return &Hung{Limit: d.watchdog}
	}
	return d.drv.check(uintptr(code), "cuStreamQuery")
}

// pollUntil calls query, a cuStreamQuery, until it answers anything but
// not-ready or limit passes (hung): at once for the first spinFor, then
// every 100 µs. A decode step's wait (milliseconds) is all spin, so that a
// run with a user set loaded (whose build arms the watchdog) is not timed
// with sleeps the runs before it did not have.
func pollUntil(query func() uint32, limit time.Duration) (code uint32, hung bool) {
	const spinFor = 50 * time.Millisecond
	start := time.Now()
	for {
		if code = query(); code != cudaErrorNotReady {
			return code, false
		}
		waited := time.Since(start)
		if waited > limit {
			return code, true
		}
		if waited < spinFor {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}
