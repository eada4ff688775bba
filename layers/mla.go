package layers

import "github.com/fuselm/fuselm/kernels"

// Workspace buffers of MLA.
const (
	bufMLAQKVA = "mla.q_kv_a" // [T, Heads·(NopeDim+RopeDim) + Rank+RopeDim] act: q then the kv latent, without q LoRA
	bufMLAQA   = "mla.q_a"    // [T, q_lora_rank] act
	bufMLAQ    = "mla.q"      // [T, Heads·(NopeDim+RopeDim)] act, with q LoRA
	bufMLAKV   = "mla.kv"     // [T, Rank+RopeDim] act, with q LoRA: the compressed kv and the shared rope key
	bufMLAOut  = "mla.out"    // [T, Heads·VDim] act, the attention output before o_proj
)

// MLA is DeepSeek-V2's multi-head latent attention, as HF's
// DeepseekV2Attention:
//
//	q = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))   [T, Heads, Nope+Rope]
//	kv_nope, k_pe = split(kv_a_proj_with_mqa(x), [Rank, Rope])
//	kv_nope = kv_a_layernorm(kv_nope)                          (in place)
//	q_pe, k_pe = rope(q_pe), rope(k_pe)                         (interleaved pairs)
//	out = o_proj(attention over the cache of (kv_nope, k_pe), expanded by kv_b_proj)
//
// The norm and the two ropes are one op, RMSNormRoPE, which a kernel set
// may run in one launch; at decode they and the attention are one op,
// MLADecodeRoPE, so that a set may fold the attention's first step into
// that launch too.
//
// Without q LoRA, q_proj and kv_a_proj_with_mqa are one Linear
// (QKVAProjWithMQA) whose output row holds q then the latent: q and kv are
// column views of it, pitched, and every op after the projection reads and
// writes them in place there. With q LoRA they are apart, each in a packed
// buffer of its own.
//
// The cache keeps the latent (kv_nope, k_pe) per token, as HF 5.x does; the
// MLA kernels expand it with kv_b_proj.
type MLA struct {
	// QKVAProjWithMQA is q_proj and kv_a_proj_with_mqa stacked, when
	// q_lora_rank is null: weight [Heads·(Nope+Rope) + Rank+Rope, hidden],
	// q_proj's rows first (and a bias likewise, zero over q_proj's rows,
	// which HF gives none). nil with q LoRA.
	QKVAProjWithMQA *Linear
	QAProj          *Linear  // q_a_proj [q_lora_rank, hidden]; nil without q LoRA
	QALayernorm     *RMSNorm // q_a_layernorm [q_lora_rank]
	QBProj          *Linear  // q_b_proj [Heads·(Nope+Rope), q_lora_rank]
	KVAProjWithMQA  *Linear  // kv_a_proj_with_mqa [Rank+Rope, hidden]; nil without q LoRA (it is in QKVAProjWithMQA)
	KVALayernorm    RMSNorm  // kv_a_layernorm [Rank]
	KVBProj         Linear   // kv_b_proj [Heads·(Nope+V), Rank]; used by the kernels as MLAArgs.WKVB
	OProj           Linear   // o_proj [hidden, Heads·V]

	Heads   int
	NopeDim int // qk_nope_head_dim
	RopeDim int // qk_rope_head_dim
	VDim    int // v_head_dim
	Rank    int // kv_lora_rank
	Scale   float32
	Rope    *kernels.Rope

	// Cache is this layer's latent cache, [MaxRows, MaxSeq, Rank+RopeDim] act.
	Cache *kernels.Tensor
}

// Reserve asks ws for the buffers Forward uses.
func (m *MLA) Reserve(ws *Workspace, act kernels.DType) {
	if m.QKVAProjWithMQA != nil {
		ws.Reserve(bufMLAQKVA, act, m.QKVAProjWithMQA.OutFeatures())
	} else {
		ws.Reserve(bufMLAQA, act, m.QAProj.OutFeatures())
		ws.Reserve(bufMLAQ, act, m.Heads*(m.NopeDim+m.RopeDim))
		ws.Reserve(bufMLAKV, act, m.Rank+m.RopeDim)
	}
	ws.Reserve(bufMLAOut, act, m.Heads*m.VDim)
}

