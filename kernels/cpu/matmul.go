package cpu

import (
	"math"

	"github.com/fuselm/fuselm/kernels"
)

// Linear is out = x · wᵀ + bias: out [N,M] act or f32, pitched; x [N,K]
// act, pitched; w [M,K] f32/bf16/f16; bias [M] or nil. The sums and the bias
// are f32; a bf16 out is rounded once, after the bias, as cuBLAS's addmm
// with a bf16 output.
func (o *ops) Linear(out, x, w, bias *kernels.Tensor) {
	const op = kernels.OpLinear
	kernels.CheckLinear(o.dev.ActDType(), out, x, w, bias)
	xm, wm := o.in(op, "x", x), weightArg(op, "w", w)
	om, commit := o.out(op, "out", out)
	var b []float32
	if bias != nil {
		b = weightArg(op, "bias", bias).vector()
	}
	gemm(om, xm, wm, b)
	commit()
}

// Block sizes of gemm: a task is gemmN rows of x against gemmM rows of w.
// gemmM rows of 16-bit weights are decoded once per task into a scratch
// block (gemmM·K floats: 128 KiB for K = 2048) that stays in L2 while every
// x row of the task streams past it.
const (
	gemmM = 16
	gemmN = 64
)

// gemm is out[i,j] = x[i,:]·w[j,:] + bias[j] (bias may be nil) for all rows
// of x and w, over tasks of gemmN×gemmM outputs spread over all cores. The
// inner kernel computes 2×4 outputs at once with 8 accumulators, reading
// each loaded x and w element several times.
func gemm(out, x mat, w wmat, bias []float32) {
	n, m, k := x.rows, w.rows, x.cols
	nb, mb := (n+gemmN-1)/gemmN, (m+gemmM-1)/gemmM
	grain := grainFor(gemmN * gemmM * k)
	kernels.Parallel(nb*mb, grain, func(lo, hi int) {
		var scratch []float32
		if w.u16 != nil && !(n < 3 && w.bf16) {
			scratch = make([]float32, gemmM*k)
		}
		var wr [gemmM][]float32
		for task := lo; task < hi; task++ {
			// Consecutive tasks share the w block when nb > 1.
			jb, ib := task/nb, task%nb
			j0, j1 := jb*gemmM, min(m, (jb+1)*gemmM)
			if n < 3 && w.bf16 {
				// Decoding would cost more than the multiply-adds
				// it serves: read the bf16 rows directly.
				gemvBF16(out, x, w, bias, j0, j1)
				continue
			}
			if task == lo || ib == 0 {
				for j := j0; j < j1; j++ {
					var dst []float32
					if scratch != nil {
						dst = scratch[(j-j0)*k:]
					}
					wr[j-j0] = w.row(j, dst)
				}
			}
			gemmBlock(out, x, wr[:j1-j0], bias, ib*gemmN, min(n, (ib+1)*gemmN), j0)
		}
	})
}

// gemmBlock computes out[i, j0+j] for rows i in [i0, i1) of x and the rows
// wr of w.
func gemmBlock(out, x mat, wr [][]float32, bias []float32, i0, i1, j0 int) {
	b := func(j int) float32 {
		if bias == nil {
			return 0
		}
		return bias[j0+j]
	}
	i := i0
	for ; i+1 < i1; i += 2 {
		x0, x1 := x.row(i), x.row(i+1)
		o0, o1 := out.row(i)[j0:], out.row(i + 1)[j0:]
		j := 0
		for ; j+3 < len(wr); j += 4 {
			s := dot2x4(x0, x1, wr[j], wr[j+1], wr[j+2], wr[j+3])
			for c := range 4 {
				o0[j+c] = s[c] + b(j+c)
				o1[j+c] = s[4+c] + b(j+c)
			}
		}
		for ; j < len(wr); j++ {
			o0[j] = dot(x0, wr[j]) + b(j)
			o1[j] = dot(x1, wr[j]) + b(j)
		}
	}
	if i < i1 {
		x0, o0 := x.row(i), out.row(i)[j0:]
		j := 0
		for ; j+3 < len(wr); j += 4 {
			s := dot1x4(x0, wr[j], wr[j+1], wr[j+2], wr[j+3])
			for c := range 4 {
				o0[j+c] = s[c] + b(j+c)
			}
		}
		for ; j < len(wr); j++ {
			o0[j] = dot(x0, wr[j]) + b(j)
		}
	}
}

// gemvBF16 computes out[i, j] for every row i of x (a few) and rows
// [j0, j1) of bf16 weights w, widening weights as it reads them.
func gemvBF16(out, x mat, w wmat, bias []float32, j0, j1 int) {
	for i := range x.rows {
		xi, oi := x.row(i), out.row(i)
		j := j0
		for ; j+3 < j1; j += 4 {
			s := dot1x4BF16(xi, w.raw(j), w.raw(j+1), w.raw(j+2), w.raw(j+3))
			for c := range 4 {
				oi[j+c] = s[c]
			}
		}
		for ; j < j1; j++ {
			oi[j] = dot1x4BF16(xi, w.raw(j), w.raw(j), w.raw(j), w.raw(j))[0]
		}
		if bias != nil {
			for j := j0; j < j1; j++ {
				oi[j] += bias[j]
			}
		}
	}
}

