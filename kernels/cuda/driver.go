package cuda

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// Error is a failed call into the CUDA driver, NVRTC or cuBLAS.
type Error struct {
	Call string // the function and what it was asked, e.g. "cuMemAlloc_v2(1073741824 bytes)"
	Code int    // the API's status code
	Name string // the status's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Msg  string // the API's description of it, e.g. "out of memory"
	Log  string // NVRTC's compile log, when there is one
}

func (e *Error) Error() string {
	s := "cuda: " + e.Call + ": " + e.Name
	if e.Msg != "" && e.Msg != e.Name {
		s += ": " + e.Msg
	}
	if log := strings.TrimRight(e.Log, "\x00\n "); log != "" {
		s += "\n" + log
	}
	return s
}

// IsOutOfMemory reports whether err is, or wraps, a device allocation that
// failed for lack of memory.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Name == "CUDA_ERROR_OUT_OF_MEMORY" || e.Name == "CUBLAS_STATUS_ALLOC_FAILED")
}

// Driver API constants (cuda.h).
const (
	cuDevAttrMaxThreadsPerBlock     = 1
	cuDevAttrMaxSharedPerBlock      = 8
	cuDevAttrWarpSize               = 10
	cuDevAttrMultiprocessorCount    = 16
	cuDevAttrL2CacheSize            = 38
	cuDevAttrComputeCapMajor        = 75
	cuDevAttrComputeCapMinor        = 76
	cuDevAttrMaxSharedPerSM         = 81
	cuDevAttrMaxSharedPerBlockOptin = 97

	cuFuncAttrMaxThreadsPerBlock        = 0
	cuFuncAttrSharedSizeBytes           = 1
	cuFuncAttrLocalSizeBytes            = 3
	cuFuncAttrNumRegs                   = 4
	cuFuncAttrMaxDynamicSharedSizeBytes = 8
	cuFuncAttrPreferredSharedCarveout   = 9

	cuStreamNonBlocking     = 1
	cuEventDefault          = 0
	cuEventDisableTiming    = 2
	cuStreamCaptureRelaxed  = 2
	cudaErrorOutOfMemory    = 2
	cudaErrorNotReady       = 600
	cudaErrorNoDevice       = 100
	cudaErrorStubLibrary    = 34
	cudaErrorNotInitialized = 3
)

// driverAPI is libcuda's entry points.
type driverAPI struct {
	lib     *library
	version int // cuDriverGetVersion: 1000*major + 10*minor

	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString       uintptr
	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceTotalMem   uintptr
	cuDeviceGetAttribute, cuDevicePrimaryCtxRetain                     uintptr
	cuDevicePrimaryCtxRelease, cuCtxSetCurrent, cuMemGetInfo           uintptr
	cuMemAlloc, cuMemFree, cuMemAllocHost, cuMemFreeHost               uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync            uintptr
	cuMemsetD8Async, cuMemsetD32Async                                  uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize               uintptr
	cuStreamQuery                                                      uintptr // 0 where not found: Sync waits unbounded
	cuStreamWaitEvent                                                  uintptr // 0 where not found: Aside queues in order
	cuEventCreate, cuEventRecord, cuEventSynchronize, cuEventDestroy   uintptr
	cuEventElapsedTime                                                 uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction              uintptr
	cuModuleGetGlobal                                                  uintptr
	cuFuncSetAttribute, cuFuncGetAttribute, cuLaunchKernel             uintptr
	cuLaunchKernelEx                                                   uintptr // 0 before CUDA 12
	cuOccupancyMaxActiveClusters                                       uintptr // 0 before CUDA 12
	cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiate       uintptr
	cuGraphUpload, cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy   uintptr
	cuTensorMapEncodeTiled                                             uintptr // 0 before CUDA 12
	elapsedName, beginCaptureName, instantiateName, primaryReleaseName string
}

var (
	drvOnce sync.Once
	drv     *driverAPI
	drvErr  error
)

