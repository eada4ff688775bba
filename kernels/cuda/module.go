package cuda

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels"
)

// Module is compiled CUDA code loaded on a device.
type Module struct {
	d     *Device
	h     uintptr // CUmodule
	name  string
	key   string
	image []byte
	funcs map[string]*Func
}

// Func is a kernel of a Module.
type Func struct {
	d    *Device
	m    *Module
	h    uintptr // CUfunction
	name string
}

// ModuleStats counts how Module calls were served.
type ModuleStats struct {
	Compiled    int           // NVRTC compiles
	DiskHits    int           // modules loaded from the disk cache
	MemHits     int           // modules already loaded on the device
	CompileTime time.Duration // spent in NVRTC
	CacheErrors int           // disk cache files that could not be written or loaded
}

// maxModuleBytes bounds a module read from the kernel cache: a cubin or PTX
// of a few MB; a FIFO or a device in its place is refused (infile).
const maxModuleBytes = 256 << 20

// ModuleStats reports how Module calls were served so far.
func (d *Device) ModuleStats() ModuleStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.modStats
}

// CacheDir is where compiled kernels are cached ("" when the cache is off).
func (d *Device) CacheDir() string { return d.cacheDir }

// CompileOptions are the NVRTC options every Module gets before its own:
// the architecture, -std=c++17, -default-device and the include path of the
// CUDA headers (cuda_bf16.h, cuda_fp16.h) when one was found.
func (d *Device) CompileOptions() []string { return append([]string(nil), d.ccOpts...) }

// Module compiles CUDA C++ source src named name, with NVRTC options opts
// after CompileOptions, for the device's exact architecture; or loads it
// from the disk cache (see cacheDirFrom) or from the modules already loaded
// by the same call. A compile error carries NVRTC's log.
func (d *Device) Module(name, src string, opts ...string) (*Module, error) {
	return d.ProgramModule(Program{Name: name, Src: src}, opts...)
}

// ProgramModule is Module for a program with headers: the module named
// p.Name, compiled from p's source and the headers it includes.
func (d *Device) ProgramModule(p Program, opts ...string) (*Module, error) {
	name := p.Name
	all := append(d.CompileOptions(), opts...)
	key := cacheKey(p, append(slices.Clone(d.ccKey), opts...), d.props.Arch, d.nvrtc.version())
	d.enter()
	defer d.leave()
	if d.closed {
		return nil, errClosed
	}
	if m := d.modules[key]; m != nil {
		d.modStats.MemHits++
		return m, nil
	}
	var path string
	if d.cacheDir != "" {
		path = cachePath(d.cacheDir, key, d.cubin)
		if img, err := infile.Read(path, maxModuleBytes); err == nil && len(img) > 0 {
			if !d.cubin {
				img = append(img, 0) // PTX is loaded as a C string
			}
			m, err := d.load(name, key, img)
			if err == nil {
				d.modStats.DiskHits++
				return m, nil
			}
			d.modStats.CacheErrors++ // a stale or damaged file: compile again and replace it
		}
	}
	start := time.Now()
	img, err := d.nvrtc.compile(p, all, d.cubin)
	d.modStats.CompileTime += time.Since(start)
	if err != nil {
		return nil, err
	}
	d.modStats.Compiled++
	if path != "" {
		if err := writeFileAtomic(path, img); err != nil {
			d.modStats.CacheErrors++
		}
	}
	if !d.cubin {
		img = append(img, 0)
	}
	return d.load(name, key, img)
}

// CompileLog compiles p as ProgramModule would (CompileOptions, then opts) but
// neither caches nor loads the result: it returns NVRTC's log whether the
// compile succeeds or not (with opts "--ptxas-options=-v", ptxas's
// registers, spills and warnings per kernel) and the image (a cubin, or PTX
// where the device gets PTX), for a disassembler.
func (d *Device) CompileLog(p Program, opts ...string) (log string, img []byte, err error) {
	all := append(d.CompileOptions(), opts...)
	d.enter()
	defer d.leave()
	if d.closed {
		return "", nil, errClosed
	}
	img, log, err = d.nvrtc.compileLog(p, all, d.cubin)
	return log, img, err
}

