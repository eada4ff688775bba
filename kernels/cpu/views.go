package cpu

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
)

// mat is a float32 matrix: row i is d[i*pitch : i*pitch+cols].
type mat struct {
	d                 []float32
	rows, cols, pitch int
}

func (m mat) row(i int) []float32 {
	o := i * m.pitch
	return m.d[o : o+m.cols : o+m.cols]
}

// newMat is a packed matrix of fresh memory.
func newMat(rows, cols int) mat {
	return mat{d: make([]float32, rows*cols), rows: rows, cols: cols, pitch: cols}
}

// floats is the view of an f32 tensor that is f32 whatever the activation
// type (rotary tables, router logits and weights); it panics, naming the op
// and argument, when t is not an f32 tensor of this device.
func floats(op kernels.Op, arg string, t *kernels.Tensor) mat {
	if t == nil {
		panic(fmt.Sprintf("cpu: %s: %s is nil", op, arg))
	}
	if _, err := hostBuffer(t); err != nil || t.DType != kernels.F32 {
		panic(fmt.Sprintf("cpu: %s: %s is %v (%T), want an f32 tensor of the cpu device", op, arg, t, t.Buf))
	}
	return mat{d: F32(t), rows: t.Rows(), cols: t.Cols(), pitch: t.Pitch}
}

// actArg is the view of an activation: an f32 tensor, or one of the
// activation type o.act; it panics, naming the op and argument, for
// anything else.
func (o *ops) actArg(op kernels.Op, arg string, t *kernels.Tensor) wmat {
	if t == nil {
		panic(fmt.Sprintf("cpu: %s: %s is nil", op, arg))
	}
	if _, err := hostBuffer(t); err != nil || t.DType != kernels.F32 && t.DType != o.act {
		want := "an f32"
		if o.act != kernels.F32 {
			want = "an f32 or " + o.act.String()
		}
		panic(fmt.Sprintf("cpu: %s: %s is %v (%T), want %s tensor of the cpu device", op, arg, t, t.Buf, want))
	}
	return weight(t)
}

// in returns activation t as float32: t's own elements when t is f32, else
// a packed copy widened from its 16-bit type.
func (o *ops) in(op kernels.Op, arg string, t *kernels.Tensor) mat {
	w := o.actArg(op, arg, t)
	if t.DType == kernels.F32 {
		return mat{d: w.f32, rows: w.rows, cols: w.cols, pitch: w.pitch}
	}
	m := newMat(w.rows, w.cols)
	for i := range m.rows {
		w.row(i, m.row(i))
	}
	return m
}

// out returns the float32 matrix an op writes activation t through, and
// commit, which completes the write: for an f32 t, t's own elements and
// nothing to do; for a 16-bit t, a packed scratch matrix that commit rounds
// into t. Every op's outputs are rounded so, once, at the end.
func (o *ops) out(op kernels.Op, arg string, t *kernels.Tensor) (m mat, commit func()) {
	return o.writable(op, arg, t, false)
}

// inout is out for an activation the op updates in place: the scratch
// matrix starts with t's values.
func (o *ops) inout(op kernels.Op, arg string, t *kernels.Tensor) (m mat, commit func()) {
	return o.writable(op, arg, t, true)
}

// writable is out, with the scratch matrix loaded from t when load.
func (o *ops) writable(op kernels.Op, arg string, t *kernels.Tensor, load bool) (mat, func()) {
	w := o.actArg(op, arg, t)
	if t.DType == kernels.F32 {
		return mat{d: w.f32, rows: w.rows, cols: w.cols, pitch: w.pitch}, func() {}
	}
	m := newMat(w.rows, w.cols)
	if load {
		for i := range m.rows {
			w.row(i, m.row(i))
		}
	}
	return m, func() {
		for i := range m.rows {
			w.put(i, m.row(i))
		}
	}
}

// round rounds v in place to the activation type: to bf16 on a bf16 device,
// not at all on an f32 one. Ops call it where HF's bf16 path rounds a
// result that the op then computes with.
func (o *ops) round(v []float32) {
	if o.bf16 {
		roundRowBF16(v)
	}
}

