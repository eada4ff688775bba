package kernels

import "math"

// The IEEE half conversions of the devices' transfers (the cpu device's
// storage, the CUDA device's uploads and reads), rounding to nearest, ties
// to even, as PyTorch's .half() does.

// F16ToF32 widens IEEE half bits exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0x1f: // inf, NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case 0: // zero, subnormal: man · 2⁻²⁴
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToF16 rounds a float32 to IEEE half bits, to nearest even: overflow
// gives ±inf, magnitudes below half's normals its subnormals or ±0, NaNs
// stay NaN (quiet, sign kept).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b >> 23 & 0xff)
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 { // subnormal half: (man|1<<23) >> (14-e), rounded
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		r := m >> shift
		rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	if rem := man & 0x1fff; rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++ // a carry into the exponent is still the right answer, up to inf
	}
	return sign | uint16(r)
}