// load loads a module image on the device; the lock is held.
func (d *Device) load(name, key string, img []byte) (*Module, error) {
	var h uintptr
	err := d.drv.check(ccall(d.drv.cuModuleLoadData, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0]))), fmt.Sprintf("cuModuleLoadData(%s, %s)", name, d.props.Arch))
	runtime.KeepAlive(img)
	if err != nil {
		return nil, err
	}
	m := &Module{d: d, h: h, name: name, key: key, image: img, funcs: map[string]*Func{}}
	d.modules[key] = m
	return m, nil
}

// Func finds the kernel name (declared extern "C" __global__) in m.
func (m *Module) Func(name string) (*Func, error) {
	d := m.d
	d.enter()
	defer d.leave()
	if d.closed {
		return nil, errClosed
	}
	if f := m.funcs[name]; f != nil {
		return f, nil
	}
	var h uintptr
	cname := cStr(name)
	if err := d.drv.check(ccall(d.drv.cuModuleGetFunction, uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(&cname[0]))), fmt.Sprintf("cuModuleGetFunction(%s, %q)", m.name, name)); err != nil {
		return nil, err
	}
	f := &Func{d: d, m: m, h: h, name: name}
	if d.carveout >= 0 {
		if err := d.drv.check(ccall(d.drv.cuFuncSetAttribute, h, cuFuncAttrPreferredSharedCarveout, uintptr(d.carveout)),
			fmt.Sprintf("cuFuncSetAttribute(%s, PREFERRED_SHARED_MEMORY_CARVEOUT, %d)", name, d.carveout)); err != nil {
			return nil, err
		}
	}
	m.funcs[name] = f
	d.own[name] = true
	return f, nil
}

// Global is the device address and size in bytes of the module's
// __device__ variable name, one at global namespace scope (whose name C++
// does not mangle), for instance to read it back with Memcpy into a tensor.
func (m *Module) Global(name string) (ptr uintptr, bytes int, err error) {
	d := m.d
	d.enter()
	defer d.leave()
	if d.closed {
		return 0, 0, errClosed
	}
	var p, n uintptr
	cname := cStr(name)
	if err := d.drv.check(ccall(d.drv.cuModuleGetGlobal, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)), m.h, uintptr(unsafe.Pointer(&cname[0]))),
		fmt.Sprintf("cuModuleGetGlobal(%s, %q)", m.name, name)); err != nil {
		return 0, 0, err
	}
	return p, int(n), nil
}

// Name is the kernel's name.
func (f *Func) Name() string { return f.name }

// Module is the module f was found in.
func (f *Func) Module() *Module { return f.m }

// SetMaxDynamicShared lets launches of f use up to bytes of dynamic shared
// memory (above 48 KiB needs this; the limit is Props.MaxSharedOptin less
// the kernel's static shared memory).
func (f *Func) SetMaxDynamicShared(bytes int) error {
	d := f.d
	d.enter()
	defer d.leave()
	if d.closed {
		return errClosed
	}
	return d.drv.check(ccall(d.drv.cuFuncSetAttribute, f.h, cuFuncAttrMaxDynamicSharedSizeBytes, uintptr(bytes)),
		fmt.Sprintf("cuFuncSetAttribute(%s, MAX_DYNAMIC_SHARED_SIZE_BYTES, %d)", f.name, bytes))
}

// FuncAttrs are what the compiler made of a kernel.
type FuncAttrs struct {
	MaxThreadsPerBlock int // the most threads a block of it can have
	Regs               int // registers per thread
	StaticShared       int // bytes of static shared memory
	LocalBytes         int // bytes of local memory per thread (spills, indexed arrays)
}

