// Package cuda runs fuselm's work on an NVIDIA GPU. It loads the CUDA
// driver (libcuda.so.1), NVRTC and cuBLAS at run time with purego, so that
// the binary is built without cgo or CUDA headers and runs on any machine
// with a driver and the CUDA 12 or 13 libraries.
//
// A Device is one GPU's primary context with one stream that all work goes
// to, in order: memory from a caching allocator, uploads through pinned
// staging buffers, kernels compiled by NVRTC for the device's exact
// architecture (cached on disk), cuBLAS for the dense products, events for
// timing, and CUDA graphs. It implements kernels.Device and kernels.Grapher.
//
// Errors of queued work are sticky: the first is recorded (Fail), later
// work is skipped, and Sync returns it.
//
// Every driver call is made with the device's context current on the
// calling OS thread, which is locked for the call, so that the device can
// be used from any goroutine; calls are serialised by the device's lock.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// Props describes a device.
type Props struct {
	Name               string
	CCMajor, CCMinor   int    // compute capability
	SMs                int    // multiprocessors
	MaxSharedPerBlock  int    // bytes of shared memory a block gets without opting in
	MaxSharedOptin     int    // bytes a block may get after Func.SetMaxDynamicShared
	MaxSharedPerSM     int    // bytes of shared memory per multiprocessor
	L2Bytes            int    // L2 cache size
	MaxThreadsPerBlock int    //
	WarpSize           int    //
	TotalMem           int64  // bytes of device memory
	DriverVersion      int    // CUDA version the driver supports, 1000*major + 10*minor (13000)
	NVRTCVersion       int    // 1000*major + 10*minor
	CUBLASVersion      int    // 10000*major + 100*minor + patch, 0 when unknown
	Arch               string // NVRTC's target: "sm_90a", or "compute_XY" when NVRTC only has PTX for the device
}

// Dim3 is a grid or block shape; a zero component counts as 1.
type Dim3 struct{ X, Y, Z uint32 }

// Device is one GPU. Make it with Open.
type Device struct {
	mu        sync.Mutex
	ordinal   int
	dev       int32 // CUdevice
	ctx       uintptr
	stream    uintptr
	props     Props
	drv       *driverAPI
	nvrtc     *nvrtcAPI
	blas      *cublasAPI
	blasH     uintptr
	workspace uintptr // cuBLAS's
	alloc     *allocator
	err       error // the first error of queued work (sticky)
	closed    bool
	watchdog  time.Duration // Sync's bound, 0 for none (SetWatchdog)
	hung      bool          // Sync gave up on work that did not finish
	capturing bool
	// captureFrom is the allocator's count of blocks given back when the
	// graph being recorded began (Graph.Current).
	captureFrom uint64
	side        *side // Aside's second stream, nil until its first use
	onSide      bool  // inside Aside: stream and blasH are the side's
	aside       bool  // Aside may use the second stream (FUSELM_ASIDE not off)

	// Kernel parameters: cuLaunchKernel gets argPtrs, whose entries point at
	// the argVals slots, and copies the values at launch.
	argVals [maxKernelArgs]uint64
	argPtrs [maxKernelArgs]uintptr
	mapArgs []byte // room for maxTensorMapArgs TensorMap arguments on 64-byte boundaries (see Launch)
	// pdl says whether kernels may be launched to overlap the one before
	// (LaunchOverlapped); launchCfg and launchAttr are cuLaunchKernelEx's
	// arguments for those launches.
	pdl        bool
	launchCfg  launchConfig
	launchAttr launchAttribute
	// carveout is the preferred share of the L1/shared memory of an SM
	// that goes to shared memory, in percent, set on every kernel as it is
	// found (FUSELM_CARVEOUT); -1 leaves the driver's choice.
	carveout int

	stage     [2]staging  // pinned host buffers for transfers
	later     []*laterBuf // pinned buffers of ReadI32Later
	stageNext int

	modules  map[string]*Module // by cache key
	modStats ModuleStats
	cacheDir string // "" when the disk cache is off
	ccOpts   []string
	ccKey    []string // ccOpts as the kernel cache's key names them (compileOptions)
	cubin    bool     // the arch is a real sm_XY: NVRTC makes cubins, else PTX

	evMu     sync.Mutex // guards the event pool, which mark cleanups reach from other goroutines
	events   []uintptr  // every timing event made
	freeEvs  []uintptr  // events no live mark holds
	evClosed bool

	graphs  map[*Graph]struct{}
	scratch map[string]*buffer // by owner's key
	asked   map[string]int     // the largest Scratch ask per key since TakeScratch

	own      map[string]bool // the kernels loaded through Module.Func: fuselm's own
	tracing  atomic.Bool     // CUPTI records the device's kernels (StartKernelTrace)
	pushedID bool            // enter pushed a trace id for CUPTI; leave pops it
}

