package kernels

import (
	"fmt"
	"strings"
)

// Buffer is the storage behind tensors, owned by one Device.
type Buffer interface {
	// Bytes is the size of the storage.
	Bytes() int
}

// Tensor is a view of rows in a Buffer.
//
// All dimensions but the last are flattened into rows; each row holds
// Shape[last] contiguous elements and rows start Pitch elements apart
// (Pitch == Shape[last] for a packed tensor). This is the BLAS "leading
// dimension" layout: it lets a kernel read a column slice of a wider matrix
// (the q part of a fused qkv projection, the rope part of a latent) without a
// copy. Offset is where row 0 starts, in elements from the start of Buf.
type Tensor struct {
	DType  DType
	Shape  []int
	Pitch  int
	Offset int
	Buf    Buffer
}

// Cols is the length of the last dimension.
func (t *Tensor) Cols() int { return t.Shape[len(t.Shape)-1] }

// Rows is the product of all dimensions but the last.
func (t *Tensor) Rows() int {
	n := 1
	for _, d := range t.Shape[:len(t.Shape)-1] {
		n *= d
	}
	return n
}

// Numel is the number of elements in the view.
func (t *Tensor) Numel() int { return t.Rows() * t.Cols() }

// Packed reports whether rows follow each other with no gap.
func (t *Tensor) Packed() bool { return t.Pitch == t.Cols() || t.Rows() <= 1 }

func (t *Tensor) String() string {
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = fmt.Sprint(d)
	}
	s := fmt.Sprintf("%s[%s]", t.DType, strings.Join(dims, ","))
	if !t.Packed() {
		s += fmt.Sprintf("/pitch %d", t.Pitch)
	}
	return s
}

// NewTensor describes a packed tensor over buf starting at element offset.
func NewTensor(buf Buffer, dt DType, offset int, shape ...int) *Tensor {
	if len(shape) == 0 {
		panic("kernels: tensor with no dimensions")
	}
	sh := append([]int(nil), shape...)
	return &Tensor{DType: dt, Shape: sh, Pitch: sh[len(sh)-1], Offset: offset, Buf: buf}
}

// Cols returns the view of columns [c0, c1) of every row.
func (t *Tensor) ColSlice(c0, c1 int) *Tensor {
	if c0 < 0 || c1 > t.Cols() || c0 > c1 {
		panic(fmt.Sprintf("kernels: column slice [%d,%d) of %v", c0, c1, t))
	}
	v := *t
	v.Shape = append([]int(nil), t.Shape...)
	v.Shape[len(v.Shape)-1] = c1 - c0
	v.Offset = t.Offset + c0
	return &v
}

// Slice returns the view of indices [i0, i1) of the first dimension.
func (t *Tensor) Slice(i0, i1 int) *Tensor {
	if len(t.Shape) < 2 || i0 < 0 || i1 > t.Shape[0] || i0 > i1 {
		panic(fmt.Sprintf("kernels: slice [%d,%d) of %v", i0, i1, t))
	}
	rowsPer := t.Rows() / t.Shape[0]
	v := *t
	v.Shape = append([]int(nil), t.Shape...)
	v.Shape[0] = i1 - i0
	v.Offset = t.Offset + i0*rowsPer*t.Pitch
	return &v
}

// Reshape returns the same packed elements under another shape. The last
// dimension may change only for a packed tensor.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n != t.Numel() {
		panic(fmt.Sprintf("kernels: reshape %v to %v", t, shape))
	}
	v := *t
	v.Shape = append([]int(nil), shape...)
	if !t.Packed() {
		if shape[len(shape)-1] != t.Cols() {
			panic(fmt.Sprintf("kernels: reshape of pitched %v to %v changes its rows", t, shape))
		}
		return &v
	}
	v.Pitch = shape[len(shape)-1]
	return &v
}

