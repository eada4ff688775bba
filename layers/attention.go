package layers

import "github.com/fuselm/fuselm/kernels"

// Workspace buffers of Attention.
const (
	bufQKV  = "attn.qkv" // [T, (Heads+2·KVHeads)·HeadDim] act
	bufAttn = "attn.out" // [T, Heads·HeadDim] act, the attention output before o_proj
)

// Attention is grouped-query attention with rotary embeddings over a KV
// cache, as HF's Qwen2Attention:
//
//	q, k, v = q_proj(x), k_proj(x), v_proj(x)      (one Linear: QKVProj)
//	q, k = rope(q), rope(k)                         (one RoPE call over the q and k heads)
//	out = o_proj(softmax(q·kᵀ·Scale) · v)           (keys and values from the cache)
//
// At decode the rope and the attention are one op, RoPEAttentionDecode,
// which a set may run as one kernel; q and k may then stay unrotated in
// the qkv buffer, which nothing reads after the attention.
type Attention struct {
	// QKVProj is q_proj, k_proj and v_proj stacked: weight
	// [(Heads+2·KVHeads)·HeadDim, hidden], rows q then k then v (and the
	// biases likewise).
	QKVProj Linear
	OProj   Linear // o_proj: [hidden, Heads·HeadDim]

	Heads   int
	KVHeads int
	HeadDim int
	Scale   float32 // head_dim^-0.5
	Rope    *kernels.Rope

	// KCache and VCache are this layer's cache, [MaxRows, KVHeads, MaxSeq,
	// HeadDim] act each.
	KCache, VCache *kernels.Tensor
}

// Reserve asks ws for the buffers Forward uses.
func (a *Attention) Reserve(ws *Workspace, act kernels.DType) {
	ws.Reserve(bufQKV, act, a.QKVProj.OutFeatures())
	ws.Reserve(bufAttn, act, a.Heads*a.HeadDim)
}

// Forward computes out [T, hidden] from x [T, hidden], appending the new
// keys and values to the cache.
func (a *Attention) Forward(s *Step, out, x *kernels.Tensor) {
	a.OProj.Forward(s, out, a.attend(s, func(qkv *kernels.Tensor) { a.QKVProj.Forward(s, qkv, x) }))
}

// ForwardNorm is Forward on in.Ready(s), the residual add and the norm
// taken with the qkv projection where in has an add (see ForwardDefer).
func (a *Attention) ForwardNorm(s *Step, out *kernels.Tensor, in NormIn) {
	a.ForwardDefer(s, out, in).Forward(s, out)
}

// ForwardDefer is ForwardNorm but for o_proj, which it returns: the qkv
// projection takes the residual add and the norm with it
// (AddRMSNormLinear) where in has an add, and the block before's pending
// projection too (LinearAddRMSNormLinear) where in has one.
func (a *Attention) ForwardDefer(s *Step, out *kernels.Tensor, in NormIn) *Pending {
	attn := a.attend(s, func(qkv *kernels.Tensor) {
		switch p := in.Pending; {
		case in.Add == nil, p != nil && p.Also != nil: // no add, or two parts to add: no projection op takes them
			a.QKVProj.Forward(s, qkv, in.Ready(s))
		case p != nil:
			s.Ops.LinearAddRMSNormLinear(in.Add, p.X, p.Proj.Weight, p.Proj.Bias,
				qkv, in.H, in.Resid, in.Norm.Weight, in.Norm.Eps, a.QKVProj.Weight, a.QKVProj.Bias)
		default:
			s.Ops.AddRMSNormLinear(qkv, in.H, in.Resid, in.Add, in.Norm.Weight, in.Norm.Eps, a.QKVProj.Weight, a.QKVProj.Bias)
		}
	})
	return &Pending{Proj: &a.OProj, X: attn}
}

// attend is the attention up to o_proj, the qkv projection done by
// project: it returns the attention's output [T, Heads·HeadDim], in the
// workspace.
func (a *Attention) attend(s *Step, project func(qkv *kernels.Tensor)) *kernels.Tensor {
	T := s.Tokens()
	qDim, kvDim := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	qkv := s.WS.Get(bufQKV, T, qDim+2*kvDim)
	project(qkv)

	attn := s.WS.Get(bufAttn, T, qDim)
	args := &kernels.AttnArgs{
		Out:     attn,
		Q:       qkv.ColSlice(0, qDim),
		K:       qkv.ColSlice(qDim, qDim+kvDim),
		V:       qkv.ColSlice(qDim+kvDim, qDim+2*kvDim),
		KCache:  s.CacheRows(a.KCache),
		VCache:  s.CacheRows(a.VCache),
		Batch:   s.Batch,
		Heads:   a.Heads,
		KVHeads: a.KVHeads,
		HeadDim: a.HeadDim,
		Scale:   a.Scale,
	}
	if s.Decode {
		s.Ops.RoPEAttentionDecode(args, s.Pos, a.Rope)
	} else {
		// q and k heads are contiguous at the start of each row: rotate
		// them all at once.
		s.Ops.RoPE(qkv, a.Heads+a.KVHeads, a.HeadDim, 0, s.Pos, a.Rope)
		s.Ops.AttentionPrefill(args)
	}
	return attn
}