// launchConfig is CUlaunchConfig, cuLaunchKernelEx's description of a
// launch.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	shared                 uint32
	_                      uint32
	stream                 uintptr
	attrs                  uintptr // *launchAttribute
	numAttrs               uint32
	_                      uint32
}

// launchAttribute is CUlaunchAttribute: an id, padding to 8 bytes, and a
// 64-byte union of values.
type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

// cuLaunchAttributeProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const cuLaunchAttributeProgrammaticStreamSerialization = 6

// overlapAllowed reports whether kernels may overlap the one before them
// (LaunchOverlapped): compute capability 9.0 or later, a driver with
// cuLaunchKernelEx, and FUSELM_PDL not "off".
func overlapAllowed(ccMajor int, haveLaunchEx bool, env string) bool {
	return ccMajor >= 9 && haveLaunchEx && env != "off"
}

// carveoutFrom is FUSELM_CARVEOUT's value as a percent of an SM's L1 and
// shared memory preferred for shared memory: "" leaves the driver's choice
// (-1), "max" is 100, else a whole percent from 0 to 100. An SM changes its
// split only when idle, so a chain of overlapped kernels whose shared
// memory needs differ may drain between them; a fixed preference for every
// kernel is what this measures.
func carveoutFrom(env string) (int, error) {
	switch env {
	case "":
		return -1, nil
	case "max":
		return 100, nil
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 0 || n > 100 {
		return 0, fmt.Errorf("cuda: FUSELM_CARVEOUT=%q: want max or a percent from 0 to 100", env)
	}
	return n, nil
}

// maxKernelArgs is the most arguments Launch passes.
const maxKernelArgs = 64

var errClosed = errors.New("cuda: device is closed")

var (
	availOnce sync.Once
	availErr  error
)

// Probe reports why no CUDA device can be used (nil when one can): the
// driver library missing, cuInit failing, or no device.
func Probe() error {
	availOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				availErr = fmt.Errorf("cuda: %v", r)
			}
		}()
		d, err := loadDriver()
		if err != nil {
			availErr = err
			return
		}
		n, err := d.deviceCount()
		if err != nil {
			availErr = err
			return
		}
		if n == 0 {
			availErr = errors.New("cuda: the driver sees no device")
		}
	})
	return availErr
}

// Available reports whether a CUDA driver and a device can be opened. It
// never panics.
func Available() bool { return Probe() == nil }

