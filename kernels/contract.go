package kernels

import (
	"fmt"
	"slices"
)

// The contract of each op, one beside the other: what it takes, checked
// once here and called by every set (the cpu set's and the CUDA sets'
// alike) so that no two sets disagree on what an op takes, and what a call
// of it costs (costOf's method, which the dispatch tells its observer).
// act is the device's activation dtype (Device.ActDType). A set may accept
// less (cuBLAS multiplies bf16 only), never more. A failed check is a
// programming error and panics with a message naming the op.

// costOf is the Ops that computes, instead of running a call, what it
// costs into *c: the dispatch runs each call on it after the call's set
// (which has checked the arguments) to tell its observer.
type costOf struct{ c *Cost }

var _ Ops = costOf{}

// need panics, naming op, when a check fails.
func need(ok bool, op Op, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("kernels: %s: %s", op, fmt.Sprintf(format, args...)))
	}
}

// IsFloat reports whether t holds one of the float types weights come in.
func IsFloat(t *Tensor) bool {
	return t != nil && (t.DType == F32 || t.DType == BF16 || t.DType == F16)
}

func isAct(t *Tensor, act DType) bool { return t != nil && t.DType == act }

// needActs checks that every named tensor holds activations.
func needActs(op Op, act DType, named ...any) {
	for i := 0; i < len(named); i += 2 {
		t := named[i+1].(*Tensor)
		need(isAct(t, act), op, "%s is %v, want %s activations", named[i], t, act)
	}
}

func isInts(t *Tensor, n int) bool { return t != nil && t.DType == I32 && t.Packed() && t.Numel() == n }

// rowsCols reports whether t is a matrix of rows × cols elements.
func rowsCols(t *Tensor, rows, cols int) bool { return t.Rows() == rows && t.Cols() == cols }

// same reports whether two views start at the same element of one buffer.
func same(a, b *Tensor) bool { return a.Buf == b.Buf && a.Offset == b.Offset }

// apart reports whether two views share no element: they lie in other
// buffers, or in spans of one buffer that do not meet, or their rows are of
// one pitch and their column windows within it do not meet (q and kv as
// column slices of one matrix).
func apart(a, b *Tensor) bool {
	if a.Buf != b.Buf || a.Numel() == 0 || b.Numel() == 0 {
		return true
	}
	end := func(t *Tensor) int { return t.Offset + (t.Rows()-1)*t.Pitch + t.Cols() }
	if end(a) <= b.Offset || end(b) <= a.Offset {
		return true
	}
	if a.Pitch != b.Pitch || a.Pitch == 0 {
		return false
	}
	ca, cb := a.Offset%a.Pitch, b.Offset%b.Pitch
	return ca+a.Cols() <= a.Pitch && cb+b.Cols() <= b.Pitch && (ca+a.Cols() <= cb || cb+b.Cols() <= ca)
}

// CheckEmbedding: out [N,D] act; table [V,D] float; ids [N] i32.
func CheckEmbedding(act DType, out, table, ids *Tensor) {
	op := OpEmbedding
	needActs(op, act, "out", out)
	need(IsFloat(table) && table.Cols() == out.Cols(), op, "table %v for out %v", table, out)
	need(isInts(ids, out.Rows()), op, "ids %v for out %v", ids, out)
}

func (k costOf) Embedding(out, table, ids *Tensor) { *k.c = Cost{Bytes: 2 * size(out)} }

// CheckLinear: out [N,M] act or f32; x [N,K] act; w [M,K] float; bias [M]
// float or nil.
func CheckLinear(act DType, out, x, w, bias *Tensor) {
	op := OpLinear
	needActs(op, act, "x", x)
	need(IsFloat(w) && w.Cols() == x.Cols(), op, "w %v for x %v", w, x)
	need((isAct(out, act) || out.DType == F32) && rowsCols(out, x.Rows(), w.Rows()), op,
		"out %v for x %v, w %v", out, x, w)
	need(bias == nil || IsFloat(bias) && bias.Numel() == w.Rows(), op, "bias %v for w %v", bias, w)
}

func (k costOf) Linear(out, x, w, bias *Tensor) { *k.c = linearCost(out, x, w, bias) }

// CheckRMSNorm: out, x [N,D] act; w [D] float.
func CheckRMSNorm(act DType, out, x, w *Tensor) {
	op := OpRMSNorm
	needActs(op, act, "out", out, "x", x)
	need(rowsCols(out, x.Rows(), x.Cols()), op, "out %v, x %v", out, x)
	need(IsFloat(w) && w.Numel() == x.Cols(), op, "w %v for x %v", w, x)
}

