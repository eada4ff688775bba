package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// linear_stream (linear_stream.cu), linear's variant "stream" for decode's
// few rows on sm_90a: each block owns whole weight rows over all of K and
// streams them into shared memory through the copy engine, its first
// stages requested before its grid_wait so that the stream starts under
// the kernel before. Its instances with SwiGLU and with the residual add in
// the epilogue are linear_swiglu's and linear_add's variant "stream". A
// module of its own (bulk copies and mbarriers are sm_90's), compiled only
// where the device's target is hopperArch; where it cannot be built New
// still succeeds and the variants say why.

// The layout of linear_stream, named as in linear_stream.cu.
const (
	linStream   = "stream"
	lsWarps     = 8  // LS_WARPS
	lsRows      = 16 // LS_ROWS: weight rows of a stage
	lsPad       = 32 // LS_WPAD: elements between a stage's rows
	lsMaxStages = 8  // LS_MAX_STAGES
	lsBars      = 128
	lsRed       = lsWarps * lsRows * 16 * 4
	// lsChunk is the k of one warp's loads of a row (4 lanes of 8): a
	// stage's k is lsWarps of them at least, and K a multiple of it.
	lsChunk = 32
	// lsNormMaxK is the widest row the norm-first kernels normalise:
	// LS_NORM_VECS 8-element accesses of each of a block's threads.
	lsNormMaxK = 4 * lsWarps * 32 * 8
)

// Without a tuning choice linear_stream runs problems of at most
// linStreamRows rows and under linStreamBytes of weights, where it can run:
// batch 1's decode, every matrix of a layer of both models (DeepSeek-V2-Lite's
// 1 to 85 MiB, Qwen2-7B's 25 to 259 MiB) but the lm_heads (400 MiB and
// more), which stay on linear_skinny. Qwen2-7B's matrices went to it only
// all together: with qkv, o and down on it and gate/up on linear_skinny, W2
// at batch 1 was slower (skinny, which keeps its weight loads in flight
// through L1, runs a sixth slower on SMs the stream kernels left with
// their large shared-memory split), with gate/up on it too (SwiGLU in its
// epilogue) faster (bench/RESULTS.md, linear_stream). At 16 rows each
// block's copy of x (16 × K) costs more than cuBLAS's tiles lose on several
// shapes; between 2 and 15 rows it has not been measured. The exception is
// a narrow output, at most linStreamNarrow features, which it runs up to
// linMaxRows rows: there a block owns a row tile or two, and at 16 rows it
// beat cuBLAS on every such decode shape of DeepSeek-V2-Lite (o_proj, the
// shared experts' down, the router) while losing the wider ones
// (bench/RESULTS.md, linear_stream).
// Variables, so that tests can put every problem it takes on it.
var (
	linStreamRows         = 1
	linStreamNarrow       = 2048
	linStreamBytes  int64 = 300 << 20
)

// streamTarget is the SMs and the shared memory a block may take that
// linear_stream plans for on o's device: a variable, so that a host test
// can plan for an H200.
var streamTarget = func(o *ops) (sms, shared int) { return o.SMs, o.MaxShared }

// lsPlan is how linear_stream covers a problem: blocks blocks, each its
// rows in tiles of lsRows, each tile's k in stages of ks, through a ring
// of stages slots; shared is the block's dynamic shared memory.
type lsPlan struct {
	blocks, ks, stages, shared int
}

func (p lsPlan) String() string {
	return fmt.Sprintf("blocks=%d stage=%dx%d slots=%d shared=%d", p.blocks, lsRows, p.ks, p.stages, p.shared)
}

// lsXRow is ls_xrow: x's row in shared memory, 64 bytes longer where K·2
// is a multiple of 128 (no bank conflicts between rows).
func lsXRow(k int) int {
	if k%64 == 0 {
		return k + 32
	}
	return k
}

// planStream plans m rows of x over n features of k inputs on sms SMs whose
// blocks may hold maxShared bytes: one block an SM (at most one a row), the
// widest stage k (halving from all of K) that leaves room for two slots
// (or for all of a block's stages, where it has one), and as many slots as
// fit, up to the block's stages and lsMaxStages. A stage of whole rows
// packs them (no padding: linear_stream.cu moves them in one copy). An
// error says why it cannot run the problem.
func planStream(m, n, k, sms, maxShared int) (lsPlan, error) {
	if n < 1 {
		return lsPlan{}, fmt.Errorf("N=%d features", n)
	}
	return planStreamTiles(m, n, lsRows, k, sms, maxShared)
}