// Open initialises the driver, device ordinal, its primary context, a
// stream, cuBLAS and the allocator. NVRTC is loaded too, so that a missing
// library is reported here rather than at the first kernel.
func Open(ordinal int) (dev *Device, err error) {
	defer func() {
		if r := recover(); r != nil {
			dev, err = nil, fmt.Errorf("cuda: Open(%d): %v", ordinal, r)
		}
	}()
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	n, err := drv.deviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: no device %d (the driver sees %d)", ordinal, n)
	}
	d := &Device{
		ordinal: ordinal,
		drv:     drv,
		modules: map[string]*Module{},
		graphs:  map[*Graph]struct{}{},
		scratch: map[string]*buffer{},
		asked:   map[string]int{},
		own:     map[string]bool{},
	}
	for i := range d.argPtrs {
		d.argPtrs[i] = uintptr(unsafe.Pointer(&d.argVals[i]))
	}
	d.mapArgs = make([]byte, maxTensorMapArgs*tensorMapBytes+tensorMapAlign)
	if d.dev, d.props, err = drv.deviceProps(ordinal); err != nil {
		return nil, err
	}
	if d.nvrtc, err = loadNVRTC(drv.version); err != nil {
		return nil, err
	}
	if d.blas, err = loadCUBLAS(drv.version); err != nil {
		return nil, err
	}
	d.props.NVRTCVersion = d.nvrtc.version()
	d.props.CUBLASVersion = d.blas.version
	d.props.Arch, d.cubin = chooseArch(d.props.CCMajor, d.props.CCMinor, d.nvrtc.major, d.nvrtc.archs)
	d.ccOpts, d.ccKey = compileOptions(d.props.Arch, d.nvrtc.lib.path)
	d.cacheDir = cacheDirFrom(os.Getenv, os.UserCacheDir)
	d.pdl = overlapAllowed(d.props.CCMajor, drv.cuLaunchKernelEx != 0, os.Getenv("FUSELM_PDL"))
	if d.aside, err = asideFrom(os.Getenv("FUSELM_ASIDE")); err != nil {
		return nil, err
	}
	if d.carveout, err = carveoutFrom(os.Getenv("FUSELM_CARVEOUT")); err != nil {
		return nil, err
	}
	d.launchAttr.id = cuLaunchAttributeProgrammaticStreamSerialization
	d.launchAttr.value[0] = 1 // programmaticStreamSerializationAllowed, an int

	d.mu.Lock()
	runtime.LockOSThread()
	defer func() {
		if err != nil {
			d.closeLocked()
		}
		runtime.UnlockOSThread()
		d.mu.Unlock()
	}()
	if err = drv.check(ccall(drv.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev)), fmt.Sprintf("cuDevicePrimaryCtxRetain(device %d)", ordinal)); err != nil {
		return nil, err
	}
	if err = drv.check(ccall(drv.cuCtxSetCurrent, d.ctx), "cuCtxSetCurrent"); err != nil {
		return nil, err
	}
	if err = drv.check(ccall(drv.cuStreamCreate, uintptr(unsafe.Pointer(&d.stream)), cuStreamNonBlocking), "cuStreamCreate"); err != nil {
		return nil, err
	}
	d.alloc = newAllocator(driverMem{drv})
	if d.blasH, d.workspace, err = d.openBlas(d.stream, ""); err != nil {
		return nil, err
	}
	return d, nil
}

// openBlas makes a cuBLAS handle that queues on stream, with a workspace
// of its own (a handle's workspace must not be shared by two streams at
// once) and the default math mode; tag follows the failing call's name in
// an error. What it made comes back with an error too, for closeBlas.
func (d *Device) openBlas(stream uintptr, tag string) (h, workspace uintptr, err error) {
	if err = d.blas.check(ccall(d.blas.cublasCreate, uintptr(unsafe.Pointer(&h))), "cublasCreate_v2"+tag); err != nil {
		return h, 0, err
	}
	if err = d.blas.check(ccall(d.blas.cublasSetStream, h, stream), "cublasSetStream_v2"+tag); err != nil {
		return h, 0, err
	}
	if err = d.drv.check(ccall(d.drv.cuMemAlloc, uintptr(unsafe.Pointer(&workspace)), cublasWorkspaceSize), fmt.Sprintf("cuMemAlloc_v2(%d bytes) for cuBLAS's workspace%s", cublasWorkspaceSize, tag)); err != nil {
		return h, 0, err
	}
	if err = d.blas.check(ccall(d.blas.cublasSetWorkspace, h, workspace, cublasWorkspaceSize), "cublasSetWorkspace_v2"+tag); err != nil {
		return h, workspace, err
	}
	err = d.blas.check(ccall(d.blas.cublasSetMathMode, h, cublasDefaultMath), "cublasSetMathMode"+tag)
	return h, workspace, err
}

