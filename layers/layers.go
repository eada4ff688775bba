// Package layers holds the building blocks of the models, written against
// kernels.Ops: Linear, Embedding, RMSNorm, Attention (GQA), MLA, MLP
// (SwiGLU) and MoE. Their fields mirror the module names of HF transformers'
// modeling files (q_a_proj → QAProj, kv_a_proj_with_mqa → KVAProjWithMQA,
// ...), with three fusions made at load time: Attention.QKVProj is q_proj,
// k_proj and v_proj stacked, MLP.GateUpProj is gate_proj and up_proj
// stacked, and MLA.QKVAProjWithMQA (without q LoRA) is q_proj and
// kv_a_proj_with_mqa stacked.
//
// A layer owns its weights as device tensors; it never allocates during a
// forward step. Temporaries come from a Workspace sized once for the largest
// step, so that a decode step touches the same device addresses every time
// (which lets a CUDA graph replay it).
package layers

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
)

// Step is what a layer needs to know about the forward step it runs in.
type Step struct {
	Ops kernels.Ops
	WS  *Workspace

	// Batch is the packed batch of new tokens. Its rows are cache rows
	// Row0, Row0+1, ... of every layer's cache.
	Batch *kernels.Batch
	Row0  int
	// Pos holds the position of every new token, [T] i32: Past[b]+i for
	// token i of row b.
	Pos *kernels.Tensor
	// Decode is true for a step of exactly one new token per row, which
	// uses the decode attention kernels (they read row lengths from the
	// device only).
	Decode bool
	// Side runs work beside the step's chain (Aside); nil queues it in
	// order.
	Side kernels.Brancher
}

// Aside queues the ops f calls beside those that follow, through s.Side,
// and returns what makes later ops wait for them; without a Side, f runs
// here and join does nothing.
func (s *Step) Aside(f func()) (join func()) {
	if s.Side == nil {
		f()
		return func() {}
	}
	return s.Side.Aside(f)
}

// Tokens is the number of new tokens of the step, T.
func (s *Step) Tokens() int { return s.Batch.Tokens }

// CacheRows returns the view of the cache rows this step's batch uses:
// indices [Row0, Row0+Rows) of the first dimension of cache.
func (s *Step) CacheRows(cache *kernels.Tensor) *kernels.Tensor {
	return cache.Slice(s.Row0, s.Row0+s.Batch.Rows)
}

// Workspace holds the scratch tensors of the layers, shared by all of them
// (layers run one after the other). Each buffer is reserved by name with the
// widest row any layer needs, then allocated once for the largest step.
type Workspace struct {
	rows int
	res  map[string]reservation
	bufs map[string]*kernels.Tensor
}

type reservation struct {
	dt   kernels.DType
	cols int
}

// NewWorkspace returns an empty workspace.
func NewWorkspace() *Workspace {
	return &Workspace{res: map[string]reservation{}, bufs: map[string]*kernels.Tensor{}}
}

// Reserve asks for buffer name to hold up to cols elements of type dt per
// token. Reserving a name again keeps the widest.
func (w *Workspace) Reserve(name string, dt kernels.DType, cols int) {
	if w.bufs[name] != nil {
		panic("layers: workspace buffer " + name + " reserved after allocation")
	}
	r, ok := w.res[name]
	if ok && r.dt != dt {
		panic(fmt.Sprintf("layers: workspace buffer %s reserved as %s and %s", name, r.dt, dt))
	}
	w.res[name] = reservation{dt: dt, cols: max(r.cols, cols)}
}

// Alloc allocates every reserved buffer for steps of up to rows tokens and
// returns them, for the caller to free.
func (w *Workspace) Alloc(dev kernels.Device, rows int) []*kernels.Tensor {
	w.rows = rows
	var out []*kernels.Tensor
	for name, r := range w.res {
		t := dev.Alloc(r.dt, rows, r.cols)
		w.bufs[name] = t
		out = append(out, t)
	}
	return out
}

