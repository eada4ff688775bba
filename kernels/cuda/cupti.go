package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fuselm/fuselm/kernels/profile"
)

// CUPTI is the CUDA Profiling Tools Interface, loaded at run time like the
// rest of CUDA. fuselm uses its activity API: CUPTI records every kernel
// the GPU runs (graph replays and cuBLAS's kernels included) into buffers
// fuselm hands it, and external correlation records that tie each CUDA API
// call to the ids fuselm pushed around it; a resource callback tells which
// id was current when each graph node was captured.

// cuptiAPI is libcupti's entry points.
type cuptiAPI struct {
	lib     *library
	version uint32 // cuptiGetVersion: the library's CUPTI_API_VERSION

	cuptiGetVersion, cuptiGetResultString, cuptiGetTimestamp                      uintptr
	cuptiActivityRegisterCallbacks, cuptiActivityEnable, cuptiActivityDisable     uintptr
	cuptiActivityFlushAll, cuptiActivityGetNextRecord                             uintptr
	cuptiActivityGetNumDroppedRecords                                             uintptr
	cuptiActivityPushExternalCorrelationId, cuptiActivityPopExternalCorrelationId uintptr
	cuptiSubscribe, cuptiUnsubscribe, cuptiEnableCallback, cuptiGetGraphNodeId    uintptr
}

// CUPTI constants (cupti_result.h, cupti_activity.h, cupti_callbacks.h).
const (
	cuptiErrorMaxLimitReached = 12 // CUPTI_ERROR_MAX_LIMIT_REACHED: no more records in the buffer
	cuptiFlushForced          = 1  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
	cuptiDomainResource       = 3  // CUPTI_CB_DOMAIN_RESOURCE
	cuptiGraphNodeCreated     = 13 // CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED
	cuptiGraphNodeCloned      = 20 // CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED
	cuptiOldestVersion        = 18 // CUDA 11.8's CUPTI_API_VERSION: the first with the kernel prefix read here

	// CUpti_ResourceData.resourceDescriptor, and CUpti_GraphData.node and
	// .originalNode (CUDA 11.8 to 13: a CUcontext, a union of one pointer,
	// then the descriptor; CUgraph graph, originalGraph, then the nodes).
	resOffDescriptor  = 16
	graphOffNode      = 16
	graphOffOrigNode  = 24
	cuptiBufferBytes  = 8 << 20 // one activity buffer
	cuptiBufferAlign  = 8       // ACTIVITY_RECORD_ALIGNMENT
	cuptiBlasExternal = 1       // the CUSTOM1 id that tags cuBLAS's calls
)

// cuptiSonames are the CUPTI libraries to try: the majors the driver
// supports, newest first.
func cuptiSonames(driverVersion int) []string {
	var s []string
	for _, m := range majorsFor(driverVersion) {
		s = append(s, fmt.Sprintf("libcupti.so.%d", m))
	}
	return s
}

// cuptiFinder searches, besides the CUDA libraries' places, each CUDA
// install's extras/CUPTI/lib64 and the CUDA 12 wheel's nvidia/cuda_cupti/lib.
func cuptiFinder(f finder) finder {
	for _, root := range f.cudaRoots() {
		f.extraDirs = append(f.extraDirs, filepath.Join(root, "extras", "CUPTI", "lib64"))
	}
	f.wheelSubdirs = append(append([]string(nil), wheelLibDirs...), "nvidia/cuda_cupti/lib")
	return f
}

var (
	cuptiOnce sync.Once
	cupti     *cuptiAPI
	cuptiErr  error
)

// loadCUPTI opens libcupti once per process.
func loadCUPTI(driverVersion int) (*cuptiAPI, error) {
	cuptiOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				cupti, cuptiErr = nil, fmt.Errorf("cuda: loading CUPTI: %v", r)
			}
		}()
		lib, err := cuptiFinder(osFinder()).find("libcupti", cuptiSonames(driverVersion), nil)
		if err != nil {
			cuptiErr = err
			return
		}
		cupti, cuptiErr = bindCUPTI(lib)
	})
	return cupti, cuptiErr
}