// closeBlas releases what openBlas made, each failure kept.
func (d *Device) closeBlas(h, workspace uintptr, tag string, keep func(error)) {
	if h != 0 {
		keep(d.blas.check(ccall(d.blas.cublasDestroy, h), "cublasDestroy_v2"+tag))
	}
	if workspace != 0 {
		keep(d.drv.check(ccall(d.drv.cuMemFree, workspace), "cuMemFree_v2(cuBLAS workspace)"+tag))
	}
}

// driverMem is the allocator's backend on a device.
type driverMem struct{ drv *driverAPI }

func (m driverMem) malloc(n int) (uintptr, error) {
	var p uintptr
	if err := m.drv.check(ccall(m.drv.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n)), fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n)); err != nil {
		return 0, err
	}
	return p, nil
}

func (m driverMem) free(p uintptr) error {
	return m.drv.check(ccall(m.drv.cuMemFree, p), fmt.Sprintf("cuMemFree_v2(%#x)", p))
}

// enter takes the device's lock and makes its context current on this OS
// thread, locked to the goroutine until leave.
func (d *Device) enter() {
	d.mu.Lock()
	runtime.LockOSThread()
	if !d.closed {
		if err := d.drv.check(ccall(d.drv.cuCtxSetCurrent, d.ctx), "cuCtxSetCurrent"); err != nil {
			d.failLocked(err)
		}
	}
	if d.tracing.Load() {
		d.pushTraceID()
	}
}

func (d *Device) leave() {
	d.popTraceID()
	runtime.UnlockOSThread()
	d.mu.Unlock()
}

// usable reports whether queued work may run: the device is open and no
// error has been recorded. The lock is held.
func (d *Device) usable() bool {
	if d.closed {
		if d.err == nil {
			d.err = errClosed
		}
		return false
	}
	return d.err == nil
}

// Props describes the device.
func (d *Device) Props() Props { return d.props }

// Name says what the device is.
func (d *Device) Name() string {
	p := d.props
	return fmt.Sprintf("cuda:%d %s (%s, %d SMs, %.0f GiB)", d.ordinal, p.Name, p.Arch, p.SMs, float64(p.TotalMem)/(1<<30))
}

// ActDType is bf16: activations and the KV cache are bf16 on CUDA.
func (d *Device) ActDType() kernels.DType { return kernels.BF16 }

// Stream is the CUstream all of the device's work goes to.
func (d *Device) Stream() uintptr { return d.stream }

// Fail records err as the device's error unless one is recorded already;
// queued work is skipped from then on, and Sync returns it.
func (d *Device) Fail(err error) {
	if err == nil {
		return
	}
	d.mu.Lock()
	d.failLocked(err)
	d.mu.Unlock()
}