// planStreamSwiGLU plans linear_stream with SwiGLU in its epilogue: m rows
// of x over inter output columns (w's 2·inter rows) of k inputs, as
// planStream plans, the blocks dividing the columns (one block an SM, at
// most one a column: their weight bytes differ by two rows at most), a
// stage the gate and up rows of lsRows/2 columns.
func planStreamSwiGLU(m, inter, k, sms, maxShared int) (lsPlan, error) {
	if inter < 1 {
		return lsPlan{}, fmt.Errorf("I=%d output columns (w's gate and up rows: N=%d)", inter, 2*inter)
	}
	return planStreamTiles(m, inter, lsRows/2, k, sms, maxShared)
}

// planStreamTiles is planStream over outs outputs, perTile a tile.
func planStreamTiles(m, outs, perTile, k, sms, maxShared int) (lsPlan, error) {
	switch {
	case m < 1 || m > linMaxRows:
		return lsPlan{}, fmt.Errorf("M=%d rows: linear_stream takes 1 to %d", m, linMaxRows)
	case k%lsChunk != 0 || k == 0:
		return lsPlan{}, fmt.Errorf("K=%d is not a positive multiple of %d (whole 32-k chunks)", k, lsChunk)
	}
	blocks := min(max(1, sms), outs)
	tiles := ((outs+blocks-1)/blocks + perTile - 1) / perTile
	x := (m*lsXRow(k)*2 + 127) / 128 * 128
	room := maxShared - lsBars - lsRed - x
	unit := lsWarps * lsChunk
	for ks := (k + unit - 1) / unit * unit; ; ks = ((ks/2 + unit - 1) / unit) * unit {
		stage := lsRows * (ks + lsPad) * 2
		if ks >= k {
			stage = lsRows * k * 2 // whole rows, packed (linear_stream.cu)
		}
		total := tiles * ((k + ks - 1) / ks)
		slots := min(max(0, room/stage), lsMaxStages, total)
		if slots >= min(2, total) && slots > 0 {
			return lsPlan{blocks: blocks, ks: ks, stages: slots, shared: lsBars + lsRed + x + slots*stage}, nil
		}
		if ks == unit {
			return lsPlan{}, fmt.Errorf("x [%d, %d] leaves no room for two stages of %d×%d weights in %d bytes of shared memory",
				m, k, lsRows, unit, maxShared)
		}
	}
}

// planStreamOK reports whether planStream takes the problem of key k.
func planStreamOK(k linearKey, sms, shared int) bool {
	_, err := planStream(k.m, k.n, k.k, sms, shared)
	return err == nil
}

// planStreamSwiGLUOK reports whether planStreamSwiGLU takes the
// linear_swiglu problem of key k (its stacked GEMM's: N = 2I).
func planStreamSwiGLUOK(k linearKey, sms, shared int) bool {
	_, err := planStreamSwiGLU(k.m, k.n/2, k.k, sms, shared)
	return err == nil
}

func linearStreamKernel(nt int, out kernels.DType) string {
	return fmt.Sprintf("linear_stream_n%d_%s", nt, out)
}

// linearStreamSwiGLUKernel and linearStreamAddKernel are linear_stream's
// instances with SwiGLU (LS_SWIGLU) and the residual add (LS_ADD) in their
// epilogues, bf16 out, for nt n-tiles of 8 rows.
func linearStreamSwiGLUKernel(nt int) string { return fmt.Sprintf("linear_stream_swiglu_n%d", nt) }
func linearStreamAddKernel(nt int) string    { return fmt.Sprintf("linear_stream_add_n%d", nt) }

// linearStreamNormKernel and linearStreamNormSwiGLUKernel are
// linear_stream's instances that normalise x as they load it, with the
// plain epilogue and with SwiGLU.
func linearStreamNormKernel(nt int) string { return fmt.Sprintf("linear_stream_norm_n%d", nt) }
func linearStreamNormSwiGLUKernel(nt int) string {
	return fmt.Sprintf("linear_stream_norm_swiglu_n%d", nt)
}

// lsModule is linear_stream's NVRTC module.
func lsModule() cudaset.Module {
	return module("linear_stream.cu", cudaset.Names(lsInstances(), lsSwiGLUInstances(), lsAddInstances(), lsNormInstances(), lsNormSwiGLUInstances()))
}

// lsKit is linear_stream on one device.
type lsKit struct {
	err    error           // why it cannot run here; nil when it can
	status *kernels.Tensor // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
	// counter is the norm-first kernels' count of blocks that have read
	// the residual, i32 [1], zero between launches (the last block puts it
	// back): one for all of them, as they run one at a time on the
	// device's stream (a Brancher's side never runs them).
	counter *kernels.Tensor
}