// Device owns memory and the order of work on it.
type Device interface {
	// Name says what the device is, e.g. "cpu (16 threads)".
	Name() string
	// Alloc returns a packed tensor whose contents are undefined.
	Alloc(dt DType, shape ...int) *Tensor
	// Free releases a tensor made by Alloc; views of it become invalid.
	Free(t *Tensor)
	// Upload copies raw little-endian host elements of type src into the
	// packed tensor t, converting them to t.DType.
	Upload(t *Tensor, data []byte, src DType) error
	// ReadF32 waits for pending work and returns t's elements as float32.
	ReadF32(t *Tensor) ([]float32, error)
	// ReadI32 waits for pending work and returns an I32 tensor's elements.
	ReadI32(t *Tensor) ([]int32, error)
	// WriteI32 copies host int32 values into a packed I32 tensor.
	WriteI32(t *Tensor, v []int32) error
	// Sync waits for all queued work and returns the first error any of it
	// raised.
	Sync() error
	// Mark records a point in the device's work queue for the profiler.
	Mark() Mark
	// Elapsed is the device time between two marks in milliseconds; it may
	// wait for the second mark to be reached.
	Elapsed(from, to Mark) (float64, error)
	// ActDType is the element type activations and the KV cache use here.
	ActDType() DType
	// Close releases everything the device holds.
	Close() error
}

// Mark is an opaque point in a device's work queue.
type Mark any

// Grapher is implemented by devices that can record a sequence of queued
// work once and replay it (CUDA graphs); the decode step uses it when present.
type Grapher interface {
	// BeginCapture starts recording the work queued from now on instead of
	// running it.
	BeginCapture() error
	// EndCapture stops recording and returns the recorded work.
	EndCapture() (Graph, error)
}

// LaterReader is implemented by devices that can read a small result
// without waiting for the work queued after it: greedy decode reads a
// step's choice of tokens while the next step, queued behind it, runs.
type LaterReader interface {
	// ReadI32Later queues a copy of t's elements (a packed I32 tensor of a
	// few elements) after the work queued so far and returns the function
	// that waits for that copy, and for no work queued after it, and
	// returns the elements. Call the function once.
	ReadI32Later(t *Tensor) (func() ([]int32, error), error)
}

// Brancher is implemented by devices that can run some queued work beside
// the rest (a second CUDA stream): a layer queues there work that nothing
// right after it needs (DeepSeek-V2's shared experts beside the router and
// the routed experts) and joins it where its result is read.
type Brancher interface {
	// Aside queues the work f queues so that it starts after the work
	// queued before Aside and may run beside the work queued after it;
	// the work queued after join waits for f's too. f's work must not
	// write what that work reads, nor read what it writes, before join;
	// nor may a buffer it uses be freed before join (the allocators hand
	// freed memory to the next request in the order work is queued, which
	// the side's work is not).
	Aside(f func()) (join func())
}

// Graph is recorded device work.
type Graph interface {
	// Replay queues the recorded work again.
	Replay() error
	// Close releases the graph.
	Close() error
}

// CurrentGraph is implemented by graphs that can say whether they may still
// be replayed: a graph holds the device addresses of every buffer its work
// used when it was recorded, so that once one of them is freed (and its
// memory handed to another) a replay would read and write what it no
// longer owns. The decode step keeps such a graph from one generation to
// the next while it is current.
type CurrentGraph interface {
	Graph
	// Current reports whether no device memory has been given back since
	// the graph's recording began, and the graph is not closed.
	Current() bool
}

// Versioned is implemented by ops whose choice of kernels can change after
// they are built (Dispatch: Switch, ApplyTuning): work recorded under one
// version runs the kernels another would choose only when the versions are
// equal.
type Versioned interface {
	// Version counts the changes to the kernels the ops run.
	Version() uint64
}

// Allocs allocates tensors on one device and frees them all at once: what a
// test case or a benchmark problem holds while it runs.
type Allocs struct {
	Dev  Device
	held []*Tensor
}

// Alloc is Dev.Alloc, the tensor kept for Free.
func (a *Allocs) Alloc(dt DType, shape ...int) *Tensor {
	t := a.Dev.Alloc(dt, shape...)
	a.held = append(a.held, t)
	return t
}

// Free frees every tensor Alloc made.
func (a *Allocs) Free() {
	for _, t := range a.held {
		a.Dev.Free(t)
	}
	a.held = nil
}