func (k costOf) RMSNorm(out, x, w *Tensor, eps float32) {
	*k.c = normCost(x, w, false)
}

// CheckAddRMSNorm: out, resid, x [N,D] act, out aliasing neither; w [D] float.
func CheckAddRMSNorm(act DType, out, resid, x, w *Tensor) {
	op := OpAddRMSNorm
	n, d := resid.Rows(), resid.Cols()
	needActs(op, act, "out", out, "resid", resid, "x", x)
	need(rowsCols(out, n, d) && rowsCols(x, n, d), op, "out %v, resid %v, x %v", out, resid, x)
	need(!same(out, resid) && !same(out, x), op, "out aliases resid or x")
	need(IsFloat(w) && w.Numel() == d, op, "w %v for rows of %d", w, d)
}

func (k costOf) AddRMSNorm(out, resid, x, w *Tensor, eps float32) { *k.c = normCost(x, w, true) }

// CheckAdd: out, a, b [N,D] act.
func CheckAdd(act DType, out, a, b *Tensor) {
	op := OpAdd
	needActs(op, act, "out", out, "a", a, "b", b)
	need(rowsCols(a, out.Rows(), out.Cols()) && rowsCols(b, out.Rows(), out.Cols()), op, "out %v, a %v, b %v", out, a, b)
}

func (k costOf) Add(out, a, b *Tensor) {
	*k.c = Cost{FLOPs: float64(out.Numel()), Bytes: 3 * size(out)}
}

// CheckAddAddRMSNorm: out, resid, x, y [N,D] act, out aliasing none of
// resid, x and y, x not resid (the parts leave the sum in x, which
// AddRMSNorm then adds into resid); w [D] float.
func CheckAddAddRMSNorm(act DType, out, resid, x, y, w *Tensor) {
	op := OpAddAddRMSNorm
	n, d := resid.Rows(), resid.Cols()
	needActs(op, act, "out", out, "resid", resid, "x", x, "y", y)
	need(rowsCols(out, n, d) && rowsCols(x, n, d) && rowsCols(y, n, d), op, "out %v, resid %v, x %v, y %v", out, resid, x, y)
	need(!same(out, resid) && !same(out, x) && !same(out, y), op, "out aliases resid, x or y")
	need(!same(x, resid), op, "x aliases resid")
	need(IsFloat(w) && w.Numel() == d, op, "w %v for rows of %d", w, d)
}

// The cost of AddAddRMSNorm is its parts' FLOPs and the bytes of one
// pass: x and y read, resid read and written, w read, out written; the
// sum the parts leave in x is no part of its floor.
func (k costOf) AddAddRMSNorm(out, resid, x, y, w *Tensor, eps float32) {
	nc := normCost(x, w, true)
	*k.c = Cost{FLOPs: float64(x.Numel()) + nc.FLOPs, Bytes: nc.Bytes + size(y)}
}

// CheckRoPE: x [T, ≥heads·headStride] act with each head's rotated dims
// [offset, offset+r.Dim) inside it; pos [T] i32; r.Cos, r.Sin [MaxPos,
// ≥Dim/2] f32 of one pitch.
func CheckRoPE(act DType, x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	checkRoPE(OpRoPE, act, x, heads, headStride, offset, pos, r)
}

// checkRoPE is CheckRoPE for op, which rotates x as RoPE does.
func checkRoPE(op Op, act DType, x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	needActs(op, act, "x", x)
	need(r != nil && r.Dim > 0 && r.Dim%2 == 0, op, "rotated dims %v", r)
	need(heads >= 0 && offset >= 0 && offset+r.Dim <= headStride && heads*headStride <= x.Cols(), op,
		"%d heads %d apart, rotated at [%d,%d), do not fit x %v", heads, headStride, offset, offset+r.Dim, x)
	need(isInts(pos, x.Rows()), op, "pos %v for x %v", pos, x)
	c, s := r.Cos, r.Sin
	need(c != nil && s != nil && c.DType == F32 && s.DType == F32 && c.Cols() >= r.Dim/2 && c.Cols() == s.Cols() &&
		c.Pitch == s.Pitch && c.Rows() == s.Rows(), op, "tables cos %v, sin %v for %d dims", c, s, r.Dim)
}

func (k costOf) RoPE(x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	*k.c = ropeCost(x, heads, r)
}

// CheckSwiGLU: out [N,I] act; gateUp [N,2I] act.
func CheckSwiGLU(act DType, out, gateUp *Tensor) {
	needActs(OpSwiGLU, act, "out", out, "gateUp", gateUp)
	need(rowsCols(gateUp, out.Rows(), 2*out.Cols()), OpSwiGLU, "out %v, gateUp %v", out, gateUp)
}