func (d *Device) failLocked(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Err is the recorded error, if any.
func (d *Device) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// buffer is device memory from the allocator.
type buffer struct {
	dev   *Device
	ptr   uintptr
	size  int // bytes asked for
	class int // bytes of the block
	freed bool
}

// Bytes is the size asked for.
func (b *buffer) Bytes() int { return b.size }

// Alloc returns a packed tensor of undefined contents from the caching
// allocator. When the allocation fails (no memory, or a size that is
// negative or overflows), the error is recorded (see Fail)
// and the tensor has no memory; work using it is skipped.
func (d *Device) Alloc(dt kernels.DType, shape ...int) *kernels.Tensor {
	n := 1
	for _, s := range shape {
		if s < 0 || (s > 0 && n > (1<<62)/s) {
			d.Fail(fmt.Errorf("cuda: Alloc of %s%v: the size is negative or overflows", dt, shape))
			return kernels.NewTensor(&buffer{dev: d}, dt, 0, shape...)
		}
		n *= s
	}
	b := d.allocBuffer(n * dt.Size())
	return kernels.NewTensor(b, dt, 0, shape...)
}

func (d *Device) allocBuffer(bytes int) *buffer {
	d.enter()
	defer d.leave()
	b := &buffer{dev: d, size: bytes}
	if !d.usable() {
		return b
	}
	p, c, err := d.alloc.alloc(bytes)
	if err != nil {
		d.failLocked(err)
		return b
	}
	b.ptr, b.class = p, c
	return b
}

// Free returns t's buffer to the allocator's cache; every view of it becomes
// invalid. Work already queued on it is unaffected: later users of the
// memory are queued after it on the same stream.
func (d *Device) Free(t *kernels.Tensor) {
	b := d.bufferOf(t)
	d.mu.Lock()
	defer d.mu.Unlock()
	if b.freed {
		panic(fmt.Sprintf("cuda: double Free of %v", t))
	}
	b.freed = true
	if b.ptr == 0 || d.closed {
		return
	}
	if err := d.alloc.release(b.ptr); err != nil {
		panic(err)
	}
}

func (d *Device) bufferOf(t *kernels.Tensor) *buffer {
	b, ok := t.Buf.(*buffer)
	if !ok || b.dev != d {
		panic(fmt.Sprintf("cuda: tensor %v is not on device %s", t, d.Name()))
	}
	return b
}

// Ptr is the device address of t's row 0: its buffer's base plus
// Offset elements. It panics when t is not on this device.
func (d *Device) Ptr(t *kernels.Tensor) uintptr {
	b := d.bufferOf(t)
	if b.freed {
		panic(fmt.Sprintf("cuda: tensor %v used after Free", t))
	}
	if b.ptr == 0 {
		return 0
	}
	return b.ptr + uintptr(t.Offset*t.DType.Size())
}

// Scratch returns device memory of at least n bytes for kernel temporaries,
// kept under key ("naive.attn.scores": the owner, then what it holds) and
// valid until the next Scratch call with the same key. A buffer grows when
// asked for more; growing it while a graph is captured is an error (the
// graph would keep the old address), so size every buffer before
// BeginCapture.
func (d *Device) Scratch(key string, n int) uintptr {
	d.enter()
	defer d.leave()
	n = max(n, 1)
	key = d.scratchKey(key)
	d.asked[key] = max(d.asked[key], n)
	b := d.scratch[key]
	if b != nil && b.size >= n {
		return b.ptr
	}
	if !d.usable() {
		return 0
	}
	if d.capturing {
		d.failLocked(fmt.Errorf("cuda: Scratch(%q, %d bytes) grows the buffer while a graph is captured; size it before BeginCapture", key, n))
		return 0
	}
	if b != nil {
		d.alloc.release(b.ptr)
		delete(d.scratch, key)
	}
	p, c, err := d.alloc.alloc(n)
	if err != nil {
		d.failLocked(err)
		return 0
	}
	d.scratch[key] = &buffer{dev: d, ptr: p, size: c, class: c}
	return p
}

// ScratchTensor is Scratch(key, ...) as a packed [rows, cols] tensor of dt,
// for a launcher that hands its temporaries to the set's own ops. It is
// valid as Scratch's memory is, and must not be freed.
func (d *Device) ScratchTensor(key string, dt kernels.DType, rows, cols int) *kernels.Tensor {
	d.Scratch(key, rows*cols*dt.Size())
	d.mu.Lock()
	b := d.scratch[d.scratchKey(key)]
	d.mu.Unlock()
	if b == nil { // the device failed; the failure is recorded
		b = &buffer{dev: d}
	}
	return kernels.NewTensor(b, dt, 0, rows, cols)
}

// MemStats reports the caching allocator's state.
func (d *Device) MemStats() MemStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.alloc == nil {
		return MemStats{}
	}
	return d.alloc.stats
}

// TakeScratch returns the bytes of scratch asked for since the last call,
// each key counted once at its largest ask, and starts counting anew
// (profile.ScratchMeter: an op call's working set).
func (d *Device) TakeScratch() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n int64
	for _, v := range d.asked {
		n += int64(v)
	}
	clear(d.asked)
	return n
}

// ScratchBytes is the memory the scratch buffers hold now.
func (d *Device) ScratchBytes() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n int64
	for _, b := range d.scratch {
		n += int64(b.class)
	}
	return n
}

