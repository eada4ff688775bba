// Package cpu is the pure-Go reference kernel set: every op of kernels.Ops in
// plain float32 arithmetic on host memory. It is the oracle the CUDA sets are
// tested against and the path that runs where there is no GPU.
//
// Its activations are f32 (NewDevice), or bf16 (NewDeviceAct): then every op
// still computes in float32, from its inputs widened, and rounds to bf16
// where PyTorch's eager bf16 path through HF transformers' modeling code
// rounds, so that it reproduces HF's bf16 numerics (see ops).
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"time"

	"github.com/fuselm/fuselm/kernels"
)

// Device is host memory. Ops run when they are called, spread over
// GOMAXPROCS goroutines, and are done when they return; Sync only reports
// the errors they found in device data (an out-of-range token id, say).
type Device struct {
	mu  sync.Mutex
	err error
	act kernels.DType
}

// NewDevice returns the CPU device with f32 activations.
func NewDevice() *Device { return &Device{act: kernels.F32} }

// NewDeviceAct returns a CPU device whose activations and caches are of
// type act: F32 (as NewDevice) or BF16.
func NewDeviceAct(act kernels.DType) (*Device, error) {
	if act != kernels.F32 && act != kernels.BF16 {
		return nil, fmt.Errorf("cpu: activations of type %s: want f32 or bf16", act)
	}
	return &Device{act: act}, nil
}

// buffer holds the elements of one allocation in the slice of its dtype:
// f32 for F32, i32 for I32, u16 (raw bits) for BF16 and F16.
type buffer struct {
	f32   []float32
	i32   []int32
	u16   []uint16
	freed bool
	// failed is set when Alloc could not allocate it (Sync says why).
	failed bool
}

func (b *buffer) Bytes() int { return 4*(len(b.f32)+len(b.i32)) + 2*len(b.u16) }

// Name says how many goroutines the ops use, and the activation type when it
// is not f32: "cpu (16 threads)", "cpu (16 threads, bf16 activations)".
func (d *Device) Name() string {
	if d.act != kernels.F32 {
		return fmt.Sprintf("cpu (%d threads, %s activations)", runtime.GOMAXPROCS(0), d.act)
	}
	return fmt.Sprintf("cpu (%d threads)", runtime.GOMAXPROCS(0))
}

// ActDType is the type of activations and caches: F32, or what
// NewDeviceAct was given.
func (d *Device) ActDType() kernels.DType { return d.act }

// Alloc returns a zeroed packed tensor. A size that is negative, overflows,
// or is more than the memory available is not allocated: the error is
// recorded for Sync, and the tensor has no storage (reading or writing it
// fails, and ops on it must not run).
func (d *Device) Alloc(dt kernels.DType, shape ...int) *kernels.Tensor {
	b := &buffer{}
	t := kernels.NewTensor(b, dt, 0, shape...)
	n, err := allocSize(dt, shape)
	if err != nil {
		b.failed = true
		d.fail("Alloc of %s%v: %v", dt, shape, err)
		return t
	}
	switch dt {
	case kernels.F32:
		b.f32 = make([]float32, n)
	case kernels.I32:
		b.i32 = make([]int32, n)
	case kernels.BF16, kernels.F16:
		b.u16 = make([]uint16, n)
	}
	return t
}

// allocSize is the number of elements of a tensor of type dt and the given
// shape, or why it cannot be allocated.
func allocSize(dt kernels.DType, shape []int) (int, error) {
	switch dt {
	case kernels.F32, kernels.I32, kernels.BF16, kernels.F16:
	default:
		return 0, fmt.Errorf("unknown dtype")
	}
	n := uint64(1)
	for _, s := range shape {
		hi, lo := bits.Mul64(n, uint64(s))
		if s < 0 || hi != 0 || lo > math.MaxInt/8 {
			return 0, fmt.Errorf("the size overflows")
		}
		n = lo
	}
	bytes := int64(n) * int64(dt.Size())
	if avail, _, err := MemInfo(); err == nil && bytes > avail {
		return 0, fmt.Errorf("%.1f GiB, more than the %.1f GiB of memory available", float64(bytes)/(1<<30), float64(avail)/(1<<30))
	}
	return int(n), nil
}

// Free drops the tensor's storage; any later use of a view of it fails.
func (d *Device) Free(t *kernels.Tensor) {
	if b, ok := t.Buf.(*buffer); ok {
		*b = buffer{freed: true}
	}
}

// Upload converts raw little-endian elements of type src into t's dtype:
// any of f32, bf16, f16 into any of them (rounding to nearest even when
// narrowing), i32 into i32 only.
func (d *Device) Upload(t *kernels.Tensor, data []byte, src kernels.DType) error {
	b, err := hostBuffer(t)
	if err != nil {
		return fmt.Errorf("cpu: upload: %w", err)
	}
	if !t.Packed() {
		return fmt.Errorf("cpu: upload into pitched tensor %v", t)
	}
	n := t.Numel()
	if len(data) != n*src.Size() {
		return fmt.Errorf("cpu: upload of %d bytes of %s into %v, want %d", len(data), src, t, n*src.Size())
	}
	if (src == kernels.I32) != (t.DType == kernels.I32) {
		return fmt.Errorf("cpu: upload of %s into %v: no conversion between integers and floats", src, t)
	}
	switch t.DType {
	case kernels.I32:
		dst := b.i32[t.Offset : t.Offset+n]
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case kernels.F32:
		dst := b.f32[t.Offset : t.Offset+n]
		for i := range dst {
			dst[i] = rawF32(data, src, i)
		}
	case kernels.BF16, kernels.F16:
		dst := b.u16[t.Offset : t.Offset+n]
		if src == t.DType {
			for i := range dst {
				dst[i] = binary.LittleEndian.Uint16(data[2*i:])
			}
			return nil
		}
		enc := f32ToBF16
		if t.DType == kernels.F16 {
			enc = kernels.F32ToF16
		}
		for i := range dst {
			dst[i] = enc(rawF32(data, src, i))
		}
	}
	return nil
}

