package loader

import (
	"fmt"
	"os"
	"runtime/debug"
	"unsafe"
)

// stMapping is one file of a checkpoint, mapped. The file stays open so
// that, should reading the mapping fault, the error can say what became of
// the file the mapping was made of, even if another has taken its name.
type stMapping struct {
	file string // relative to the model directory
	f    *os.File
	size int64  // the file's size when it was mapped
	data []byte // nil until mapped
}

// Read calls fn with t's data and returns fn's error. Reading a mapped
// file faults where the file has been cut short since it was opened (or
// where the disk fails): Read turns such a fault into an error that names
// the file and the tensor, instead of a crash. debug.SetPanicOnFault holds
// for one goroutine: fn reads the data on the calling goroutine, or raises
// there again the panics of the goroutines it reads with.
func (w *Weights) Read(t *TensorInfo, fn func(data []byte) error) error {
	return w.guard(fmt.Sprintf("tensor %q", t.Name), func() error { return fn(t.Data) })
}

// guard runs fn with faults turned into panics, and a panic for a fault
// inside one of w's mappings into an error about what (a tensor, the
// header); other panics go on.
func (w *Weights) guard(what string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			if m := w.mappingAt(f.Addr()); m != nil {
				err = m.faultError(what, f.Addr())
				return
			}
		}
		panic(r)
	}()
	return fn()
}

// mappingAt is the mapping that holds the address addr, or nil.
func (w *Weights) mappingAt(addr uintptr) *stMapping {
	for _, m := range w.maps {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
		if m.data != nil && base <= addr && addr-base < uintptr(len(m.data)) {
			return m
		}
	}
	return nil
}

// faultError says why reading what at addr faulted: the file is shorter
// than when it was mapped, or else reading it failed.
func (m *stMapping) faultError(what string, addr uintptr) error {
	if fi, err := m.f.Stat(); err == nil && fi.Size() < m.size {
		return fmt.Errorf("loader: %s: %s: the file was cut short while it was being read (%d bytes when opened, %d now)", m.file, what, m.size, fi.Size())
	}
	off := addr - uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
	return fmt.Errorf("loader: %s: %s: reading byte %d of the file failed (an I/O error?)", m.file, what, off)
}