func (k costOf) SwiGLU(out, gateUp *Tensor) { *k.c = swigluCost(out) }

// CheckLinearSwiGLU: out [N,I] act, not x; x [N,K] act; w [2I,K] float, the
// gate rows then the up rows.
func CheckLinearSwiGLU(act DType, out, x, w *Tensor) {
	op := OpLinearSwiGLU
	needActs(op, act, "out", out, "x", x)
	need(IsFloat(w) && w.Cols() == x.Cols(), op, "w %v for x %v", w, x)
	need(rowsCols(out, x.Rows(), w.Rows()/2) && w.Rows()%2 == 0, op, "out %v for x %v, w %v (gate and up rows)", out, x, w)
	need(!same(out, x), op, "out aliases x")
}

// The cost of LinearSwiGLU is its parts' FLOPs and the bytes of one pass:
// x and w read, out written; the [N, 2I] intermediate of the unfused pair
// is no part of its floor.
func (k costOf) LinearSwiGLU(out, x, w *Tensor) {
	lin := linearCost(out, x, w, nil)
	*k.c = Cost{FLOPs: lin.FLOPs + swigluCost(out).FLOPs, Bytes: size(x) + size(w) + size(out)}
}

// CheckRMSNormRoPE: q [T, ≥heads·headStride] act with each head's rotated
// dims [offset, offset+r.Dim) inside it; kv [T, Rank+r.Dim] act, no
// element of it in q; w [Rank] float; pos [T] i32; the tables as RoPE's.
func CheckRMSNormRoPE(act DType, q, kv, w *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	checkRMSNormRoPE(OpRMSNormRoPE, act, q, kv, w, heads, headStride, offset, pos, r)
}

// checkRMSNormRoPE is CheckRMSNormRoPE for op, which does RMSNormRoPE's work.
func checkRMSNormRoPE(op Op, act DType, q, kv, w *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	needActs(op, act, "q", q, "kv", kv)
	need(r != nil && r.Dim > 0 && r.Dim%2 == 0, op, "rotated dims %v", r)
	need(IsFloat(w) && w.Numel() > 0 && kv.Cols() == w.Numel()+r.Dim, op, "kv %v for a latent of w %v and %d rotated dims", kv, w, r.Dim)
	need(q.Rows() == kv.Rows(), op, "q %v, kv %v", q, kv)
	need(apart(q, kv), op, "q %v and kv %v share elements", q, kv)
	checkRoPE(op, act, q, heads, headStride, offset, pos, r)
}

// The cost of RMSNormRoPE is its parts': the latent's norm and the two
// rotations, each of which reads and writes only its own elements.
func (k costOf) RMSNormRoPE(q, kv, w *Tensor, eps float32, heads, headStride, offset int, pos *Tensor, r *Rope) {
	norm := normCost(kv.ColSlice(0, w.Numel()), w, false)
	qr, kr := ropeCost(q, heads, r), ropeCost(kv, 1, r)
	*k.c = Cost{FLOPs: norm.FLOPs + qr.FLOPs + kr.FLOPs, Bytes: norm.Bytes + qr.Bytes + kr.Bytes}
}

// CheckLinearAdd: out, addend [N,M] act, out either addend (the same view)
// or apart from it, and not x; x [N,K] act; w [M,K] float; bias [M] float
// or nil.
func CheckLinearAdd(act DType, out, x, w, bias, addend *Tensor) {
	op := OpLinearAdd
	needActs(op, act, "out", out, "x", x, "addend", addend)
	need(IsFloat(w) && w.Cols() == x.Cols(), op, "w %v for x %v", w, x)
	need(rowsCols(out, x.Rows(), w.Rows()) && rowsCols(addend, x.Rows(), w.Rows()), op,
		"out %v, addend %v for x %v, w %v", out, addend, x, w)
	need(bias == nil || IsFloat(bias) && bias.Numel() == w.Rows(), op, "bias %v for w %v", bias, w)
	need(!same(out, x), op, "out aliases x")
	need(!same(out, addend) || out.Pitch == addend.Pitch, op, "out %v starts where addend %v does with another pitch", out, addend)
}

// The cost of LinearAdd is its parts' FLOPs and the bytes of one pass: x,
// w, bias and addend read, out written; the [N, M] intermediate of the
// unfused pair is no part of its floor.
func (k costOf) LinearAdd(out, x, w, bias, addend *Tensor) {
	lin := linearCost(out, x, w, bias)
	*k.c = Cost{FLOPs: lin.FLOPs + float64(out.Numel()), Bytes: lin.Bytes + size(addend)}
}