// rawF32 is element i of little-endian float data of type src, as float32.
func rawF32(data []byte, src kernels.DType, i int) float32 {
	switch src {
	case kernels.F32:
		return math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	case kernels.BF16:
		return bf16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
	default:
		return kernels.F16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
	}
}

// ReadF32 returns the elements of a float tensor (packed or pitched) as
// float32, row after row.
func (d *Device) ReadF32(t *kernels.Tensor) ([]float32, error) {
	if _, err := hostBuffer(t); err != nil {
		return nil, fmt.Errorf("cpu: read: %w", err)
	}
	if t.DType == kernels.I32 {
		return nil, fmt.Errorf("cpu: ReadF32 of %v: use ReadI32", t)
	}
	w := weight(t)
	out := make([]float32, 0, t.Numel())
	row := make([]float32, t.Cols())
	for r := 0; r < w.rows; r++ {
		out = append(out, w.row(r, row)...)
	}
	return out, nil
}

// ReadI32 returns the elements of an I32 tensor, row after row.
func (d *Device) ReadI32(t *kernels.Tensor) ([]int32, error) {
	if _, err := hostBuffer(t); err != nil {
		return nil, fmt.Errorf("cpu: read: %w", err)
	}
	if t.DType != kernels.I32 {
		return nil, fmt.Errorf("cpu: ReadI32 of %v", t)
	}
	v := I32(t)
	out := make([]int32, 0, t.Numel())
	for r := 0; r < t.Rows(); r++ {
		out = append(out, v[r*t.Pitch:r*t.Pitch+t.Cols()]...)
	}
	return out, nil
}

// ReadI32Later is ReadI32 now: the cpu set's work is done by the time its
// call returns, so the elements are those after the work queued so far.
func (d *Device) ReadI32Later(t *kernels.Tensor) (func() ([]int32, error), error) {
	v, err := d.ReadI32(t)
	if err != nil {
		return nil, err
	}
	return func() ([]int32, error) { return v, nil }, nil
}

// WriteI32 copies v into a packed I32 tensor.
func (d *Device) WriteI32(t *kernels.Tensor, v []int32) error {
	if _, err := hostBuffer(t); err != nil {
		return fmt.Errorf("cpu: write: %w", err)
	}
	if t.DType != kernels.I32 || !t.Packed() || len(v) != t.Numel() {
		return fmt.Errorf("cpu: WriteI32 of %d values into %v", len(v), t)
	}
	copy(I32(t), v)
	return nil
}

// Sync returns, and forgets, the first error an op found since the last
// Sync; all work is already done.
func (d *Device) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.err
	d.err = nil
	return err
}

// fail records an error found in device data, for Sync to return.
func (d *Device) fail(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = fmt.Errorf("cpu: "+format, args...)
	}
}

// Mark is the wall-clock time.
func (d *Device) Mark() kernels.Mark { return time.Now() }

// Elapsed is the wall time between two marks in milliseconds.
func (d *Device) Elapsed(from, to kernels.Mark) (float64, error) {
	f, ok1 := from.(time.Time)
	t, ok2 := to.(time.Time)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("cpu: elapsed between marks %T and %T of another device", from, to)
	}
	return float64(t.Sub(f).Nanoseconds()) / 1e6, nil
}

// Close does nothing: memory goes with the garbage collector.
func (d *Device) Close() error { return nil }

func hostBuffer(t *kernels.Tensor) (*buffer, error) {
	b, ok := t.Buf.(*buffer)
	if !ok {
		return nil, fmt.Errorf("tensor %v is not on the cpu device", t)
	}
	if b.freed {
		return nil, fmt.Errorf("tensor %v was freed", t)
	}
	if b.failed {
		return nil, fmt.Errorf("tensor %v could not be allocated", t)
	}
	return b, nil
}

// span is the number of elements from the start of t's first row to the end
// of its last.
func span(t *kernels.Tensor) int {
	if t.Numel() == 0 {
		return 0
	}
	return (t.Rows()-1)*t.Pitch + t.Cols()
}

// F32 returns the elements behind an F32 tensor view of the CPU device: row
// r of t is F32(t)[r*t.Pitch : r*t.Pitch+t.Cols()]. It panics for a tensor
// of another dtype or device.
func F32(t *kernels.Tensor) []float32 {
	b, err := hostBuffer(t)
	if err != nil || t.DType != kernels.F32 {
		panic(fmt.Sprintf("cpu: F32 of %v (%T)", t, t.Buf))
	}
	return b.f32[t.Offset : t.Offset+span(t)]
}

// I32 is F32 for an I32 tensor.
func I32(t *kernels.Tensor) []int32 {
	b, err := hostBuffer(t)
	if err != nil || t.DType != kernels.I32 {
		panic(fmt.Sprintf("cpu: I32 of %v (%T)", t, t.Buf))
	}
	return b.i32[t.Offset : t.Offset+span(t)]
}
