package kernels

//go:generate go run ./internal/opsgen

// Op names one operation of the Ops interface: the unit a kernel spec selects
// ("--kernels fused,attn_prefill=naive") and the profile counts.
type Op string

// Every op, in the order of opTable.
const (
	OpEmbedding        Op = "embedding"
	OpLinear           Op = "linear"
	OpRMSNorm          Op = "rms_norm"
	OpAddRMSNorm       Op = "add_rms_norm"
	OpAdd              Op = "add"
	OpAddAddRMSNorm    Op = "add_add_rms_norm"
	OpRoPE             Op = "rope"
	OpSwiGLU           Op = "swiglu"
	OpLinearSwiGLU     Op = "linear_swiglu"
	OpRMSNormRoPE      Op = "rms_norm_rope"
	OpLinearAdd        Op = "linear_add"
	OpNormLinear       Op = "add_rms_norm_linear"
	OpAddAddNormLinear Op = "add_add_rms_norm_linear"
	OpNormSwiGLU       Op = "add_rms_norm_linear_swiglu"
	OpLinearNormLinear Op = "linear_add_rms_norm_linear"
	OpLinearNormSwiGLU Op = "linear_add_rms_norm_linear_swiglu"
	OpAttnPrefill      Op = "attn_prefill"
	OpAttnDecode       Op = "attn_decode"
	OpRoPEAttnDecode   Op = "rope_attn_decode"
	OpMLAPrefill       Op = "mla_prefill"
	OpMLADecode        Op = "mla_decode"
	OpMLADecodeRoPE    Op = "mla_decode_rope"
	OpMoERoute         Op = "moe_route"
	OpMoEExperts       Op = "moe_experts"
	OpMoERouted        Op = "moe_routed"
	OpGroupGemm        Op = "group_gemm"
	OpArgmax           Op = "argmax"
	OpDecodeAdvance    Op = "decode_advance"
)

// OpInfo describes an op: its name, the group a kernel spec may name it by
// (TileGym's per-op patch flags attn=, rms_norm=, ...), the ops it is made
// of, and what it does.
type OpInfo struct {
	Op     Op
	Method string // the Ops method that runs it
	Group  string // "" when the op belongs to no group
	// Parts are the ops a composite op does the work of, in order: the
	// Dispatch runs it as one call of its set only where that set fuses it
	// (SetInfo.Fuses) and the spec runs every part on that set too, or
	// where the spec names the op itself (Spec.Whole); else it runs the
	// parts, each on the set the spec runs it on, so that
	// "fused,linear=naive" still means what it says. nil for the other ops.
	Parts []Op
	Doc   string
}

