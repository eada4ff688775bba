package cpu_test

import (
	"encoding/binary"
	"math"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// fixture is a cpu device, its op set and a seeded source of inputs.
type fixture struct {
	t   *testing.T
	dev *cpu.Device
	ops kernels.Ops
	rng *rand.Rand
}

func newFixture(t *testing.T, seed int64) *fixture {
	t.Helper()
	return newFixtureAct(t, seed, kernels.F32)
}

// newFixtureAct is newFixture on a device with activations of type act.
func newFixtureAct(t *testing.T, seed int64, act kernels.DType) *fixture {
	t.Helper()
	dev, err := cpu.NewDeviceAct(act)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := cpu.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, dev: dev, ops: ops, rng: rand.New(rand.NewSource(seed))}
}

// tensor is a packed tensor of dtype dt holding vals (rounded to dt).
func (f *fixture) tensor(dt kernels.DType, vals []float32, shape ...int) *kernels.Tensor {
	f.t.Helper()
	t := f.dev.Alloc(dt, shape...)
	if err := f.dev.Upload(t, f32Bytes(vals), kernels.F32); err != nil {
		f.t.Fatal(err)
	}
	return t
}

// randn is a tensor of N(0, scale²) values.
func (f *fixture) randn(dt kernels.DType, scale float64, shape ...int) *kernels.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return f.tensor(dt, f.normal(n, scale), shape...)
}

func (f *fixture) normal(n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(f.rng.NormFloat64() * scale)
	}
	return v
}

func (f *fixture) ints(vals []int32, shape ...int) *kernels.Tensor {
	f.t.Helper()
	t := f.dev.Alloc(kernels.I32, shape...)
	if err := f.dev.WriteI32(t, vals); err != nil {
		f.t.Fatal(err)
	}
	return t
}

// read returns t's values (as stored: decoded from bf16/f16) in float64.
func (f *fixture) read(t *kernels.Tensor) []float64 {
	f.t.Helper()
	v, err := f.dev.ReadF32(t)
	if err != nil {
		f.t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// sync fails the test on a device error.
func (f *fixture) sync() {
	f.t.Helper()
	if err := f.dev.Sync(); err != nil {
		f.t.Fatal(err)
	}
}

// assertClose fails when ‖got − want‖/‖want‖ > tol or any value is NaN.
func assertClose(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var d2, w2 float64
	worst := 0
	for i := range got {
		if math.IsNaN(got[i]) != math.IsNaN(want[i]) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
		if math.IsNaN(want[i]) {
			continue
		}
		d := got[i] - want[i]
		d2 += d * d
		w2 += want[i] * want[i]
		if math.Abs(d) > math.Abs(got[worst]-want[worst]) || math.IsNaN(got[worst]) {
			worst = i
		}
	}
	if rel := math.Sqrt(d2) / math.Max(math.Sqrt(w2), 1e-300); !(rel <= tol) {
		t.Errorf("%s: relative error %.3g > %.3g (worst at %d: got %g, want %g)", what, rel, tol, worst, got[worst], want[worst])
	}
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// softmax64 is the softmax of s in float64.
func softmax64(s []float64) []float64 {
	m := math.Inf(-1)
	for _, x := range s {
		m = math.Max(m, x)
	}
	out := make([]float64, len(s))
	var z float64
	for i, x := range s {
		out[i] = math.Exp(x - m)
		z += out[i]
	}
	for i := range out {
		out[i] /= z
	}
	return out
}

// rowsOf cuts packed values into rows of n.
func rowsOf(v []float64, n int) [][]float64 {
	out := make([][]float64, len(v)/n)
	for i := range out {
		out[i] = v[i*n : (i+1)*n]
	}
	return out
}

var nan32 = float32(math.NaN())
