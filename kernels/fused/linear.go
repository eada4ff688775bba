package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The tiling of linear_skinny, named as in linear.cu.
const (
	// linWarps is LIN_WARPS: warps of a block, each one m16 tile of
	// output features; linFeatures (LIN_FEATS) is a block column.
	linWarps    = 8
	linFeatures = linWarps * 16
	// linStage is LIN_STAGE: the k of one pipeline stage (4 chunks of 32),
	// the unit a split of K comes in.
	linStage = 128
	// linPhase is LIN_PHASE: the k of x one shared buffer holds.
	linPhase = 512
	// linMaxRows is the most rows (tokens) the kernel takes: two n8 tiles,
	// the 16 columns of one mma m16n8k16 pair.
	linMaxRows = 16
	// linMinSplitK is the least k a split covers: two stages, so that a
	// split block keeps a stage in flight while it multiplies one.
	linMinSplitK = 2 * linStage
	// linMinBlocks is LIN_MIN_BLOCKS, the blocks an SM holds by the
	// kernel's launch bounds: the residency a plan assumes when the compiled
	// kernel is not at hand (a dry run).
	linMinBlocks = 2
	// regsPerSM and threadsPerSM are what every SM from sm_80 to sm_90
	// has; sharedReserve is what the driver keeps per block.
	regsPerSM     = 64 << 10
	threadsPerSM  = 2048
	sharedReserve = 1 << 10
)

// Linear variants: "skinny", linear_skinny (weights streamed once, rows ≤
// linMaxRows); "cublas", the shared cuBLAS addmm naive runs too; on sm_90a
// linear_stream (linear_stream.go), the default for linStreamRows rows
// under linStreamBytes, linear_swap (linear_swap.go) for up to swMaxRows
// rows, the default for 9 to 16 rows of K at least linSwapMinK (linear_swap.go) and
// everywhere where linSwapDefault is on, and linear_wgmma's instances for prefill's many
// rows (lwConfigs, linear_wgmma.go), which run without a tuning choice
// only where linWgmmaDefault says so (nowhere yet). Without a
// tuning choice a shape runs skinny when it has at most linMaxRows rows and
// at least linSkinnyBytes of weights: in infer bench linear
// (bench/RESULTS.md, linear), skinny reads the big streams at
// 95–101% of the copy rate where cuBLAS reaches 86–100% (gate_up 67.8 µs
// against 74.4 at one row, lm_heads 99 against 108), but loses 1–4 µs on
// every matrix under ~150 MB (its split-K reduction and launch cost more
// than cuBLAS's own), so the default leaves those to cuBLAS; `infer bench
// linear --optimize` chooses per shape. Beyond linMaxRows cuBLAS's tiles
// reuse each weight over many rows.
const (
	linSkinny = "skinny"
	linCuBLAS = "cublas"
)

// linSkinnyBytes is the least weight bytes a problem has for linear_skinny
// to run it without a tuning choice (see above): 200 MiB puts Qwen2-7B's
// gate_up (259 MiB) and both models' lm_heads on it, and every matrix that
// measured slower than cuBLAS (the largest, Qwen2-7B's down, 130 MiB) off.
// A variable, so that tests can put every small problem on skinny.
var linSkinnyBytes int64 = 200 << 20

// linearKey is a linear problem as its tuning key names it: M rows of x,
// N output features, K inputs.
type linearKey struct{ m, n, k int }

func (k linearKey) String() string { return fmt.Sprintf("M=%d,N=%d,K=%d", k.m, k.n, k.k) }

func parseLinearKey(s string) (linearKey, error) {
	var k linearKey
	if _, err := fmt.Sscanf(s, "M=%d,N=%d,K=%d", &k.m, &k.n, &k.k); err != nil || k.String() != s {
		return linearKey{}, fmt.Errorf("tuning key %q is not M=<rows>,N=<features>,K=<inputs>", s)
	}
	return k, nil
}