// opTable is the one list of ops: the op list, spec parsing, the dispatch
// (ops_gen.go, written from it and the Ops interface by go generate) and
// the profile's order all come from it.
var opTable = []OpInfo{
	{Op: OpEmbedding, Method: "Embedding", Doc: "gather rows of the embedding table"},
	{Op: OpLinear, Method: "Linear", Doc: "dense projection x·wᵀ + bias (cuBLAS; fused streams decode's weights itself)"},
	{Op: OpRMSNorm, Method: "RMSNorm", Doc: "RMSNorm of each row"},
	{Op: OpAddRMSNorm, Method: "AddRMSNorm", Doc: "residual add, then RMSNorm of the sum"},
	{Op: OpAdd, Method: "Add", Doc: "elementwise sum"},
	{Op: OpAddAddRMSNorm, Method: "AddAddRMSNorm", Parts: []Op{OpAdd, OpAddRMSNorm},
		Doc: "the sum of two addends added into the residual, then RMSNorm of it (the MoE's routed and shared experts' outputs and the next norm): one pass where a set has it"},
	{Op: OpRoPE, Method: "RoPE", Doc: "rotary embedding of the q and k heads, in place"},
	{Op: OpSwiGLU, Method: "SwiGLU", Doc: "silu(gate)·up"},
	{Op: OpLinearSwiGLU, Method: "LinearSwiGLU", Parts: []Op{OpLinear, OpSwiGLU},
		Doc: "the MLP's gate/up projection and SwiGLU: swiglu(x·wᵀ), one GEMM with SwiGLU in its epilogue where a set has it"},
	{Op: OpRMSNormRoPE, Method: "RMSNormRoPE", Parts: []Op{OpRMSNorm, OpRoPE},
		Doc: "DeepSeek's kv_a_layernorm of the latent and the rotary embedding of q's and k's rope dims, in place, in one launch where a set has it"},
	{Op: OpLinearAdd, Method: "LinearAdd", Parts: []Op{OpLinear, OpAdd},
		Doc: "a projection and a residual add: x·wᵀ + bias + addend, one GEMM with the add in its epilogue where a set has it"},
	{Op: OpNormLinear, Method: "AddRMSNormLinear", Parts: []Op{OpAddRMSNorm, OpLinear},
		Doc: "the residual add and the norm before a block, and the block's first projection (Qwen2's qkv): one GEMM normalising x as it loads it where a set has it"},
	{Op: OpAddAddNormLinear, Method: "AddAddRMSNormLinear", Parts: []Op{OpAdd, OpAddRMSNorm, OpLinear},
		Doc: "the MoE's two outputs added into the residual, the norm before the next block, and that block's first projection (DeepSeek's q+kv_a at decode): the projection's weights streamed under the kernel before the norm where a set has it"},
	{Op: OpNormSwiGLU, Method: "AddRMSNormLinearSwiGLU", Parts: []Op{OpAddRMSNorm, OpLinear, OpSwiGLU},
		Doc: "the residual add and the norm before an MLP, its gate/up projection and SwiGLU: one GEMM normalising x as it loads it, SwiGLU in its epilogue, where a set has it"},
	{Op: OpLinearNormLinear, Method: "LinearAddRMSNormLinear", Parts: []Op{OpLinear, OpAddRMSNorm, OpLinear},
		Doc: "a block's last projection, the residual add and the norm after it, and the next block's first projection (Qwen2's down_proj, then qkv): one kernel across the block boundary where a set has it"},
	{Op: OpLinearNormSwiGLU, Method: "LinearAddRMSNormLinearSwiGLU", Parts: []Op{OpLinear, OpAddRMSNorm, OpLinear, OpSwiGLU},
		Doc: "attention's last projection, the residual add and the norm before the MLP, its gate/up projection and SwiGLU (Qwen2's o_proj, then gate/up): one kernel across the block boundary where a set has it"},
	{Op: OpAttnPrefill, Method: "AttentionPrefill", Group: "attn", Doc: "causal GQA attention of new tokens over the KV cache"},
	{Op: OpAttnDecode, Method: "AttentionDecode", Group: "attn", Doc: "GQA attention of one new token per row over the KV cache"},
	// No group: "attn=naive" names attn_decode, and so splits this op,
	// leaving its rope where the spec's base puts it.
	{Op: OpRoPEAttnDecode, Method: "RoPEAttentionDecode", Parts: []Op{OpRoPE, OpAttnDecode},
		Doc: "the rotary embedding of the new token's q and k heads, then attn_decode over them: one kernel rotating them as it loads them where a set has it"},
	{Op: OpMLAPrefill, Method: "MLAPrefill", Group: "mla", Doc: "DeepSeek-V2 latent attention of new tokens"},
	{Op: OpMLADecode, Method: "MLADecode", Group: "mla", Doc: "DeepSeek-V2 latent attention of one new token per row"},
	// No group: "mla=naive" names mla_decode, and would otherwise name this
	// op too and so take its norm and ropes off the base set with it.
	{Op: OpMLADecodeRoPE, Method: "MLADecodeRoPE", Parts: []Op{OpRMSNorm, OpRoPE, OpMLADecode},
		Doc: "a decode step's MLA from its projection on: rms_norm_rope then mla_decode, with q_lat's work in the norm and ropes' launch where a set has it"},
	{Op: OpMoERoute, Method: "MoERoute", Group: "moe", Doc: "MoE router: softmax and top-k of the router logits"},
	{Op: OpMoEExperts, Method: "MoEExperts", Group: "moe", Doc: "MoE routed experts, weighted and summed"},
	{Op: OpMoERouted, Method: "MoERouted", Parts: []Op{OpMoERoute, OpMoEExperts},
		Doc: "MoE router and routed experts: moe_route then moe_experts, one kernel chain where a set has it (every gate/up block routing the tokens itself)"},
	{Op: OpGroupGemm, Method: "GroupGemm", Doc: "grouped GEMM: each group of rows times its own weight matrix"},
	{Op: OpArgmax, Method: "Argmax", Doc: "index of each row's largest logit"},
	{Op: OpDecodeAdvance, Method: "DecodeAdvance",
		Doc: "a greedy decode step's next inputs from its argmax, on the device: each row's chosen token, at the position after its last"},
}

