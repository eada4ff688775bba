// Package model builds the Qwen2 and DeepSeek-V2 causal LMs from the layers,
// holds their KV caches, and runs generation: a batched prefill of prompts of
// different lengths, then one decode step per new token (replayed as a CUDA
// graph where the device can), with greedy or sampled token choice.
//
// The CLI's path:
//
//	m, err := model.Load(cfg, weights, dev, ops, model.LoadOptions{MaxRows: len(prompts), MaxSeq: longest + maxNew})
//	gen, err := model.Generate(m, prompts, model.GenerateOptions{MaxNewTokens: maxNew})
//	m.Close()
package model

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/layers"
	"github.com/fuselm/fuselm/loader"
)

// Model is a loaded causal LM: *Qwen2 or *DeepseekV2.
type Model interface {
	// Config is the model's config.json.
	Config() *loader.Config
	// Device is where its weights and cache live.
	Device() kernels.Device
	// Capacity is the most prompts a Generate call takes (rows) and the most
	// tokens, prompt and new ones, a row holds (seq): LoadOptions' MaxRows
	// and MaxSeq.
	Capacity() (rows, seq int)
	// Memory says how much device memory the model holds.
	Memory() Memory
	// Close frees the model's device memory.
	Close() error

	base() *engine
}

// LoadOptions size what Load allocates once: the cache and the work buffers.
type LoadOptions struct {
	// MaxRows is the most prompts one Generate call runs together.
	MaxRows int
	// MaxSeq is the cache capacity of a row: its prompt plus its new tokens.
	// The rotary tables cover these positions only.
	MaxSeq int
	// PrefillChunk is the most tokens one prefill step runs (prompts longer
	// in total are run in several steps); it sizes the work buffers. 0 means
	// MaxRows·MaxSeq: every prefill in one step.
	PrefillChunk int
	// Progress, when set, is called after each weight upload with the bytes
	// of checkpoint data uploaded so far and in all.
	Progress func(done, total int64)
}

// Load uploads the checkpoint w of the model cfg describes to dev and
// allocates its cache and work buffers, for ops (built for dev) to run.
// Before allocating anything it checks every tensor's presence and shape,
// and that the memory the model needs (Estimate) is free on dev when dev can
// tell (a MemInfo method, as the cuda and cpu devices have): if not, the
// error is a *MemoryError.
func Load(cfg *loader.Config, w *loader.Weights, dev kernels.Device, ops kernels.Ops, opt LoadOptions) (Model, error) {
	if cfg == nil || w == nil || dev == nil || ops == nil {
		return nil, fmt.Errorf("model: Load needs a config, weights, a device and its ops")
	}
	p, err := planLoad(cfg, w, dev.ActDType(), opt)
	if err != nil {
		return nil, err
	}
	if err := checkMemory(dev, p.need); err != nil {
		return nil, err
	}
	if err := p.checkSteps(opt); err != nil {
		return nil, err
	}
	switch cfg.Arch {
	case loader.ArchQwen2:
		return loadQwen2(cfg, w, dev, ops, opt, p)
	default:
		return loadDeepseekV2(cfg, w, dev, ops, opt, p)
	}
}

// archOf is what Load needs to know of cfg's architecture: its constructor,
// run on a planning weightSet, and the dims and pairing of its rotary
// embedding. build is nil for an architecture not supported.
func archOf(cfg *loader.Config) (build func(*weightSet) decoder, ropeDim int, interleaved bool) {
	switch cfg.Arch {
	case loader.ArchQwen2:
		// rotate_half pairs (i, i+head_dim/2) over head_dim.
		return func(s *weightSet) decoder { return buildQwen2(cfg, s, newKVCache(nil, cfg, 0, 0), nil) }, cfg.HeadDim, false
	case loader.ArchDeepseekV2:
		// qk_rope_head_dim (HF sets config.head_dim to it) with interleaved
		// pairs (2i, 2i+1), as apply_rotary_emb's view_as_complex.
		return func(s *weightSet) decoder { return buildDeepseekV2(cfg, s, newLatentCache(nil, cfg, 0, 0), nil) },
			cfg.DeepSeek.QKRopeHeadDim, true
	}
	return nil, 0, false
}

