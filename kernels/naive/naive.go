// Package naive is the baseline CUDA kernel set: every op the way PyTorch
// eager runs it, one plain kernel or cuBLAS call per torch op, attention with
// its scores materialized. The .cu sources are embedded and compiled by NVRTC
// when the set is built for a device.
package naive

import (
	_ "embed"
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
)

var (
	//go:embed common.cuh
	commonSrc string
	//go:embed elementwise.cu
	elementwiseSrc string
	//go:embed attention.cu
	attentionSrc string
	//go:embed moe.cu
	moeSrc string
)

// Launch shapes.
const (
	// blockThreads is the block size of the 1-D grid-stride kernels and the
	// most threads of the per-row ones.
	blockThreads = 256
	// blocksPerSM is how many blocks of blockThreads an SM holds at once
	// (2048 resident threads on Hopper); grid-stride launches fill one wave.
	blocksPerSM = 8
	// argmaxThreads is the block of the per-row argmax over a vocabulary.
	argmaxThreads = 1024
	// vecWidth is the elements one thread moves per access when every row
	// start allows it: 16 bytes of bf16.
	vecWidth = 8
	// routeThreads is moe_route's block: one thread per expert, so the most
	// experts a router may have.
	routeThreads = 256
	// maxTopK is the most experts a token may choose.
	maxTopK = 16
)

// Sizes that pick between code paths; variables so that the tests can take
// every path at small shapes.
var (
	// chunkBudget bounds the temporaries of one step of materialized
	// attention: the f32 scores and bf16 probabilities of a chunk of queries,
	// or MLA decode's decompressed keys and values.
	chunkBudget int64 = 4 << 30
	// queryChunk is the most queries one step of prefill attention takes.
	// A chunk's keys stop at its last query's position, so chunking by
	// queries leaves most of the causally masked half of the score square
	// uncomputed: at 10,816 tokens, chunks of 1024 compute 1.1× the causal
	// scores where one chunk of all queries would compute 2×; each GEMM
	// still has 1024×group rows.
	queryChunk = 1024
	// moeGraphTokens is the most tokens MoEExperts handles without reading
	// anything on the host, so that decode steps of up to this many rows can
	// be captured in a CUDA graph. Larger calls (prefill) read the
	// per-expert counts back once, as HF's expert loop does.
	moeGraphTokens = 64
)

// Scratch slots. Ops run one after another on the device's stream, so ops
// share slots; within one op each temporary has a slot of its own.
const (
	slotRstd      = 0 // RMSNorm: rstd f32 [N]
	slotScores    = 0 // attention: scores f32 [heads*queries, keys]
	slotProbs     = 1 // attention: probabilities bf16 [heads*queries, keys]
	slotLatentKV  = 2 // MLA: decompressed keys and values bf16 [positions, Heads*(NopeDim+VDim)]
	slotMaskedKV  = 3 // decode: the cache with unused positions zeroed
	slotAttnAcc   = 4 // attention: P·V of the softmax numerators f32 [queries, heads*dim]
	slotAttnSum   = 5 // attention: the numerators' sums f32 [heads*queries]
	slotLatentF32 = 6 // MLA, math-backend dims: the decompressed keys and values as f32
	slotMoESlot   = 0 // MoE: sorted row of every choice i32 [N*K]
	slotMoEX      = 1 // MoE: gathered tokens, then expert outputs bf16 [rows, H]
	slotMoEH      = 2 // MoE: gate and up projections bf16 [rows, 2I]
	slotMoEAct    = 3 // MoE: SwiGLU activations bf16 [rows, I]
)

func init() {
	kernels.Register(kernels.SetInfo{Name: "naive", Device: "cuda", New: New})
}

// module is one NVRTC compilation unit: common.cuh followed by src.
type module struct {
	file  string
	src   string
	opts  []string
	funcs []string // its extern "C" kernels
}