// opPos is each op's position in opTable.
var opPos = func() map[Op]int {
	m := make(map[Op]int, len(opTable))
	for i, info := range opTable {
		m[info.Op] = i
	}
	return m
}()

// OpTable lists every op with its group and description.
func OpTable() []OpInfo { return opTable }

// PartsOf is op's parts where it is a composite op (OpInfo.Parts), else
// nil.
func PartsOf(op Op) []Op {
	if i := opIndex(op); i >= 0 {
		return opTable[i].Parts
	}
	return nil
}

// AllOps lists every op, in opTable's order.
var AllOps = func() []Op {
	ops := make([]Op, len(opTable))
	for i, info := range opTable {
		ops[i] = info.Op
	}
	return ops
}()

// OpGroups are names a kernel spec accepts for several ops at once,
// mirroring TileGym's per-op patch flags (attn=, rms_norm=, rope=, swiglu=).
var OpGroups = func() map[string][]Op {
	g := map[string][]Op{}
	for _, info := range opTable {
		if info.Group != "" {
			g[info.Group] = append(g[info.Group], info.Op)
		}
	}
	return g
}()

// opIndex is op's position in opTable, or -1.
func opIndex(op Op) int {
	if i, ok := opPos[op]; ok {
		return i
	}
	return -1
}