// Bytes is the device memory the reserved buffers take for steps of up to
// rows tokens.
func (w *Workspace) Bytes(rows int) int64 {
	var n int64
	for _, r := range w.res {
		n += int64(rows) * int64(r.cols) * int64(r.dt.Size())
	}
	return n
}

// Get returns buffer name as a packed [rows, cols] tensor over the start of
// its storage.
func (w *Workspace) Get(name string, rows, cols int) *kernels.Tensor {
	b := w.bufs[name]
	if b == nil {
		panic("layers: workspace buffer " + name + " was not reserved and allocated")
	}
	if rows > w.rows || cols > b.Cols() {
		panic(fmt.Sprintf("layers: workspace buffer %s is [%d,%d], asked for [%d,%d]", name, w.rows, b.Cols(), rows, cols))
	}
	return kernels.NewTensor(b.Buf, b.DType, b.Offset, rows, cols)
}

// Linear is nn.Linear: out = x · Weightᵀ + Bias.
type Linear struct {
	Weight *kernels.Tensor // [out_features, in_features]
	Bias   *kernels.Tensor // [out_features], or nil
}

// OutFeatures is the width of the output.
func (l *Linear) OutFeatures() int { return l.Weight.Shape[0] }

// Forward computes out [T, out_features] from x [T, in_features]; out may be
// f32 or act.
func (l *Linear) Forward(s *Step, out, x *kernels.Tensor) {
	s.Ops.Linear(out, x, l.Weight, l.Bias)
}

// Embedding is nn.Embedding: out[i] = Weight[ids[i]].
type Embedding struct {
	Weight *kernels.Tensor // [vocab_size, hidden_size]
}

// Forward gathers the rows of ids [T] i32 into out [T, hidden_size].
func (e *Embedding) Forward(s *Step, out, ids *kernels.Tensor) {
	s.Ops.Embedding(out, e.Weight, ids)
}

// RMSNorm is HF's *RMSNorm: x / sqrt(mean(x²) + Eps) · Weight, the
// normalisation in f32.
type RMSNorm struct {
	Weight *kernels.Tensor // [hidden_size]
	Eps    float32
}

// Forward computes out = RMSNorm(x); out may be x, and both may be pitched.
func (n *RMSNorm) Forward(s *Step, out, x *kernels.Tensor) {
	s.Ops.RMSNorm(out, x, n.Weight, n.Eps)
}

// AddForward is the residual connection before the norm: resid += x, then
// out = RMSNorm(resid).
func (n *RMSNorm) AddForward(s *Step, out, resid, x *kernels.Tensor) {
	s.Ops.AddRMSNorm(out, resid, x, n.Weight, n.Eps)
}

// AddAddForward is AddForward of a block output that comes in two parts:
// resid += x + y (the sum rounded first, as an add of the two would), then
// out = RMSNorm(resid). x may be left holding the sum.
func (n *RMSNorm) AddAddForward(s *Step, out, resid, x, y *kernels.Tensor) {
	s.Ops.AddAddRMSNorm(out, resid, x, y, n.Weight, n.Eps)
}

// NormIn is a block's input as the layer makes it: the residual stream
// Resid, after adding the previous block's output Add (nil where there is
// none: the first layer's), normalised by Norm into H. Where Pending is
// set, the block before left work to this one: its last projection, whose
// output Add is then, not yet computed, or a second part of its output,
// Pending.Also, to add with Add. A block that takes its input whole
// (NormFirst) hands it to its first projection, an op a set may run as one
// kernel that normalises its input as it loads it (and, with a pending
// projection, computes Add first in the same kernel); the others, and
// those given a second part, take Ready's H.
type NormIn struct {
	H, Resid, Add *kernels.Tensor
	Pending       *Pending
	Norm          *RMSNorm
}