func modules() []module {
	var ew, at, moe []string
	vecs := []int{1, vecWidth}
	floats := []kernels.DType{kernels.BF16, kernels.F16, kernels.F32}
	for _, v := range vecs {
		for _, out := range []kernels.DType{kernels.BF16, kernels.F32} {
			for _, in := range floats {
				ew = append(ew, fmt.Sprintf("copy_rows_%s_%s_v%d", out, in, v))
			}
		}
		for _, w := range floats {
			ew = append(ew, fmt.Sprintf("rms_scale_%s_v%d", w, v))
		}
		ew = append(ew, vname("add", v), vname("mul", v), vname("silu", v), vname("rms_rstd", v))
		at = append(at, vname("kv_append", v), vname("kv_masked_copy", v))
		moe = append(moe, vname("moe_combine", v))
	}
	ew = append(ew, "rope_half", "rope_interleaved", "argmax_bf16", "argmax_f32")
	for _, p := range []string{"bf16", "f32"} {
		at = append(at, "softmax_mask_global_"+p, "softmax_mask_smem_"+p)
	}
	at = append(at, "attn_normalize")
	moe = append(moe, "moe_route", "iota_i32", "moe_count", "moe_offsets", "moe_assign")
	return []module{
		{file: "elementwise.cu", src: elementwiseSrc, funcs: ew},
		{file: "attention.cu", src: attentionSrc, funcs: at},
		{file: "moe.cu", src: moeSrc, funcs: moe,
			opts: []string{fmt.Sprintf("-DROUTE_THREADS=%d", routeThreads), fmt.Sprintf("-DMAX_TOPK=%d", maxTopK)}},
	}
}

// vname is the name of the VEC-wide instance of a kernel.
func vname(kernel string, vec int) string { return fmt.Sprintf("%s_v%d", kernel, vec) }

// New compiles the set's kernels for dev, which must be a *cuda.Device.
func New(dev kernels.Device) (kernels.Ops, error) {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("naive: needs a cuda device, got %T (%s)", dev, dev.Name())
	}
	props := d.Props()
	o := &ops{d: d, fn: map[string]*cuda.Func{}, sms: props.SMs, maxShared: props.MaxSharedOptin}
	for _, m := range modules() {
		// #line keeps NVRTC's messages pointing into the .cu file itself.
		src := commonSrc + fmt.Sprintf("#line 1 %q\n", m.file) + m.src
		mod, err := d.Module("naive_"+m.file, src, m.opts...)
		if err != nil {
			return nil, fmt.Errorf("naive: %s: %w", m.file, err)
		}
		for _, name := range m.funcs {
			f, err := mod.Func(name)
			if err != nil {
				return nil, fmt.Errorf("naive: %s: %w", m.file, err)
			}
			o.fn[name] = f
		}
	}
	// The dynamic shared memory softmax_mask_smem may have: what a block may
	// opt in to, less the kernel's own static shared memory.
	max0 := o.maxShared
	for _, name := range []string{"softmax_mask_smem_bf16", "softmax_mask_smem_f32"} {
		sm := o.fn[name]
		attrs, err := sm.Attrs()
		if err == nil {
			o.maxShared = min(o.maxShared, max0-attrs.StaticShared)
			err = sm.SetMaxDynamicShared(max0 - attrs.StaticShared)
		}
		if err != nil {
			return nil, fmt.Errorf("naive: %s: %w", name, err)
		}
	}
	return o, nil
}

// ops is the naive set on one device.
type ops struct {
	d         *cuda.Device
	fn        map[string]*cuda.Func
	sms       int // multiprocessors
	maxShared int // bytes of dynamic shared memory softmax_mask_smem may have

	// moeMeta holds MoE's per-expert counts, offsets and cursors (see
	// MoEExperts); allocated at the first call, grown with the expert count.
	moeMeta *kernels.Tensor
}

// mat is a pitched matrix in device memory: element (r, c) at p + (r*pitch + c)
// elements of dt.
type mat struct {
	p     uintptr
	pitch int
	dt    kernels.DType
}

func (o *ops) mat(t *kernels.Tensor) mat { return mat{p: o.d.Ptr(t), pitch: t.Pitch, dt: t.DType} }

// sub is the matrix starting at element (r, c) of m, with m's pitch.
func (m mat) sub(r, c int) mat {
	m.p += uintptr((int64(r)*int64(m.pitch) + int64(c)) * int64(m.dt.Size()))
	return m
}

// skip is m advanced by n elements.
func (m mat) skip(n int64) mat {
	m.p += uintptr(n * int64(m.dt.Size()))
	return m
}

// scratch is a packed [rows, cols] matrix of dt in a scratch slot.
func (o *ops) scratch(slot int, dt kernels.DType, rows, cols int) mat {
	return mat{p: o.d.Scratch(slot, rows*cols*dt.Size()), pitch: cols, dt: dt}
}

// vecFor is the widest access (vecWidth or 1 elements) that every row start
// of the matrices allows when rows of cols elements are moved.
func vecFor(cols int, ms ...mat) int {
	if cols%vecWidth != 0 {
		return 1
	}
	for _, m := range ms {
		if m.p%uintptr(vecWidth*m.dt.Size()) != 0 || m.pitch%vecWidth != 0 {
			return 1
		}
	}
	return vecWidth
}