// Ops is what a kernel set implements. Layers call it and never know which
// set runs an op.
//
// Conventions for every method:
//   - Tensors are rows of contiguous elements (see Tensor); an argument
//     documented "pitched" may be a column slice of a wider matrix, the others
//     are packed.
//   - "act" is the device's activation type (Device.ActDType: f32 on the CPU
//     unless made with bf16 activations, bf16 on CUDA); weights are f32, bf16
//     or f16 as loaded; indices are i32. With bf16 activations, sets round
//     where HF's bf16 path rounds (see SDPAFused for attention).
//   - A batch is packed: the T new tokens of all B rows follow each other,
//     row b's tokens at [Batch.Start[b], Batch.Start[b+1]).
//   - Methods queue work and return; errors surface at Device.Sync. Shapes
//     that do not fit are programming errors and panic.
type Ops interface {
	// Embedding gathers rows: out[i,:] = table[ids[i],:].
	// out [N,D] act; table [V,D] weight or act; ids [N] i32.
	Embedding(out, table, ids *Tensor)

	// Linear is out = x · wᵀ + bias.
	// out [N,M] act or f32, pitched; x [N,K] act, pitched; w [M,K] weight;
	// bias [M] weight or nil.
	Linear(out, x, w, bias *Tensor)

	// RMSNorm is out = x / sqrt(mean(x²) + eps) · w over each row, computed in
	// f32 and rounded to act before the multiply by w (as HF does).
	// out, x [N,D] act, pitched, out may be x; w [D] weight.
	RMSNorm(out, x, w *Tensor, eps float32)

	// AddRMSNorm is resid += x, then out = RMSNorm(resid): the residual
	// connection followed by the next norm.
	// out, resid, x [N,D] act; out must not alias resid or x.
	AddRMSNorm(out, resid, x, w *Tensor, eps float32)

	// Add is out = a + b elementwise. out, a, b [N,D] act; out may be a or b.
	Add(out, a, b *Tensor)

	// AddAddRMSNorm is Add(x, x, y) then AddRMSNorm(out, resid, x, w, eps),
	// each rounded as that op rounds: resid += (x + y), the sum rounded to
	// act before it is added, then out = RMSNorm(resid). It is the residual
	// connection of a block whose output comes in two parts (the MoE's
	// routed experts' and its shared experts', which ran beside them) with
	// the next norm. out, resid, x, y [N,D] act; out aliasing none of
	// resid, x and y; x not resid; w [D] weight. x is where the parts
	// leave the sum: a set that runs the op as one kernel may leave it as
	// it was, so that only out and resid are results. It is a composite op
	// (OpInfo.Parts): a Dispatch runs Add and AddRMSNorm (see
	// AddAddRMSNormParts) where the spec puts them on other sets.
	AddAddRMSNorm(out, resid, x, y, w *Tensor, eps float32)

	// RoPE rotates, in place, dims [offset, offset+r.Dim) of each of the
	// heads of every token: head h of token t starts at column h*headStride
	// of row t of x, and is rotated by the angles of position pos[t].
	// x [T, ≥heads*headStride] act, pitched; pos [T] i32.
	RoPE(x *Tensor, heads, headStride, offset int, pos *Tensor, r *Rope)

	// SwiGLU is out = silu(gate) · up with gate = gateUp[:, :I] and
	// up = gateUp[:, I:]. out [N,I] act; gateUp [N,2I] act.
	SwiGLU(out, gateUp *Tensor)

	// LinearSwiGLU is Linear then SwiGLU, out = SwiGLU(x · wᵀ), rounded as
	// the two round (gate and up to act, then as SwiGLU), with w the gate
	// and up projections stacked as the loader holds them: gate rows first.
	// out [N,I] act, pitched; x [N,K] act, pitched; w [2I,K] weight. It is
	// a composite op (OpInfo.Parts): a Dispatch runs Linear and SwiGLU
	// instead where the spec puts them on other sets.
	LinearSwiGLU(out, x, w *Tensor)

	// RMSNormRoPE is what MLA does to q and the new latent after their
	// projection, in place: RMSNorm of kv's first Rank = len(w) columns
	// (kv_a_layernorm), RoPE of q's heads as RoPE(q, heads, headStride,
	// offset, pos, r), and RoPE of kv's last r.Dim columns (k_pe, one
	// head, not normalised), each rounded as that op rounds.
	// q [T, ≥heads*headStride] act, pitched; kv [T, Rank+r.Dim] act,
	// pitched, sharing no element with q (both may be column slices of
	// one matrix); w [Rank] weight; pos [T] i32. It is a composite op
	// (OpInfo.Parts): a Dispatch runs RMSNorm and RoPE, three calls (see
	// RMSNormRoPEParts), where the spec puts them on other sets.
	RMSNormRoPE(q, kv, w *Tensor, eps float32, heads, headStride, offset int, pos *Tensor, r *Rope)
	// LinearAdd is Linear then Add, out = (x · wᵀ + bias) + addend, rounded
	// as the two round (the projection to act, then the sum): the MoE's
	// shared experts' down projection added to the routed experts' output.
	// out, addend [N,M] act, pitched; out may be addend (the same view), so
	// that out += x · wᵀ + bias; out must not alias x; x [N,K] act,
	// pitched; w [M,K] weight; bias [M] weight or nil. It is a composite op
	// (OpInfo.Parts): a Dispatch runs Linear and Add instead where the spec
	// puts them on other sets.
	LinearAdd(out, x, w, bias, addend *Tensor)
	// AddRMSNormLinear is AddRMSNorm(h, resid, x, norm, eps) then
	// Linear(out, h, w, bias), each rounded as that op rounds: a decoder
	// layer's residual connection, the norm before the next block and that
	// block's first projection. out [N,M] act, pitched; h, resid, x [N,K]
	// act, h aliasing neither; norm [K] weight; w [M,K] weight; bias [M]
	// weight or nil. h is where the parts leave the norm's output; a set
	// that runs the op as one kernel may leave it unwritten, so that only
	// out and resid are results. It is a composite op (OpInfo.Parts): a
	// Dispatch runs AddRMSNorm and Linear where the spec puts them on other
	// sets.
	AddRMSNormLinear(out, h, resid, x, norm *Tensor, eps float32, w, bias *Tensor)
	// AddAddRMSNormLinear is AddAddRMSNorm(h, resid, x, y, norm, eps) then
	// Linear(out, h, w, bias), each rounded as that op rounds: a block's
	// output that comes in two parts (the MoE's routed and shared experts'
	// outputs) added into the residual, the norm before the next block and
	// that block's first projection. y [N,K] act; x may be left holding
	// x + y, as AddAddRMSNorm's parts leave it; h is a result, as out and
	// resid are (the next block's attention reads only out, but a set
	// running the op whole writes h as the norm does); the rest as
	// AddRMSNormLinear's. It is a composite op (OpInfo.Parts): a Dispatch
	// runs AddAddRMSNorm (itself Add and AddRMSNorm where the spec splits
	// them) and Linear where the spec puts the parts on other sets.
	AddAddRMSNormLinear(out, h, resid, x, y, norm *Tensor, eps float32, w, bias *Tensor)
	// AddRMSNormLinearSwiGLU is AddRMSNorm(h, resid, x, norm, eps) then
	// LinearSwiGLU(out, h, w), as AddRMSNormLinear is with Linear: the
	// residual connection and the norm before an MLP, and its gate/up
	// projection with SwiGLU. out [N,I] act, pitched; w [2I,K] weight, the
	// gate rows first; the rest as AddRMSNormLinear's. It is a composite op
	// (OpInfo.Parts): a Dispatch runs AddRMSNorm and LinearSwiGLU (itself
	// Linear and SwiGLU where the spec splits them) where the spec puts the
	// parts on other sets.
	AddRMSNormLinearSwiGLU(out, h, resid, x, norm *Tensor, eps float32, w *Tensor)
	// LinearAddRMSNormLinear is Linear(mid, x, w0, bias0) then
	// AddRMSNormLinear(out, h, resid, mid, norm, eps, w, bias), each
	// rounded as that op rounds: a block's last projection, the residual
	// connection and the norm after it, and the next block's first
	// projection (Qwen2's down_proj, then the next layer's input_layernorm
	// and qkv), which a set may run as one kernel across the boundary.
	// mid [N,K] act; x [N,K0] act; w0 [K,K0] weight; bias0 [K] weight or
	// nil; the rest as AddRMSNormLinear's with mid its x: out [N,M] act,
	// pitched; h, resid [N,K] act; norm [K] weight; w [M,K] weight; bias
	// [M] weight or nil. mid is a result, as out and resid are: the parts
	// write it, and so must a set that runs the op whole; h it may leave
	// unwritten. out aliases none of mid, x, h and resid; mid neither x,
	// resid nor h. It is a composite op (OpInfo.Parts): a Dispatch runs
	// Linear and AddRMSNormLinear (itself AddRMSNorm and Linear where the
	// spec splits them) where the spec puts the parts on other sets.
	LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w, bias *Tensor)
	// LinearAddRMSNormLinearSwiGLU is Linear(mid, x, w0, bias0) then
	// AddRMSNormLinearSwiGLU(out, h, resid, mid, norm, eps, w), as
	// LinearAddRMSNormLinear is with AddRMSNormLinear: attention's last
	// projection, the residual connection and the norm before the MLP, and
	// its gate/up projection with SwiGLU (Qwen2's o_proj, then
	// post_attention_layernorm and gate/up). out [N,I] act, pitched; w
	// [2I,K] weight, the gate rows first; the rest as
	// LinearAddRMSNormLinear's. It is a composite op (OpInfo.Parts): a
	// Dispatch runs Linear and AddRMSNormLinearSwiGLU (itself composite)
	// where the spec puts the parts on other sets.
	LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w *Tensor)

	// AttentionPrefill is causal attention of a packed batch of new tokens
	// against each row's KV cache, after appending the new keys and values to
	// it (see AttnArgs).
	AttentionPrefill(a *AttnArgs)

	// AttentionDecode is AttentionPrefill for exactly one new token per row.
	// It reads the row lengths from Batch.PastDev only, so that a CUDA graph
	// can replay it while they change.
	AttentionDecode(a *AttnArgs)

	// RoPEAttentionDecode is RoPE then AttentionDecode, as Qwen2's layer
	// calls them at decode: RoPE(x, Heads, HeadDim, 0, pos, r) of a.Q's
	// and of a.K's heads (dims [0, r.Dim) of each), then AttentionDecode(a)
	// over them, each rounded as that op rounds. a.Q and a.K are the
	// unrotated projections, and a set may leave them so: only a.Out and
	// the caches are results (the cached keys rotated, as AttentionDecode
	// after RoPE caches them). pos [T] i32; a.Q and a.K share no element.
	// It is a composite op (OpInfo.Parts): a Dispatch runs RoPE and
	// AttentionDecode (see RoPEAttentionDecodeParts) where the spec puts
	// them on other sets.
	RoPEAttentionDecode(a *AttnArgs, pos *Tensor, r *Rope)

	// MLAPrefill is DeepSeek-V2 multi-head latent attention of a packed batch
	// against each row's latent cache, after appending the new latents to it
	// (see MLAArgs).
	MLAPrefill(a *MLAArgs)

	// MLADecode is MLAPrefill for one new token per row, reading row lengths
	// from Batch.PastDev only.
	MLADecode(a *MLAArgs)

	// MLADecodeRoPE is RMSNormRoPE of a.Q and a.KV, then MLADecode(a): a
	// decode step's MLA from its projection on, with the norm weights w
	// [Rank] weight, pos [T] i32 and the rotary tables r (r.Dim =
	// a.RopeDim; q's heads rotated at NopeDim of a head of NopeDim+RopeDim),
	// each rounded as those ops round. It is a composite op
	// (OpInfo.Parts): a Dispatch runs RMSNormRoPE (itself composite) and
	// MLADecode instead where the spec puts rms_norm, rope or mla_decode on
	// other sets (see MLADecodeRoPEParts).
	MLADecodeRoPE(a *MLAArgs, w *Tensor, eps float32, pos *Tensor, r *Rope)

	// MoERoute chooses each token's experts from the router logits (see
	// Routing). idx [N,K] i32; weight [N,K] f32; logits [N,E] f32.
	MoERoute(idx, weight, logits *Tensor, r *Routing)

	// MoEExperts is out[t] = Σ_k weight[t,k] · down_e(silu(gate_e·x[t]) · up_e·x[t])
	// with e = idx[t,k], gate_e = gateUp[e, :I], up_e = gateUp[e, I:].
	// out, x [N,H] act; idx, weight [N,K]; gateUp [E,2I,H] weight;
	// down [E,H,I] weight.
	MoEExperts(out, x, idx, weight, gateUp, down *Tensor)

	// MoERouted is MoERoute then MoEExperts over its routes: idx and weight
	// are written as MoERoute writes them, and out as MoEExperts computes
	// it from them, rounded as the two round. out, x [N,H] act; idx [N,K]
	// i32, weight [N,K] f32 (K = r.TopK); logits [N,E] f32; gateUp
	// [E,2I,H] weight; down [E,H,I] weight. It is a composite op
	// (OpInfo.Parts): a Dispatch runs MoERoute and MoEExperts instead where
	// the spec puts them on other sets.
	MoERouted(out, idx, weight, x, logits, gateUp, down *Tensor, r *Routing)

	// GroupGemm is the MoE experts' grouped GEMM: for every group g,
	// out[r] = x[r] · w[g]ᵀ for the rows r in [first[g], first[g+1]). The
	// offsets are read on the device only (a CUDA set may read them on the
	// host, and then says so), so that a graph can replay it with new
	// groups. Rows outside [first[0], first[E]) are not written.
	// out [M,N] act, pitched; x [M,K] act, pitched; w [E,N,K] weight,
	// packed; first [E+1] i32, ascending, first[0] ≥ 0, first[E] ≤ M (an
	// offset outside that fails the call, reported at Sync).
	GroupGemm(out, x, w, first *Tensor)

	// Argmax is out[b] = the first index of the largest element of row b,
	// NaN counting as the largest (as torch.argmax).
	// out [B] i32, or [B,2] i32: then out[b,1] is that element's value, as
	// f32 bits, so that a caller reads the choice and the value it checks in
	// one transfer; logits [B,V] f32 or act.
	Argmax(out, logits *Tensor)

	// DecodeAdvance is what a greedy decode step's inputs become for the
	// next step, one new token a row at the position after its last: for
	// every row b, ids[b] = choice[b,0], past[b] += 1, then pos[b] =
	// past[b] (the new length, which is the new token's position). It
	// reads nothing on the host, so that a CUDA graph of a decode step
	// that ends with it leaves the next step's inputs ready on the device.
	// ids, pos, past [B] i32 (Batch.PastDev); choice [B,2] i32, Argmax's
	// out (the token, then its logit's f32 bits, not read); no two of them
	// share an element.
	DecodeAdvance(ids, pos, past, choice *Tensor)
}