// Ready computes the input into H (Pending's projection into Add first,
// where there is one; Resid += Add, where Add is set, and + Pending.Also
// where that is set) and returns H.
func (in NormIn) Ready(s *Step) *kernels.Tensor {
	p := in.Pending
	if p != nil {
		p.Forward(s, in.Add)
	}
	switch {
	case in.Add == nil:
		in.Norm.Forward(s, in.H, in.Resid)
	case p != nil && p.Also != nil:
		in.Norm.AddAddForward(s, in.H, in.Resid, in.Add, p.Also)
	default:
		in.Norm.AddForward(s, in.H, in.Resid, in.Add)
	}
	return in.H
}

// Pending is what a block left undone for the block after it to take with
// its own first op (Deferring): its last projection, Proj of X (nil where
// it wrote its output), and Also, where set, a second part of its output,
// which the next NormIn adds into the residual with the first
// (AddAddForward): the MoE's shared experts' output, computed beside the
// routed experts'.
type Pending struct {
	Proj *Linear
	X    *kernels.Tensor
	Also *kernels.Tensor
}

// Forward runs the projection, if there is one, into out.
func (p *Pending) Forward(s *Step, out *kernels.Tensor) {
	if p.Proj != nil {
		p.Proj.Forward(s, out, p.X)
	}
}

// NormFirst is a Mixer or FFN that takes its input's residual add and norm
// with its first projection: ForwardNorm is Forward(s, out, in.Ready(s)),
// but for the ops it calls. out may be in.Add (read, after Pending wrote
// it, before out is written).
type NormFirst interface {
	ForwardNorm(s *Step, out *kernels.Tensor, in NormIn)
}

// Deferring is a block that can leave the end of its work to the block
// after it: ForwardDefer does Forward's work on in (ForwardNorm's, for a
// NormFirst block) but its last projection into out, or the sum of its
// output's two parts, which it returns instead (its X, or its Also, stays
// untouched until the next block's first op has read it); nil where it
// wrote out whole. The next block's NormIn then has Add out and the
// returned Pending.
type Deferring interface {
	ForwardDefer(s *Step, out *kernels.Tensor, in NormIn) *Pending
}

// Forward runs block b (a Mixer or an FFN) on in into out: through
// ForwardNorm where b takes its norm with it, else on in.Ready(s).
func Forward(s *Step, b interface {
	Forward(s *Step, out, x *kernels.Tensor)
}, out *kernels.Tensor, in NormIn) {
	if n, ok := b.(NormFirst); ok {
		n.ForwardNorm(s, out, in)
		return
	}
	b.Forward(s, out, in.Ready(s))
}

// ForwardDefer is Forward, but where b is Deferring its last projection is
// left undone and returned, for the next block's NormIn (Add out); nil
// where b wrote out.
func ForwardDefer(s *Step, b interface {
	Forward(s *Step, out, x *kernels.Tensor)
}, out *kernels.Tensor, in NormIn) *Pending {
	if d, ok := b.(Deferring); ok {
		return d.ForwardDefer(s, out, in)
	}
	Forward(s, b, out, in)
	return nil
}

// Mixer is a token-mixing block: Attention or MLA. Forward maps x [T, H] to
// out [T, H], reading and extending the layer's cache; Reserve asks the
// workspace for its temporaries, given the activation type.
type Mixer interface {
	Reserve(ws *Workspace, act kernels.DType)
	Forward(s *Step, out, x *kernels.Tensor)
}

// FFN is a per-token block: MLP or MoE, with the methods of Mixer.
type FFN interface {
	Reserve(ws *Workspace, act kernels.DType)
	Forward(s *Step, out, x *kernels.Tensor)
}

// DecoderLayer is one transformer block, as HF's *DecoderLayer:
//
//	h = x + self_attn(input_layernorm(x))
//	out = h + mlp(post_attention_layernorm(h))
type DecoderLayer struct {
	InputLayernorm         RMSNorm
	SelfAttn               Mixer
	PostAttentionLayernorm RMSNorm
	MLP                    FFN
}
