package kernels

// dispatch routes every op to the set the spec chose for it and records the
// call in the profile under that set's name, with its cost.
type dispatch struct {
	dev   Device
	prof  *Profile
	kind  string         // the device kind of the sets
	built map[string]Ops // every set built so far, by name (Switch adds to it)
	pick  [numOps]Ops
	names [numOps]string // the set that runs each op
}

// timed runs f on op i's set; cost, asked after the call (which has
// checked the arguments), is what the call computes and moves.
func (d *dispatch) timed(i int, cost func() Cost, f func(Ops)) {
	c := d.prof.begin(opTable[i].Op, d.names[i])
	set := d.run(i, f)
	if c != nil {
		c.call.Set = set
		d.prof.end(c, cost())
	}
}

// run calls f on op i's set, or, when that set declines the call
// (Unsupported), on the set it falls back to, and so on; it returns the
// name of the set that ran it.
func (d *dispatch) run(i int, f func(Ops)) string {
	name := d.names[i]
	for {
		ops := d.built[name]
		u, declined := Declined(func() { f(ops) })
		if !declined {
			return name
		}
		fb := FallbackOf(name)
		if fb == "" || d.built[fb] == nil {
			panic(u)
		}
		name = fb
	}
}

func (d *dispatch) Embedding(out, table, ids *Tensor) {
	d.timed(iEmbedding, func() Cost { return Cost{Bytes: 2 * size(out)} },
		func(o Ops) { o.Embedding(out, table, ids) })
}

func (d *dispatch) Linear(out, x, w, bias *Tensor) {
	d.timed(iLinear, func() Cost { return linearCost(out, x, w, bias) },
		func(o Ops) { o.Linear(out, x, w, bias) })
}

func (d *dispatch) RMSNorm(out, x, w *Tensor, eps float32) {
	d.timed(iRMSNorm, func() Cost { return normCost(x, w, false) },
		func(o Ops) { o.RMSNorm(out, x, w, eps) })
}

func (d *dispatch) AddRMSNorm(out, resid, x, w *Tensor, eps float32) {
	d.timed(iAddRMSNorm, func() Cost { return normCost(x, w, true) },
		func(o Ops) { o.AddRMSNorm(out, resid, x, w, eps) })
}

func (d *dispatch) Add(out, a, b *Tensor) {
	d.timed(iAdd, func() Cost { return Cost{FLOPs: float64(out.Numel()), Bytes: 3 * size(out)} },
		func(o Ops) { o.Add(out, a, b) })
}

func (d *dispatch) RoPE(x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope) {
	d.timed(iRoPE, func() Cost { return ropeCost(x, heads, r) },
		func(o Ops) { o.RoPE(x, heads, headStride, offset, pos, r) })
}

func (d *dispatch) SwiGLU(out, gateUp *Tensor) {
	d.timed(iSwiGLU, func() Cost { return swigluCost(out) },
		func(o Ops) { o.SwiGLU(out, gateUp) })
}

func (d *dispatch) AttentionPrefill(a *AttnArgs) {
	d.timed(iAttnPrefill, func() Cost { return attnCost(a, false) },
		func(o Ops) { o.AttentionPrefill(a) })
}

func (d *dispatch) AttentionDecode(a *AttnArgs) {
	d.timed(iAttnDecode, func() Cost { return attnCost(a, true) },
		func(o Ops) { o.AttentionDecode(a) })
}

func (d *dispatch) MLAPrefill(a *MLAArgs) {
	d.timed(iMLAPrefill, func() Cost { return mlaCost(a, false) },
		func(o Ops) { o.MLAPrefill(a) })
}

func (d *dispatch) MLADecode(a *MLAArgs) {
	d.timed(iMLADecode, func() Cost { return mlaCost(a, true) },
		func(o Ops) { o.MLADecode(a) })
}

func (d *dispatch) MoERoute(idx, weight, logits *Tensor, r *Routing) {
	d.timed(iMoERoute, func() Cost { return Cost{Bytes: size(logits) + size(idx) + size(weight)} },
		func(o Ops) { o.MoERoute(idx, weight, logits, r) })
}

func (d *dispatch) MoEExperts(out, x, idx, weight, gateUp, down *Tensor) {
	d.timed(iMoEExperts, func() Cost { return moeCost(out, idx, gateUp, down) },
		func(o Ops) { o.MoEExperts(out, x, idx, weight, gateUp, down) })
}

func (d *dispatch) GroupGemm(out, x, w, first *Tensor) {
	d.timed(iGroupGemm, func() Cost { return groupGemmCost(out, x, w) },
		func(o Ops) { o.GroupGemm(out, x, w, first) })
}

func (d *dispatch) Argmax(out, logits *Tensor) {
	d.timed(iArgmax, func() Cost { return Cost{Bytes: size(logits) + size(out)} },
		func(o Ops) { o.Argmax(out, logits) })
}