// ints is the i32 view of an index tensor, row after row of its columns.
func ints(op kernels.Op, arg string, t *kernels.Tensor) []int32 {
	if t == nil {
		panic(fmt.Sprintf("cpu: %s: %s is nil", op, arg))
	}
	if _, err := hostBuffer(t); err != nil || t.DType != kernels.I32 || !t.Packed() {
		panic(fmt.Sprintf("cpu: %s: %s is %v (%T), want a packed i32 tensor of the cpu device", op, arg, t, t.Buf))
	}
	return I32(t)
}

// wmat is a matrix of f32, bf16 or f16 elements (weights, or an activation
// cache), read and written a row at a time.
type wmat struct {
	f32               []float32 // F32 elements, or
	u16               []uint16  // BF16 or F16 bits
	bf16              bool
	rows, cols, pitch int
}

// weight is the view of a float tensor of any of the three float dtypes.
func weight(t *kernels.Tensor) wmat {
	b, err := hostBuffer(t)
	if err != nil {
		panic("cpu: " + err.Error())
	}
	w := wmat{rows: t.Rows(), cols: t.Cols(), pitch: t.Pitch}
	n := span(t)
	switch t.DType {
	case kernels.F32:
		w.f32 = b.f32[t.Offset : t.Offset+n]
	case kernels.BF16, kernels.F16:
		w.u16 = b.u16[t.Offset : t.Offset+n]
		w.bf16 = t.DType == kernels.BF16
	default:
		panic(fmt.Sprintf("cpu: %v is not a float tensor", t))
	}
	return w
}

// weightArg is weight with the op and argument named in a panic.
func weightArg(op kernels.Op, arg string, t *kernels.Tensor) wmat {
	if t == nil || t.DType == kernels.I32 {
		panic(fmt.Sprintf("cpu: %s: %s is %v, want f32, bf16 or f16 weights", op, arg, t))
	}
	if _, err := hostBuffer(t); err != nil {
		panic(fmt.Sprintf("cpu: %s: %s: %v", op, arg, err))
	}
	return weight(t)
}

// row returns row i as float32: the stored row itself for f32 weights, else
// the row decoded into scratch (which needs w.cols elements).
func (w wmat) row(i int, scratch []float32) []float32 {
	o := i * w.pitch
	if w.f32 != nil || w.u16 == nil {
		return w.f32[o : o+w.cols : o+w.cols]
	}
	dst := scratch[:w.cols:w.cols]
	decode16(dst, w.u16[o:o+w.cols], w.bf16)
	return dst
}

// put stores v as row i, rounded to nearest even for 16-bit elements.
func (w wmat) put(i int, v []float32) {
	o := i * w.pitch
	if w.u16 == nil {
		copy(w.f32[o:o+w.cols], v)
		return
	}
	dst := w.u16[o : o+w.cols]
	if w.bf16 {
		encodeBF16(dst, v)
		return
	}
	for j, x := range v[:w.cols] {
		dst[j] = kernels.F32ToF16(x)
	}
}

// raw is row i of 16-bit weights as stored.
func (w wmat) raw(i int) []uint16 { return w.u16[i*w.pitch : i*w.pitch+w.cols] }

// sub is the view of rows [r0, r1).
func (w wmat) sub(r0, r1 int) wmat {
	v := w
	v.rows = r1 - r0
	if w.f32 != nil {
		v.f32 = w.f32[r0*w.pitch:]
	} else {
		v.u16 = w.u16[r0*w.pitch:]
	}
	return v
}

// vector is a whole weight vector (a norm weight, a bias) as float32.
func (w wmat) vector() []float32 {
	if w.rows != 1 {
		panic(fmt.Sprintf("cpu: weight vector with %d rows", w.rows))
	}
	return w.row(0, make([]float32, w.cols))
}

// check panics with the op's name when a shape does not fit.
func check(ok bool, op kernels.Op, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("cpu: %s: ", op) + fmt.Sprintf(format, args...))
	}
}

// grainFor is how many items of cost work each a chunk of kernels.Parallel needs to
// be worth a goroutine.
func grainFor(work int) int {
	const chunkWork = 1 << 15 // multiply-adds worth a goroutine start
	return max(1, chunkWork/max(1, work))
}