// LibraryBytes is the device memory the device holds outside its
// allocator: cuBLAS's workspace (two, once Aside has made its stream).
func (d *Device) LibraryBytes() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.side != nil {
		return 2 * cublasWorkspaceSize
	}
	return cublasWorkspaceSize
}

// ReleaseScratch frees every scratch buffer and gives the allocator's
// cached blocks back to the driver, then makes MemStats' Peak count from
// what is held now: the memory of the work that follows is its own (infer
// compare measures each kernel spec so). Graphs captured before must not
// be replayed after it.
func (d *Device) ReleaseScratch() error {
	d.enter()
	defer d.leave()
	if d.closed {
		return errClosed
	}
	if d.capturing {
		return errors.New("cuda: ReleaseScratch while a graph is captured")
	}
	if err := d.joinLocked(); err != nil {
		return err
	}
	if err := d.drv.check(ccall(d.drv.cuStreamSynchronize, d.stream), "cuStreamSynchronize"); err != nil {
		return err
	}
	for key, b := range d.scratch {
		if err := d.alloc.release(b.ptr); err != nil {
			return err
		}
		delete(d.scratch, key)
	}
	err := d.alloc.trim()
	d.alloc.stats.Peak = d.alloc.stats.InUse + d.alloc.stats.Cached
	return err
}

// MemInfo is the driver's count of free and total device memory.
func (d *Device) MemInfo() (free, total int64, err error) {
	d.enter()
	defer d.leave()
	if d.closed {
		return 0, 0, errClosed
	}
	var f, t uint64
	if err := d.drv.check(ccall(d.drv.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))), "cuMemGetInfo_v2"); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// TrimCache gives the allocator's cached blocks back to the driver.
func (d *Device) TrimCache() error {
	d.enter()
	defer d.leave()
	if d.closed {
		return errClosed
	}
	return d.alloc.trim()
}

// Memcpy queues a copy of n bytes between device addresses.
func (d *Device) Memcpy(dst, src uintptr, n int) {
	if n <= 0 {
		return
	}
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	if r := ccall(d.drv.cuMemcpyDtoDAsync, dst, src, uintptr(n), d.stream); uint32(r) != 0 {
		d.failLocked(d.drv.check(r, fmt.Sprintf("cuMemcpyDtoDAsync_v2(%d bytes)", n)))
	}
}

// MemsetD8 queues setting n bytes at dst to v.
func (d *Device) MemsetD8(dst uintptr, v uint8, n int) {
	if n <= 0 {
		return
	}
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	if r := ccall(d.drv.cuMemsetD8Async, dst, uintptr(v), uintptr(n), d.stream); uint32(r) != 0 {
		d.failLocked(d.drv.check(r, fmt.Sprintf("cuMemsetD8Async(%d bytes)", n)))
	}
}

// MemsetD32 queues setting n 32-bit words at dst (4-byte aligned) to v.
func (d *Device) MemsetD32(dst uintptr, v uint32, n int) {
	if n <= 0 {
		return
	}
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	if r := ccall(d.drv.cuMemsetD32Async, dst, uintptr(v), uintptr(n), d.stream); uint32(r) != 0 {
		d.failLocked(d.drv.check(r, fmt.Sprintf("cuMemsetD32Async(%d words)", n)))
	}
}

// Zero queues setting every element of t to zero (bit pattern 0).
func (d *Device) Zero(t *kernels.Tensor) {
	es := t.DType.Size()
	if t.Packed() {
		d.MemsetD8(d.Ptr(t), 0, t.Numel()*es)
		return
	}
	for r := 0; r < t.Rows(); r++ {
		d.MemsetD8(d.Ptr(t)+uintptr(r*t.Pitch*es), 0, t.Cols()*es)
	}
}

// Sync waits for all queued work and returns the first error recorded.
func (d *Device) Sync() error {
	d.enter()
	defer d.leave()
	if d.closed {
		return errClosed
	}
	if d.capturing {
		return errors.New("cuda: Sync while a graph is captured")
	}
	if err := d.syncStream(); err != nil {
		d.failLocked(err)
	}
	return d.err
}

// mark is a timing event recorded on the stream.
type mark struct {
	d  *Device
	ev uintptr // 0 when none was recorded
}