// CheckAddRMSNormLinear: AddRMSNorm's operands (h its out) and Linear's
// (h its x), out act; out aliasing none of h, resid and x.
func CheckAddRMSNormLinear(act DType, out, h, resid, x, norm, w, bias *Tensor) {
	checkAddRMSNormLinear(OpNormLinear, act, out, h, resid, x, norm, w, bias)
}

// checkAddRMSNormLinear is CheckAddRMSNormLinear for op, which does its
// work.
func checkAddRMSNormLinear(op Op, act DType, out, h, resid, x, norm, w, bias *Tensor) {
	checkNormIn(op, act, h, resid, x, norm)
	need(IsFloat(w) && w.Cols() == h.Cols(), op, "w %v for rows of %d", w, h.Cols())
	needActs(op, act, "out", out)
	need(rowsCols(out, h.Rows(), w.Rows()), op, "out %v for h %v, w %v", out, h, w)
	need(bias == nil || IsFloat(bias) && bias.Numel() == w.Rows(), op, "bias %v for w %v", bias, w)
	need(!same(out, h) && !same(out, resid) && !same(out, x), op, "out aliases h, resid or x")
}

// The cost of AddRMSNormLinear is its parts' FLOPs and the bytes of one
// pass: resid read and written, x, norm, w and bias read, out written; h,
// the parts' intermediate, is no part of its floor.
func (k costOf) AddRMSNormLinear(out, h, resid, x, norm *Tensor, eps float32, w, bias *Tensor) {
	lin := linearCost(out, h, w, bias)
	nc := normCost(x, norm, true)
	*k.c = Cost{FLOPs: lin.FLOPs + nc.FLOPs, Bytes: 3*size(x) + size(norm) + size(w) + size(bias) + size(out)}
}

// CheckAddAddRMSNormLinear: AddAddRMSNorm's operands (h its out) and
// Linear's (h its x), out act; out aliasing none of h, resid, x and y.
func CheckAddAddRMSNormLinear(act DType, out, h, resid, x, y, norm, w, bias *Tensor) {
	op := OpAddAddNormLinear
	checkNormIn(op, act, h, resid, x, norm)
	needActs(op, act, "y", y)
	need(rowsCols(y, resid.Rows(), resid.Cols()), op, "y %v for resid %v", y, resid)
	need(!same(h, y) && !same(x, resid), op, "h aliases y, or x aliases resid")
	need(IsFloat(w) && w.Cols() == h.Cols(), op, "w %v for rows of %d", w, h.Cols())
	needActs(op, act, "out", out)
	need(rowsCols(out, h.Rows(), w.Rows()), op, "out %v for h %v, w %v", out, h, w)
	need(bias == nil || IsFloat(bias) && bias.Numel() == w.Rows(), op, "bias %v for w %v", bias, w)
	need(!same(out, h) && !same(out, resid) && !same(out, x) && !same(out, y), op, "out aliases h, resid, x or y")
}

// The cost of AddAddRMSNormLinear is its parts' FLOPs and the bytes of one
// pass of each: AddAddRMSNorm's (h written) and the projection's (h read
// back, w and bias read, out written).
func (k costOf) AddAddRMSNormLinear(out, h, resid, x, y, norm *Tensor, eps float32, w, bias *Tensor) {
	var nc Cost
	costOf{&nc}.AddAddRMSNorm(h, resid, x, y, norm, eps)
	lin := linearCost(out, h, w, bias)
	*k.c = Cost{FLOPs: nc.FLOPs + lin.FLOPs, Bytes: nc.Bytes + lin.Bytes}
}

// CheckAddRMSNormLinearSwiGLU: AddRMSNorm's operands (h its out) and
// LinearSwiGLU's (h its x); out aliasing none of h, resid and x.
func CheckAddRMSNormLinearSwiGLU(act DType, out, h, resid, x, norm, w *Tensor) {
	checkAddRMSNormLinearSwiGLU(OpNormSwiGLU, act, out, h, resid, x, norm, w)
}

// checkAddRMSNormLinearSwiGLU is CheckAddRMSNormLinearSwiGLU for op, which
// does its work.
func checkAddRMSNormLinearSwiGLU(op Op, act DType, out, h, resid, x, norm, w *Tensor) {
	checkNormIn(op, act, h, resid, x, norm)
	need(IsFloat(w) && w.Cols() == h.Cols() && w.Rows()%2 == 0, op, "w %v for rows of %d (gate and up rows)", w, h.Cols())
	needActs(op, act, "out", out)
	need(rowsCols(out, h.Rows(), w.Rows()/2), op, "out %v for h %v, w %v (gate and up rows)", out, h, w)
	need(!same(out, h) && !same(out, resid) && !same(out, x), op, "out aliases h, resid or x")
}

