package fused

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestMLAAbsorb holds mla_absorb (MLADecode's two per-head projections) to
// cuBLAS's strided-batched GEMMs on the same operands, both projections,
// at DeepSeek-V2-Lite's dims (16 heads, 16 and 9 rows) and at dims of no
// tile (3 heads of 32 nope dims and rank 96; 2 of 16 and rank 32): within
// one bf16 rounding of each other (each sums in f32, in another order, and
// rounds once), every value; each call must have run on mla_absorb. It logs both paths' time
// alone at 16 rows, then runs the shared kerneltest's mla_decode cases and
// the decode graph with the keys variant (whose projections mla_absorb
// runs) the default at every batch.
func TestMLAAbsorb(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	defer func(v bool, d string) { absorbCuBLAS, mlaDecodeDefault = v, d }(absorbCuBLAS, mlaDecodeDefault)
	o := newSet(t, dev)
	rng := rand.New(rand.NewSource(37))
	random := normalOn(t, dev, rng)
	for _, c := range []struct{ rows, heads, nope, rope, v, rank int }{
		{16, 16, 128, 64, 128, 512}, {9, 16, 128, 64, 128, 512}, {5, 3, 32, 16, 32, 96}, {1, 2, 16, 16, 16, 32},
	} {
		name := fmt.Sprintf("%d rows, %d heads, nope %d, v %d, rank %d", c.rows, c.heads, c.nope, c.v, c.rank)
		wkvb := random(kernels.BF16, 0.05, c.heads*(c.nope+c.v), c.rank)
		q := random(kernels.BF16, 1, c.rows, c.heads*(c.nope+c.rope))
		olat := random(kernels.BF16, 1, c.rows, c.heads*c.rank)
		w, perHead := o.Mat(wkvb), int64((c.nope+c.v)*c.rank)
		var qlat, out [2]*kernels.Tensor
		project := func(i int) {
			o.absorb(false, c.rows, c.rank, c.nope, o.Mat(q), int64(c.nope+c.rope), w, perHead, o.Mat(qlat[i]), int64(c.rank), c.heads)
			o.absorb(true, c.rows, c.v, c.rank, o.Mat(olat), int64(c.rank), w.Sub(c.nope, 0), perHead, o.Mat(out[i]), int64(c.v), c.heads)
		}
		for i, cublas := range []bool{true, false} {
			qlat[i] = dev.Alloc(kernels.BF16, c.rows, c.heads*c.rank)
			out[i] = dev.Alloc(kernels.BF16, c.rows, c.heads*c.v)
			absorbCuBLAS = cublas
			runs := o.absorbRuns
			project(i)
			if !cublas && o.absorbRuns != runs+2 {
				t.Errorf("%s: mla_absorb ran %d of the 2 projections", name, o.absorbRuns-runs)
			}
		}
		for _, p := range []struct {
			what     string
			gemm, ab *kernels.Tensor
		}{{"q_lat", qlat[0], qlat[1]}, {"out", out[0], out[1]}} {
			want, got := read(t, dev, p.gemm), read(t, dev, p.ab)
			bad := 0
			for i := range want {
				d := math.Abs(float64(got[i] - want[i]))
				if d > math.Max(math.Abs(float64(want[i])), math.Abs(float64(got[i])))/128+1e-6 || math.IsNaN(float64(got[i])) {
					if bad < 5 {
						t.Errorf("%s: %s[%d] = %g, cuBLAS %g", name, p.what, i, got[i], want[i])
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%s: %s: %d of %d values past one bf16 rounding of cuBLAS's", name, p.what, bad, len(want))
			}
		}
		if c.rows == 16 && c.heads == 16 {
			var ms [2]float64
			for i, cublas := range []bool{true, false} {
				absorbCuBLAS = cublas
				ms[i] = msPerCall(t, dev, func() { project(i) })
			}
			t.Logf("%s: both projections cuBLAS %.2f µs, mla_absorb %.2f µs (alone, back to back)", name, ms[0]*1e3, ms[1]*1e3)
		}
		for _, x := range []*kernels.Tensor{wkvb, q, olat, qlat[0], qlat[1], out[0], out[1]} {
			dev.Free(x)
		}
	}
	absorbCuBLAS, mlaDecodeDefault = false, mlaKeysVariant
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLADecode)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// TestMLAAbsorbTakes checks, without a GPU, which problems absorb gives
// mla_absorb: DeepSeek-V2-Lite's two projections at 1 to 16 rows, and not
// 17 rows, reduced dims of no 16, columns of no 8, a pitch or stride of no
// 8 elements, a misaligned pointer, f32, or shared memory past 48 KiB.
func TestMLAAbsorbTakes(t *testing.T) {
	const heads, nope, rope, v, rank = 16, 128, 64, 128, 512
	perHead := int64((nope + v) * rank)
	mat := func(pitch int) cudaset.Mat { return cudaset.Mat{P: 1 << 20, Pitch: pitch, DT: kernels.BF16} }
	q, w, qlat, olat, out := mat(heads*(nope+rope)), mat(rank), mat(heads*rank), mat(heads*rank), mat(heads*v)
	qProj := func(rows, kk, n int, a cudaset.Mat, sA int64) bool {
		return absorbTakes(false, rows, n, kk, a, sA, w, perHead, qlat, int64(rank))
	}
	outProj := func(rows, kk, n int, b cudaset.Mat, sB int64) bool {
		return absorbTakes(true, rows, n, kk, olat, int64(rank), b, sB, out, int64(v))
	}
	for _, rows := range []int{1, 9, 16} {
		if !qProj(rows, nope, rank, q, nope+rope) || !outProj(rows, rank, v, w.Skip(int64(nope*rank)), perHead) {
			t.Errorf("%d rows at V2-Lite's dims: declined", rows)
		}
	}
	misaligned := q
	misaligned.P += 8
	f32 := q
	f32.DT = kernels.F32
	for _, c := range []struct {
		name  string
		takes bool
	}{
		{"17 rows", qProj(17, nope, rank, q, nope+rope)},
		{"nope 120", qProj(16, 120, rank, q, nope+rope)},
		{"rank 500", qProj(16, nope, 500, q, nope+rope)},
		{"q pitch 3071", qProj(16, nope, rank, mat(3071), nope+rope)},
		{"head stride 190", qProj(16, nope, rank, q, 190)},
		{"q 8 bytes off", qProj(16, nope, rank, misaligned, nope+rope)},
		{"q f32", qProj(16, nope, rank, f32, nope+rope)},
		{"out projection of rank 2048 (shared memory)", outProj(16, 2048, v, w, perHead)},
	} {
		if c.takes {
			t.Errorf("%s: taken", c.name)
		}
	}
	if got := mlaAbsorbFor(true).shared(rank); got > 48<<10 {
		t.Errorf("the out projection's shared memory at rank %d: %d bytes, past 48 KiB", rank, got)
	}
}