// Mark records a timing event on the stream. Marks made while a graph is
// captured, after an error or on a closed device hold no event, and
// Elapsed reports an error for them. Events return to a pool once their
// marks are unreachable.
func (d *Device) Mark() kernels.Mark {
	d.enter()
	defer d.leave()
	m := &mark{d: d}
	if !d.usable() || d.capturing {
		return m
	}
	ev, err := d.timingEvent()
	if err != nil {
		d.failLocked(err)
		return m
	}
	if err := d.drv.check(ccall(d.drv.cuEventRecord, ev, d.stream), "cuEventRecord"); err != nil {
		d.putEvent(ev)
		d.failLocked(err)
		return m
	}
	m.ev = ev
	runtime.AddCleanup(m, d.putEvent, ev)
	return m
}

// timingEvent takes an event from the pool or makes one; the lock is held.
func (d *Device) timingEvent() (uintptr, error) {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	if n := len(d.freeEvs); n > 0 {
		ev := d.freeEvs[n-1]
		d.freeEvs = d.freeEvs[:n-1]
		return ev, nil
	}
	var ev uintptr
	if err := d.drv.check(ccall(d.drv.cuEventCreate, uintptr(unsafe.Pointer(&ev)), cuEventDefault), "cuEventCreate"); err != nil {
		return 0, err
	}
	d.events = append(d.events, ev)
	return ev, nil
}

// putEvent returns an event to the pool; mark cleanups call it from the
// runtime's cleanup goroutine.
func (d *Device) putEvent(ev uintptr) {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	if !d.evClosed {
		d.freeEvs = append(d.freeEvs, ev)
	}
}

// Elapsed is the device time in milliseconds between two marks; it waits
// for the second to be reached.
func (d *Device) Elapsed(from, to kernels.Mark) (float64, error) {
	f, ok1 := from.(*mark)
	t, ok2 := to.(*mark)
	if !ok1 || !ok2 || f.d != d || t.d != d {
		return 0, fmt.Errorf("cuda: Elapsed of marks not made by %s", d.Name())
	}
	if f.ev == 0 || t.ev == 0 {
		return 0, errors.New("cuda: Elapsed of a mark with no event (made during graph capture, after an error or after Close)")
	}
	d.enter()
	defer d.leave()
	defer runtime.KeepAlive(f)
	defer runtime.KeepAlive(t)
	if d.closed {
		return 0, errClosed
	}
	if err := d.drv.check(ccall(d.drv.cuEventSynchronize, t.ev), "cuEventSynchronize"); err != nil {
		return 0, err
	}
	var ms float32
	if err := d.drv.check(ccall(d.drv.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), f.ev, t.ev), d.drv.elapsedName); err != nil {
		return 0, err
	}
	return float64(ms), nil
}

// Close waits for queued work and releases everything the device holds:
// graphs, modules, events, cuBLAS, all memory, the stream and the context.
// Tensors and graphs of the device are invalid afterwards.
func (d *Device) Close() error {
	d.enter()
	defer d.leave()
	if d.closed {
		return nil
	}
	return d.closeLocked()
}