// checkConfig rejects configs the models cannot run, with the field at fault.
func checkConfig(cfg *loader.Config) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("model: %s config: %s", cfg.Arch, fmt.Sprintf(format, args...))
	}
	if cfg.NumLayers < 1 || cfg.HiddenSize < 1 || cfg.VocabSize < 1 || cfg.NumHeads < 1 {
		return bad("num_hidden_layers, hidden_size, vocab_size and num_attention_heads must be positive")
	}
	switch cfg.Arch {
	case loader.ArchQwen2:
		if cfg.Qwen2 == nil {
			return bad("no Qwen2 section")
		}
		if cfg.NumKVHeads < 1 || cfg.NumHeads%cfg.NumKVHeads != 0 {
			return bad("num_attention_heads %d is not a multiple of num_key_value_heads %d", cfg.NumHeads, cfg.NumKVHeads)
		}
	case loader.ArchDeepseekV2:
		d := cfg.DeepSeek
		if d == nil {
			return bad("no DeepSeek-V2 section")
		}
		if d.FirstKDenseReplace < cfg.NumLayers {
			if d.NRoutedExperts < 1 || d.NumExpertsPerTok < 1 || d.NumExpertsPerTok > d.NRoutedExperts {
				return bad("n_routed_experts %d and num_experts_per_tok %d do not make an MoE", d.NRoutedExperts, d.NumExpertsPerTok)
			}
			switch d.TopkMethod {
			case loader.TopkGreedy:
			case loader.TopkGroupLimitedGreedy:
				if d.NGroup < 1 || d.NRoutedExperts%d.NGroup != 0 || d.TopkGroup < 1 || d.TopkGroup > d.NGroup {
					return bad("n_group %d and topk_group %d do not split %d experts", d.NGroup, d.TopkGroup, d.NRoutedExperts)
				}
			default:
				return bad("topk_method %q is not supported (want %s or %s)", d.TopkMethod, loader.TopkGreedy, loader.TopkGroupLimitedGreedy)
			}
		}
	}
	return nil
}

// ParamCount is the number of parameters of the model cfg describes, as
// HF's num_parameters() counts them (tied embeddings once).
func ParamCount(cfg *loader.Config) int64 {
	if checkConfig(cfg) != nil {
		return 0
	}
	build, _, _ := archOf(cfg)
	if build == nil {
		return 0
	}
	s := &weightSet{}
	build(s)
	var n int64
	for _, w := range s.want {
		n += int64(numel(w.Shape))
	}
	return n
}

// KVBytesPerToken is the cache memory one token of one row takes with
// activations of type act (the device's ActDType).
func KVBytesPerToken(cfg *loader.Config, act kernels.DType) int64 {
	switch cfg.Arch {
	case loader.ArchQwen2:
		return int64(2*cfg.NumLayers*cfg.NumKVHeads*cfg.HeadDim) * int64(act.Size())
	case loader.ArchDeepseekV2:
		return int64(cfg.NumLayers*(cfg.DeepSeek.KVLoraRank+cfg.DeepSeek.QKRopeHeadDim)) * int64(act.Size())
	}
	return 0
}

// decoder is what both architectures are made of: HF's *Model
// (embed_tokens, layers, norm) and lm_head.
type decoder struct {
	embedTokens layers.Embedding
	layers      []*layers.DecoderLayer
	norm        layers.RMSNorm
	lmHead      layers.Linear // its weight is embed_tokens' when tie_word_embeddings
}

// lmHead is lm_head, or embed_tokens when the embeddings are tied (then
// lm_head.weight is not read even when present, as HF ties it).
func lmHead(cfg *loader.Config, s *weightSet, embed layers.Embedding) layers.Linear {
	if cfg.TieWordEmbeddings {
		return layers.Linear{Weight: embed.Weight}
	}
	return s.linear("lm_head", cfg.VocabSize, cfg.HiddenSize, false)
}

// Workspace buffers of the decoder itself.
const (
	bufHidden = "model.hidden" // [T, H] act: the residual stream
	bufNormed = "model.normed" // [T, H] act: the current norm's output
	bufOut    = "model.out"    // [T, H] act: the current block's output
)

// engine is the state both architectures share: the decoder, the device
// and its ops, the step inputs and the work buffers.
type engine struct {
	decoder
	cfg       *loader.Config
	dev       kernels.Device
	ops       kernels.Ops
	decodeOps kernels.Ops // ops, or ops leaving out what FUSELM_SKIP_OPS names (skip.go)
	maxRows   int
	maxSeq    int
	maxTokens int // the largest step: PrefillChunk, and at least maxRows

	rope    *kernels.Rope
	weights *weightSet
	ws      *layers.Workspace

	// Step inputs, i32, in one buffer [2·maxTokens + 3·maxRows + 1], so that
	// a step writes them in one transfer: newStep packs a step's token ids,
	// positions, Batch.StartDev, Batch.PastDev and last at its start
	// (stepViews).
	in *kernels.Tensor
	// Outputs.
	lastHidden *kernels.Tensor // [maxRows, H] act: the last new token of each row, after the final norm
	logits     *kernels.Tensor // [maxRows, V] f32
	// next is [maxRows, 2] i32: each row's argmax and its logit's f32
	// bits, read back in one transfer per step (chooser.choose).
	next *kernels.Tensor

	cacheTensors, workTensors []*kernels.Tensor
	// kept is the decode graph the last generation recorded, for the next
	// one of the same batch (Generate; nil when none).
	kept   *keptGraph
	closed bool
}

