package kernels

// dispatch routes every op to the set the spec chose for it and records the
// call in the profile under that set's name.
type dispatch struct {
	dev   Device
	prof  *Profile
	pick  [numOps]Ops
	names [numOps]string // the set that runs each op
}

func (d *dispatch) timed(i int, f func(Ops)) {
	m, on := d.prof.begin()
	f(d.pick[i])
	if on {
		d.prof.end(opTable[i].Op, d.names[i], m)
	}
}

func (d *dispatch) Embedding(out, table, ids *Tensor) {
	d.timed(iEmbedding, func(o Ops) { o.Embedding(out, table, ids) })
}

func (d *dispatch) Linear(out, x, w, bias *Tensor) {
	d.timed(iLinear, func(o Ops) { o.Linear(out, x, w, bias) })
}

func (d *dispatch) RMSNorm(out, x, w *Tensor, eps float32) {
	d.timed(iRMSNorm, func(o Ops) { o.RMSNorm(out, x, w, eps) })
}

func (d *dispatch) AddRMSNorm(out, resid, x, w *Tensor, eps float32) {
	d.timed(iAddRMSNorm, func(o Ops) { o.AddRMSNorm(out, resid, x, w, eps) })
}

func (d *dispatch) Add(out, a, b *Tensor) {
	d.timed(iAdd, func(o Ops) { o.Add(out, a, b) })
}

func (d *dispatch) RoPE(x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	d.timed(iRoPE, func(o Ops) { o.RoPE(x, heads, headStride, offset, pos, r) })
}

func (d *dispatch) SwiGLU(out, gateUp *Tensor) {
	d.timed(iSwiGLU, func(o Ops) { o.SwiGLU(out, gateUp) })
}

func (d *dispatch) AttentionPrefill(a *AttnArgs) {
	d.timed(iAttnPrefill, func(o Ops) { o.AttentionPrefill(a) })
}

func (d *dispatch) AttentionDecode(a *AttnArgs) {
	d.timed(iAttnDecode, func(o Ops) { o.AttentionDecode(a) })
}

func (d *dispatch) MLAPrefill(a *MLAArgs) {
	d.timed(iMLAPrefill, func(o Ops) { o.MLAPrefill(a) })
}

func (d *dispatch) MLADecode(a *MLAArgs) {
	d.timed(iMLADecode, func(o Ops) { o.MLADecode(a) })
}

func (d *dispatch) MoERoute(idx, weight, logits *Tensor, r *Routing) {
	d.timed(iMoERoute, func(o Ops) { o.MoERoute(idx, weight, logits, r) })
}

func (d *dispatch) MoEExperts(out, x, idx, weight, gateUp, down *Tensor) {
	d.timed(iMoEExperts, func(o Ops) { o.MoEExperts(out, x, idx, weight, gateUp, down) })
}

func (d *dispatch) Argmax(out, logits *Tensor) {
	d.timed(iArgmax, func(o Ops) { o.Argmax(out, logits) })
}