// threadsFor is the block for n items of per-block work: n rounded up to
// whole warps, at most blockThreads.
func threadsFor(n int) int {
	const warp = 32
	t := (n + warp - 1) / warp * warp
	return max(warp, min(t, blockThreads))
}

// launch runs kernel name on a 1-D grid of 1-D blocks.
func (o *ops) launch(name string, blocks, threads int, args ...any) {
	o.launchShared(name, blocks, threads, 0, args...)
}

// launchShared is launch with shared bytes of dynamic shared memory per block.
func (o *ops) launchShared(name string, blocks, threads, shared int, args ...any) {
	f, ok := o.fn[name]
	if !ok {
		panic("naive: no kernel " + name)
	}
	if blocks == 0 {
		return
	}
	o.d.Launch(f, cuda.Dim3{X: uint32(blocks), Y: 1, Z: 1}, cuda.Dim3{X: uint32(threads), Y: 1, Z: 1}, shared, args...)
}

// launchItems runs a grid-stride kernel over n items: one wave of
// blockThreads blocks, fewer when n is small.
func (o *ops) launchItems(name string, n int64, args ...any) {
	blocks := min((n+blockThreads-1)/blockThreads, int64(o.sms*blocksPerSM))
	o.launch(name, int(blocks), blockThreads, args...)
}

// gemm is c = alpha·a·op(b) + beta·c for row-major a [m,k], c [m,n] and b
// [k,n], or [n,k] used transposed when transB; leading dimensions are the
// pitches.
func (o *ops) gemm(transB bool, m, n, k int, alpha float32, a, b mat, beta float32, c mat) {
	if m == 0 || n == 0 {
		return
	}
	o.d.Gemm(transB, m, n, k, alpha, a.p, a.dt, a.pitch, b.p, b.dt, b.pitch, beta, c.p, c.dt, c.pitch)
}

// gemmBatched is gemm over batch problems, problem i's matrices sA, sB, sC
// elements after problem i-1's (0 shares one matrix).
func (o *ops) gemmBatched(transB bool, m, n, k int, alpha float32, a mat, sA int64, b mat, sB int64,
	beta float32, c mat, sC int64, batch int) {
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	o.d.GemmStridedBatched(false, transB, m, n, k, alpha, a.p, a.dt, a.pitch, sA, b.p, b.dt, b.pitch, sB,
		beta, c.p, c.dt, c.pitch, sC, batch)
}

// batch2 is a two-level batch of matrices: matrix (i, j) starts si*i + sj*j
// elements after m.
type batch2 struct {
	m      mat
	si, sj int64
}

// gemmBatch2 is gemm over the ni×nj problems of two-level batches, as
// strided-batched calls along the longer level, one per index of the shorter.
func (o *ops) gemmBatch2(transB bool, m, n, k int, alpha float32, a, b batch2, beta float32, c batch2, ni, nj int) {
	if nj <= ni {
		for j := range nj {
			o.gemmBatched(transB, m, n, k, alpha, a.m.skip(a.sj*int64(j)), a.si, b.m.skip(b.sj*int64(j)), b.si,
				beta, c.m.skip(c.sj*int64(j)), c.si, ni)
		}
		return
	}
	for i := range ni {
		o.gemmBatched(transB, m, n, k, alpha, a.m.skip(a.si*int64(i)), a.sj, b.m.skip(b.si*int64(i)), b.sj,
			beta, c.m.skip(c.si*int64(i)), c.sj, nj)
	}
}

// chunkRows is how many of n queries one step of materialized attention
// takes so that heads×queries×keys scores (f32) and probabilities (bf16) fit
// in chunkBudget, and at most queryChunk; at least 1.
func chunkRows(heads, keys, n int) int {
	per := int64(heads) * int64(keys) * int64(kernels.F32.Size()+kernels.BF16.Size())
	return int(max(1, min(int64(n), int64(queryChunk), chunkBudget/per)))
}

// need panics with an op-named message when a shape check fails: shapes that
// do not fit are programming errors (see kernels.Ops).
func need(ok bool, op kernels.Op, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("naive: %s: ", op) + fmt.Sprintf(format, args...))
	}
}

// isAct reports whether t holds activations of the CUDA device (bf16), or
// weights a GEMM multiplies them by: cuBLAS needs both operands alike.
func isAct(t *kernels.Tensor) bool { return t != nil && t.DType == kernels.BF16 }

// isFloat reports whether t is a weight of one of the float types.
func isFloat(t *kernels.Tensor) bool {
	return t != nil && (t.DType == kernels.BF16 || t.DType == kernels.F16 || t.DType == kernels.F32)
}