// Attrs reads f's attributes from the driver.
func (f *Func) Attrs() (FuncAttrs, error) {
	d := f.d
	d.enter()
	defer d.leave()
	var a FuncAttrs
	if d.closed {
		return a, errClosed
	}
	for _, x := range []struct {
		dst  *int
		attr int
	}{
		{&a.MaxThreadsPerBlock, cuFuncAttrMaxThreadsPerBlock},
		{&a.Regs, cuFuncAttrNumRegs},
		{&a.StaticShared, cuFuncAttrSharedSizeBytes},
		{&a.LocalBytes, cuFuncAttrLocalSizeBytes},
	} {
		var v int32
		if err := d.drv.check(ccall(d.drv.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(x.attr), f.h), fmt.Sprintf("cuFuncGetAttribute(%s, %d)", f.name, x.attr)); err != nil {
			return a, err
		}
		*x.dst = int(v)
	}
	return a, nil
}

// argBits is a kernel argument's value as the low bytes of a 64-bit slot:
// uintptr, int64, uint64, float64 and *kernels.Tensor (its device address)
// take 8 bytes; int32, uint32, float32 and int (as a C int, which it must
// fit) 4; bool 1.
func (d *Device) argBits(a any) (uint64, bool) {
	switch v := a.(type) {
	case uintptr:
		return uint64(v), true
	case int32:
		return uint64(uint32(v)), true
	case uint32:
		return uint64(v), true
	case int64:
		return uint64(v), true
	case uint64:
		return v, true
	case float32:
		return uint64(math.Float32bits(v)), true
	case float64:
		return math.Float64bits(v), true
	case int:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return 0, false
		}
		return uint64(uint32(int32(v))), true
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case *kernels.Tensor:
		return uint64(d.Ptr(v)), true
	}
	return 0, false
}

func dim(v uint32) uintptr { return uintptr(max(v, 1)) }

// LaunchOverlapped is Launch for a kernel that may start while the kernel
// before it on the stream is still running (programmatic dependent
// launch): its blocks begin once every block of that kernel has run
// griddepcontrol.launch_dependents or exited, and it must run
// griddepcontrol.wait before it reads anything the kernels before it write,
// or writes anything they read (common.cuh's grid_wait and grid_release).
// What it runs before grid_wait (address arithmetic, loads of weights no
// kernel writes) overlaps the previous kernel's tail. Where the device
// cannot (below compute capability 9.0 or CUDA 12), or FUSELM_PDL=off
// asked it not to (to measure what the overlap buys), it is Launch, and
// the griddepcontrol instructions return at once. Stream capture keeps the
// overlap as a programmatic edge of the graph.
func (d *Device) LaunchOverlapped(f *Func, grid, block Dim3, sharedBytes int, args ...any) {
	d.launch(f, d.pdl, grid, block, sharedBytes, args...)
}

// Launch queues f on the device stream with a grid of blocks, sharedBytes
// of dynamic shared memory and args, each passed by address as the
// kernel's parameters: uintptr (device pointers), int32, uint32, int64,
// float32 (also uint64, float64, bool, int as a C int, and *kernels.Tensor
// as its device address), and *TensorMap, whose 128 bytes the driver copies
// into a `const __grid_constant__` struct parameter. Errors are recorded
// with Fail.
func (d *Device) Launch(f *Func, grid, block Dim3, sharedBytes int, args ...any) {
	d.launch(f, false, grid, block, sharedBytes, args...)
}