func (e *engine) base() *engine { return e }

// Config is the model's config.
func (e *engine) Config() *loader.Config { return e.cfg }

// Device is where the model lives.
func (e *engine) Device() kernels.Device { return e.dev }

// Capacity is LoadOptions' MaxRows and MaxSeq.
func (e *engine) Capacity() (rows, seq int) { return e.maxRows, e.maxSeq }

// Memory says how much device memory the model holds.
func (e *engine) Memory() Memory {
	sum := func(ts []*kernels.Tensor) Bytes {
		var n Bytes
		for _, t := range ts {
			n += Bytes(t.Numel() * t.DType.Size())
		}
		return n
	}
	return Memory{Weights: sum(e.weights.owned), Cache: sum(e.cacheTensors), Work: sum(e.workTensors)}
}

// Close frees the model's device memory; the model is unusable after.
func (e *engine) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	if e.kept != nil {
		e.kept.graph.Close()
		e.kept = nil
	}
	for _, ts := range [][]*kernels.Tensor{e.weights.owned, e.cacheTensors, e.workTensors} {
		for _, t := range ts {
			e.dev.Free(t)
		}
	}
	return nil
}

// newEngine returns an engine for the model p planned, whose weightSet
// uploads, with the rotary tables made.
func newEngine(cfg *loader.Config, w *loader.Weights, dev kernels.Device, ops kernels.Ops, opt LoadOptions, p *plan) (*engine, error) {
	e := &engine{cfg: cfg, dev: dev, ops: ops, decodeOps: ops, maxRows: opt.MaxRows, maxSeq: opt.MaxSeq, maxTokens: p.maxTokens}
	skip, err := skipOps()
	if err != nil {
		return nil, err
	}
	if skip != nil {
		e.decodeOps = newSkipping(ops, skip)
		fmt.Fprintf(os.Stderr, "infer: %s: decode steps leave out %v, so the text is wrong: for measuring what those ops cost a step\n", skipEnv, skip)
	}
	e.weights = &weightSet{w: w, dev: dev, act: dev.ActDType(), progress: opt.Progress}
	for _, want := range p.weights.want {
		info, _ := w.Get(want.Name)
		e.weights.total += int64(len(info.Data))
	}
	rope, owned, err := newRope(dev, &cfg.Rope, p.ropeDim, opt.MaxSeq, p.interleaved)
	e.weights.owned = append(e.weights.owned, owned...)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("model: %w", err)
	}
	e.rope = rope
	return e, nil
}

// reserve asks ws for the work buffers of the decoder d and its layers.
func (d *decoder) reserve(ws *layers.Workspace, act kernels.DType, hidden int) {
	for _, name := range []string{bufHidden, bufNormed, bufOut} {
		ws.Reserve(name, act, hidden)
	}
	for _, l := range d.layers {
		l.SelfAttn.Reserve(ws, act)
		l.MLP.Reserve(ws, act)
	}
}

// ioBuffer is one of a model's step inputs and outputs: the engine field
// that holds it, its element type and its shape.
type ioBuffer struct {
	dst   **kernels.Tensor
	dt    kernels.DType
	shape []int
}

// ioBuffers are the engine's step inputs and outputs, for rows rows and
// steps of up to tokens tokens.
func (e *engine) ioBuffers(act kernels.DType, rows, tokens int) []ioBuffer {
	return []ioBuffer{
		{&e.in, kernels.I32, []int{2*tokens + 3*rows + 1}},
		{&e.lastHidden, act, []int{rows, e.cfg.HiddenSize}},
		{&e.logits, kernels.F32, []int{rows, e.cfg.VocabSize}},
		{&e.next, kernels.I32, []int{rows, 2}},
	}
}

// finish checks the weight uploads and allocates the work buffers of the
// built decoder, then checks the allocations.
func (e *engine) finish() error {
	if err := errors.Join(e.weights.err, e.dev.Sync()); err != nil {
		return err
	}
	act := e.dev.ActDType()
	e.ws = layers.NewWorkspace()
	e.decoder.reserve(e.ws, act, e.cfg.HiddenSize)
	e.workTensors = e.ws.Alloc(e.dev, e.maxTokens)
	for _, b := range e.ioBuffers(act, e.maxRows, e.maxTokens) {
		*b.dst = e.dev.Alloc(b.dt, b.shape...)
		e.workTensors = append(e.workTensors, *b.dst)
	}
	return e.dev.Sync()
}