// linearDefault is the variant a problem runs without a tuning choice:
// linWgmmaDefault from linWgmmaRows rows where it can run here, stream for
// up to linStreamRows rows (linMaxRows where the output has at most
// linStreamNarrow features) under linStreamBytes where it can run, swap
// for linSwapMinRows to swMaxRows rows where linSwapDefault is on and it
// can run, and for linSwapMinRows to linMaxRows rows of at least
// linSwapMinK inputs and more than linStreamNarrow outputs where it can
// run, skinny for the other big streams of few rows, else cuBLAS.
func (o *ops) linearDefault(k linearKey) string {
	if linWgmmaDefault != "" && k.m >= linWgmmaRows {
		if _, ok := o.lw.runs(linWgmmaDefault); ok {
			return linWgmmaDefault
		}
	}
	bytes := int64(k.n) * int64(k.k) * 2
	rows := k.m <= linStreamRows || k.m <= linMaxRows && k.n <= linStreamNarrow
	if rows && bytes < linStreamBytes && o.ls.ready() == nil {
		if sms, shared := streamTarget(o); planStreamOK(k, sms, shared) {
			return linStream
		}
	}
	swapRows := linSwapDefault && k.m <= swMaxRows || k.m <= linMaxRows && k.k >= linSwapMinK && k.n > linStreamNarrow
	if swapRows && k.m >= linSwapMinRows && o.sw.ready() == nil {
		if _, err := o.swapPlan(k.m, k.n, k.k, false); err == nil {
			return linSwap
		}
	}
	if k.m <= linMaxRows && bytes >= linSkinnyBytes {
		return linSkinny
	}
	return linCuBLAS
}

// linearState is the fused set's linear on one device.
type linearState struct {
	counters *kernels.Tensor // i32 [SMs]: finished splits of each split column, 0 between launches
	perSM    map[string]int  // blocks an SM holds, by kernel
}

func linearKernel(nt int, out kernels.DType) string {
	return fmt.Sprintf("linear_skinny_n%d_%s", nt, out)
}

func linearKernels() []string { return cudaset.Names(linearInstances()) }

// initLinear reads each kernel's residency from what the compiler made of
// it and allocates the split counters: at most one per SM (see planLinear),
// zeroed once here, so that no launch allocates or clears anything and a
// captured graph replays it.
func (o *ops) initLinear() error {
	o.lin.perSM = map[string]int{}
	for _, name := range linearKernels() {
		a, err := o.Func(name).Attrs()
		if err != nil {
			return fmt.Errorf("fused: %s: %w", name, err)
		}
		o.lin.perSM[name] = o.residentBlocks(a, linWarps*32, 0)
	}
	o.lin.counters = newCounters(o.Kit, o.SMs)
	return nil
}

// residentBlocks is how many blocks of a kernel the compiler made a of,
// with threads threads and dynShared bytes of dynamic shared memory, an SM
// holds at once (its registers, threads and shared memory), at least one.
func (o *ops) residentBlocks(a cuda.FuncAttrs, threads, dynShared int) int {
	regs := (a.Regs + 7) / 8 * 8 // allocated per thread in units of 8
	return max(1, min(regsPerSM/max(1, regs*threads), threadsPerSM/threads,
		o.D.Props().MaxSharedPerSM/(a.StaticShared+dynShared+sharedReserve)))
}

// linearPlan is how linear_skinny covers a problem: columns of linFeatures
// features, the first full of them each one block over all of K, the rest
// each split over K into splits blocks of chunk k.
type linearPlan struct {
	columns, full, splits, chunk int
}

// blocks is the grid.
func (p linearPlan) blocks() int { return p.full + (p.columns-p.full)*p.splits }

// planLinear plans n features of k inputs on sms SMs holding perSM blocks
// each. Whole columns come in waves of sms·perSM blocks; the streams of one
// wave progress together, each at its share of the memory's rate, so a wave
// with at least one block per SM keeps the memory busy. A last wave with
// fewer columns than SMs (or a problem of fewer) would leave SMs idle and
// too few bytes in flight: those columns are split over K so that their
// blocks number about one per SM, each split at least linMinSplitK deep.
// Split columns are always fewer than sms (one counter each).
func planLinear(n, k, sms, perSM int) linearPlan {
	c := (n + linFeatures - 1) / linFeatures
	p := linearPlan{columns: c, full: c, splits: 1}
	wave := sms * perSM
	rem := c % wave
	if c < wave {
		rem = c
	}
	if rem == 0 || rem >= sms || k < 2*linMinSplitK {
		return p
	}
	splits := min((sms+rem-1)/rem, k/linMinSplitK)
	chunk := ((k+splits-1)/splits + linStage - 1) / linStage * linStage
	splits = (k + chunk - 1) / chunk
	if splits < 2 {
		return p
	}
	p.full, p.splits, p.chunk = c-rem, splits, chunk
	return p
}