// loadDriver opens libcuda.so.1, resolves the entry points and calls cuInit,
// once per process.
func loadDriver() (*driverAPI, error) {
	drvOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				drv, drvErr = nil, fmt.Errorf("cuda: loading the driver: %v", r)
			}
		}()
		lib, err := osFinder().find("libcuda", []string{"libcuda.so.1"}, nil)
		if err != nil {
			drvErr = err
			return
		}
		d := &driverAPI{lib: lib}
		err = lib.resolve([]symbol{
			sym(&d.cuInit, "cuInit"),
			sym(&d.cuDriverGetVersion, "cuDriverGetVersion"),
			sym(&d.cuGetErrorName, "cuGetErrorName"),
			sym(&d.cuGetErrorString, "cuGetErrorString"),
			sym(&d.cuDeviceGetCount, "cuDeviceGetCount"),
			sym(&d.cuDeviceGet, "cuDeviceGet"),
			sym(&d.cuDeviceGetName, "cuDeviceGetName"),
			sym(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
			sym(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
			sym(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
			{ptr: &d.cuDevicePrimaryCtxRelease, names: []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, used: &d.primaryReleaseName},
			sym(&d.cuCtxSetCurrent, "cuCtxSetCurrent"),
			sym(&d.cuMemGetInfo, "cuMemGetInfo_v2"),
			sym(&d.cuMemAlloc, "cuMemAlloc_v2"),
			sym(&d.cuMemFree, "cuMemFree_v2"),
			sym(&d.cuMemAllocHost, "cuMemAllocHost_v2"),
			sym(&d.cuMemFreeHost, "cuMemFreeHost"),
			sym(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
			sym(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
			sym(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
			sym(&d.cuMemsetD8Async, "cuMemsetD8Async"),
			sym(&d.cuMemsetD32Async, "cuMemsetD32Async"),
			sym(&d.cuStreamCreate, "cuStreamCreate"),
			sym(&d.cuStreamDestroy, "cuStreamDestroy_v2"),
			sym(&d.cuStreamSynchronize, "cuStreamSynchronize"),
			optSym(&d.cuStreamQuery, "cuStreamQuery"),
			optSym(&d.cuStreamWaitEvent, "cuStreamWaitEvent"),
			sym(&d.cuEventCreate, "cuEventCreate"),
			sym(&d.cuEventRecord, "cuEventRecord"),
			sym(&d.cuEventSynchronize, "cuEventSynchronize"),
			sym(&d.cuEventDestroy, "cuEventDestroy_v2"),
			{ptr: &d.cuEventElapsedTime, names: []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}, used: &d.elapsedName},
			sym(&d.cuModuleLoadData, "cuModuleLoadData"),
			sym(&d.cuModuleUnload, "cuModuleUnload"),
			sym(&d.cuModuleGetFunction, "cuModuleGetFunction"),
			sym(&d.cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
			sym(&d.cuFuncSetAttribute, "cuFuncSetAttribute"),
			sym(&d.cuFuncGetAttribute, "cuFuncGetAttribute"),
			sym(&d.cuLaunchKernel, "cuLaunchKernel"),
			optSym(&d.cuLaunchKernelEx, "cuLaunchKernelEx"),
			optSym(&d.cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters"),
			{ptr: &d.cuStreamBeginCapture, names: []string{"cuStreamBeginCapture_v2", "cuStreamBeginCapture"}, used: &d.beginCaptureName},
			sym(&d.cuStreamEndCapture, "cuStreamEndCapture"),
			{ptr: &d.cuGraphInstantiate, names: []string{"cuGraphInstantiateWithFlags"}, used: &d.instantiateName},
			optSym(&d.cuGraphUpload, "cuGraphUpload"),
			sym(&d.cuGraphLaunch, "cuGraphLaunch"),
			sym(&d.cuGraphExecDestroy, "cuGraphExecDestroy"),
			sym(&d.cuGraphDestroy, "cuGraphDestroy"),
			optSym(&d.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
		})
		if err != nil {
			drvErr = err
			return
		}
		var v int32
		if err := d.check(ccall(d.cuDriverGetVersion, uintptr(unsafe.Pointer(&v))), "cuDriverGetVersion"); err != nil {
			drvErr = err
			return
		}
		d.version = int(v)
		if err := d.check(ccall(d.cuInit, 0), "cuInit(0)"); err != nil {
			drvErr = initError(lib, err)
			return
		}
		drv = d
	})
	return drv, drvErr
}

// initError says first what a failed cuInit means for someone who wants
// to run on a GPU: none there, or a stub where the driver should be.
func initError(lib *library, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	path := lib.path
	if !filepath.IsAbs(path) {
		path = loadedPath(path)
	}
	switch e.Code {
	case cudaErrorNoDevice:
		return fmt.Errorf("cuda: no CUDA GPU: the driver %s sees none (cuInit: %s)", path, e.Name)
	case cudaErrorStubLibrary:
		return fmt.Errorf("cuda: no CUDA driver: %s is the CUDA toolkit's stub, not a driver (cuInit: %s)", path, e.Name)
	}
	return err
}

// check turns a CUresult into nil or an *Error about call.
func (d *driverAPI) check(r uintptr, call string) error {
	code := uint32(r)
	if code == 0 {
		return nil
	}
	return d.errorOf(code, call)
}

func (d *driverAPI) errorOf(code uint32, call string) *Error {
	e := &Error{Call: call, Code: int(code), Name: fmt.Sprintf("CUDA_ERROR_%d", code)}
	var p uintptr
	if uint32(ccall(d.cuGetErrorName, uintptr(code), uintptr(unsafe.Pointer(&p)))) == 0 && p != 0 {
		e.Name = cString(p)
	}
	p = 0
	if uint32(ccall(d.cuGetErrorString, uintptr(code), uintptr(unsafe.Pointer(&p)))) == 0 && p != 0 {
		e.Msg = cString(p)
	}
	return e
}

// deviceCount is the number of CUDA devices the driver sees.
func (d *driverAPI) deviceCount() (int, error) {
	var n int32
	if err := d.check(ccall(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))), "cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return int(n), nil
}

func (d *driverAPI) attr(dev int32, a int) (int, error) {
	var v int32
	err := d.check(ccall(d.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev)),
		fmt.Sprintf("cuDeviceGetAttribute(%d, device %d)", a, dev))
	return int(v), err
}

// deviceProps reads what Props holds about a device from the driver.
func (d *driverAPI) deviceProps(ordinal int) (int32, Props, error) {
	var p Props
	var dev int32
	if err := d.check(ccall(d.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal)), fmt.Sprintf("cuDeviceGet(%d)", ordinal)); err != nil {
		return 0, p, err
	}
	var name [256]byte
	if err := d.check(ccall(d.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev)), "cuDeviceGetName"); err != nil {
		return 0, p, err
	}
	n := 0
	for n < len(name) && name[n] != 0 {
		n++
	}
	p.Name = string(name[:n])
	var total uint64
	if err := d.check(ccall(d.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(dev)), "cuDeviceTotalMem_v2"); err != nil {
		return 0, p, err
	}
	p.TotalMem = int64(total)
	for _, a := range []struct {
		dst  *int
		attr int
	}{
		{&p.CCMajor, cuDevAttrComputeCapMajor},
		{&p.CCMinor, cuDevAttrComputeCapMinor},
		{&p.SMs, cuDevAttrMultiprocessorCount},
		{&p.MaxSharedPerBlock, cuDevAttrMaxSharedPerBlock},
		{&p.MaxSharedOptin, cuDevAttrMaxSharedPerBlockOptin},
		{&p.MaxSharedPerSM, cuDevAttrMaxSharedPerSM},
		{&p.L2Bytes, cuDevAttrL2CacheSize},
		{&p.MaxThreadsPerBlock, cuDevAttrMaxThreadsPerBlock},
		{&p.WarpSize, cuDevAttrWarpSize},
	} {
		v, err := d.attr(dev, a.attr)
		if err != nil {
			return 0, p, err
		}
		*a.dst = v
	}
	p.DriverVersion = d.version
	return dev, p, nil
}

// versionString formats a CUDA version number (1000*major + 10*minor).
func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }
