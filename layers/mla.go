package layers

import "github.com/fuselm/fuselm/kernels"

// Workspace buffers of MLA.
const (
	bufMLAQA  = "mla.q_a" // [T, q_lora_rank] act
	bufMLAQ   = "mla.q"   // [T, Heads·(NopeDim+RopeDim)] act
	bufMLAKV  = "mla.kv"  // [T, Rank+RopeDim] act: the compressed kv and the shared rope key
	bufMLAOut = "mla.out" // [T, Heads·VDim] act, the attention output before o_proj
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
// The cache keeps the latent (kv_nope, k_pe) per token, as HF 5.x does; the
// MLA kernels expand it with kv_b_proj.
type MLA struct {
	QProj          *Linear  // q_proj [Heads·(Nope+Rope), hidden]; nil when q_lora_rank is set
	QAProj         *Linear  // q_a_proj [q_lora_rank, hidden]
	QALayernorm    *RMSNorm // q_a_layernorm [q_lora_rank]
	QBProj         *Linear  // q_b_proj [Heads·(Nope+Rope), q_lora_rank]
	KVAProjWithMQA Linear   // kv_a_proj_with_mqa [Rank+Rope, hidden]
	KVALayernorm   RMSNorm  // kv_a_layernorm [Rank]
	KVBProj        Linear   // kv_b_proj [Heads·(Nope+V), Rank]; used by the kernels as MLAArgs.WKVB
	OProj          Linear   // o_proj [hidden, Heads·V]

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
	if m.QAProj != nil {
		ws.Reserve(bufMLAQA, act, m.QAProj.OutFeatures())
	}
	ws.Reserve(bufMLAQ, act, m.Heads*(m.NopeDim+m.RopeDim))
	ws.Reserve(bufMLAKV, act, m.Rank+m.RopeDim)
	ws.Reserve(bufMLAOut, act, m.Heads*m.VDim)
}

// Forward computes out [T, hidden] from x [T, hidden], appending the new
// latents to the cache.
func (m *MLA) Forward(s *Step, out, x *kernels.Tensor) {
	T := s.Tokens()
	qk := m.NopeDim + m.RopeDim
	q := s.WS.Get(bufMLAQ, T, m.Heads*qk)
	if m.QProj != nil {
		m.QProj.Forward(s, q, x)
	} else {
		qa := s.WS.Get(bufMLAQA, T, m.QAProj.OutFeatures())
		m.QAProj.Forward(s, qa, x)
		m.QALayernorm.Forward(s, qa, qa)
		m.QBProj.Forward(s, q, qa)
	}

	kv := s.WS.Get(bufMLAKV, T, m.Rank+m.RopeDim)
	m.KVAProjWithMQA.Forward(s, kv, x)
	kvNope := kv.ColSlice(0, m.Rank)
	m.KVALayernorm.Forward(s, kvNope, kvNope)

	// q_pe is the last RopeDim of each head; k_pe is one head after the latent.
	s.Ops.RoPE(q, m.Heads, qk, m.NopeDim, s.Pos, m.Rope)
	s.Ops.RoPE(kv, 1, m.Rank+m.RopeDim, m.Rank, s.Pos, m.Rope)

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
	if s.Decode {
		s.Ops.MLADecode(args)
	} else {
		s.Ops.MLAPrefill(args)
	}
	m.OProj.Forward(s, out, attn)
}
