package kernels

import "fmt"

// DType is the element type of a tensor.
type DType uint8

// The element types fuselm moves around.
const (
	F32 DType = iota
	BF16
	F16
	I32
)

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	default:
		return 2
	}
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}
