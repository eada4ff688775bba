package cuda

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// bf16Ref rounds x to bfloat16 to nearest even through big.Float.
func bf16Ref(x float32) uint16 {
	if x != x {
		return uint16(math.Float32bits(x)>>16) | 0x40
	}
	if math.IsInf(float64(x), 0) {
		return uint16(math.Float32bits(x) >> 16)
	}
	// 8 significant bits, exponent range of float32; subnormals keep fewer bits,
	// which big.Float does not model, so handle them by scaling.
	f := new(big.Float).SetPrec(8).SetMode(big.ToNearestEven)
	abs := math.Abs(float64(x))
	if abs < 0x1p-126 { // subnormal bf16: a multiple of 2^-133
		q := math.RoundToEven(abs * 0x1p133)
		v := float32(math.Copysign(q*0x1p-133, float64(x)))
		return uint16(math.Float32bits(v) >> 16)
	}
	f.SetFloat64(float64(x))
	v, _ := f.Float64()
	if math.Abs(v) >= 0x1p128 {
		return uint16(math.Float32bits(float32(math.Copysign(math.Inf(1), v))) >> 16)
	}
	return uint16(math.Float32bits(float32(v)) >> 16)
}

func TestF32ToBF16(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.00390625, 1.01171875, 3.4028235e38, -3.4028235e38,
		1e-40, -1e-40, 1e-45, float32(math.Inf(1)), float32(math.Inf(-1)), 65504, 0x1p-126, 0x1.fep-127}
	r := rand.New(rand.NewSource(2))
	for i := 0; i < 200000; i++ {
		special = append(special, math.Float32frombits(r.Uint32()))
	}
	for _, x := range special {
		if x != x {
			continue
		}
		if got, want := F32ToBF16(x), bf16Ref(x); got != want {
			t.Fatalf("F32ToBF16(%g = %#08x) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
	nan := math.Float32frombits(0x7f800001) // a signalling NaN whose payload rounding would make inf
	if b := F32ToBF16(nan); BF16ToF32(b) == BF16ToF32(b) {
		t.Errorf("NaN became %#04x", b)
	}
	if b := F32ToBF16(math.Float32frombits(0xff800001)); b&0x8000 == 0 {
		t.Error("NaN lost its sign")
	}
}

func TestConvertParallel(t *testing.T) {
	n := 3*convertGrain + 17
	src := make([]byte, n*4)
	r := rand.New(rand.NewSource(3))
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(src[i*4:], math.Float32bits(float32(r.NormFloat64())))
	}
	dst := make([]byte, n*2)
	convert(dst, kernels.BF16, src, kernels.F32)
	for i := 0; i < n; i++ {
		want := F32ToBF16(math.Float32frombits(binary.LittleEndian.Uint32(src[i*4:])))
		if got := binary.LittleEndian.Uint16(dst[i*2:]); got != want {
			t.Fatalf("element %d: %#04x, want %#04x", i, got, want)
		}
	}
	back := make([]byte, n*4)
	convert(back, kernels.F32, dst, kernels.BF16)
	for i := 0; i < n; i++ {
		if got, want := binary.LittleEndian.Uint32(back[i*4:]), uint32(binary.LittleEndian.Uint16(dst[i*2:]))<<16; got != want {
			t.Fatalf("widen %d: %#08x, want %#08x", i, got, want)
		}
	}
	// f16 → bf16 goes through f32 exactly.
	h := []byte{0x00, 0x3c, 0x01, 0x00, 0xff, 0x7b} // 1, the smallest subnormal, 65504
	o := make([]byte, 6)
	convert(o, kernels.BF16, h, kernels.F16)
	for i, want := range []float32{1, 0x1p-24, 65536} { // 65504 rounds to 65536 in bf16
		if got := BF16ToF32(binary.LittleEndian.Uint16(o[i*2:])); got != want {
			t.Errorf("f16→bf16 %d: %g, want %g", i, got, want)
		}
	}
	// bf16 → f16 rounds the bf16 value: 1, 2^-24, and 1+2^-7 exactly; 2^20 to inf.
	b := []byte{0x80, 0x3f, 0x80, 0x33, 0x81, 0x3f, 0x80, 0x49}
	o = make([]byte, 8)
	convert(o, kernels.F16, b, kernels.BF16)
	for i, want := range []float32{1, 0x1p-24, 1 + 0x1p-7, float32(math.Inf(1))} {
		if got := kernels.F16ToF32(binary.LittleEndian.Uint16(o[i*2:])); got != want {
			t.Errorf("bf16→f16 %d: %g, want %g", i, got, want)
		}
	}
}