// vec is the view of the first n entries of the 1-D tensor t.
func vec(t *kernels.Tensor, n int) *kernels.Tensor {
	return kernels.NewTensor(t.Buf, t.DType, t.Offset, n)
}

// newStep writes the inputs of a forward step to the device and describes
// it: cache rows [row0, row0+len(tokens)), row i getting the new tokens
// tokens[i] after past[i] cached ones. The first nLogits rows end their
// prompt (or are decoding): the step computes their logits.
//
// It waits for the device first, since the previous step may still read the
// input tensors; it queues nothing, so a decode step's work (decodeOne) can
// be captured in a graph and replayed after each newStep.
func (e *engine) newStep(row0 int, tokens [][]int, past []int, decode bool, nLogits int) (*step, error) {
	if err := e.dev.Sync(); err != nil {
		return nil, err
	}
	s, in := e.stepOf(row0, tokens, past, decode, nLogits)
	if err := e.dev.WriteI32(vec(e.in, len(in)), in); err != nil {
		return nil, fmt.Errorf("model: writing step inputs: %w", err)
	}
	return s, nil
}

// stepOf is newStep's step and the inputs it writes, unwritten: a greedy
// decode step whose inputs the step before made on the device
// (DecodeAdvance) takes the step alone, for its host-side fields.
func (e *engine) stepOf(row0 int, tokens [][]int, past []int, decode bool, nLogits int) (*step, []int32) {
	B := len(tokens)
	start := make([]int, B+1)
	start32 := make([]int32, B+1)
	past32 := make([]int32, B)
	var ids, pos []int32
	for b, toks := range tokens {
		for i, t := range toks {
			ids = append(ids, int32(t))
			pos = append(pos, int32(past[b]+i))
		}
		start[b+1] = start[b] + len(toks)
		start32[b+1] = int32(start[b+1])
		past32[b] = int32(past[b])
	}
	last := make([]int32, nLogits)
	for b := range last {
		last[b] = int32(start[b+1] - 1)
	}
	T := start[B]
	v := e.stepViews(T, B, nLogits)
	batch := &kernels.Batch{
		Rows: B, Tokens: T, Start: start, Past: append([]int(nil), past...), MaxSeq: e.maxSeq,
		StartDev: v.start, PastDev: v.past,
	}
	ops := e.ops
	if decode {
		ops = e.decodeOps
	}
	side, _ := e.dev.(kernels.Brancher)
	s := &step{Step: &layers.Step{Ops: ops, WS: e.ws, Batch: batch, Row0: row0, Pos: v.pos, Decode: decode, Side: side},
		ids: v.ids, last: v.last}
	return s, slices.Concat(ids, pos, start32, past32, last)
}

// step is a forward step: what the layers see of it, and the token ids
// and last-token indices the decoder itself reads (views of engine.in).
type step struct {
	*layers.Step
	ids, last *kernels.Tensor
}

// stepInputs are the views of one step's inputs in engine.in.
type stepInputs struct{ ids, pos, start, past, last *kernels.Tensor }

// stepViews lays out the inputs of a step of T tokens in B rows, nLogits
// of which give logits, at the start of e.in, in the order newStep writes
// them. Every decode step of a batch has the same layout, so that a graph
// captured on one replays with the inputs of the next.
func (e *engine) stepViews(T, B, nLogits int) stepInputs {
	at := 0
	next := func(n int) *kernels.Tensor {
		t := kernels.NewTensor(e.in.Buf, kernels.I32, e.in.Offset+at, n)
		at += n
		return t
	}
	return stepInputs{ids: next(T), pos: next(T), start: next(B + 1), past: next(B), last: next(nLogits)}
}

// setLayer tells the observer of the ops, where they have one (the
// Dispatch of kernels.Spec.Build), which decoder layer the calls that
// follow belong to; -1 means none.
func (e *engine) setLayer(layer int) {
	if m, ok := e.ops.(kernels.LayerMarker); ok {
		m.SetLayer(layer)
	}
}

