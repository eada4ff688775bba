package cuda

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/fuselm/fuselm/kernels"
)

// TestTensorMapSlots checks that every TensorMap a launch can pass gets
// 128 bytes on a 64-byte boundary, apart from the others.
func TestTensorMapSlots(t *testing.T) {
	buf := make([]byte, maxTensorMapArgs*tensorMapBytes+tensorMapAlign)
	var prev uintptr
	for i := range maxTensorMapArgs {
		s := aligned64(buf[i*tensorMapBytes:])
		p := uintptr(unsafe.Pointer(&s[0]))
		if p%tensorMapAlign != 0 || len(s) != tensorMapBytes || i > 0 && p != prev+tensorMapBytes {
			t.Errorf("slot %d at %#x (previous %#x), %d bytes", i, p, prev, len(s))
		}
		prev = p
	}
	d := &Device{}
	if _, err := d.EncodeTiled(Tiled{Elem: 2, Dims: []uint64{64}, Box: []uint32{64, 1}}); err == nil || !strings.Contains(err.Error(), "box") {
		t.Errorf("a box of rank 2 for a tensor of rank 1: %v", err)
	}
	if _, err := d.EncodeTiled(Tiled{Elem: 3, Dims: []uint64{64}, Box: []uint32{64}}); err == nil {
		t.Errorf("3-byte elements accepted")
	}
}

// TestEncodeTiled makes the tensor maps flash_hopper makes, and one the
// driver must refuse, on a GPU with CUDA 12 or later.
func TestEncodeTiled(t *testing.T) {
	d := openDevice(t)
	if d.drv.cuTensorMapEncodeTiled == 0 {
		t.Skipf("the driver (CUDA %s) has no cuTensorMapEncodeTiled", versionString(d.drv.version))
	}
	x := d.Alloc(kernels.BF16, 4, 2, 300, 128) // a cache [B, kvh, maxSeq, D]
	defer d.Free(x)
	if _, err := d.EncodeTiled(Tiled{Addr: d.Ptr(x), Elem: 2, Dims: []uint64{128, 300, 8}, Strides: []uint64{256, 300 * 256},
		Box: []uint32{64, 128, 1}, Swizzle: 128}); err != nil {
		t.Errorf("3-D cache map: %v", err)
	}
	if _, err := d.EncodeTiled(Tiled{Addr: d.Ptr(x), Elem: 2, Dims: []uint64{1024, 300}, Strides: []uint64{2048},
		Box: []uint32{64, 128}, Swizzle: 128}); err != nil {
		t.Errorf("2-D q map: %v", err)
	}
	if _, err := d.EncodeTiled(Tiled{Addr: d.Ptr(x), Elem: 2, Dims: []uint64{128, 300}, Strides: []uint64{250},
		Box: []uint32{64, 128}, Swizzle: 128}); err == nil {
		t.Errorf("a stride of 250 bytes (not a multiple of 16) accepted")
	}
}