func (p linearPlan) String() string {
	s := fmt.Sprintf("columns=%d of %d features", p.columns, linFeatures)
	if p.full < p.columns {
		s += fmt.Sprintf(", %d split %d ways of %d k", p.columns-p.full, p.splits, p.chunk)
	}
	return s
}

// Linear is out = x·wᵀ + bias: linear_skinny for the few rows of a decode
// step, linear_wgmma on sm_90a for prefill's many, cuBLAS (cudaset.Addmm,
// the GEMM naive runs) for the rest, as the tuning choice for the shape, or
// linearDefault, says. All round as torch's addmm (see linear.cu). skinny
// needs bf16 weights with K a multiple of 8 and x's rows on 16-byte
// boundaries, linear_wgmma bf16 out and every matrix's rows on 16-byte
// boundaries (lwTakes); a problem that has not them runs cuBLAS.
func (o *ops) Linear(out, x, w, bias *kernels.Tensor) {
	kernels.CheckLinear(o.D.ActDType(), out, x, w, bias)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	if m == 0 || n == 0 {
		return
	}
	v := o.linearFor(linearKey{m, n, k})
	if v == linStream && m <= linMaxRows && o.streamTakes(out, x, w) && o.stream(out, x, w, bias) {
		return
	}
	if v == linSwap && o.swap(out, x, w, bias) {
		return
	}
	if v == linSkinny && m <= linMaxRows && o.skinnyTakes(out, x, w) {
		o.skinny(out, x, w, bias)
		return
	}
	if c, ok := o.lw.runs(v); ok && o.lwTakes(out, x, w) {
		o.linearWgmma(c, out, x, w, bias)
		return
	}
	o.Addmm(out, x, w, bias)
}

// skinnyTakes reports whether linear_skinny's loads fit x and w: bf16
// x and weights (the mma's operands), packed weights, K a multiple of 8,
// and 16-byte aligned rows; and whether it has an instance for out's dtype
// (bf16 or f32).
func (o *ops) skinnyTakes(out, x, w *kernels.Tensor) bool {
	k := x.Cols()
	return decodeLinearOut(out) && cudaset.IsBF16(x) && cudaset.IsBF16(w) && w.Pitch == k && k%cudaset.VecWidth == 0 && x.Pitch%cudaset.VecWidth == 0 &&
		o.D.Ptr(x)%16 == 0 && o.D.Ptr(w)%16 == 0
}

// decodeLinearOut reports whether the decode linears (linear_skinny,
// linear_stream) have instances writing out's dtype: bf16 activations or
// f32 logits.
func decodeLinearOut(out *kernels.Tensor) bool {
	return out.DType == kernels.BF16 || out.DType == kernels.F32
}

// skinny launches linear_skinny as planLinear cuts the problem.
func (o *ops) skinny(out, x, w, bias *kernels.Tensor) {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	nt := (m + 7) / 8
	name := linearKernel(nt, out.DType)
	p := planLinear(n, k, o.SMs, o.lin.perSM[name])
	var part cudaset.Mat
	if p.full < p.columns {
		part = o.Scratch("linear.part", kernels.F32, p.splits*m, (p.columns-p.full)*linFeatures)
	}
	bp, biasType := o.linBias(bias)
	om, xm := o.Mat(out), o.Mat(x)
	o.Launch(name, p.blocks(), linWarps*32,
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), o.D.Ptr(w), bp, biasType, part.P, o.D.Ptr(o.lin.counters),
		int32(m), int32(n), int32(k), int32(p.full), int32(p.splits), int32(p.chunk))
}