// The cost of AddRMSNormLinearSwiGLU is its parts' FLOPs and the bytes of
// one pass, as AddRMSNormLinear's.
func (k costOf) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *Tensor, eps float32, w *Tensor) {
	lin := linearCost(out, h, w, nil)
	nc := normCost(x, norm, true)
	*k.c = Cost{FLOPs: lin.FLOPs + nc.FLOPs + swigluCost(out).FLOPs, Bytes: 3*size(x) + size(norm) + size(w) + size(out)}
}

// CheckLinearAddRMSNormLinear: Linear's operands (mid its out, act) and
// AddRMSNormLinear's (mid its x); out aliasing none of mid and x either,
// mid neither x, resid nor h.
func CheckLinearAddRMSNormLinear(act DType, mid, x, w0, bias0, out, h, resid, norm, w, bias *Tensor) {
	op := OpLinearNormLinear
	checkLinearMid(op, act, mid, x, w0, bias0)
	checkAddRMSNormLinear(op, act, out, h, resid, mid, norm, w, bias)
	need(!same(out, x), op, "out aliases x")
	need(!same(mid, resid), op, "mid aliases resid")
}

// The cost of LinearAddRMSNormLinear is its parts' FLOPs and the bytes of
// one pass: x, w0 and bias0 read, mid written, resid read and written,
// norm, w and bias read, out written; h, and mid read back by the second
// part, are no part of its floor.
func (k costOf) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w, bias *Tensor) {
	first, second := linearCost(mid, x, w0, bias0), linearCost(out, h, w, bias)
	nc := normCost(mid, norm, true)
	*k.c = Cost{FLOPs: first.FLOPs + nc.FLOPs + second.FLOPs,
		Bytes: size(x) + size(w0) + size(bias0) + size(mid) + 2*size(resid) + size(norm) + size(w) + size(bias) + size(out)}
}

// CheckLinearAddRMSNormLinearSwiGLU: Linear's operands (mid its out, act)
// and AddRMSNormLinearSwiGLU's (mid its x), with the aliasing of
// CheckLinearAddRMSNormLinear.
func CheckLinearAddRMSNormLinearSwiGLU(act DType, mid, x, w0, bias0, out, h, resid, norm, w *Tensor) {
	op := OpLinearNormSwiGLU
	checkLinearMid(op, act, mid, x, w0, bias0)
	checkAddRMSNormLinearSwiGLU(op, act, out, h, resid, mid, norm, w)
	need(!same(out, x), op, "out aliases x")
	need(!same(mid, resid), op, "mid aliases resid")
}

// The cost of LinearAddRMSNormLinearSwiGLU is its parts' FLOPs and the
// bytes of one pass, as LinearAddRMSNormLinear's.
func (k costOf) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w *Tensor) {
	first, second := linearCost(mid, x, w0, bias0), linearCost(out, h, w, nil)
	nc := normCost(mid, norm, true)
	*k.c = Cost{FLOPs: first.FLOPs + nc.FLOPs + second.FLOPs + swigluCost(out).FLOPs,
		Bytes: size(x) + size(w0) + size(bias0) + size(mid) + 2*size(resid) + size(norm) + size(w) + size(out)}
}

// checkLinearMid is the first projection's contract for op, which then
// adds its output mid into the residual: mid [N,K] act, not x; x [N,K0]
// act; w0 [K,K0] float; bias0 [K] float or nil.
func checkLinearMid(op Op, act DType, mid, x, w0, bias0 *Tensor) {
	needActs(op, act, "mid", mid, "x", x)
	need(IsFloat(w0) && w0.Cols() == x.Cols(), op, "w0 %v for x %v", w0, x)
	need(rowsCols(mid, x.Rows(), w0.Rows()), op, "mid %v for x %v, w0 %v", mid, x, w0)
	need(bias0 == nil || IsFloat(bias0) && bias0.Numel() == w0.Rows(), op, "bias0 %v for w0 %v", bias0, w0)
	need(!same(mid, x), op, "mid aliases x")
}

// checkNormIn is AddRMSNorm's contract for op, which does its work first:
// h, resid, x [N,K] act, h aliasing neither; norm [K] float.
func checkNormIn(op Op, act DType, h, resid, x, norm *Tensor) {
	n, d := resid.Rows(), resid.Cols()
	needActs(op, act, "h", h, "resid", resid, "x", x)
	need(rowsCols(h, n, d) && rowsCols(x, n, d), op, "h %v, resid %v, x %v", h, resid, x)
	need(!same(h, resid) && !same(h, x), op, "h aliases resid or x")
	need(IsFloat(norm) && norm.Numel() == d, op, "norm %v for rows of %d", norm, d)
}

