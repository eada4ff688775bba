package cpu_test

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/profile"
)

// roundTo64 rounds x to a float with mant explicit mantissa bits and
// exponents down to minExp (below which it is subnormal), ties to even: an
// independent model of bf16 (7, -126) and f16 (10, -14) narrowing, without
// overflow.
func roundTo64(x float64, mant, minExp int) float64 {
	if x == 0 {
		return x
	}
	e := max(int(math.Floor(math.Log2(math.Abs(x)))), minExp)
	ulp := math.Ldexp(1, e-mant)
	return math.RoundToEven(x/ulp) * ulp
}

func TestUploadRounding(t *testing.T) {
	f := newFixture(t, 1)
	vals := []float32{1, 1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/256 + 1.0/(1<<20), -2.5, 3e38, 1e-40, -1e-45,
		float32(math.Inf(1)), float32(math.Inf(-1)), 65504, 65519, 65520, 1 + 1.0/2048, 1 + 3.0/2048,
		1.0 / (1 << 24), 1.0 / (1 << 25), 1.5 / (1 << 25), 1.0 / (1 << 14), 3.0 / (1 << 26)}
	wantBF := []float64{1, 1, 1 + 1.0/64, 1 + 1.0/128, -2.5, roundTo64(3e38, 7, -126), roundTo64(float64(float32(1e-40)), 7, -126), negZero,
		math.Inf(1), math.Inf(-1), 65536, 65536, 65536, 1, 1,
		1.0 / (1 << 24), 1.0 / (1 << 25), 1.5 / (1 << 25), 1.0 / (1 << 14), 3.0 / (1 << 26)}
	wantH := []float64{1, 1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/256, -2.5, math.Inf(1), 0, negZero,
		math.Inf(1), math.Inf(-1), 65504, 65504, math.Inf(1), 1, 1 + 1.0/512,
		1.0 / (1 << 24), 0, 1.0 / (1 << 24), 1.0 / (1 << 14), 1.0 / (1 << 24)}
	for _, c := range []struct {
		dt   kernels.DType
		want []float64
	}{{kernels.BF16, wantBF}, {kernels.F16, wantH}} {
		got := f.read(f.tensor(c.dt, vals, len(vals)))
		for i := range vals {
			if got[i] != c.want[i] || math.Signbit(got[i]) != math.Signbit(c.want[i]) {
				t.Errorf("%s(%g) = %g, want %g", c.dt, vals[i], got[i], c.want[i])
			}
		}
	}
	nans := f.read(f.tensor(kernels.BF16, []float32{nan32, math.Float32frombits(0x7f800001)}, 2))
	nansH := f.read(f.tensor(kernels.F16, []float32{nan32, math.Float32frombits(0x7f800001)}, 2))
	for i := range 2 {
		if !math.IsNaN(nans[i]) || !math.IsNaN(nansH[i]) {
			t.Errorf("NaN %d became %g (bf16), %g (f16)", i, nans[i], nansH[i])
		}
	}
}

// TestUploadRandom holds narrowing of random floats over the whole range of
// each format against roundTo64.
func TestUploadRandom(t *testing.T) {
	f := newFixture(t, 2)
	vals := make([]float32, 20000)
	for i := range vals {
		vals[i] = float32(math.Ldexp(1+f.rng.Float64(), f.rng.Intn(46)-30))
		if i%2 == 1 {
			vals[i] = -vals[i]
		}
	}
	for _, c := range []struct {
		dt           kernels.DType
		mant, minExp int
		largest      float64
	}{{kernels.BF16, 7, -126, 3.4e38}, {kernels.F16, 10, -14, 65504}} {
		got := f.read(f.tensor(c.dt, vals, len(vals)))
		for i, x := range vals {
			want := roundTo64(float64(x), c.mant, c.minExp)
			if math.Abs(want) > c.largest {
				want = math.Inf(int(math.Copysign(1, want)))
			}
			if got[i] != want {
				t.Fatalf("%s(%g) = %g, want %g", c.dt, x, got[i], want)
			}
		}
	}
}

// TestWidenNarrow widens every 16-bit pattern and narrows it back.
func TestWidenNarrow(t *testing.T) {
	f := newFixture(t, 3)
	raw := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(raw[2*i:], uint16(i))
	}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		wide := f.dev.Alloc(kernels.F32, 1<<16)
		if err := f.dev.Upload(wide, raw, dt); err != nil {
			t.Fatal(err)
		}
		w := cpu.F32(wide)
		back := f.read(f.tensor(dt, w, len(w)))
		for i, x := range w {
			if math.IsNaN(float64(x)) {
				if !math.IsNaN(back[i]) {
					t.Errorf("%s %#04x: NaN came back as %g", dt, i, back[i])
				}
				continue
			}
			if float64(x) != back[i] || math.Signbit(back[i]) != (i&0x8000 != 0) {
				t.Errorf("%s %#04x = %g came back as %g", dt, i, x, back[i])
			}
		}
	}
	// Between the two 16-bit formats.
	h := f.dev.Alloc(kernels.BF16, 3)
	if err := f.dev.Upload(h, []byte{0x00, 0x3c, 0x00, 0xc1, 0x01, 0x00}, kernels.F16); err != nil {
		t.Fatal(err)
	}
	if got := f.read(h); got[0] != 1 || got[1] != -2.5 || got[2] != roundTo64(1.0/(1<<24), 7, -126) {
		t.Errorf("f16 {1, -2.5, 2^-24} into bf16 = %v", got)
	}
}