func (d *Device) launch(f *Func, overlap bool, grid, block Dim3, sharedBytes int, args ...any) {
	if len(args) > maxKernelArgs {
		panic(fmt.Sprintf("cuda: Launch(%s) with %d arguments (at most %d)", f.name, len(args), maxKernelArgs))
	}
	if f.d != d {
		panic(fmt.Sprintf("cuda: Launch(%s) of a kernel loaded on another device", f.name))
	}
	d.enter()
	defer d.leave()
	if !d.usable() {
		return
	}
	maps := 0
	for i, a := range args {
		if m, ok := a.(*TensorMap); ok {
			if maps == maxTensorMapArgs {
				panic(fmt.Sprintf("cuda: Launch(%s) with more than %d tensor maps", f.name, maxTensorMapArgs))
			}
			slot := aligned64(d.mapArgs[maps*tensorMapBytes:])
			copy(slot, m.b[:])
			d.argPtrs[i] = uintptr(unsafe.Pointer(&slot[0]))
			maps++
			continue
		}
		v, ok := d.argBits(a)
		if !ok {
			panic(fmt.Sprintf("cuda: Launch(%s): argument %d is %T %v, which no kernel parameter takes", f.name, i, a, a))
		}
		d.argVals[i] = v
	}
	var r uintptr
	call := "cuLaunchKernel"
	if overlap {
		call = "cuLaunchKernelEx"
		c := &d.launchCfg
		c.gridX, c.gridY, c.gridZ = uint32(dim(grid.X)), uint32(dim(grid.Y)), uint32(dim(grid.Z))
		c.blockX, c.blockY, c.blockZ = uint32(dim(block.X)), uint32(dim(block.Y)), uint32(dim(block.Z))
		c.shared, c.stream = uint32(sharedBytes), d.stream
		c.attrs, c.numAttrs = uintptr(unsafe.Pointer(&d.launchAttr)), 1
		r = ccall(d.drv.cuLaunchKernelEx, uintptr(unsafe.Pointer(c)), f.h, uintptr(unsafe.Pointer(&d.argPtrs[0])), 0)
	} else {
		r = ccall(d.drv.cuLaunchKernel, f.h,
			dim(grid.X), dim(grid.Y), dim(grid.Z), dim(block.X), dim(block.Y), dim(block.Z),
			uintptr(sharedBytes), d.stream, uintptr(unsafe.Pointer(&d.argPtrs[0])), 0)
	}
	if maps > 0 { // the driver has copied the maps: the slots point at the scalar values again
		for i := range args {
			d.argPtrs[i] = uintptr(unsafe.Pointer(&d.argVals[i]))
		}
	}
	if uint32(r) != 0 {
		d.failLocked(d.drv.errorOf(uint32(r), fmt.Sprintf("%s(%s, grid %dx%dx%d, block %dx%dx%d, shared %d)",
			call, f.name, dim(grid.X), dim(grid.Y), dim(grid.Z), dim(block.X), dim(block.Y), dim(block.Z), sharedBytes)))
	}
}

// MaxActiveClusters is how many clusters of f (a kernel whose cluster
// shape is compiled in, __cluster_dims__) can run on the device at once
// with blocks of block threads and sharedBytes of dynamic shared memory,
// as the driver counts them (cuOccupancyMaxActiveClusters) for a grid of
// grid blocks (a multiple of the cluster shape); an error where the driver
// cannot say (before CUDA 12) or f has no clusters.
func (f *Func) MaxActiveClusters(grid, block Dim3, sharedBytes int) (int, error) {
	d := f.d
	d.enter()
	defer d.leave()
	if d.closed {
		return 0, errClosed
	}
	if d.drv.cuOccupancyMaxActiveClusters == 0 {
		return 0, fmt.Errorf("cuda: %s: the driver has no cuOccupancyMaxActiveClusters (CUDA 12 or later)", f.name)
	}
	var c launchConfig
	c.gridX, c.gridY, c.gridZ = uint32(dim(grid.X)), uint32(dim(grid.Y)), uint32(dim(grid.Z))
	c.blockX, c.blockY, c.blockZ = uint32(dim(block.X)), uint32(dim(block.Y)), uint32(dim(block.Z))
	c.shared, c.stream = uint32(sharedBytes), d.stream
	var n int32
	r := ccall(d.drv.cuOccupancyMaxActiveClusters, uintptr(unsafe.Pointer(&n)), f.h, uintptr(unsafe.Pointer(&c)))
	if err := d.drv.check(r, fmt.Sprintf("cuOccupancyMaxActiveClusters(%s, block %d, shared %d)", f.name, dim(block.X), sharedBytes)); err != nil {
		return 0, err
	}
	return int(n), nil
}