// Check checks the batch's host tables and device mirrors for a step of
// tokens new tokens; a prefill also checks that every row's new tokens fit
// its cache (decode lengths live on the device: kernels check them there).
func (b *Batch) Check(op Op, tokens int, prefill bool) {
	need(b != nil && b.Rows >= 0 && len(b.Start) == b.Rows+1 && len(b.Past) == b.Rows && b.Start[0] == 0 &&
		b.Start[b.Rows] == b.Tokens && b.Tokens == tokens, op, "batch tables do not describe %d tokens", tokens)
	need(isInts(b.StartDev, b.Rows+1) && isInts(b.PastDev, b.Rows), op, "batch device tables missing or of the wrong size")
	if !prefill {
		need(b.Tokens == b.Rows, op, "decode of %d tokens for %d rows", b.Tokens, b.Rows)
		return
	}
	for r := range b.Rows {
		n := b.Start[r+1] - b.Start[r]
		need(n >= 0 && b.Past[r] >= 0 && b.Past[r]+n <= b.MaxSeq, op,
			"row %d: %d cached + %d new tokens exceed the cache's %d", r, b.Past[r], n, b.MaxSeq)
	}
}

// cacheFor reports whether cache is a packed [B, heads, MaxSeq, dim] act
// tensor for batch b.
func cacheFor(cache *Tensor, act DType, b *Batch, heads, dim int) bool {
	return isAct(cache, act) && cache.Packed() && cache.Cols() == dim && cache.Rows() == b.Rows*heads*b.MaxSeq
}

// Check checks the operands of an attention op (see AttnArgs): all of one
// element type, act, or, for a prefill, one of also: the other types the
// caller's kernels take (f16, where a set measures attention in it for the
// kernel benchmarks; a model's attention runs on its activations).
func (a *AttnArgs) Check(op Op, act DType, prefill bool, also ...DType) {
	b := a.Batch
	b.Check(op, a.Q.Rows(), prefill)
	need(a.KVHeads > 0 && a.Heads%a.KVHeads == 0 && a.HeadDim > 0, op,
		"%d heads over %d kv heads of %d dims", a.Heads, a.KVHeads, a.HeadDim)
	qw, kw := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	dt := act
	if prefill && slices.Contains(also, a.Q.DType) {
		dt = a.Q.DType
	}
	needActs(op, dt, "Q", a.Q, "Out", a.Out, "K", a.K, "V", a.V)
	need(a.Q.Cols() == qw, op, "q %v", a.Q)
	need(rowsCols(a.Out, b.Tokens, qw), op, "out %v", a.Out)
	for _, t := range []*Tensor{a.K, a.V} {
		need(rowsCols(t, b.Tokens, kw), op, "new keys or values %v", t)
	}
	for _, t := range []*Tensor{a.KCache, a.VCache} {
		need(cacheFor(t, dt, b, a.KVHeads, a.HeadDim), op, "cache %v for %d rows × %d kv heads × %d positions × %d",
			t, b.Rows, a.KVHeads, b.MaxSeq, a.HeadDim)
	}
}

func (k costOf) AttentionPrefill(a *AttnArgs) { *k.c = attnCost(a, false) }
func (k costOf) AttentionDecode(a *AttnArgs)  { *k.c = attnCost(a, true) }

// CheckRoPEAttnDecode: a as AttentionDecode's, with a.Q and a.K (sharing
// no element) rotated over dims [0, r.Dim) of each head as RoPE would
// rotate them; pos [T] i32; the tables as RoPE's.
func CheckRoPEAttnDecode(act DType, a *AttnArgs, pos *Tensor, r *Rope) {
	op := OpRoPEAttnDecode
	a.Check(op, act, false)
	checkRoPE(op, act, a.Q, a.Heads, a.HeadDim, 0, pos, r)
	checkRoPE(op, act, a.K, a.KVHeads, a.HeadDim, 0, pos, r)
	need(apart(a.Q, a.K), op, "q %v and k %v share elements", a.Q, a.K)
}

// The cost of RoPEAttentionDecode is its parts': the attention's, and the
// rotations' arithmetic and bytes (a set that rotates as it loads moves
// fewer).
func (k costOf) RoPEAttentionDecode(a *AttnArgs, pos *Tensor, r *Rope) {
	at, qr, kr := attnCost(a, true), ropeCost(a.Q, a.Heads, r), ropeCost(a.K, a.KVHeads, r)
	*k.c = Cost{FLOPs: at.FLOPs + qr.FLOPs + kr.FLOPs, Bytes: at.Bytes + qr.Bytes + kr.Bytes}
}

