package kerneltest

import (
	"encoding/binary"
	"math"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// RunDecodeGraph records the ops of a decode step that the kernel set named
// set has kernels of its own for, built on dev, as one graph and replays it
// with new row lengths, positions and routes: each replay must give what the
// ops give when called directly. A decode kernel that reads a length on the
// host, or grows a buffer after the capture, fails it. dev must record
// graphs (kernels.Grapher); the test is skipped, saying so, when it does not.
func RunDecodeGraph(t *testing.T, dev kernels.Device, set string) {
	t.Helper()
	gr, ok := dev.(kernels.Grapher)
	if !ok {
		t.Skipf("%s records no graphs", dev.Name())
	}
	info := setInfo(t, set)
	ops, err := info.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	decodeGraph(testingT{t}, gr, dev, set, info.Owns, ops)
}

// decodeGraph is RunDecodeGraph on ops, the set named set built on dev,
// for the ops owns reports.
func decodeGraph(t tester, gr kernels.Grapher, dev kernels.Device, set string, owns func(kernels.Op) bool, ops kernels.Ops) {
	g := &graphCase{t: t, dev: dev, rng: rand.New(rand.NewSource(1)), mem: kernels.Allocs{Dev: dev}}
	defer g.free()
	act := dev.ActDType()

	const rows, seq = 3, 300
	b := &kernels.Batch{Rows: rows, Tokens: rows, Start: []int{0, 1, 2, 3}, Past: make([]int, rows), MaxSeq: seq,
		StartDev: g.ints(0, 1, 2, 3), PastDev: g.ints(0, 5, 20)}
	pos := g.ints(0, 5, 20)
	lengths := [][]int32{{1, 260, 21}, {298, 0, 130}}

	var steps []func()          // the step's ops, in order
	var outs []*kernels.Tensor  // what the step writes
	var state []*kernels.Tensor // what it changes in place: reset before each run
	var names []string
	add := func(op kernels.Op, run func(), out ...*kernels.Tensor) {
		if owns(op) {
			steps = append(steps, run)
			outs = append(outs, out...)
			for range out {
				names = append(names, string(op))
			}
		}
	}

	const hidden, inter = 256, 192
	w := g.random(kernels.BF16, 1, hidden)
	x, resid := g.random(act, rows, hidden), g.random(act, rows, hidden)
	normed := g.alloc(act, rows, hidden)
	state = append(state, resid)
	add(kernels.OpRMSNorm, func() { ops.RMSNorm(normed, x, w, 1e-6) }, normed)
	add(kernels.OpAddRMSNorm, func() { ops.AddRMSNorm(normed, resid, x, w, 1e-6) }, normed, resid)

	const heads, kvHeads, dim = 8, 2, 128
	qkv := g.random(act, rows, (heads+2*kvHeads)*dim)
	state = append(state, qkv)
	cos, sin := g.random(kernels.F32, seq, dim/2), g.random(kernels.F32, seq, dim/2)
	rope := &kernels.Rope{Dim: dim, Cos: cos, Sin: sin}
	add(kernels.OpRoPE, func() { ops.RoPE(qkv, heads+kvHeads, dim, 0, pos, rope) }, qkv)

	// addWhole is add for a composite op: a set that fuses it for some
	// shapes only declines the others (the Dispatch then runs its parts,
	// recorded as their own ops), and the call is left out then.
	addWhole := func(op kernels.Op, run func(), out ...*kernels.Tensor) {
		if !owns(op) {
			return
		}
		if _, declined := kernels.Declined(run); !declined {
			add(op, run, out...)
		}
	}

	// The MoE's routed and shared outputs joining the next norm, as the
	// layers call it where the shared experts ran aside; the parts leave
	// their sum in routedSum, reset before each run too.
	routedSum, sharedOut := g.random(act, rows, hidden), g.random(act, rows, hidden)
	state = append(state, routedSum)
	addWhole(kernels.OpAddAddRMSNorm, func() { ops.AddAddRMSNorm(normed, resid, routedSum, sharedOut, w, 1e-6) }, normed, resid)

	// The same join taken with the next block's first projection, as
	// DeepSeek's MLA calls it after the MoE at decode.
	joinH, joinOut := g.alloc(act, rows, hidden), g.alloc(act, rows, 96)
	joinW := g.random(kernels.BF16, 96, hidden)
	addWhole(kernels.OpAddAddNormLinear, func() {
		ops.AddAddRMSNormLinear(joinOut, joinH, resid, routedSum, sharedOut, w, 1e-6, joinW, nil)
	}, joinOut, joinH, resid)

	gateUp, swi := g.random(act, rows, 2*inter), g.alloc(act, rows, inter)
	add(kernels.OpSwiGLU, func() { ops.SwiGLU(swi, gateUp) }, swi)
	// linear_swiglu is fused for prefill's shapes only, if at all. Its
	// output holds numbers before it first runs: linear_add below reads it.
	mlpW, mlpOut := g.random(kernels.BF16, 2*inter, hidden), g.random(act, rows, inter)
	addWhole(kernels.OpLinearSwiGLU, func() { ops.LinearSwiGLU(mlpOut, x, mlpW) }, mlpOut)
	// The shared experts' down projection of the MLP's output added in
	// place, as the MoE adds it to the routed experts' output.
	sum, downW, downB := g.random(act, rows, hidden), g.random(kernels.BF16, hidden, inter), g.random(kernels.BF16, hidden)
	state = append(state, sum)
	addWhole(kernels.OpLinearAdd, func() { ops.LinearAdd(sum, mlpOut, downW, downB, sum) }, sum)

	// The residual add and the norm taken with the next block's first
	// projection, as Qwen2's layers call them: its qkv (bias), then its
	// MLP's gate/up with SwiGLU, both adding x into one residual.
	nres, nh := g.random(act, rows, hidden), g.alloc(act, rows, hidden)
	state = append(state, nres)
	qkvW, qkvB, qkvOut := g.random(kernels.BF16, 96, hidden), g.random(kernels.BF16, 96), g.alloc(act, rows, 96)
	addWhole(kernels.OpNormLinear, func() { ops.AddRMSNormLinear(qkvOut, nh, nres, x, w, 1e-6, qkvW, qkvB) }, qkvOut, nres)
	guW, guOut := g.random(kernels.BF16, 2*inter, hidden), g.alloc(act, rows, inter)
	addWhole(kernels.OpNormSwiGLU, func() { ops.AddRMSNormLinearSwiGLU(guOut, nh, nres, x, w, 1e-6, guW) }, guOut, nres)
	// The same across a block boundary, as Qwen2's layers call them at
	// decode: the MLP's down projection (of linear_swiglu's output above)
	// into mid, then the next layer's residual add, norm and qkv; the
	// attention's o_proj into mid, then the MLP's residual add, norm and
	// gate/up with SwiGLU.
	mid := g.alloc(act, rows, hidden)
	chainQKV, chainGU := g.alloc(act, rows, 96), g.alloc(act, rows, inter)
	addWhole(kernels.OpLinearNormLinear, func() {
		ops.LinearAddRMSNormLinear(mid, mlpOut, downW, nil, chainQKV, nh, nres, w, 1e-6, qkvW, qkvB)
	}, chainQKV, mid, nres)
	oW := g.random(kernels.BF16, hidden, hidden)
	addWhole(kernels.OpLinearNormSwiGLU, func() {
		ops.LinearAddRMSNormLinearSwiGLU(mid, x, oW, nil, chainGU, nh, nres, w, 1e-6, guW)
	}, chainGU, mid, nres)

	kc, vc := g.random(act, rows, kvHeads, seq, dim), g.random(act, rows, kvHeads, seq, dim)
	state = append(state, kc, vc)
	attn := &kernels.AttnArgs{Out: g.alloc(act, rows, heads*dim), Q: qkv.ColSlice(0, heads*dim),
		K: qkv.ColSlice(heads*dim, (heads+kvHeads)*dim), V: qkv.ColSlice((heads+kvHeads)*dim, (heads+2*kvHeads)*dim),
		KCache: kc, VCache: vc, Batch: b, Heads: heads, KVHeads: kvHeads, HeadDim: dim, Scale: 0.088}
	add(kernels.OpAttnDecode, func() { ops.AttentionDecode(attn) }, attn.Out)
	// Qwen2's rope and attention as the one op its layer calls at decode.
	addWhole(kernels.OpRoPEAttnDecode, func() { ops.RoPEAttentionDecode(attn, pos, rope) }, attn.Out, kc)

	// MLA as DeepSeek-V2-Lite's layer runs it: q and the new latent are
	// column slices of one q_kv_a row, rotated in place, then attended.
	const mh, nope, ropeDim, vdim, rank = 4, 64, 32, 64, 256
	const mq, mkv = mh * (nope + ropeDim), rank + ropeDim
	qkva, cache := g.random(act, rows, mq+mkv), g.random(act, rows, seq, mkv)
	state = append(state, qkva, cache)
	mcos, msin := g.random(kernels.F32, seq, ropeDim/2), g.random(kernels.F32, seq, ropeDim/2)
	mrope := &kernels.Rope{Dim: ropeDim, Interleaved: true, Cos: mcos, Sin: msin}
	mla := &kernels.MLAArgs{Out: g.alloc(act, rows, mh*vdim), Q: qkva.ColSlice(0, mq), KV: qkva.ColSlice(mq, mq+mkv),
		Cache: cache, WKVB: g.random(kernels.BF16, mh*(nope+vdim), rank),
		Batch: b, Heads: mh, NopeDim: nope, RopeDim: ropeDim, VDim: vdim, Rank: rank, Scale: 0.1}
	add(kernels.OpRoPE, func() { ops.RoPE(mla.Q, mh, nope+ropeDim, nope, pos, mrope) }, qkva)
	add(kernels.OpRoPE, func() { ops.RoPE(mla.KV, 1, mkv, rank, pos, mrope) }, qkva)
	// The layer's kv_a_layernorm and both ropes as the one op it calls.
	mnorm := g.random(kernels.BF16, rank)
	addWhole(kernels.OpRMSNormRoPE, func() { ops.RMSNormRoPE(mla.Q, mla.KV, mnorm, 1e-6, mh, nope+ropeDim, nope, pos, mrope) }, qkva)
	add(kernels.OpMLADecode, func() { ops.MLADecode(mla) }, mla.Out)
	// The layer's decode as the one op it calls: the norm, the ropes and
	// the attention.
	addWhole(kernels.OpMLADecodeRoPE, func() { ops.MLADecodeRoPE(mla, mnorm, 1e-6, pos, mrope) }, qkva, mla.Out)

	const experts, topK = 16, 4
	logits := g.random(kernels.F32, rows, experts)
	idx, weight := g.alloc(kernels.I32, rows, topK), g.random(kernels.F32, rows, topK)
	routing := &kernels.Routing{Method: kernels.RouteGreedy, TopK: topK, NormTopK: true, Scale: 1}
	add(kernels.OpMoERoute, func() { ops.MoERoute(idx, weight, logits, routing) }, idx, weight)
	if !owns(kernels.OpMoERoute) {
		// Routes for the experts, rewritten before every run.
		state = append(state, idx, weight)
	}
	moeOut, moeX := g.alloc(act, rows, hidden), g.random(act, rows, hidden)
	moeGU, moeDown := g.random(kernels.BF16, experts, 2*inter, hidden), g.random(kernels.BF16, experts, hidden, inter)
	add(kernels.OpMoEExperts, func() { ops.MoEExperts(moeOut, moeX, idx, weight, moeGU, moeDown) }, moeOut)
	// moe_routed over logits of its own, new before every run (so new
	// routes), into routes of its own. A set that declines the call runs
	// the parts, recorded above: it is left out then.
	routedLogits := g.random(kernels.F32, rows, experts)
	routedIdx, routedWeight := g.alloc(kernels.I32, rows, topK), g.alloc(kernels.F32, rows, topK)
	routedOut := g.alloc(act, rows, hidden)
	routed := func() {
		ops.MoERouted(routedOut, routedIdx, routedWeight, moeX, routedLogits, moeGU, moeDown, routing)
	}
	if owns(kernels.OpMoERouted) {
		if _, declined := kernels.Declined(routed); !declined {
			add(kernels.OpMoERouted, routed, routedOut, routedIdx, routedWeight)
		}
	}

	// Projections: whole columns (K too short to split), with a bias; f32
	// logits; a K long enough that the weight-streaming kernels split it.
	proj, projW, projB := g.alloc(act, rows, 200), g.random(kernels.BF16, 200, hidden), g.random(kernels.BF16, 200)
	add(kernels.OpLinear, func() { ops.Linear(proj, x, projW, projB) }, proj)
	logitsOut, head := g.alloc(kernels.F32, rows, 1000), g.random(kernels.BF16, 1000, hidden)
	add(kernels.OpLinear, func() { ops.Linear(logitsOut, x, head, nil) }, logitsOut)
	longX, longW := g.random(act, rows, 1032), g.random(kernels.BF16, 300, 1032)
	longOut, longB := g.alloc(act, rows, 300), g.random(kernels.BF16, 300)
	add(kernels.OpLinear, func() { ops.Linear(longOut, longX, longW, longB) }, longOut)

	// The step's greedy choice, each beside its logit's bits as the model
	// reads it (fixed choices where the set leaves argmax to another), then
	// the next step's inputs made from it: the lengths and positions every
	// run starts from (reset) advanced in place.
	next := g.alloc(kernels.I32, rows, 2)
	g.write(next, []int32{7, 0, 11, 0, 13, 0})
	add(kernels.OpArgmax, func() { ops.Argmax(next, logits) }, next)
	ids := g.ints(-1, -1, -1)
	add(kernels.OpDecodeAdvance, func() { ops.DecodeAdvance(ids, pos, b.PastDev, next) }, ids, pos, b.PastDev)

	if len(steps) == 0 {
		t.Skipf("set %s has no decode ops of its own", set)
	}
	step := func() {
		for _, s := range steps {
			s()
		}
	}
	// Every in-place tensor is reset to one fixed value before each run, and
	// the routes (when the set does not make them) to fixed distinct experts.
	saved := make([][]float32, len(state))
	for i, s := range state {
		if s.DType == kernels.I32 {
			continue
		}
		saved[i] = g.read(s)
	}
	reset := func(lens []int32) {
		g.write(b.PastDev, lens)
		g.write(pos, lens)
		// moe_routed's logits, drawn from the lengths: new routes each replay.
		rng := rand.New(rand.NewSource(int64(lens[0])<<20 | int64(lens[1])<<10 | int64(lens[2])))
		v := make([]float32, rows*experts)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		g.upload(routedLogits, v)
		for i, s := range state {
			if s == idx {
				var v []int32
				for r := range rows {
					for k := range topK {
						v = append(v, int32((r*5+k*3)%experts))
					}
				}
				g.write(idx, v)
				continue
			}
			g.upload(s, saved[i])
		}
	}

	reset([]int32{0, 5, 20})
	step() // sizes every buffer the ops keep before the capture
	g.sync()
	if err := gr.BeginCapture(); err != nil {
		t.Fatalf("%v", err)
	}
	step()
	graph, err := gr.EndCapture()
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer graph.Close()

	for i, lens := range lengths {
		reset(lens)
		if err := graph.Replay(); err != nil {
			t.Fatalf("%v", err)
		}
		replayed := g.readAll(outs)
		reset(lens)
		step()
		direct := g.readAll(outs)
		for j := range outs {
			if d := kernels.RelErr(replayed[j], direct[j]); !(d <= 1e-3) {
				t.Errorf("replay %d (lengths %v): %s output %d differs from a direct call by %.3g", i, lens, names[j], j, d)
			}
		}
	}
}

// graphCase allocates and fills the tensors of RunDecodeGraph.
type graphCase struct {
	t   tester
	dev kernels.Device
	rng *rand.Rand
	mem kernels.Allocs // every tensor of the case
}

func (g *graphCase) alloc(dt kernels.DType, shape ...int) *kernels.Tensor {
	return g.mem.Alloc(dt, shape...)
}

func (g *graphCase) free() { g.mem.Free() }

func (g *graphCase) random(dt kernels.DType, shape ...int) *kernels.Tensor {
	x := g.alloc(dt, shape...)
	v := make([]float32, x.Numel())
	for i := range v {
		v[i] = float32(g.rng.NormFloat64())
	}
	g.upload(x, v)
	return x
}

func (g *graphCase) upload(x *kernels.Tensor, v []float32) {
	g.t.Helper()
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	if err := g.dev.Upload(x, b, kernels.F32); err != nil {
		g.t.Fatalf("%v", err)
	}
}

func (g *graphCase) ints(v ...int32) *kernels.Tensor {
	x := g.alloc(kernels.I32, len(v))
	g.write(x, v)
	return x
}

func (g *graphCase) write(x *kernels.Tensor, v []int32) {
	g.t.Helper()
	if err := g.dev.WriteI32(x, v); err != nil {
		g.t.Fatalf("%v", err)
	}
}

func (g *graphCase) read(x *kernels.Tensor) []float32 {
	g.t.Helper()
	if x.DType == kernels.I32 {
		v, err := g.dev.ReadI32(x)
		if err != nil {
			g.t.Fatalf("%v", err)
		}
		f := make([]float32, len(v))
		for i, n := range v {
			f[i] = float32(n)
		}
		return f
	}
	v, err := g.dev.ReadF32(x)
	if err != nil {
		g.t.Fatalf("%v", err)
	}
	return v
}

func (g *graphCase) readAll(xs []*kernels.Tensor) [][]float32 {
	out := make([][]float32, len(xs))
	for i, x := range xs {
		out[i] = g.read(x)
	}
	return out
}

func (g *graphCase) sync() {
	g.t.Helper()
	if err := g.dev.Sync(); err != nil {
		g.t.Fatalf("%v", err)
	}
}