// linBias is bias as the decode linears take it (linear.cuh's lin_bias):
// its address (0 for none) and the code of its dtype.
func (o *ops) linBias(bias *kernels.Tensor) (uintptr, int32) {
	if bias == nil {
		return 0, 0
	}
	code := map[kernels.DType]int32{kernels.BF16: 1, kernels.F16: 2, kernels.F32: 3}[bias.DType]
	return o.D.Ptr(bias), code
}

// skinnyValid is linear_skinny's params for shape s (M rows, N features,
// K inputs) on t, with its plan on t's SMs, or why it cannot run it.
func skinnyValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	m, n, k := s["M"], s["N"], s["K"]
	var rows, vec string
	if m > linMaxRows {
		rows = fmt.Sprintf("M=%d rows: linear_skinny takes at most %d (two n8 tiles of one mma)", m, linMaxRows)
	}
	if k%cudaset.VecWidth != 0 {
		vec = fmt.Sprintf("K=%d is not a multiple of %d (16-byte weight loads): cublas runs it", k, cudaset.VecWidth)
	}
	why = join(archWhy(t), rows, vec)
	params = fmt.Sprintf("warps=%d stage_k=%d phase_k=%d rows<=%d", linWarps, linStage, linPhase, linMaxRows)
	if why == "" {
		params += fmt.Sprintf(" %v", planLinear(n, k, max(1, t.SMs), linMinBlocks))
	}
	return params, why, true
}

// chosenOr is the tuning choice of op for k where there is one, else
// what def says.
func (o *ops) chosenOr(op kernels.Op, k linearKey, def func(linearKey) string) string {
	if v, ok := o.choice[choiceKey{op, k.String()}]; ok {
		return v
	}
	return def(k)
}

// linearFor is the variant problems of key run: the tuning choice for key,
// else linearDefault (linear's rule, tunings' pick).
func (o *ops) linearFor(k linearKey) string {
	return o.chosenOr(kernels.OpLinear, k, o.linearDefault)
}

// linSwiGLUUnfused is linear_swiglu's variant that runs the pair as two
// ops: LinearSwiGLU declines it, and the Dispatch runs the set's Linear
// (its own variant for the stacked problem: skinny, cuBLAS or
// linear_wgmma) into an intermediate [M, 2I], then swiglu. The others are
// linStream, linear_stream with SwiGLU in its epilogue, and linear_wgmma's
// instances (lwConfigs) with SwiGLU in the epilogue, named as linear's.
const linSwiGLUUnfused = "unfused"

// linearSwiGLUDefault is the variant a linear_swiglu problem (k: its
// stacked GEMM, N = 2I) runs without a tuning choice: the epilogue of the
// kernel linear's rule would run the stacked problem on, where that kernel
// has one and it can run here; else the unfused pair. So linear_wgmma's
// default instance from linWgmmaRows rows (where linWgmmaDefault names
// one: nowhere yet), and linear_stream where linearDefault runs it (at one
// row under linStreamBytes: both models' MLPs at batch 1),
// and linear_swap where linearDefault runs it (Qwen2-7B's MLP at 16 rows).
func (o *ops) linearSwiGLUDefault(k linearKey) string {
	if linWgmmaDefault != "" && k.m >= linWgmmaRows {
		if _, ok := o.lw.runs(linWgmmaDefault); ok {
			return linWgmmaDefault
		}
	}
	if k.n%2 == 0 && o.linearDefault(k) == linStream {
		if sms, shared := streamTarget(o); planStreamSwiGLUOK(k, sms, shared) {
			return linStream
		}
	}
	if k.n%2 == 0 && o.linearDefault(k) == linSwap {
		if _, err := o.swapPlan(k.m, k.n/2, k.k, true); err == nil {
			return linSwap
		}
	}
	return linSwiGLUUnfused
}

// linearSwiGLUFor is the variant linear_swiglu problems of k run: the
// tuning choice for k, else linearSwiGLUDefault.
func (o *ops) linearSwiGLUFor(k linearKey) string {
	return o.chosenOr(kernels.OpLinearSwiGLU, k, o.linearSwiGLUDefault)
}