// Check checks the operands of an MLA op (see MLAArgs).
func (a *MLAArgs) Check(op Op, act DType, prefill bool) {
	b := a.Batch
	b.Check(op, a.Q.Rows(), prefill)
	need(a.Heads > 0 && a.NopeDim > 0 && a.RopeDim > 0 && a.VDim > 0 && a.Rank > 0, op,
		"%d heads, dims nope %d rope %d v %d rank %d", a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank)
	width := a.Rank + a.RopeDim
	needActs(op, act, "Q", a.Q, "KV", a.KV, "Out", a.Out)
	need(a.Q.Cols() == a.Heads*(a.NopeDim+a.RopeDim), op, "q %v", a.Q)
	need(rowsCols(a.KV, b.Tokens, width), op, "new latents %v", a.KV)
	need(rowsCols(a.Out, b.Tokens, a.Heads*a.VDim), op, "out %v", a.Out)
	need(cacheFor(a.Cache, act, b, 1, width), op, "cache %v for %d rows × %d positions × %d", a.Cache, b.Rows, b.MaxSeq, width)
	need(IsFloat(a.WKVB) && rowsCols(a.WKVB, a.Heads*(a.NopeDim+a.VDim), a.Rank), op, "kv_b_proj %v", a.WKVB)
}

func (k costOf) MLAPrefill(a *MLAArgs) { *k.c = mlaCost(a, false) }
func (k costOf) MLADecode(a *MLAArgs)  { *k.c = mlaCost(a, true) }

// CheckMLADecodeRoPE: a as MLADecode's; w [a.Rank] float; pos [T] i32;
// r's rotated dims a.RopeDim; and RMSNormRoPE's contract for q = a.Q,
// kv = a.KV with a.Heads heads of NopeDim+RopeDim rotated from NopeDim.
func CheckMLADecodeRoPE(act DType, a *MLAArgs, w *Tensor, pos *Tensor, r *Rope) {
	op := OpMLADecodeRoPE
	a.Check(op, act, false)
	need(r != nil && r.Dim == a.RopeDim, op, "rotated dims %v for rope dims %d", r, a.RopeDim)
	need(w.Numel() == a.Rank, op, "norm weights %v for rank %d", w, a.Rank)
	checkRMSNormRoPE(op, act, a.Q, a.KV, w, a.Heads, a.NopeDim+a.RopeDim, a.NopeDim, pos, r)
}

// The cost of MLADecodeRoPE is its parts': RMSNormRoPE's and MLADecode's.
func (k costOf) MLADecodeRoPE(a *MLAArgs, w *Tensor, eps float32, pos *Tensor, r *Rope) {
	var nr Cost
	costOf{&nr}.RMSNormRoPE(a.Q, a.KV, w, eps, a.Heads, a.NopeDim+a.RopeDim, a.NopeDim, pos, r)
	m := mlaCost(a, true)
	*k.c = Cost{FLOPs: nr.FLOPs + m.FLOPs, Bytes: nr.Bytes + m.Bytes}
}

// CheckMoERoute: logits [N,E] f32; idx [N,K] i32; weight [N,K] f32; the
// routing fits E experts.
func CheckMoERoute(idx, weight, logits *Tensor, r *Routing) {
	op := OpMoERoute
	n, e, k := logits.Rows(), logits.Cols(), r.TopK
	need(logits.DType == F32, op, "logits are %v, want f32", logits)
	need(k > 0 && k <= e, op, "top-%d of %d experts", k, e)
	need(idx.DType == I32 && rowsCols(idx, n, k), op, "idx %v for top-%d of %v", idx, k, logits)
	need(weight.DType == F32 && rowsCols(weight, n, k), op, "weight %v for top-%d of %v", weight, k, logits)
	switch r.Method {
	case RouteGreedy:
	case RouteGroupLimited:
		need(r.Groups > 0 && e%r.Groups == 0 && r.TopKGroups > 0 && r.TopKGroups <= r.Groups, op,
			"%d experts in %d groups, top %d groups", e, r.Groups, r.TopKGroups)
	default:
		need(false, op, "unknown routing method %d", r.Method)
	}
}

func (k costOf) MoERoute(idx, weight, logits *Tensor, r *Routing) {
	*k.c = Cost{Bytes: size(logits) + size(idx) + size(weight)}
}