// Batch describes the packed rows of one forward step. Host fields drive
// host-side decisions (launch shapes, the CPU set); the device mirrors are
// what decode kernels read, so that a captured graph can replay with new
// lengths.
type Batch struct {
	Rows   int   // B
	Tokens int   // T, the number of new tokens of all rows
	Start  []int // len B+1: row b's new tokens are packed at [Start[b], Start[b+1])
	Past   []int // len B: tokens already in row b's cache before this step
	MaxSeq int   // the cache's capacity per row

	StartDev *Tensor // [B+1] i32, Start on the device
	PastDev  *Tensor // [B] i32, Past on the device
}

// AttnArgs are the operands of grouped-query attention over a KV cache.
//
// For every row b and new token i of it (position p = Past[b]+i), every query
// head h attends to keys 0..p of row b in kv head h / (Heads/KVHeads) (all
// the row's keys when NonCausal): out = softmax(q·kᵀ·Scale) · v, with the
// softmax in f32.
type AttnArgs struct {
	Out    *Tensor // [T, Heads*HeadDim] act
	Q      *Tensor // [T, Heads*HeadDim] act, pitched, already rotated
	K, V   *Tensor // [T, KVHeads*HeadDim] act, pitched: the new keys (rotated) and values
	KCache *Tensor // [B, KVHeads, MaxSeq, HeadDim] act; new keys are written at [b, :, Past[b]+i]
	VCache *Tensor // as KCache

	Batch   *Batch
	Heads   int
	KVHeads int
	HeadDim int
	Scale   float32
	// NonCausal makes every new token of a prefill attend to all of its
	// row's keys, Past[b] + its new tokens (the kernel benchmarks'
	// non-causal case; the models never set it). Decode ignores it: its one
	// new token is the last key either way.
	NonCausal bool
}

// MLAArgs are the operands of DeepSeek-V2 multi-head latent attention.
//
// The cache keeps, per token, the latent c (Rank values, already through
// kv_a_layernorm) followed by the shared rotated key kr (RopeDim values). For
// head h, with kv_b_proj split per head into W_UK[h] (NopeDim rows) and
// W_UV[h] (VDim rows):
//
//	k_h[s] = (W_UK[h]·c[s], kr[s]), v_h[s] = W_UV[h]·c[s]
//	out_h = softmax(q_h·k_hᵀ·Scale) · v_h over s = 0..p (causal)
//
// which is HF's DeepseekV2Attention; an implementation may instead absorb
// W_UK into q and W_UV into the output.
type MLAArgs struct {
	Out   *Tensor // [T, Heads*VDim] act
	Q     *Tensor // [T, Heads*(NopeDim+RopeDim)] act, pitched; per head nope then rope (rotated)
	KV    *Tensor // [T, Rank+RopeDim] act, pitched: the new latents and rotated keys
	Cache *Tensor // [B, MaxSeq, Rank+RopeDim] act; new entries written at [b, Past[b]+i]
	WKVB  *Tensor // kv_b_proj.weight [Heads*(NopeDim+VDim), Rank]

	Batch   *Batch
	Heads   int
	NopeDim int
	RopeDim int
	VDim    int
	Rank    int
	Scale   float32
}

