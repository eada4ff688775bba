package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// TensorMap is a CUtensorMap: the 128-byte descriptor of a tensor in device
// memory that the copy engine (TMA, cp.async.bulk.tensor) reads tiles of,
// made on the host by the driver's cuTensorMapEncodeTiled. A kernel takes it
// by value as a `const __grid_constant__` parameter of a 64-byte-aligned
// 128-byte struct; Launch passes a *TensorMap argument that way.
type TensorMap struct{ b [tensorMapBytes]byte }

const (
	tensorMapBytes = 128
	tensorMapAlign = 64
	// maxTensorMapArgs is the most TensorMap arguments one Launch passes.
	maxTensorMapArgs = 4
)

// Tiled describes a tensor of rank 1 to 5 for TMA copies of Box-shaped
// tiles: dimension 0 is the contiguous one. Elements outside Dims read as
// zeros.
type Tiled struct {
	Addr    uintptr  // device address of element 0, 16-byte aligned
	Elem    int      // bytes of one element: 1, 2, 4 or 8 (copied as unsigned integers)
	Dims    []uint64 // elements along each dimension
	Strides []uint64 // bytes between consecutive indices of dimensions 1.., multiples of 16
	Box     []uint32 // elements of a tile along each dimension, at most 256 each
	Swizzle int      // the shared-memory swizzle span in bytes: 0, 32, 64 or 128 (Box[0]·Elem at most that)
}

// CUtensorMap enums (cuda.h). Elements are moved as unsigned integers of
// their size: a copy does not convert, and out-of-bounds elements are zero
// bits whatever the type.
var tensorMapElem = map[int]uintptr{1: 0, 2: 1, 4: 2, 8: 4} // CU_TENSOR_MAP_DATA_TYPE_UINT8, UINT16, UINT32, UINT64

var tensorMapSwizzle = map[int]uintptr{0: 0, 32: 1, 64: 2, 128: 3} // CU_TENSOR_MAP_SWIZZLE_NONE, 32B, 64B, 128B

const (
	tensorMapInterleaveNone = 0 // CU_TENSOR_MAP_INTERLEAVE_NONE
	tensorMapL2Promote128   = 2 // CU_TENSOR_MAP_L2_PROMOTION_L2_128B
	tensorMapOOBZero        = 0 // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros
)

// aligned64 is the 128 bytes of buf (at least 192 long) that start on a
// 64-byte boundary, as CUtensorMap must.
func aligned64(buf []byte) []byte {
	off := (tensorMapAlign - int(uintptr(unsafe.Pointer(&buf[0]))%tensorMapAlign)) % tensorMapAlign
	return buf[off : off+tensorMapBytes]
}

// EncodeTiled makes the tensor map of t with cuTensorMapEncodeTiled; the
// driver's error names what it refused.
func (d *Device) EncodeTiled(t Tiled) (*TensorMap, error) {
	rank := len(t.Dims)
	if rank < 1 || rank > 5 || len(t.Box) != rank || len(t.Strides) != rank-1 {
		return nil, fmt.Errorf("cuda: EncodeTiled: %d dims, %d strides, %d box sizes (want 1 to 5 dims, one stride fewer, a box size each)",
			rank, len(t.Strides), len(t.Box))
	}
	dt, ok := tensorMapElem[t.Elem]
	sw, ok2 := tensorMapSwizzle[t.Swizzle]
	if !ok || !ok2 {
		return nil, fmt.Errorf("cuda: EncodeTiled: elements of %d bytes, swizzle %d: not a CUtensorMap type", t.Elem, t.Swizzle)
	}
	if d.drv.cuTensorMapEncodeTiled == 0 {
		return nil, fmt.Errorf("cuda: the driver (CUDA %s) has no cuTensorMapEncodeTiled (CUDA 12.0 or later has)", versionString(d.drv.version))
	}
	ones := make([]uint32, rank)
	for i := range ones {
		ones[i] = 1
	}
	strides := append(append([]uint64(nil), t.Strides...), 0) // never empty
	buf := make([]byte, tensorMapBytes+tensorMapAlign)
	m := aligned64(buf)
	d.enter()
	defer d.leave()
	if d.closed {
		return nil, errClosed
	}
	r := ccall(d.drv.cuTensorMapEncodeTiled, uintptr(unsafe.Pointer(&m[0])), dt, uintptr(rank), t.Addr,
		uintptr(unsafe.Pointer(&t.Dims[0])), uintptr(unsafe.Pointer(&strides[0])), uintptr(unsafe.Pointer(&t.Box[0])),
		uintptr(unsafe.Pointer(&ones[0])), tensorMapInterleaveNone, sw, tensorMapL2Promote128, tensorMapOOBZero)
	runtime.KeepAlive(t.Dims)
	runtime.KeepAlive(strides)
	runtime.KeepAlive(t.Box)
	runtime.KeepAlive(ones)
	if uint32(r) != 0 { // the message is made only for an error: maps are encoded on every eager call
		return nil, d.drv.check(r, fmt.Sprintf("cuTensorMapEncodeTiled(%#x, %d-byte elements, dims %v, strides %v, box %v, swizzle %d)",
			t.Addr, t.Elem, t.Dims, t.Strides, t.Box, t.Swizzle))
	}
	tm := &TensorMap{}
	copy(tm.b[:], m)
	return tm, nil
}