// dot1x4BF16 returns x·w_c for c < 4, the w_c being bf16 bits.
func dot1x4BF16(x []float32, w0, w1, w2, w3 []uint16) [4]float32 {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var s0, s1, s2, s3 float32
	for k, a := range x {
		s0 += a * math.Float32frombits(uint32(w0[k])<<16)
		s1 += a * math.Float32frombits(uint32(w1[k])<<16)
		s2 += a * math.Float32frombits(uint32(w2[k])<<16)
		s3 += a * math.Float32frombits(uint32(w3[k])<<16)
	}
	return [4]float32{s0, s1, s2, s3}
}

// dot2x4 returns x_r·w_c for r < 2, c < 4, row-major.
func dot2x4(x0, x1, w0, w1, w2, w3 []float32) [8]float32 {
	n := len(x0)
	x1, w0, w1, w2, w3 = x1[:n], w0[:n], w1[:n], w2[:n], w3[:n]
	var s00, s01, s02, s03, s10, s11, s12, s13 float32
	for k := range n {
		a, b := x0[k], x1[k]
		c0, c1, c2, c3 := w0[k], w1[k], w2[k], w3[k]
		s00 += a * c0
		s01 += a * c1
		s02 += a * c2
		s03 += a * c3
		s10 += b * c0
		s11 += b * c1
		s12 += b * c2
		s13 += b * c3
	}
	return [8]float32{s00, s01, s02, s03, s10, s11, s12, s13}
}

// dot1x4 returns x·w_c for c < 4.
func dot1x4(x, w0, w1, w2, w3 []float32) [4]float32 {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var s0, s1, s2, s3 float32
	for k, a := range x {
		s0 += a * w0[k]
		s1 += a * w1[k]
		s2 += a * w2[k]
		s3 += a * w3[k]
	}
	return [4]float32{s0, s1, s2, s3}
}

// dot is x·y with four accumulators.
func dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	for len(x) >= 4 && len(y) >= 4 {
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
		x, y = x[4:], y[4:]
	}
	for k, v := range x {
		s0 += v * y[k]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy is y += a·x.
func axpy(a float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}

// LinearSwiGLU is Linear then SwiGLU, out = swiglu(x·wᵀ): out [N,I] act,
// pitched; x [N,K] act, pitched; w [2I,K], the gate rows first. It rounds
// as the two ops do: gate and up to bf16 (Linear's output), then as
// SwiGLU.
func (o *ops) LinearSwiGLU(out, x, w *kernels.Tensor) {
	const op = kernels.OpLinearSwiGLU
	kernels.CheckLinearSwiGLU(o.dev.ActDType(), out, x, w)
	xm, wm := o.in(op, "x", x), weightArg(op, "w", w)
	om, commit := o.out(op, "out", out)
	gu := newMat(xm.rows, wm.rows)
	gemm(gu, xm, wm, nil)
	o.round(gu.d)
	kernels.Parallel(om.rows, grainFor(om.cols), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			swiglu(om.row(i), gu.row(i), o.bf16)
		}
	})
	commit()
}

// LinearAdd is Linear then Add, out = (x·wᵀ + bias) + addend: out, addend
// [N,M] act, pitched, out may be addend; x [N,K] act, pitched; w [M,K];
// bias [M] or nil. It rounds as the two ops do: the projection to bf16
// (Linear's output), then the sum.
func (o *ops) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	const op = kernels.OpLinearAdd
	kernels.CheckLinearAdd(o.dev.ActDType(), out, x, w, bias, addend)
	xm, wm := o.in(op, "x", x), weightArg(op, "w", w)
	var b []float32
	if bias != nil {
		b = weightArg(op, "bias", bias).vector()
	}
	lin := newMat(xm.rows, wm.rows)
	gemm(lin, xm, wm, b)
	o.round(lin.d)
	am := o.in(op, "addend", addend)
	om, commit := o.out(op, "out", out)
	addRows(om, am, lin)
	commit()
}

// AddRMSNormLinear is the set's AddRMSNorm into h, then its Linear of h.
func (o *ops) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckAddRMSNormLinear(o.dev.ActDType(), out, h, resid, x, norm, w, bias)
	kernels.AddRMSNormLinearParts(o, out, h, resid, x, norm, eps, w, bias)
}

// AddAddRMSNormLinear is the set's AddAddRMSNorm into h, then its Linear
// of h.
func (o *ops) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckAddAddRMSNormLinear(o.dev.ActDType(), out, h, resid, x, y, norm, w, bias)
	kernels.AddAddRMSNormLinearParts(o, out, h, resid, x, y, norm, eps, w, bias)
}

// AddRMSNormLinearSwiGLU is the set's AddRMSNorm into h, then its
// LinearSwiGLU of h.
func (o *ops) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckAddRMSNormLinearSwiGLU(o.dev.ActDType(), out, h, resid, x, norm, w)
	kernels.AddRMSNormLinearSwiGLUParts(o, out, h, resid, x, norm, eps, w)
}

// LinearAddRMSNormLinear is the set's Linear into mid, then its
// AddRMSNormLinear of mid.
func (o *ops) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinear(o.dev.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w, bias)
	kernels.LinearAddRMSNormLinearParts(o, mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
}

// LinearAddRMSNormLinearSwiGLU is the set's Linear into mid, then its
// AddRMSNormLinearSwiGLU of mid.
func (o *ops) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinearSwiGLU(o.dev.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w)
	kernels.LinearAddRMSNormLinearSwiGLUParts(o, mid, x, w0, bias0, out, h, resid, norm, eps, w)
}