// LinearSwiGLU is the MLP's gate/up projection and SwiGLU in one kernel,
// out written once, on sm_90a only: linear_stream with SwiGLU in its
// epilogue where the variant for the problem is linStream and it takes the
// operands (streamSwiGLU), linear_wgmma with it where the variant is one
// of its instances and the operands fit its tensor maps (lwTakes).
// Elsewhere (the unfused variant: a decode step of more rows, prefill
// while linear_wgmma's epilogue is not the default, any other device) it
// declines the call, and the Dispatch runs the parts, the set's Linear and
// SwiGLU, as they ran before this op and in their own profile rows (see
// kernels.Dispatch). All round as HF's bf16 act_fn(gate_proj(x)) *
// up_proj(x) (see linear_wgmma.cu's LwSwiGLU); linear_stream's epilogue
// gives its unfused pair's outputs (linear_stream then swiglu) bit for
// bit.
func (o *ops) LinearSwiGLU(out, x, w *kernels.Tensor) {
	kernels.CheckLinearSwiGLU(o.D.ActDType(), out, x, w)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	v := o.linearSwiGLUFor(linearKey{m, n, k})
	if v == linSwap {
		o.Need(o.swapSwiGLU(out, x, w), kernels.OpLinearSwiGLU,
			"variant %s at M=%d,N=%d,K=%d: linear_swap does not take it: linear then swiglu run it", v, m, n, k)
		return
	}
	if v == linStream {
		o.Need(o.streamSwiGLU(out, x, w), kernels.OpLinearSwiGLU,
			"variant %s at M=%d,N=%d,K=%d: linear_stream does not take it: linear then swiglu run it", v, m, n, k)
		return
	}
	c, ok := o.lw.runs(v)
	o.Need(ok && o.lwTakes(out, x, w), kernels.OpLinearSwiGLU, "variant %s at M=%d,N=%d,K=%d: linear then swiglu run it", v, m, n, k)
	if m > 0 {
		o.linearSwiGLUWgmma(c, out, x, w)
	}
}

// linAddUnfused is linear_add's variant that runs the pair as two ops:
// LinearAdd declines it, and the Dispatch runs the set's Linear (its own
// variant for the problem) into an intermediate [M, N], then add. The
// other is linStream, linear_stream with the add in its epilogue.
const linAddUnfused = "unfused"

// linearAddDefault is the variant a linear_add problem runs without a
// tuning choice: linear_stream with the add in its epilogue where linear
// runs linear_stream for the problem (linearFor: its tuning choice, else
// linearDefault: DeepSeek-V2-Lite's shared experts' down projection up to
// 16 rows), else the unfused pair.
func (o *ops) linearAddDefault(k linearKey) string {
	return streamWhere(o.linearFor(k), linAddUnfused)
}

// streamWhere is the default of an op that is linear_stream with work
// folded in: linStream where base, the variant of the op it folds into
// (linear's or linear_swiglu's for the problem), is linStream, else
// unfused, its parts.
func streamWhere(base, unfused string) string {
	if base == linStream {
		return linStream
	}
	return unfused
}

// linearAddFor is the variant linear_add problems of k run: the tuning
// choice for k, else linearAddDefault.
func (o *ops) linearAddFor(k linearKey) string {
	return o.chosenOr(kernels.OpLinearAdd, k, o.linearAddDefault)
}

// LinearAdd is a projection and a residual add in one kernel, out written
// once, on sm_90a only: linear_stream with the add in its epilogue where
// the variant for the problem is linStream and it takes the operands
// (streamAdd). Elsewhere it declines the call, and the Dispatch runs the
// parts, the set's Linear and Add, as they ran before this op and in their
// own profile rows (see kernels.Dispatch). The epilogue gives the parts'
// outputs (linear_stream, then fused's add) bit for bit.
func (o *ops) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	kernels.CheckLinearAdd(o.D.ActDType(), out, x, w, bias, addend)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	v := o.linearAddFor(linearKey{m, n, k})
	o.Need(v == linStream && o.streamAdd(out, x, w, bias, addend), kernels.OpLinearAdd,
		"variant %s at M=%d,N=%d,K=%d: linear then add run it", v, m, n, k)
}