// forward runs the decoder over the step's new tokens, as HF's *Model then
// lm_head, and writes the logits of the last new token of the step's first
// nLogits rows to rows [Row0, Row0+nLogits) of e.logits.
//
// The residual additions are fused with the norm that follows them:
// AddRMSNorm(h, x, y) is x += y; h = norm(x). A block takes its input as
// that pair (layers.NormIn), so that its first projection may take them
// with it; and a block that can (layers.Deferring: Qwen2's attention and
// MLPs) leaves its last projection into y to the block after it, whose
// first op may then run both projections as one kernel
// (linear_add_rms_norm_linear and its SwiGLU twin). DeepSeek-V2's MoE,
// where its shared experts ran aside, leaves their output apart from the
// routed experts' in y, and the next norm (the next layer's, or the final
// one) adds both into x (add_add_rms_norm). The profile counts
// such a call under the layer whose block it starts: a layer's down_proj
// is then counted under the next layer (the last layer's stays under it,
// with the final norm), o_proj under its own.
func (e *engine) forward(st *step, nLogits int) {
	s := st.Step
	T, H := s.Tokens(), e.cfg.HiddenSize
	x := e.ws.Get(bufHidden, T, H)
	h := e.ws.Get(bufNormed, T, H)
	y := e.ws.Get(bufOut, T, H)
	e.setLayer(-1)
	e.embedTokens.Forward(s, x, st.ids)
	e.setLayer(0)
	in := layers.NormIn{H: h, Resid: x, Norm: &e.layers[0].InputLayernorm}
	for i, l := range e.layers {
		e.setLayer(i) // the profile counts the calls under layer i
		p := layers.ForwardDefer(s, l.SelfAttn, y, in)
		p = layers.ForwardDefer(s, l.MLP, y, layers.NormIn{H: h, Resid: x, Add: y, Pending: p, Norm: &l.PostAttentionLayernorm})
		next := &e.norm
		if i+1 < len(e.layers) {
			next = &e.layers[i+1].InputLayernorm
		}
		in = layers.NormIn{H: h, Resid: x, Add: y, Pending: p, Norm: next}
	}
	in.Ready(s) // the last pending projection (or shared experts' output) and norm, still under the last layer as before
	e.setLayer(-1)
	if nLogits == 0 {
		return
	}
	// Only the last new token of each row needs logits: gather those rows.
	// A decode step's rows hold one new token each, token b of row b, so
	// there h's first rows are those rows already and the copy is left out
	// (a launch on every step's chain).
	last := h.Slice(0, nLogits)
	if !s.Decode || T != nLogits {
		last = e.lastHidden.Slice(0, nLogits)
		e.ops.Embedding(last, h, st.last)
	}
	e.lmHead.Forward(s, e.logits.Slice(s.Row0, s.Row0+nLogits), last)
}

// prefill runs the prompts through the model, in steps of at most
// e.maxTokens tokens (a step covers consecutive rows; a prompt too long for
// one step continues in the next), filling cache rows [0, len(prompts)) and
// leaving the logits of each prompt's last token in rows [0, len(prompts))
// of e.logits.
func prefill(e *engine, prompts [][]int) error {
	done := make([]int, len(prompts))
	for b0 := 0; b0 < len(prompts); {
		var tokens [][]int
		var past []int
		budget := e.maxTokens
		for b := b0; b < len(prompts) && budget > 0; b++ {
			n := min(len(prompts[b])-done[b], budget)
			tokens = append(tokens, prompts[b][done[b]:done[b]+n])
			past = append(past, done[b])
			budget -= n
		}
		complete := len(tokens)
		if lastRow := b0 + complete - 1; done[lastRow]+len(tokens[complete-1]) < len(prompts[lastRow]) {
			complete--
		}
		s, err := e.newStep(b0, tokens, past, false, complete)
		if err != nil {
			return err
		}
		e.forward(s, complete)
		for i, t := range tokens {
			done[b0+i] += len(t)
		}
		b0 += complete
	}
	return nil
}

// decodeOne is one decode step, whose inputs newStep wrote: one token
// through the model for every row of s, leaving the logits in rows [0, B) of
// e.logits and, when greedy, their argmax in e.next. It only queues device
// work, so a CUDA graph can capture it.
func decodeOne(e *engine, s *step, greedy bool) {
	B := s.Batch.Rows
	e.forward(s, B)
	if greedy {
		e.ops.Argmax(e.next.Slice(0, B), e.logits.Slice(0, B))
	}
}

// decodeAhead is a greedy decodeOne that leaves the next step's inputs in
// place of its own (DecodeAdvance: each row's argmax its token, one
// position further), so that the next step can be queued before the host
// has read this one's choice.
func decodeAhead(e *engine, s *step) {
	B := s.Batch.Rows
	decodeOne(e, s, true)
	e.ops.DecodeAdvance(s.ids, s.Pos, s.Batch.PastDev, e.next.Slice(0, B))
}