func (d *Device) closeLocked() error {
	if d.hung { // waiting on the stream, or freeing what it uses, would wait forever
		d.closed = true
		return d.err
	}
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	d.popTraceID()
	keep(d.StopKernelTrace())
	drv := d.drv
	if d.ctx != 0 {
		keep(drv.check(ccall(drv.cuCtxSetCurrent, d.ctx), "cuCtxSetCurrent"))
	}
	if d.capturing {
		var g uintptr
		ccall(drv.cuStreamEndCapture, d.stream, uintptr(unsafe.Pointer(&g)))
		if g != 0 {
			ccall(drv.cuGraphDestroy, g)
		}
		d.capturing = false
	}
	if d.stream != 0 {
		keep(drv.check(ccall(drv.cuStreamSynchronize, d.stream), "cuStreamSynchronize"))
	}
	if d.side != nil {
		keep(d.closeSide(d.side))
		d.side, d.onSide = nil, false
	}
	for g := range d.graphs {
		keep(g.destroy())
	}
	for _, m := range d.modules {
		keep(drv.check(ccall(drv.cuModuleUnload, m.h), "cuModuleUnload("+m.name+")"))
	}
	d.modules = nil
	d.evMu.Lock()
	for _, ev := range d.events {
		keep(drv.check(ccall(drv.cuEventDestroy, ev), "cuEventDestroy_v2"))
	}
	d.events, d.freeEvs, d.evClosed = nil, nil, true
	d.evMu.Unlock()
	for _, l := range d.later {
		keep((&staging{host: l.host, ev: l.ev}).free(drv))
	}
	d.later = nil
	for i := range d.stage {
		keep(d.stage[i].free(drv))
	}
	d.closeBlas(d.blasH, d.workspace, "", keep)
	d.blasH, d.workspace = 0, 0
	if d.alloc != nil {
		keep(d.alloc.releaseAll())
	}
	d.scratch = nil
	if d.stream != 0 {
		keep(drv.check(ccall(drv.cuStreamDestroy, d.stream), "cuStreamDestroy_v2"))
		d.stream = 0
	}
	if d.ctx != 0 {
		keep(drv.check(ccall(drv.cuDevicePrimaryCtxRelease, uintptr(d.dev)), drv.primaryReleaseName))
		d.ctx = 0
	}
	d.closed = true
	return errors.Join(errs...)
}

// Describe says which CUDA libraries were found where, their versions and
// the devices, one line each, for diagnostics; what failed is said in its
// line. It never panics.
func Describe() (s string) {
	var b strings.Builder
	defer func() {
		if r := recover(); r != nil {
			s = b.String() + fmt.Sprintf("panic: %v\n", r)
		}
	}()
	drv, err := loadDriver()
	if err != nil {
		fmt.Fprintf(&b, "libcuda: %v\n", err)
		return b.String()
	}
	fmt.Fprintf(&b, "libcuda: %s (driver supports CUDA %s)\n", shownPath(drv.lib), versionString(drv.version))
	if n, err := loadNVRTC(drv.version); err != nil {
		fmt.Fprintf(&b, "libnvrtc: %v\n", err)
	} else {
		fmt.Fprintf(&b, "libnvrtc: %s (NVRTC %d.%d)\n", shownPath(n.lib), n.major, n.minor)
		if inc := includeDirFor(n.lib.path, os.Getenv, osFinder().isFile); inc != "" {
			fmt.Fprintf(&b, "cuda headers: %s\n", inc)
		}
	}
	if c, err := loadCUBLAS(drv.version); err != nil {
		fmt.Fprintf(&b, "libcublas: %v\n", err)
	} else {
		fmt.Fprintf(&b, "libcublas: %s (cuBLAS %s)\n", shownPath(c.lib), c.versionString())
	}
	b.WriteString(describeCUPTI(drv.version))
	fmt.Fprintf(&b, "kernel cache: %s\n", orOff(cacheDirFrom(os.Getenv, os.UserCacheDir)))
	n, err := drv.deviceCount()
	if err != nil {
		fmt.Fprintf(&b, "devices: %v\n", err)
		return b.String()
	}
	for i := 0; i < n; i++ {
		_, p, err := drv.deviceProps(i)
		if err != nil {
			fmt.Fprintf(&b, "device %d: %v\n", i, err)
			continue
		}
		fmt.Fprintf(&b, "device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %d MiB, shared memory %d KiB per block (opt-in)\n",
			i, p.Name, p.CCMajor, p.CCMinor, p.SMs, float64(p.TotalMem)/(1<<30), p.L2Bytes>>20, p.MaxSharedOptin>>10)
	}
	if n == 0 {
		b.WriteString("devices: none\n")
	}
	return b.String()
}

func shownPath(l *library) string {
	if strings.HasPrefix(l.path, "/") {
		return l.path
	}
	return loadedPath(l.path) + " (via the system loader)"
}

func orOff(dir string) string {
	if dir == "" {
		return "off"
	}
	return dir
}