// newLinearStream compiles linear_stream into k where the device allows it,
// lets its kernels take all the shared memory a block may, and launches them
// overlapped. It never fails: what went wrong is kept in the kit.
func newLinearStream(k *cudaset.Kit) *lsKit {
	l := &lsKit{}
	if l.err = addHopperModule(k, "linear "+linStream, "linear_stream", lsModule()); l.err != nil {
		return l
	}
	for _, name := range lsModule().Funcs {
		if err := k.FitShared(name, k.MaxShared); err != nil {
			l.err = fmt.Errorf("fused: linear %s: %s: %w", linStream, name, err)
			return l
		}
	}
	k.Overlap(lsModule().Funcs...)
	l.status = newWaitStatus(k)
	l.counter = newCounters(k, 1)
	return l
}

// ready is nil where linear_stream runs, else why not.
func (l *lsKit) ready() error {
	if l == nil {
		return fmt.Errorf("fused: linear %s: not built", linStream)
	}
	return l.err
}

// streamTakes reports whether linear_stream's copies fit x and w: bf16 x
// and weights (the mma's operands), packed weights, 16-byte aligned rows of
// x and w; and whether it has an instance for out's dtype.
func (o *ops) streamTakes(out, x, w *kernels.Tensor) bool {
	k := x.Cols()
	return o.ls.ready() == nil && decodeLinearOut(out) && cudaset.IsBF16(x) && cudaset.IsBF16(w) && w.Pitch == k && x.Pitch%cudaset.VecWidth == 0 &&
		o.D.Ptr(x)%16 == 0 && o.D.Ptr(w)%16 == 0
}

// stream launches linear_stream as planStream cuts the problem, or reports
// false where it cannot (the caller runs another variant).
func (o *ops) stream(out, x, w, bias *kernels.Tensor) bool {
	sms, shared := streamTarget(o)
	p, err := planStream(x.Rows(), w.Rows(), x.Cols(), sms, shared)
	if err != nil {
		return false
	}
	o.launchStream(p, out, x, w, bias)
	return true
}

// launchStream launches linear_stream as p, planStream's plan for the
// problem, cuts it.
func (o *ops) launchStream(p lsPlan, out, x, w, bias *kernels.Tensor) {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	bp, biasType := o.linBias(bias)
	om, xm := o.Mat(out), o.Mat(x)
	o.LaunchShared(linearStreamKernel((m+7)/8, out.DType), p.blocks, lsWarps*32, p.shared,
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), o.D.Ptr(w), bp, biasType,
		int32(m), int32(n), int32(k), int32(p.ks), int32(p.stages), o.D.Ptr(o.ls.status))
}

// streamSwiGLU launches linear_stream with SwiGLU in its epilogue, out =
// swiglu(x·wᵀ) with w's gate rows then its up rows, as planStreamSwiGLU
// cuts the problem, or reports false, launching nothing, where it cannot
// (bf16 out only).
func (o *ops) streamSwiGLU(out, x, w *kernels.Tensor) bool {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	sms, shared := streamTarget(o)
	p, err := planStreamSwiGLU(m, n/2, k, sms, shared)
	if err != nil || out.DType != kernels.BF16 || !o.streamTakes(out, x, w) {
		return false
	}
	om, xm := o.Mat(out), o.Mat(x)
	o.LaunchShared(linearStreamSwiGLUKernel((m+7)/8), p.blocks, lsWarps*32, p.shared,
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), o.D.Ptr(w),
		int32(m), int32(n), int32(k), int32(p.ks), int32(p.stages), o.D.Ptr(o.ls.status))
	return true
}

// streamAdd launches linear_stream with the residual add in its epilogue,
// out = (x·wᵀ + bias) + addend (out may be addend), as planStream cuts the
// problem, or reports false, launching nothing, where it cannot (bf16 out
// only).
func (o *ops) streamAdd(out, x, w, bias, addend *kernels.Tensor) bool {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	sms, shared := streamTarget(o)
	p, err := planStream(m, n, k, sms, shared)
	if err != nil || out.DType != kernels.BF16 || !o.streamTakes(out, x, w) {
		return false
	}
	bp, biasType := o.linBias(bias)
	om, xm, am := o.Mat(out), o.Mat(x), o.Mat(addend)
	o.LaunchShared(linearStreamAddKernel((m+7)/8), p.blocks, lsWarps*32, p.shared,
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), o.D.Ptr(w), bp, biasType, am.P, int32(am.Pitch),
		int32(m), int32(n), int32(k), int32(p.ks), int32(p.stages), o.D.Ptr(o.ls.status))
	return true
}