// Rope holds the rotary angles of every position, computed by the model
// (default, or YaRN with its scaling folded into the table).
type Rope struct {
	Dim         int     // rotated dims per head (even)
	Interleaved bool    // pairs (2i, 2i+1) as DeepSeek-V2; else (i, i+Dim/2) as Qwen2's rotate_half
	Cos, Sin    *Tensor // [MaxPos, Dim/2] f32
}

// RouteMethod is how MoERoute picks experts.
type RouteMethod int

// The routing methods of DeepSeek-V2 (config topk_method).
const (
	RouteGreedy       RouteMethod = iota // top-k of all experts
	RouteGroupLimited                    // top-k within the TopKGroups groups whose best expert scores highest
)

// Routing is the MoE router's configuration: scores = softmax(logits) in f32;
// choose TopK experts by Method; weights are the chosen scores, divided by
// their sum when NormTopK (and TopK > 1), then multiplied by Scale.
type Routing struct {
	Method     RouteMethod
	TopK       int
	Groups     int // n_group, for RouteGroupLimited
	TopKGroups int // topk_group, for RouteGroupLimited
	NormTopK   bool
	Scale      float32 // routed_scaling_factor
}

// SDPAFused reports whether HF's default attention, torch's
// scaled_dot_product_attention on CUDA with bf16 inputs, runs heads with
// query/key dim dqk and value dim dv in a fused kernel (flash attention when
// dqk == dv ≤ 256; memory-efficient or cuDNN attention when both are
// multiples of 8) or else in its math backend. The two round differently:
// the fused kernels round the softmax numerators exp(s − max) to bf16 before
// P·V and divide by their f32 sum; the math backend computes in f32 and
// rounds only the output. Kernel sets that mean to match HF's logits in bf16
// follow the same split.
func SDPAFused(dqk, dv int) bool { return dqk == dv && dqk <= 256 || dqk%8 == 0 && dv%8 == 0 }