// Forward computes out [T, hidden] from x [T, hidden], appending the new
// latents to the cache.
func (m *MLA) Forward(s *Step, out, x *kernels.Tensor) {
	m.forward(s, out, x, nil)
}

// ForwardNorm is Forward on in.Ready(s), but where in joins a block's
// output that comes in two parts (the MoE's, Pending.Also) and the
// attention stacks q and kv_a in one projection, the join, the norm and
// that projection are one op, add_add_rms_norm_linear, which a set may
// run so that the projection's weights stream in before the norm (fused,
// at decode's rows).
func (m *MLA) ForwardNorm(s *Step, out *kernels.Tensor, in NormIn) {
	p := in.Pending
	if m.QKVAProjWithMQA == nil || in.Add == nil || p == nil || p.Also == nil || p.Proj != nil {
		m.Forward(s, out, in.Ready(s))
		return
	}
	proj := m.QKVAProjWithMQA
	m.forward(s, out, in.H, func(qkva *kernels.Tensor) {
		s.Ops.AddAddRMSNormLinear(qkva, in.H, in.Resid, in.Add, p.Also, in.Norm.Weight, in.Norm.Eps, proj.Weight, proj.Bias)
	})
}

// forward is Forward of x, the stacked q and kv_a projection written by
// project where it is set (which also leaves x), else computed from x.
func (m *MLA) forward(s *Step, out, x *kernels.Tensor, project func(qkva *kernels.Tensor)) {
	T := s.Tokens()
	qk := m.NopeDim + m.RopeDim
	qDim, kvDim := m.Heads*qk, m.Rank+m.RopeDim
	var q, kv *kernels.Tensor
	if m.QKVAProjWithMQA != nil {
		qkva := s.WS.Get(bufMLAQKVA, T, qDim+kvDim)
		if project != nil {
			project(qkva)
		} else {
			m.QKVAProjWithMQA.Forward(s, qkva, x)
		}
		q, kv = qkva.ColSlice(0, qDim), qkva.ColSlice(qDim, qDim+kvDim)
	} else {
		qa := s.WS.Get(bufMLAQA, T, m.QAProj.OutFeatures())
		m.QAProj.Forward(s, qa, x)
		m.QALayernorm.Forward(s, qa, qa)
		q = s.WS.Get(bufMLAQ, T, qDim)
		m.QBProj.Forward(s, q, qa)
		kv = s.WS.Get(bufMLAKV, T, kvDim)
		m.KVAProjWithMQA.Forward(s, kv, x)
	}
	attn := s.WS.Get(bufMLAOut, T, m.Heads*m.VDim)
	args := &kernels.MLAArgs{
		Out:     attn,
		Q:       q,
		KV:      kv,
		Cache:   s.CacheRows(m.Cache),
		WKVB:    m.KVBProj.Weight,
		Batch:   s.Batch,
		Heads:   m.Heads,
		NopeDim: m.NopeDim,
		RopeDim: m.RopeDim,
		VDim:    m.VDim,
		Rank:    m.Rank,
		Scale:   m.Scale,
	}
	// kv_a_layernorm of the latent (kv's first Rank columns), and the rope
	// of q_pe (the last RopeDim of each head) and of k_pe (one head after
	// the latent), in place: one op, one launch where the set fuses it. At
	// decode the attention joins them in one op, so that a set may start
	// its first step (q_lat, from q_nope, which the norm and ropes leave)
	// in that same launch.
	if s.Decode {
		s.Ops.MLADecodeRoPE(args, m.KVALayernorm.Weight, m.KVALayernorm.Eps, s.Pos, m.Rope)
	} else {
		s.Ops.RMSNormRoPE(q, kv, m.KVALayernorm.Weight, m.KVALayernorm.Eps, m.Heads, qk, m.NopeDim, s.Pos, m.Rope)
		s.Ops.MLAPrefill(args)
	}
	m.OProj.Forward(s, out, attn)
}
