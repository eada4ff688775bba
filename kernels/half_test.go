package kernels_test

import (
	"math"
	"math/big"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

func TestF16ToF32(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got := kernels.F16ToF32(uint16(h))
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		e, m := (h>>10)&0x1f, h&0x3ff
		var want float64
		switch {
		case e == 0:
			want = sign * float64(m) * 0x1p-24
		case e == 31 && m == 0:
			want = math.Inf(int(sign))
		case e == 31:
			if got == got {
				t.Fatalf("f16 %#04x: got %g, want NaN", h, got)
			}
			continue
		default:
			want = sign * (1 + float64(m)/1024) * math.Pow(2, float64(e-15))
		}
		if float64(got) != want || math.Signbit(float64(got)) != (sign < 0) {
			t.Fatalf("f16 %#04x: got %g, want %g", h, got, want)
		}
	}
}

// f16Ref rounds x to an IEEE half to nearest even through big.Float, as
// a float64 (±inf beyond half's range).
func f16Ref(x float32) float64 {
	abs := math.Abs(float64(x))
	if abs < 0x1p-14 { // subnormal half: a multiple of 2^-24
		return math.Copysign(math.RoundToEven(abs*0x1p24)*0x1p-24, float64(x))
	}
	f := new(big.Float).SetPrec(11).SetMode(big.ToNearestEven).SetFloat64(float64(x))
	v, _ := f.Float64()
	if math.Abs(v) > 65504 {
		return math.Copysign(math.Inf(1), v)
	}
	return v
}

func TestF32ToF16(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65519.99, 65520, -65520, 1e9,
		0x1p-14, 0x1p-24, 0x1p-25, 0x1.000002p-25, 0x1.8p-24, 0x1p-26, 1e-40, 1 + 0x1p-11, 1 + 0x3p-11,
		float32(math.Inf(1)), float32(math.Inf(-1))}
	r := rand.New(rand.NewSource(4))
	for i := 0; i < 200000; i++ {
		special = append(special, math.Float32frombits(r.Uint32()), float32(r.NormFloat64()*math.Pow(2, float64(r.Intn(40)-28))))
	}
	for _, x := range special {
		if x != x {
			continue
		}
		got := kernels.F16ToF32(kernels.F32ToF16(x))
		if want := f16Ref(x); float64(got) != want || math.Signbit(float64(got)) != math.Signbit(float64(x)) {
			t.Fatalf("F32ToF16(%g = %#08x) widens to %g, want %g", x, math.Float32bits(x), got, want)
		}
	}
	for _, nan := range []uint32{0x7f800001, 0xffc00000} {
		h := kernels.F32ToF16(math.Float32frombits(nan))
		if got := kernels.F16ToF32(h); got == got || (h&0x8000 != 0) != (nan>>31 != 0) {
			t.Errorf("NaN %#08x became %#04x", nan, h)
		}
	}
}
