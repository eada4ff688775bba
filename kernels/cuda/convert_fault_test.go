//go:build linux

package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// convertPanic runs convert with faults turned into panics, as the
// loader's Weights.Read does, and returns what it recovered.
func convertPanic(dst []byte, dt kernels.DType, src []byte, st kernels.DType) (r any) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() { r = recover() }()
	convert(dst, dt, src, st)
	return nil
}

// A fault in one of convert's workers, reading a mapped file cut short
// under it, reaches the caller's goroutine as a panic it can recover,
// and so does a worker's other panic, instead of ending the process.
func TestConvertWorkersPanicOnCaller(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	n := 4 * convertGrain // four workers
	path := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(path, make([]byte, 4*n), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := syscall.Mmap(int(f.Fd()), 0, 4*n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Skip("no mmap here:", err)
	}
	defer syscall.Munmap(src)
	dst := make([]byte, 2*n)
	if r := convertPanic(dst, kernels.BF16, src, kernels.F32); r != nil {
		t.Fatalf("whole file: %v", r)
	}
	if err := os.Truncate(path, int64(2*n)); err != nil { // the last two workers' halves go
		t.Fatal(err)
	}
	r := convertPanic(dst, kernels.BF16, src, kernels.F32)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(src)))
	if f, ok := r.(interface{ Addr() uintptr }); !ok || f.Addr() < base+uintptr(2*n) || f.Addr() >= base+uintptr(4*n) {
		t.Errorf("file cut short: recovered %v, want a fault past its new end", r)
	}
	r = convertPanic(dst[:n/2:n/2], kernels.BF16, src[:2*n], kernels.F32) // dst too short for the second worker
	if !strings.Contains(fmt.Sprint(r), "out of range") {
		t.Errorf("a worker's bug: recovered %v", r)
	}
}
