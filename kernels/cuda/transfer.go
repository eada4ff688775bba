package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// stageBytes is the size of each of the two pinned staging buffers.
const stageBytes = 32 << 20

// staging is a pinned host buffer and the event recorded after the last
// copy that reads or writes it.
type staging struct {
	host uintptr
	ev   uintptr
}

func (s *staging) bytes() []byte { return unsafe.Slice((*byte)(ptrOf(s.host)), stageBytes) }

func (s *staging) free(drv *driverAPI) error {
	var errs []error
	if s.host != 0 {
		errs = append(errs, drv.check(ccall(drv.cuMemFreeHost, s.host), "cuMemFreeHost"))
		s.host = 0
	}
	if s.ev != 0 {
		errs = append(errs, drv.check(ccall(drv.cuEventDestroy, s.ev), "cuEventDestroy_v2"))
		s.ev = 0
	}
	return errors.Join(errs...)
}

// stagingBuf returns the next staging buffer once the copy last queued on
// it has finished, making the buffers on first use. The lock is held.
func (d *Device) stagingBuf() (*staging, error) {
	s := &d.stage[d.stageNext]
	d.stageNext ^= 1
	if s.host == 0 {
		if err := d.drv.check(ccall(d.drv.cuMemAllocHost, uintptr(unsafe.Pointer(&s.host)), stageBytes), fmt.Sprintf("cuMemAllocHost_v2(%d bytes)", stageBytes)); err != nil {
			return nil, err
		}
		if err := d.drv.check(ccall(d.drv.cuEventCreate, uintptr(unsafe.Pointer(&s.ev)), cuEventDisableTiming), "cuEventCreate"); err != nil {
			return nil, err
		}
		return s, nil
	}
	if err := d.drv.check(ccall(d.drv.cuEventSynchronize, s.ev), "cuEventSynchronize(staging)"); err != nil {
		return nil, err
	}
	return s, nil
}

// laterBytes is the size of each pinned buffer of ReadI32Later: a decode
// step's choice of every row (two i32 a row) many times over.
const laterBytes = 4 << 10

// laterBuf is a pinned buffer of ReadI32Later and the event recorded after
// the copy into it; busy from ReadI32Later until its wait has returned.
type laterBuf struct {
	host, ev uintptr
	busy     bool
}

// ReadI32Later queues a copy of t's elements (I32, packed, at most
// laterBytes) after the work queued so far, into a pinned buffer of its
// own, and returns the function that waits for that copy's event, not for
// the work queued after it, and returns the elements.
func (d *Device) ReadI32Later(t *kernels.Tensor) (func() ([]int32, error), error) {
	if t.DType != kernels.I32 || !t.Packed() || t.Numel()*4 > laterBytes {
		return nil, fmt.Errorf("cuda: ReadI32Later of %v: a packed i32 tensor of at most %d bytes", t, laterBytes)
	}
	n, src := t.Numel(), d.Ptr(t)
	d.enter()
	defer d.leave()
	if err := d.transferable("a read"); err != nil {
		return nil, err
	}
	l, err := d.takeLater()
	if err != nil {
		d.failLocked(err)
		return nil, err
	}
	if n > 0 {
		if err := d.drv.check(ccall(d.drv.cuMemcpyDtoHAsync, l.host, src, uintptr(n*4), d.stream), "cuMemcpyDtoHAsync_v2(later)"); err != nil {
			l.busy = false
			d.failLocked(err)
			return nil, err
		}
	}
	if err := d.drv.check(ccall(d.drv.cuEventRecord, l.ev, d.stream), "cuEventRecord(later)"); err != nil {
		l.busy = false
		d.failLocked(err)
		return nil, err
	}
	return func() ([]int32, error) {
		d.enter()
		defer d.leave()
		defer func() { l.busy = false }()
		if d.closed {
			return nil, errClosed
		}
		if err := d.drv.check(ccall(d.drv.cuEventSynchronize, l.ev), "cuEventSynchronize(later)"); err != nil {
			d.failLocked(err)
			return nil, err
		}
		out := make([]int32, n)
		copy(out, unsafe.Slice((*int32)(ptrOf(l.host)), n))
		return out, nil
	}, nil
}

// takeLater returns a free buffer of ReadI32Later, made busy, allocating
// one where none is free; the lock is held.
func (d *Device) takeLater() (*laterBuf, error) {
	for _, l := range d.later {
		if !l.busy {
			l.busy = true
			return l, nil
		}
	}
	l := &laterBuf{}
	if err := d.drv.check(ccall(d.drv.cuMemAllocHost, uintptr(unsafe.Pointer(&l.host)), laterBytes), fmt.Sprintf("cuMemAllocHost_v2(%d bytes)", laterBytes)); err != nil {
		return nil, err
	}
	if err := d.drv.check(ccall(d.drv.cuEventCreate, uintptr(unsafe.Pointer(&l.ev)), cuEventDisableTiming), "cuEventCreate"); err != nil {
		_ = d.drv.check(ccall(d.drv.cuMemFreeHost, l.host), "cuMemFreeHost") // the error returned is the event's
		return nil, err
	}
	l.busy = true
	d.later = append(d.later, l)
	return l, nil
}

// transferable reports whether a copy may be queued now; the lock is held.
func (d *Device) transferable(what string) error {
	switch {
	case d.closed:
		return errClosed
	case d.capturing:
		return fmt.Errorf("cuda: %s while a graph is captured", what)
	}
	if err := d.joinLocked(); err != nil {
		d.failLocked(err)
	}
	return d.err
}

// Upload copies raw little-endian host elements of type src into the packed
// tensor t, converting them to t's type on the host: f32, bf16 or f16 into
// any of them (rounding to nearest even), i32 into i32. The
// data goes through two pinned buffers in turn, so that converting one
// chunk overlaps the copy of the last; Upload returns once data has been
// read, with the last copies still queued on the stream.
func (d *Device) Upload(t *kernels.Tensor, data []byte, src kernels.DType) error {
	if !t.Packed() {
		return fmt.Errorf("cuda: Upload into pitched %v", t)
	}
	if !convertible(src, t.DType) {
		return fmt.Errorf("cuda: Upload of %v data into %v: no conversion", src, t)
	}
	n := t.Numel()
	if len(data) != n*src.Size() {
		return fmt.Errorf("cuda: Upload into %v: %d bytes of %v data, want %d", t, len(data), src, n*src.Size())
	}
	dst := d.Ptr(t)
	d.enter()
	defer d.leave()
	if err := d.transferable("Upload"); err != nil {
		return err
	}
	ss, ds := src.Size(), t.DType.Size()
	per := stageBytes / max(ss, ds)
	for off := 0; off < n; off += per {
		cnt := min(per, n-off)
		s, err := d.stagingBuf()
		if err != nil {
			d.failLocked(err)
			return err
		}
		host := s.bytes()[:cnt*ds]
		convert(host, t.DType, data[off*ss:(off+cnt)*ss], src)
		if err := d.drv.check(ccall(d.drv.cuMemcpyHtoDAsync, dst+uintptr(off*ds), s.host, uintptr(cnt*ds), d.stream), fmt.Sprintf("cuMemcpyHtoDAsync_v2(%d bytes)", cnt*ds)); err != nil {
			d.failLocked(err)
			return err
		}
		if err := d.drv.check(ccall(d.drv.cuEventRecord, s.ev, d.stream), "cuEventRecord(staging)"); err != nil {
			d.failLocked(err)
			return err
		}
	}
	return nil
}

// WriteI32 copies host int32 values into a packed I32 tensor.
func (d *Device) WriteI32(t *kernels.Tensor, v []int32) error {
	if t.DType != kernels.I32 {
		return fmt.Errorf("cuda: WriteI32 into %v", t)
	}
	if len(v) == 0 {
		return d.Upload(t, nil, kernels.I32)
	}
	return d.Upload(t, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4), kernels.I32)
}

// ReadF32 waits for queued work and returns t's elements (f32, bf16 or f16;
// pitched or not) as float32.
func (d *Device) ReadF32(t *kernels.Tensor) ([]float32, error) {
	switch t.DType {
	case kernels.F32, kernels.BF16, kernels.F16:
	default:
		return nil, fmt.Errorf("cuda: ReadF32 of %v", t)
	}
	raw, err := d.read(t)
	if err != nil {
		return nil, err
	}
	out := make([]float32, t.Numel())
	convert(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(out)*4), kernels.F32, raw, t.DType)
	return out, nil
}

// ReadI32 waits for queued work and returns an I32 tensor's elements.
func (d *Device) ReadI32(t *kernels.Tensor) ([]int32, error) {
	if t.DType != kernels.I32 {
		return nil, fmt.Errorf("cuda: ReadI32 of %v", t)
	}
	raw, err := d.read(t)
	if err != nil {
		return nil, err
	}
	out := make([]int32, t.Numel())
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(out)*4), raw)
	return out, nil
}

// read waits for queued work and returns t's rows packed, as raw bytes of
// its type.
func (d *Device) read(t *kernels.Tensor) ([]byte, error) {
	es := t.DType.Size()
	rows, cols := t.Rows(), t.Cols()
	if rows == 0 || cols == 0 {
		return nil, nil
	}
	span := ((rows-1)*t.Pitch + cols) * es // bytes from row 0's start to the last row's end
	src := d.Ptr(t)
	d.enter()
	defer d.leave()
	if err := d.transferable("a read"); err != nil {
		return nil, err
	}
	if err := d.syncStream(); err != nil {
		d.failLocked(err)
		return nil, err
	}
	raw := make([]byte, span)
	for off := 0; off < span; off += stageBytes {
		cnt := min(stageBytes, span-off)
		s, err := d.stagingBuf()
		if err != nil {
			d.failLocked(err)
			return nil, err
		}
		if err := d.drv.check(ccall(d.drv.cuMemcpyDtoHAsync, s.host, src+uintptr(off), uintptr(cnt), d.stream), fmt.Sprintf("cuMemcpyDtoHAsync_v2(%d bytes)", cnt)); err != nil {
			d.failLocked(err)
			return nil, err
		}
		if err := d.drv.check(ccall(d.drv.cuEventRecord, s.ev, d.stream), "cuEventRecord(staging)"); err != nil {
			d.failLocked(err)
			return nil, err
		}
		if err := d.drv.check(ccall(d.drv.cuEventSynchronize, s.ev), "cuEventSynchronize(staging)"); err != nil {
			d.failLocked(err)
			return nil, err
		}
		copy(raw[off:off+cnt], s.bytes()[:cnt])
	}
	if t.Pitch == cols || rows == 1 {
		return raw, nil
	}
	packed := make([]byte, rows*cols*es)
	for r := 0; r < rows; r++ {
		copy(packed[r*cols*es:(r+1)*cols*es], raw[r*t.Pitch*es:])
	}
	return packed, nil
}

// convertible reports whether convert handles src into dst.
func convertible(src, dst kernels.DType) bool {
	switch dst {
	case kernels.BF16, kernels.F32, kernels.F16:
		return src == kernels.F32 || src == kernels.BF16 || src == kernels.F16
	case kernels.I32:
		return src == dst
	}
	return false
}

// convertGrain is the fewest elements a goroutine of convert gets.
const convertGrain = 256 << 10