// bindCUPTI resolves CUPTI's entry points in lib and checks its version.
func bindCUPTI(lib *library) (*cuptiAPI, error) {
	c := &cuptiAPI{lib: lib}
	err := lib.resolve([]symbol{
		sym(&c.cuptiGetVersion, "cuptiGetVersion"),
		sym(&c.cuptiGetResultString, "cuptiGetResultString"),
		sym(&c.cuptiGetTimestamp, "cuptiGetTimestamp"),
		sym(&c.cuptiActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks"),
		sym(&c.cuptiActivityEnable, "cuptiActivityEnable"),
		sym(&c.cuptiActivityDisable, "cuptiActivityDisable"),
		sym(&c.cuptiActivityFlushAll, "cuptiActivityFlushAll"),
		sym(&c.cuptiActivityGetNextRecord, "cuptiActivityGetNextRecord"),
		sym(&c.cuptiActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords"),
		sym(&c.cuptiActivityPushExternalCorrelationId, "cuptiActivityPushExternalCorrelationId"),
		sym(&c.cuptiActivityPopExternalCorrelationId, "cuptiActivityPopExternalCorrelationId"),
		sym(&c.cuptiSubscribe, "cuptiSubscribe"),
		sym(&c.cuptiUnsubscribe, "cuptiUnsubscribe"),
		sym(&c.cuptiEnableCallback, "cuptiEnableCallback"),
		sym(&c.cuptiGetGraphNodeId, "cuptiGetGraphNodeId"),
	})
	if err != nil {
		return nil, err
	}
	if err := c.check(ccall(c.cuptiGetVersion, uintptr(unsafe.Pointer(&c.version))), "cuptiGetVersion"); err != nil {
		return nil, err
	}
	if c.version < cuptiOldestVersion {
		return nil, fmt.Errorf("cuda: CUPTI %s (%s) is older than CUDA 11.8's, whose kernel records this build reads", c.versionString(), lib.path)
	}
	return c, nil
}

// versionString is the CUPTI API version as CUDA names it: 13.0 for
// 130000 and later (CUDA 13 numbers it so), the plain number before.
func (c *cuptiAPI) versionString() string {
	if c.version >= 100000 {
		return fmt.Sprintf("%d.%d (API version %d)", c.version/10000, c.version%10000/100, c.version)
	}
	return fmt.Sprintf("API version %d", c.version)
}

// check turns a CUptiResult into nil or an *Error about call.
func (c *cuptiAPI) check(r uintptr, call string) error {
	code := uint32(r)
	if code == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(code), Name: fmt.Sprintf("CUPTI_ERROR_%d", code)}
	var p uintptr
	if uint32(ccall(c.cuptiGetResultString, uintptr(code), uintptr(unsafe.Pointer(&p)))) == 0 && p != 0 {
		e.Name = cString(p)
	}
	return e
}

// timestamp is CUPTI's clock, in ns.
func (c *cuptiAPI) timestamp() (uint64, error) {
	var ts uint64
	err := c.check(ccall(c.cuptiGetTimestamp, uintptr(unsafe.Pointer(&ts))), "cuptiGetTimestamp")
	return ts, err
}

// activityKinds are what the trace enables: kernels, the external
// correlation records, and the driver and runtime API records CUPTI needs
// enabled to emit those.
var activityKinds = []struct {
	kind uint32
	name string
}{
	{actKindConcurrentKernel, "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"},
	{actKindExternal, "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION"},
	{actKindDriver, "CUPTI_ACTIVITY_KIND_DRIVER"},
	{actKindRuntime, "CUPTI_ACTIVITY_KIND_RUNTIME"},
}

// kernelTrace is the process's CUPTI session (CUPTI's state is one per
// process): one device traces at a time. Its callbacks run on any thread,
// CUPTI's own included; the mutex guards what they fill.
type kernelTrace struct {
	api    *cuptiAPI
	dev    *Device // the device tracing, nil when none
	on     bool    // a device traces: buffers are read, not dropped
	offset int64   // host wall clock − CUPTI's clock, ns
	subErr error   // why graph nodes are not followed, when they are not

	cur  atomic.Uint64 // the trace id set now (profile.KernelTracer.TraceID)
	blas atomic.Bool   // a cuBLAS call is under way

	mu      sync.Mutex
	bufs    map[uintptr][]byte // buffers CUPTI holds, by the address handed out
	spare   [][]byte
	raw     []rawKernel
	ext     map[uint32]extIDs
	nodes   map[uint64]nodeInfo
	names   map[uintptr]string
	dropped uint64
	untimed int   // kernel records without timestamps
	recSize int   // the size of the kernel records seen, for Describe
	err     error // the first error met in a callback
}

var (
	trace = &kernelTrace{
		bufs:  map[uintptr][]byte{},
		ext:   map[uint32]extIDs{},
		nodes: map[uint64]nodeInfo{},
		names: map[uintptr]string{},
	}
	callbacksOnce                        sync.Once
	cbRequested, cbCompleted, cbResource uintptr
)

// makeCallbacks makes the C function pointers of CUPTI's callbacks, once
// per process (purego never frees them).
func makeCallbacks() {
	callbacksOnce.Do(func() {
		cbRequested = purego.NewCallback(func(buf, size, maxRecords uintptr) {
			trace.bufferRequested(buf, size, maxRecords)
		})
		cbCompleted = purego.NewCallback(func(ctx, stream, buf, size, valid uintptr) {
			trace.bufferCompleted(ctx, uint32(stream), buf, valid)
		})
		cbResource = purego.NewCallback(func(_, domain, cbid, data uintptr) {
			trace.resource(uint32(domain), uint32(cbid), data)
		})
	})
}

// fail keeps the first error a callback met; the lock is held.
func (t *kernelTrace) failLocked(err error) {
	if t.err == nil {
		t.err = err
	}
}

// bufferRequested hands CUPTI an empty buffer (CUpti_BuffersCallbackRequestFunc:
// uint8_t **buffer, size_t *size, size_t *maxNumRecords). The buffer is Go
// memory, which does not move; the map keeps it alive while CUPTI holds it.
func (t *kernelTrace) bufferRequested(buf, size, maxRecords uintptr) {
	defer t.recoverInto()
	t.mu.Lock()
	var b []byte
	if n := len(t.spare); n > 0 {
		b, t.spare = t.spare[n-1], t.spare[:n-1]
	} else {
		b = make([]byte, cuptiBufferBytes+cuptiBufferAlign)
	}
	base := uintptr(unsafe.Pointer(&b[0]))
	p := (base + cuptiBufferAlign - 1) &^ (cuptiBufferAlign - 1)
	t.bufs[p] = b
	t.mu.Unlock()
	*(*uintptr)(ptrOf(buf)) = p
	*(*uintptr)(ptrOf(size)) = cuptiBufferBytes
	*(*uintptr)(ptrOf(maxRecords)) = 0
}

// bufferCompleted reads the records CUPTI wrote into a buffer
// (CUpti_BuffersCallbackCompleteFunc: CUcontext, uint32_t streamId,
// uint8_t *buffer, size_t size, size_t validSize) and takes it back.
func (t *kernelTrace) bufferCompleted(ctx uintptr, stream uint32, p, valid uintptr) {
	defer t.recoverInto()
	t.mu.Lock()
	b, ok := t.bufs[p]
	delete(t.bufs, p)
	t.mu.Unlock()
	if !ok {
		return // not a buffer of ours; nothing to read
	}
	off := int(p - uintptr(unsafe.Pointer(&b[0])))
	data := b[off : off+int(valid)]
	var offsets []int
	var rec uintptr
	for {
		r := ccall(t.api.cuptiActivityGetNextRecord, p, valid, uintptr(unsafe.Pointer(&rec)))
		if uint32(r) == cuptiErrorMaxLimitReached {
			break
		}
		if err := t.api.check(r, "cuptiActivityGetNextRecord"); err != nil {
			t.mu.Lock()
			t.failLocked(err)
			t.mu.Unlock()
			break
		}
		offsets = append(offsets, int(rec-p))
	}
	var dropped uint64
	t.api.check(ccall(t.api.cuptiActivityGetNumDroppedRecords, ctx, uintptr(stream), uintptr(unsafe.Pointer(&dropped))), "cuptiActivityGetNumDroppedRecords")
	t.mu.Lock()
	defer t.mu.Unlock()
	t.spare = append(t.spare, b)
	if !t.on {
		return // recorded while no device traced
	}
	t.readRecords(data, offsets)
	t.dropped += dropped
}

// readRecords decodes the records at offsets of data (one buffer, in
// CUPTI's order: a record ends where the next begins); the lock is held.
func (t *kernelTrace) readRecords(data []byte, offsets []int) {
	for i, o := range offsets {
		end := len(data)
		if i+1 < len(offsets) {
			end = offsets[i+1]
		}
		rec := data[o:end]
		switch binary.LittleEndian.Uint32(rec) {
		case actKindConcurrentKernel, actKindKernel:
			if i+1 < len(offsets) {
				t.recSize = len(rec)
			}
			k, err := decodeKernel(rec, t.name)
			if err != nil {
				t.failLocked(err)
				continue
			}
			if k.start == 0 && k.end == 0 {
				t.untimed++
			}
			t.raw = append(t.raw, k)
		case actKindExternal:
			if err := decodeExternal(rec, t.ext); err != nil {
				t.failLocked(err)
			}
		}
	}
}

// name is the kernel name at p, a string CUPTI owns; the lock is held.
func (t *kernelTrace) name(p uintptr) string {
	if p == 0 {
		return "(unnamed)"
	}
	if s, ok := t.names[p]; ok {
		return s
	}
	s := cString(p)
	t.names[p] = s
	return s
}

// resource follows graph nodes (CUpti_CallbackFunc in the resource
// domain, whose data is a CUpti_ResourceData with a CUpti_GraphData
// descriptor): a node created while a trace id is set remembers it, a node
// cloned when a graph is instantiated inherits its original's. It runs on
// the thread that made the CUDA call, inside it.
func (t *kernelTrace) resource(domain, cbid uint32, data uintptr) {
	defer t.recoverInto()
	if domain != cuptiDomainResource || data == 0 || (cbid != cuptiGraphNodeCreated && cbid != cuptiGraphNodeCloned) {
		return
	}
	desc := *(*uintptr)(ptrOf(data + resOffDescriptor))
	if desc == 0 {
		return
	}
	id, ok := t.nodeID(*(*uintptr)(ptrOf(desc + graphOffNode)))
	if !ok {
		return
	}
	if cbid == cuptiGraphNodeCreated {
		if cur := t.cur.Load(); cur != 0 {
			t.mu.Lock()
			t.nodes[id] = nodeInfo{id: cur, blas: t.blas.Load()}
			t.mu.Unlock()
		}
		return
	}
	orig, ok := t.nodeID(*(*uintptr)(ptrOf(desc + graphOffOrigNode)))
	if !ok {
		return
	}
	t.mu.Lock()
	if n, ok := t.nodes[orig]; ok {
		t.nodes[id] = n
	}
	t.mu.Unlock()
}

func (t *kernelTrace) nodeID(node uintptr) (uint64, bool) {
	if node == 0 {
		return 0, false
	}
	var id uint64
	return id, uint32(ccall(t.api.cuptiGetGraphNodeId, node, uintptr(unsafe.Pointer(&id)))) == 0
}

// recoverInto keeps a panic in a callback as the trace's error: a Go panic
// must not unwind into CUPTI's C frames.
func (t *kernelTrace) recoverInto() {
	if r := recover(); r != nil {
		t.mu.Lock()
		t.failLocked(fmt.Errorf("cuda: CUPTI callback: %v", r))
		t.mu.Unlock()
	}
}

// StartKernelTrace starts recording every kernel the device runs with
// CUPTI (profile.KernelTracer). It fails, saying why, when CUPTI cannot be
// loaded or enabled, or another device traces. No lock is held while CUPTI
// is called: it may call back at once.
func (d *Device) StartKernelTrace() (err error) {
	api, err := loadCUPTI(d.drv.version)
	if err != nil {
		return err
	}
	t := trace
	t.mu.Lock()
	switch {
	case t.dev == d:
		t.mu.Unlock()
		return nil
	case t.dev != nil:
		t.mu.Unlock()
		return fmt.Errorf("cuda: %s traces kernels already", t.dev.Name())
	}
	t.api = api
	t.mu.Unlock()
	sessionOnce.Do(func() { sessionErr = t.startSession(api) })
	if sessionErr != nil {
		return sessionErr
	}
	// Drop what CUPTI recorded while no device traced.
	if err := api.check(ccall(api.cuptiActivityFlushAll, cuptiFlushForced), "cuptiActivityFlushAll"); err != nil {
		return err
	}
	ts, err := api.timestamp()
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dev != nil {
		return fmt.Errorf("cuda: %s traces kernels already", t.dev.Name())
	}
	t.raw, t.ext, t.names, t.dropped, t.untimed, t.err = nil, map[uint32]extIDs{}, map[uintptr]string{}, 0, 0, nil
	t.offset = time.Now().UnixNano() - int64(ts)
	t.dev, t.on = d, true
	t.cur.Store(0)
	d.tracing.Store(true)
	return nil
}

var (
	sessionOnce sync.Once
	sessionErr  error
)

// startSession sets CUPTI up, once per process: the buffer callbacks, the
// activity kinds, and the subscriber that follows graph nodes. It stays up
// until the process ends (a device that stops tracing only detaches), so
// that every trace is CUPTI's first session: CUDA 13.0's CUPTI gives graph
// launches wrong correlation ids in later ones (fixed in 13.1 Update 1).
func (t *kernelTrace) startSession(api *cuptiAPI) error {
	makeCallbacks()
	if err := api.check(ccall(api.cuptiActivityRegisterCallbacks, cbRequested, cbCompleted), "cuptiActivityRegisterCallbacks"); err != nil {
		return err
	}
	var enabled []uint32
	for _, k := range activityKinds {
		if err := api.check(ccall(api.cuptiActivityEnable, uintptr(k.kind)), "cuptiActivityEnable("+k.name+")"); err != nil {
			for _, e := range enabled {
				ccall(api.cuptiActivityDisable, uintptr(e))
			}
			return err
		}
		enabled = append(enabled, k.kind)
	}
	// Graph nodes are followed through a subscriber, which CUPTI allows one
	// of per process: under another tool, replayed kernels are matched by
	// position instead (profile.Profile).
	var sub uintptr
	subErr := api.check(ccall(api.cuptiSubscribe, uintptr(unsafe.Pointer(&sub)), cbResource, 0), "cuptiSubscribe")
	if subErr == nil {
		for _, cbid := range []uintptr{cuptiGraphNodeCreated, cuptiGraphNodeCloned} {
			if err := api.check(ccall(api.cuptiEnableCallback, 1, sub, cuptiDomainResource, cbid), "cuptiEnableCallback"); err != nil && subErr == nil {
				subErr = err
			}
		}
	}
	t.mu.Lock()
	t.subErr = subErr
	t.mu.Unlock()
	return nil
}

// TraceID sets the id the device's work from now on is attributed to
// (profile.KernelTracer).
func (d *Device) TraceID(id uint64) {
	if d.tracing.Load() {
		trace.cur.Store(id)
	}
}

// KernelRecords flushes CUPTI's buffers and returns the kernels recorded
// since the last call, tied to trace ids, on the host's clock
// (profile.KernelTracer). The device must have finished them (Sync).
func (d *Device) KernelRecords() ([]profile.KernelRecord, string, error) {
	t := trace
	if !d.tracing.Load() {
		return nil, "", errors.New("cuda: KernelRecords of a device that is not tracing kernels")
	}
	if err := t.api.check(ccall(t.api.cuptiActivityFlushAll, cuptiFlushForced), "cuptiActivityFlushAll"); err != nil {
		return nil, "", err
	}
	t.mu.Lock()
	raw, ext, dropped, untimed, err := t.raw, t.ext, t.dropped, t.untimed, t.err
	t.raw, t.ext, t.names, t.dropped, t.untimed, t.err = nil, map[uint32]extIDs{}, map[uintptr]string{}, 0, 0, nil
	nodes, offset, subErr := maps.Clone(t.nodes), t.offset, t.subErr
	t.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	// The device's lock is taken without the trace's: it is held around
	// the CUDA calls whose callbacks take the trace's.
	d.mu.Lock()
	own := maps.Clone(d.own)
	d.mu.Unlock()
	recs := joinKernels(raw, ext, nodes, func(name string) bool { return own[name] }, offset)
	var note string
	if dropped > 0 {
		note = fmt.Sprintf("CUPTI dropped %d records: kernel times miss some kernels", dropped)
	}
	if untimed > 0 {
		note = joinNotes(note, fmt.Sprintf("%d kernels came without timestamps", untimed))
	}
	if subErr != nil {
		note = joinNotes(note, fmt.Sprintf("graph nodes not followed (%v)", subErr))
	}
	return recs, note, nil
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// StopKernelTrace detaches the device from the trace and drops what was
// not read; CUPTI's session stays up for the next trace (startSession).
func (d *Device) StopKernelTrace() error {
	if !d.tracing.Load() {
		return nil
	}
	t := trace
	d.tracing.Store(false)
	t.mu.Lock()
	t.dev, t.on = nil, false
	t.cur.Store(0)
	t.raw, t.ext, t.names = nil, map[uint32]extIDs{}, map[uintptr]string{}
	t.mu.Unlock()
	return t.api.check(ccall(t.api.cuptiActivityFlushAll, cuptiFlushForced), "cuptiActivityFlushAll")
}

// pushTraceID pushes the current trace id as CUPTI's external correlation
// id on this thread, for the CUDA calls until popTraceID; the device's lock
// is held and the thread locked (enter).
func (d *Device) pushTraceID() {
	if id := trace.cur.Load(); id != 0 {
		ccall(trace.api.cuptiActivityPushExternalCorrelationId, extKindTraceID, uintptr(id))
		d.pushedID = true
	}
}

// popTraceID undoes pushTraceID (leave).
func (d *Device) popTraceID() {
	if d.pushedID {
		var last uint64
		ccall(trace.api.cuptiActivityPopExternalCorrelationId, extKindTraceID, uintptr(unsafe.Pointer(&last)))
		d.pushedID = false
	}
}

// blasCall calls the cuBLAS entry point fn, tagged as cuBLAS's for the
// kernel trace: the kernels it launches, or the graph nodes it captures,
// count as cuBLAS's. The device's lock is held.
//
//go:uintptrescapes
func (d *Device) blasCall(fn uintptr, args ...uintptr) uintptr {
	if !d.tracing.Load() {
		return ccall(fn, args...)
	}
	ccall(trace.api.cuptiActivityPushExternalCorrelationId, extKindLibrary, cuptiBlasExternal)
	trace.blas.Store(true)
	r := ccall(fn, args...)
	trace.blas.Store(false)
	var last uint64
	ccall(trace.api.cuptiActivityPopExternalCorrelationId, extKindLibrary, uintptr(unsafe.Pointer(&last)))
	return r
}

// describeCUPTI is Describe's line about CUPTI.
func describeCUPTI(driverVersion int) string {
	c, err := loadCUPTI(driverVersion)
	if err != nil {
		return fmt.Sprintf("libcupti: %v\n", err)
	}
	s := fmt.Sprintf("libcupti: %s (CUPTI %s)", shownPath(c.lib), c.versionString())
	trace.mu.Lock()
	if trace.recSize > 0 {
		s += fmt.Sprintf(", kernel records of %d bytes", trace.recSize)
	}
	trace.mu.Unlock()
	return s + "\n"
}

// Interface check.
var _ profile.KernelTracer = (*Device)(nil)
