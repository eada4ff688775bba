package cpu

import "github.com/fuselm/fuselm/kernels"

// GroupGemm is out[r] = x[r] · w[g]ᵀ for the rows r in [first[g],
// first[g+1]) of every group g, one gemm per group: out [M,N] act,
// pitched; x [M,K] act, pitched; w [E,N,K] any float type; first [E+1]
// i32. Sums are f32 and a bf16 out is rounded once, as Linear. Rows outside
// [first[0], first[E]) keep their values; offsets that are not ascending
// within [0, M] fail the call (reported at Sync) and write nothing.
func (o *ops) GroupGemm(out, x, w, first *kernels.Tensor) {
	const op = kernels.OpGroupGemm
	kernels.CheckGroupGemm(o.dev.ActDType(), out, x, w, first)
	fs := ints(op, "first", first)
	groups, n, m := w.Shape[0], w.Shape[1], x.Rows()
	for g := range groups {
		if fs[g] < 0 || fs[g] > fs[g+1] || int(fs[g+1]) > m {
			o.dev.fail("%s: group %d's rows [%d, %d) are not ascending within the %d rows of x", op, g, fs[g], fs[g+1], m)
			return
		}
	}
	xm, wm := o.in(op, "x", x), weightArg(op, "w", w)
	om, commit := o.inout(op, "out", out)
	for g := range groups {
		r0, r1 := int(fs[g]), int(fs[g+1])
		if r0 == r1 {
			continue
		}
		gemm(om.span(r0, r1), xm.span(r0, r1), wm.sub(g*n, (g+1)*n), nil)
	}
	commit()
}

// span is the view of rows [r0, r1) of m.
func (m mat) span(r0, r1 int) mat {
	return mat{d: m.d[r0*m.pitch:], rows: r1 - r0, cols: m.cols, pitch: m.pitch}
}