func TestDeviceIO(t *testing.T) {
	f := newFixture(t, 4)
	d := f.dev
	x := d.Alloc(kernels.F32, 2, 3)
	other := &kernels.Tensor{DType: kernels.F32, Shape: []int{2, 3}, Pitch: 3, Buf: fakeBuffer{}}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"short data", d.Upload(x, make([]byte, 20), kernels.F32)},
		{"pitched target", d.Upload(x.ColSlice(0, 2), make([]byte, 16), kernels.F32)},
		{"int into float", d.Upload(x, make([]byte, 24), kernels.I32)},
		{"foreign tensor", d.Upload(other, make([]byte, 24), kernels.F32)},
		{"ReadI32 of f32", func() error { _, err := d.ReadI32(x); return err }()},
		{"WriteI32 into f32", d.WriteI32(x, make([]int32, 6))},
		{"ReadF32 of foreign", func() error { _, err := d.ReadF32(other); return err }()},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		} else if !strings.HasPrefix(c.err.Error(), "cpu: ") {
			t.Errorf("%s: error %q does not say where", c.name, c.err)
		}
	}

	f.tensor(kernels.F32, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	y := f.tensor(kernels.F32, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if got := f.read(y.ColSlice(1, 3)); len(got) != 4 || got[0] != 2 || got[1] != 3 || got[2] != 5 || got[3] != 6 {
		t.Errorf("ReadF32 of a column slice = %v, want [2 3 5 6]", got)
	}
	raw := make([]byte, 12)
	for i, v := range []int32{-1, 7, 1 << 30} {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
	}
	ids := d.Alloc(kernels.I32, 3)
	if err := d.Upload(ids, raw, kernels.I32); err != nil {
		t.Fatal(err)
	}
	if got, err := d.ReadI32(ids); err != nil || got[0] != -1 || got[1] != 7 || got[2] != 1<<30 {
		t.Errorf("i32 upload read back as %v, %v", got, err)
	}
	if got := x.Buf.Bytes(); got != 24 {
		t.Errorf("a 2x3 f32 buffer has %d bytes, want 24", got)
	}
	if got := d.Alloc(kernels.BF16, 5).Buf.Bytes(); got != 10 {
		t.Errorf("a 5-element bf16 buffer has %d bytes, want 10", got)
	}

	d.Free(y)
	if _, err := d.ReadF32(y); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Errorf("ReadF32 after Free: %v", err)
	}

	if !strings.Contains(d.Name(), "threads") || d.ActDType() != kernels.F32 {
		t.Errorf("name %q, act dtype %s", d.Name(), d.ActDType())
	}
	m0 := d.Mark()
	time.Sleep(2 * time.Millisecond)
	if ms, err := d.Elapsed(m0, d.Mark()); err != nil || ms < 1 {
		t.Errorf("elapsed %g ms, %v; want ≥ 1", ms, err)
	}
	if _, err := d.Elapsed(m0, "x"); err == nil {
		t.Error("elapsed to a foreign mark: no error")
	}
}

type fakeBuffer struct{}

func (fakeBuffer) Bytes() int { return 24 }

type fakeDevice struct{ kernels.Device }

func (fakeDevice) Name() string { return "cuda:0 (fake)" }

func TestRegistered(t *testing.T) {
	var found bool
	for _, s := range kernels.Sets() {
		if s.Name == "cpu" {
			found = s.Device == "cpu"
		}
	}
	if !found {
		t.Fatal(`no set "cpu" on device "cpu" registered`)
	}
	if _, err := cpu.New(fakeDevice{}); err == nil || !strings.Contains(err.Error(), "cpu device") {
		t.Errorf("New on another device: %v", err)
	}
	spec, err := kernels.ParseSpec("cpu")
	if err != nil {
		t.Fatal(err)
	}
	dev := cpu.NewDevice()
	prof := profile.New(dev)
	ops, err := spec.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	a := dev.Alloc(kernels.F32, 1, 4)
	ops.Add(a, a, a)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	if tab := prof.Table(); len(tab) != 1 || tab[0].Op != kernels.OpAdd || tab[0].Calls != 1 {
		t.Errorf("profile after one add through the spec: %+v", tab)
	}
}

var negZero = math.Copysign(0, -1)

// A spec naming a set this binary lacks (no CUDA set is linked into the cpu
// package's tests) fails when parsed: set names are the registered ones.
func TestSpecOfAbsentSet(t *testing.T) {
	_, err := kernels.ParseSpec("fused")
	if err == nil || !strings.Contains(err.Error(), `unknown kernel set "fused" (want one of cpu: the sets built into this binary)`) {
		t.Errorf("fused, absent from this test binary: %v, want not built", err)
	}
}
