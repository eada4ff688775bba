package kernels

// NotOwned is the Ops of a set for the ops it has no kernel of its own for
// (SetInfo.Own): a set embeds it, the dispatch routes those ops to the set's
// Fallback and never here, and a direct call panics saying so.
type NotOwned struct{ Set string }

func (n NotOwned) panic(op Op) {
	panic("kernels: set " + n.Set + " has no kernel of its own for " + string(op) + "; its fallback runs it")
}

func (n NotOwned) Embedding(out, table, ids *Tensor)                    { n.panic(OpEmbedding) }
func (n NotOwned) Linear(out, x, w, bias *Tensor)                       { n.panic(OpLinear) }
func (n NotOwned) RMSNorm(out, x, w *Tensor, eps float32)               { n.panic(OpRMSNorm) }
func (n NotOwned) AddRMSNorm(out, resid, x, w *Tensor, eps float32)     { n.panic(OpAddRMSNorm) }
func (n NotOwned) Add(out, a, b *Tensor)                                { n.panic(OpAdd) }
func (n NotOwned) SwiGLU(out, gateUp *Tensor)                           { n.panic(OpSwiGLU) }
func (n NotOwned) AttentionPrefill(a *AttnArgs)                         { n.panic(OpAttnPrefill) }
func (n NotOwned) AttentionDecode(a *AttnArgs)                          { n.panic(OpAttnDecode) }
func (n NotOwned) MLAPrefill(a *MLAArgs)                                { n.panic(OpMLAPrefill) }
func (n NotOwned) MLADecode(a *MLAArgs)                                 { n.panic(OpMLADecode) }
func (n NotOwned) MoERoute(idx, weight, logits *Tensor, r *Routing)     { n.panic(OpMoERoute) }
func (n NotOwned) MoEExperts(out, x, idx, weight, gateUp, down *Tensor) { n.panic(OpMoEExperts) }
func (n NotOwned) GroupGemm(out, x, w, first *Tensor)                   { n.panic(OpGroupGemm) }
func (n NotOwned) Argmax(out, logits *Tensor)                           { n.panic(OpArgmax) }
func (n NotOwned) RoPE(x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	n.panic(OpRoPE)
}