// streamNorm launches linear_stream normalising x as it loads it (resid +=
// x, then RMSNorm by norm, the GEMM over that; with swiglu SwiGLU in the
// epilogue, w the gate rows then the up rows), as planStream (or
// planStreamSwiGLU) cuts the problem, or reports false, launching nothing,
// where it cannot: bf16 out and norm weights only, and only where fused's
// add_rms_norm would take the rows in one 16-byte access a thread (K up to
// lsNormMaxK), whose shape (the order of its sum of squares) the kernel
// then follows, so that its results are add_rms_norm's then linear's (or
// linear_swiglu's) bit for bit. h is left unwritten.
func (o *ops) streamNorm(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor, swiglu bool) bool {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	sms, shared := streamTarget(o)
	var p lsPlan
	var err error
	if swiglu {
		p, err = planStreamSwiGLU(m, n/2, k, sms, shared)
	} else {
		p, err = planStream(m, n, k, sms, shared)
	}
	if err != nil || out.DType != kernels.BF16 || norm.DType != kernels.BF16 || !o.streamTakes(out, x, w) {
		return false
	}
	om, hm, rm, xm, nm := o.Mat(out), o.Mat(h), o.Mat(resid), o.Mat(x), o.Mat(norm)
	ns := normShapeOf(k, hm, xm, nm, rm)
	if ns.vec != cudaset.VecWidth || ns.items != 1 || k > lsNormMaxK {
		return false
	}
	if m == 0 {
		return true
	}
	if swiglu {
		o.LaunchShared(linearStreamNormSwiGLUKernel((m+7)/8), p.blocks, lsWarps*32, p.shared,
			om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), rm.P, int32(rm.Pitch), nm.P, eps, int32(ns.threads),
			o.D.Ptr(o.ls.counter), o.D.Ptr(w), int32(m), int32(n), int32(k), int32(p.ks), int32(p.stages), o.D.Ptr(o.ls.status))
		return true
	}
	bp, biasType := o.linBias(bias)
	o.LaunchShared(linearStreamNormKernel((m+7)/8), p.blocks, lsWarps*32, p.shared,
		om.P, int32(om.Pitch), xm.P, int32(xm.Pitch), rm.P, int32(rm.Pitch), nm.P, eps, int32(ns.threads),
		o.D.Ptr(o.ls.counter), o.D.Ptr(w), bp, biasType, int32(m), int32(n), int32(k), int32(p.ks), int32(p.stages), o.D.Ptr(o.ls.status))
	return true
}

// linearStreamWaits reports a wait of linear_stream that timed out since
// the last call (synchronizing with the device), and clears the record
// and the norm-first kernels' count.
func (o *ops) linearStreamWaits() error {
	if o.ls == nil {
		return nil
	}
	st, err := o.takeWait(o.ls.status)
	if st == nil {
		return err
	}
	// A block that gave up may not have counted itself, or the last may
	// not have put the norm-first kernels' count back: start it again.
	o.D.Zero(o.ls.counter)
	what := map[int32]string{1: "x", 2: "a stage of weights"}[st[0]]
	return fmt.Errorf("fused: linear_stream: a wait for %s timed out: block %d, thread %d, stage %d, parity %d (the kernel gave up; its output is garbage)",
		what, st[1], st[4], st[5], st[6])
}

// streamValid is linear_stream's params for shape s on t, or why it cannot
// run it: offered on hopperArch only.
func streamValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	if t.Arch != hopperArch {
		return "", "", false
	}
	p, err := planStream(s["M"], s["N"], s["K"], t.SMs, t.SharedPerBlock)
	if err != nil {
		return "", err.Error(), true
	}
	return fmt.Sprintf("warps=%d bulk copies before the grid wait, %v", lsWarps, p), "", true
}

// streamSwiGLUValid is linear_swiglu's variant stream (linear_stream with
// SwiGLU in its epilogue) for shape s (N = 2I) on t, or why it cannot run
// it: offered on hopperArch only.
func streamSwiGLUValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	if t.Arch != hopperArch {
		return "", "", false
	}
	p, err := planStreamSwiGLU(s["M"], s["N"]/2, s["K"], t.SMs, t.SharedPerBlock)
	if err != nil {
		return "", err.Error(), true
	}
	return fmt.Sprintf("warps=%d bulk copies before the grid wait, %v, a stage the gate and up rows of %d columns; SwiGLU in the epilogue",
		lsWarps, p, lsRows/2), "", true
}
