package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// Graph is device work recorded by BeginCapture and EndCapture, ready to
// replay on the device's stream.
type Graph struct {
	d     *Device
	graph uintptr // CUgraph
	exec  uintptr // CUgraphExec
	// released is the allocator's count of blocks given back when the
	// recording began (Current).
	released uint64
}

// BeginCapture starts recording the work queued on the device's stream
// instead of running it. The capture is relaxed (CU_STREAM_CAPTURE_MODE_RELAXED):
// a goroutine may move between OS threads during it, which the other modes
// do not allow. Uploads, reads and Sync are refused until EndCapture;
// Scratch slots must not grow; Marks record nothing.
func (d *Device) BeginCapture() error {
	d.enter()
	defer d.leave()
	if d.closed {
		return errClosed
	}
	if d.err != nil {
		return d.err
	}
	if d.capturing {
		return errors.New("cuda: BeginCapture while a graph is captured already")
	}
	if err := d.drv.check(ccall(d.drv.cuStreamBeginCapture, d.stream, cuStreamCaptureRelaxed), d.drv.beginCaptureName+"(relaxed)"); err != nil {
		return err
	}
	d.capturing = true
	d.captureFrom = d.alloc.released
	return nil
}

// EndCapture stops recording and returns the recorded work, instantiated.
// When queued work failed during the capture, that error is returned.
func (d *Device) EndCapture() (kernels.Graph, error) {
	d.enter()
	defer d.leave()
	if d.closed {
		return nil, errClosed
	}
	if !d.capturing {
		return nil, errors.New("cuda: EndCapture without BeginCapture")
	}
	d.capturing = false
	if err := d.joinLocked(); err != nil {
		d.failLocked(err)
	}
	var g uintptr
	if err := d.drv.check(ccall(d.drv.cuStreamEndCapture, d.stream, uintptr(unsafe.Pointer(&g))), "cuStreamEndCapture"); err != nil {
		if g != 0 {
			ccall(d.drv.cuGraphDestroy, g)
		}
		return nil, err
	}
	if d.err != nil {
		ccall(d.drv.cuGraphDestroy, g)
		return nil, fmt.Errorf("cuda: work captured in the graph failed: %w", d.err)
	}
	var exec uintptr
	if err := d.drv.check(ccall(d.drv.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), g, 0), d.drv.instantiateName); err != nil {
		ccall(d.drv.cuGraphDestroy, g)
		return nil, err
	}
	gr := &Graph{d: d, graph: g, exec: exec, released: d.captureFrom}
	if d.drv.cuGraphUpload != 0 {
		if err := d.drv.check(ccall(d.drv.cuGraphUpload, exec, d.stream), "cuGraphUpload"); err != nil {
			gr.destroy()
			return nil, err
		}
	}
	d.graphs[gr] = struct{}{}
	return gr, nil
}

// Replay queues the recorded work on the device's stream. An error is also
// recorded with Fail.
func (g *Graph) Replay() error {
	d := g.d
	d.enter()
	defer d.leave()
	if g.exec == 0 {
		return errors.New("cuda: Replay of a closed graph")
	}
	if !d.usable() {
		return d.err
	}
	if d.capturing {
		return errors.New("cuda: Replay while a graph is captured")
	}
	if err := d.drv.check(ccall(d.drv.cuGraphLaunch, g.exec, d.stream), "cuGraphLaunch"); err != nil {
		d.failLocked(err)
		return err
	}
	return nil
}

// Current reports whether the graph may still be replayed: it is not
// closed, nor is its device, and no device memory has been given back
// since its recording began, so that every address its work holds is
// still its buffer's (kernels.CurrentGraph). Scratch that grows gives its
// old block back, and so makes every graph recorded before it stale.
func (g *Graph) Current() bool {
	d := g.d
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.closed && g.exec != 0 && d.alloc.released == g.released
}

// Close releases the graph.
func (g *Graph) Close() error {
	d := g.d
	d.enter()
	defer d.leave()
	if d.closed || g.exec == 0 {
		return nil // Close of the device destroyed it
	}
	return g.destroy()
}

// destroy frees the graph; the lock is held.
func (g *Graph) destroy() error {
	d := g.d
	delete(d.graphs, g)
	err := errors.Join(
		d.drv.check(ccall(d.drv.cuGraphExecDestroy, g.exec), "cuGraphExecDestroy"),
		d.drv.check(ccall(d.drv.cuGraphDestroy, g.graph), "cuGraphDestroy"))
	g.exec, g.graph = 0, 0
	return err
}

// Interface checks.
var (
	_ kernels.Device       = (*Device)(nil)
	_ kernels.Grapher      = (*Device)(nil)
	_ kernels.Graph        = (*Graph)(nil)
	_ kernels.CurrentGraph = (*Graph)(nil)
)
