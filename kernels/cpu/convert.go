package cpu

import "math"

// Conversions between float32 and the 16-bit float formats, all rounding to
// nearest, ties to even, as PyTorch's .to(torch.bfloat16) and .half() do.

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

// f16ToF32 widens an IEEE half exactly.
func f16ToF32(h uint16) float32 {
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

// f32ToF16 rounds a float32 to an IEEE half: overflow gives ±inf, tiny
// values become subnormal or zero.
func f32ToF16(f float32) uint16 {
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
		dst[i] = f16ToF32(h)
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