// CheckMoEExperts: out, x [N,H] act; idx [N,K] i32; weight [N,K] f32;
// gateUp [E,2I,H] and down [E,H,I] packed float.
func CheckMoEExperts(act DType, out, x, idx, weight, gateUp, down *Tensor) {
	op := OpMoEExperts
	n, h := x.Rows(), x.Cols()
	needActs(op, act, "out", out, "x", x)
	need(rowsCols(out, n, h), op, "out %v, x %v", out, x)
	need(idx.DType == I32 && idx.Rows() == n && weight.DType == F32 && rowsCols(weight, n, idx.Cols()), op,
		"idx %v, weight %v for %d tokens", idx, weight, n)
	need(IsFloat(gateUp) && gateUp.Packed() && len(gateUp.Shape) == 3 && gateUp.Shape[2] == h &&
		gateUp.Shape[1] > 0 && gateUp.Shape[1]%2 == 0, op, "gateUp %v for hidden size %d", gateUp, h)
	e, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	need(IsFloat(down) && down.Packed() && len(down.Shape) == 3 && down.Shape[0] == e && down.Shape[1] == h &&
		down.Shape[2] == inter, op, "down %v for gateUp %v", down, gateUp)
}

func (k costOf) MoEExperts(out, x, idx, weight, gateUp, down *Tensor) {
	*k.c = moeCost(out, idx, gateUp, down)
}

// CheckMoERouted: MoERoute's contract and MoEExperts', over the same E
// experts: logits [N,E], gateUp [E,2I,H].
func CheckMoERouted(act DType, out, idx, weight, x, logits, gateUp, down *Tensor, r *Routing) {
	CheckMoERoute(idx, weight, logits, r)
	CheckMoEExperts(act, out, x, idx, weight, gateUp, down)
	need(logits.Cols() == gateUp.Shape[0], OpMoERouted, "logits %v for %d experts", logits, gateUp.Shape[0])
}

// The cost of MoERouted is the experts' and the router's: MoEExperts'
// work, the logits read and the routes written.
func (k costOf) MoERouted(out, idx, weight, x, logits, gateUp, down *Tensor, r *Routing) {
	c := moeCost(out, idx, gateUp, down)
	c.Bytes += size(logits) + size(idx) + size(weight)
	*k.c = c
}

// CheckGroupGemm: out [M,N] act; x [M,K] act; w [E,N,K] packed float;
// first [E+1] i32.
func CheckGroupGemm(act DType, out, x, w, first *Tensor) {
	op := OpGroupGemm
	needActs(op, act, "out", out, "x", x)
	need(IsFloat(w) && w.Packed() && len(w.Shape) == 3 && w.Shape[0] > 0 && w.Shape[2] == x.Cols(), op,
		"w %v for x %v", w, x)
	need(rowsCols(out, x.Rows(), w.Shape[1]), op, "out %v for x %v, w %v", out, x, w)
	need(isInts(first, w.Shape[0]+1), op, "first %v for %d groups", first, w.Shape[0])
}

func (k costOf) GroupGemm(out, x, w, first *Tensor) { *k.c = groupGemmCost(out, x, w) }

// CheckArgmax: out [B] or [B,2] i32; logits [B,V] f32 or act, V > 0.
func CheckArgmax(act DType, out, logits *Tensor) {
	need(logits.DType == F32 || logits.DType == act, OpArgmax, "logits are %v", logits)
	B := logits.Rows()
	need(logits.Cols() > 0 && (isInts(out, B) || isInts(out, 2*B) && rowsCols(out, B, 2)), OpArgmax, "out %v for logits %v", out, logits)
}

func (k costOf) Argmax(out, logits *Tensor) { *k.c = Cost{Bytes: size(logits) + size(out)} }

// CheckDecodeAdvance: ids, pos, past [B] i32, B ≥ 1; choice [B,2] i32; all
// packed, no two sharing an element.
func CheckDecodeAdvance(ids, pos, past, choice *Tensor) {
	op := OpDecodeAdvance
	need(past != nil && past.Numel() > 0, op, "past %v: no rows", past)
	B := past.Numel()
	need(isInts(past, B), op, "past is %v, want packed i32", past)
	need(isInts(ids, B), op, "ids %v for past %v", ids, past)
	need(isInts(pos, B), op, "pos %v for past %v", pos, past)
	need(isInts(choice, 2*B) && rowsCols(choice, B, 2), op, "choice %v for past %v", choice, past)
	named := []struct {
		name string
		t    *Tensor
	}{{"ids", ids}, {"pos", pos}, {"past", past}, {"choice", choice}}
	for i, a := range named {
		for _, b := range named[i+1:] {
			need(apart(a.t, b.t), op, "%s %v and %s %v share elements", a.name, a.t, b.name, b.t)
		}
	}
}

// The cost of DecodeAdvance is the chosen tokens read (choice's first
// column), past read and written, and ids and pos written.
func (k costOf) DecodeAdvance(ids, pos, past, choice *Tensor) {
	*k.c = Cost{Bytes: size(choice)/2 + 2*size(past) + size(ids) + size(pos)}
}