// convert writes the elements of src (type st) into dst (type dt), in
// parallel for large inputs: besides the arithmetic, reading a memory-mapped
// checkpoint faults its pages in, which several threads do faster. The
// workers fault as the caller does (debug.SetPanicOnFault), and a worker's
// panic is raised again on the caller's goroutine: a caller that recovers
// a fault reading a mapped file cut short under it (the loader's
// Weights.Read) recovers it here too.
func convert(dst []byte, dt kernels.DType, src []byte, st kernels.DType) {
	n := len(src) / st.Size()
	workers := min(runtime.GOMAXPROCS(0), 8, n/convertGrain)
	if workers <= 1 {
		convertRange(dst, dt, src, st, 0, n)
		return
	}
	onFault := debug.SetPanicOnFault(false)
	debug.SetPanicOnFault(onFault)
	var wg sync.WaitGroup
	per := (n + workers - 1) / workers
	panics := make([]any, workers)
	for i := 0; i*per < n; i++ {
		lo, hi := i*per, min((i+1)*per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { panics[i] = recover() }()
			debug.SetPanicOnFault(onFault)
			convertRange(dst, dt, src, st, lo, hi)
		}()
	}
	wg.Wait()
	for _, p := range panics {
		if p != nil {
			panic(p)
		}
	}
}

// convertRange converts elements [lo, hi).
func convertRange(dst []byte, dt kernels.DType, src []byte, st kernels.DType, lo, hi int) {
	if lo >= hi {
		return
	}
	if st == dt {
		es := st.Size()
		copy(dst[lo*es:hi*es], src[lo*es:hi*es])
		return
	}
	switch {
	case st == kernels.F32 && dt == kernels.BF16:
		s, o := u32s(src, lo, hi), u16s(dst, lo, hi)
		for i, v := range s {
			o[i] = f32ToBF16(v)
		}
	case st == kernels.F16 && dt == kernels.BF16:
		s, o := u16s(src, lo, hi), u16s(dst, lo, hi)
		for i, v := range s {
			o[i] = f32ToBF16(math.Float32bits(kernels.F16ToF32(v)))
		}
	case st == kernels.BF16 && dt == kernels.F32:
		s, o := u16s(src, lo, hi), u32s(dst, lo, hi)
		for i, v := range s {
			o[i] = uint32(v) << 16
		}
	case st == kernels.F16 && dt == kernels.F32:
		s, o := u16s(src, lo, hi), u32s(dst, lo, hi)
		for i, v := range s {
			o[i] = math.Float32bits(kernels.F16ToF32(v))
		}
	case st == kernels.F32 && dt == kernels.F16:
		s, o := u32s(src, lo, hi), u16s(dst, lo, hi)
		for i, v := range s {
			o[i] = kernels.F32ToF16(math.Float32frombits(v))
		}
	case st == kernels.BF16 && dt == kernels.F16:
		s, o := u16s(src, lo, hi), u16s(dst, lo, hi)
		for i, v := range s {
			o[i] = kernels.F32ToF16(math.Float32frombits(uint32(v) << 16))
		}
	default:
		panic(fmt.Sprintf("cuda: no conversion of %v into %v", st, dt))
	}
}

// u16s and u32s view elements [lo, hi) of little-endian bytes as words
// (every platform Go and CUDA share is little-endian). The byte slices may
// be unaligned Go memory; x86 and arm64 load unaligned words.
func u16s(b []byte, lo, hi int) []uint16 {
	b = b[lo*2 : hi*2]
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), hi-lo)
}

func u32s(b []byte, lo, hi int) []uint32 {
	b = b[lo*4 : hi*4]
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), hi-lo)
}

// f32ToBF16 rounds float32 bits to bfloat16 bits, to nearest even, keeping
// NaNs NaN (quiet, sign kept) as PyTorch does.
func f32ToBF16(f uint32) uint16 {
	if f&0x7fffffff > 0x7f800000 {
		return uint16(f>>16) | 0x40
	}
	return uint16((f + 0x7fff + (f>>16)&1) >> 16)
}

// BF16ToF32 and F32ToBF16 are the host conversions Upload and ReadF32 use,
// for tests and callers that prepare data.
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds to nearest even.
func F32ToBF16(f float32) uint16 { return f32ToBF16(math.Float32bits(f)) }