// linNormUnfused is add_rms_norm_linear's and add_rms_norm_linear_swiglu's
// variant that runs the op as its parts: the op declines it, and the
// Dispatch runs the set's AddRMSNorm into h, then its Linear (or
// LinearSwiGLU) of h. The other is linStream, linear_stream normalising x
// as it loads it.
const linNormUnfused = "unfused"

// normLinearDefault is the variant an add_rms_norm_linear problem (k: its
// projection's) runs without a tuning choice: linear_stream where linear
// runs linear_stream for the problem (linearFor: its tuning choice, else
// linearDefault: one row), else the parts.
func (o *ops) normLinearDefault(k linearKey) string {
	return streamWhere(o.linearFor(k), linNormUnfused)
}

// normSwiGLUDefault is normLinearDefault for add_rms_norm_linear_swiglu (k:
// its stacked GEMM's, N = 2I), following linear_swiglu's variant.
func (o *ops) normSwiGLUDefault(k linearKey) string {
	return streamWhere(o.linearSwiGLUFor(k), linNormUnfused)
}

// addAddNormLinearDefault is the variant an add_add_rms_norm_linear problem
// (k: its projection's) runs without a tuning choice: linStream, the
// releasing norm then linear_stream, where linear runs cuBLAS or
// linear_stream for the problem at up to linMaxRows rows and
// linear_stream can run it (DeepSeek-V2-Lite's q+kv_a after the MoE at 16
// rows, which linear runs on cuBLAS: W4 +1.1%, W5 ±0.0%, bench/RESULTS.md,
// Decode), else the parts.
func (o *ops) addAddNormLinearDefault(k linearKey) string {
	if v := o.linearFor(k); k.m <= linMaxRows && (v == linCuBLAS || v == linStream) && o.ls.ready() == nil {
		if sms, shared := streamTarget(o); planStreamOK(k, sms, shared) {
			return linStream
		}
	}
	return linNormUnfused
}

// addAddNormLinearFor is the variant add_add_rms_norm_linear problems of k
// run: the tuning choice for k, else the default.
func (o *ops) addAddNormLinearFor(k linearKey) string {
	return o.chosenOr(kernels.OpAddAddNormLinear, k, o.addAddNormLinearDefault)
}

// normLinearFor and normSwiGLUFor are the variants problems of k run: the
// tuning choice for k, else the default.
func (o *ops) normLinearFor(k linearKey) string {
	return o.chosenOr(kernels.OpNormLinear, k, o.normLinearDefault)
}
func (o *ops) normSwiGLUFor(k linearKey) string {
	return o.chosenOr(kernels.OpNormSwiGLU, k, o.normSwiGLUDefault)
}

// AddRMSNormLinear is the residual add, the norm and a projection in one
// kernel on sm_90a: linear_stream normalising x as it loads it where the
// variant for the problem is linStream and it takes the operands
// (streamNorm). Elsewhere it declines the call, and the Dispatch runs the
// parts, the set's AddRMSNorm and Linear, as they ran before this op and in
// their own profile rows. Its results are the parts' bit for bit; h is
// left unwritten.
func (o *ops) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckAddRMSNormLinear(o.D.ActDType(), out, h, resid, x, norm, w, bias)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	v := o.normLinearFor(linearKey{m, n, k})
	o.Need(v == linStream && o.streamNorm(out, h, resid, x, norm, eps, w, bias, false), kernels.OpNormLinear,
		"variant %s at M=%d,N=%d,K=%d: add_rms_norm then linear run it", v, m, n, k)
}

