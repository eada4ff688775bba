package cpu

import (
	"math"

	"github.com/fuselm/fuselm/kernels"
)

// Conversions between float32 and bfloat16, rounding to nearest, ties to
// even, as PyTorch's .to(torch.bfloat16) does (f16's are kernels').

// bf16ToF32 widens a bfloat16 exactly.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f32ToBF16 rounds a float32 to bfloat16; a NaN stays a (quiet) NaN.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// decode16 widens n 16-bit floats of type bf16 (else f16) from src into dst.
func decode16(dst []float32, src []uint16, bf16 bool) {
	src = src[:len(dst)]
	if bf16 {
		for i, h := range src {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
		return
	}
	for i, h := range src {
		dst[i] = kernels.F16ToF32(h)
	}
}

// roundBF16 is f rounded to the nearest bfloat16, as a float32: what a bf16
// tensor holds after torch writes f into it.
func roundBF16(f float32) float32 { return bf16ToF32(f32ToBF16(f)) }

// roundRowBF16 rounds every element of v to bfloat16 in place.
func roundRowBF16(v []float32) {
	for i, x := range v {
		v[i] = roundBF16(x)
	}
}

// encodeBF16 rounds src to bfloat16 bits into dst (len(src) elements).
func encodeBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = f32ToBF16(x)
	}
}