// AddAddRMSNormLinear is a block's two-part output added into the
// residual, the norm and the next block's first projection, on sm_90a
// where the variant for the projection is linStream
// (addAddNormLinearFor): two launches, add_add_rms_norm's instance that
// releases the kernel after it before its own grid_wait, then
// linear_stream, so that the projection's blocks request their weights
// (all of them at DeepSeek-V2-Lite's q+kv_a: two 64 KB stages a block)
// under the kernel before the norm, where SMs free up as it ends (moe_one's
// tail), not under the norm's 2 µs. Both launches are the parts' kernels
// (h the norm's output, the projection linear_stream's), so the results
// are bit for bit those of the parts on this set with linear_stream.
// Elsewhere (another variant, bf16 weights not 16-byte aligned for the
// norm, operands linear_stream does not take) it declines, and the
// Dispatch runs add_add_rms_norm then linear.
func (o *ops) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	const op = kernels.OpAddAddNormLinear
	kernels.CheckAddAddRMSNormLinear(o.D.ActDType(), out, h, resid, x, y, norm, w, bias)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	if m == 0 || n == 0 {
		return
	}
	v := o.addAddNormLinearFor(linearKey{m, n, k})
	o.Need(v == linStream, op, "variant %s at M=%d,N=%d,K=%d: add_add_rms_norm then linear run it", v, m, n, k)
	o.Need(o.addAddReleasing(h, resid, x, y, norm), op, "no releasing add_add_rms_norm for these operands (bf16 weights, 16-byte rows): add_add_rms_norm then linear run it")
	sms, shared := streamTarget(o)
	p, err := planStream(m, n, k, sms, shared)
	o.Need(err == nil && o.streamTakes(out, h, w), op, "linear_stream does not take M=%d,N=%d,K=%d here: add_add_rms_norm then linear run it", m, n, k)
	o.norm(op, "add_add_rms_norm_rf", h, resid, x, y, norm, eps)
	o.launchStream(p, out, h, w, bias)
}

// LinearAddRMSNormLinear is a block's last projection, the residual add
// and norm of its output and the next block's first projection, on sm_90a
// where both projections' variants are linSwap (16 rows): linear_swap's two
// launches with the norm split between them (swapChain), no add_rms_norm
// launch between. Elsewhere it declines, and the Dispatch runs linear then
// add_rms_norm_linear, each as before. mid and resid are the parts' bit
// for bit; out is computed from the unnormalised sums scaled by each row's
// 1/rms (linear_swap.cu), within rounding of the parts'; h holds
// bf16(norm·resid).
func (o *ops) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinear(o.D.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w, bias)
	m, k0, n0, n := x.Rows(), x.Cols(), w0.Rows(), w.Rows()
	v0, v := o.linearFor(linearKey{m, n0, k0}), o.linearFor(linearKey{m, n, n0})
	o.Need(v0 == linSwap && v == linSwap && o.swapChain(mid, x, w0, bias0, out, h, resid, norm, eps, w, bias, false),
		kernels.OpLinearNormLinear, "variants %s then %s at M=%d,N0=%d,K0=%d,N=%d: linear then add_rms_norm_linear run it", v0, v, m, n0, k0, n)
}

// LinearAddRMSNormLinearSwiGLU is LinearAddRMSNormLinear with SwiGLU in
// the second projection's epilogue, where linear_swiglu's variant is
// linSwap.
func (o *ops) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckLinearAddRMSNormLinearSwiGLU(o.D.ActDType(), mid, x, w0, bias0, out, h, resid, norm, w)
	m, k0, n0, n := x.Rows(), x.Cols(), w0.Rows(), w.Rows()
	v0, v := o.linearFor(linearKey{m, n0, k0}), o.linearSwiGLUFor(linearKey{m, n, n0})
	o.Need(v0 == linSwap && v == linSwap && o.swapChain(mid, x, w0, bias0, out, h, resid, norm, eps, w, nil, true),
		kernels.OpLinearNormSwiGLU, "variants %s then %s at M=%d,N0=%d,K0=%d,N=%d: linear then add_rms_norm_linear_swiglu run it", v0, v, m, n0, k0, n)
}

// AddRMSNormLinearSwiGLU is AddRMSNormLinear with SwiGLU in the epilogue,
// where linear_swiglu's variant for the problem is linStream.
func (o *ops) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	kernels.CheckAddRMSNormLinearSwiGLU(o.D.ActDType(), out, h, resid, x, norm, w)
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	v := o.normSwiGLUFor(linearKey{m, n, k})
	o.Need(v == linStream && o.streamNorm(out, h, resid, x, norm, eps, w, nil, true), kernels.OpNormSwiGLU,
		"variant %s at M=%d,N=%d,K=%d: add_rms_norm then linear_swiglu run it", v, m, n, k)
}
