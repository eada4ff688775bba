package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// linear_swap (linear_swap.cu), linear's and linear_swiglu's variant "swap"
// for a decode step of up to swMaxRows rows on sm_90a: wgmma with w's rows
// as its M and x's token rows as its N, the weights by tensor copies through
// a ring a producer warp fills (its first stages requested before the grid
// wait), whole waves of tiles unsplit and the k-steps of the rest split
// over blocks in few long ranges, the splits' partial sums added in split
// order by the tile's last block. A module of its own, compiled only where the
// device's target is hopperArch; where it cannot be built New still
// succeeds and the variants say why.

// The layout of linear_swap, named as in linear_swap.cu.
const (
	linSwap   = "swap"
	swBM      = 128 // SW_BM: weight rows of a tile, 64 a consumer warpgroup
	swK       = 64  // HG_BK: k of a stage
	swThreads = 288 // SW_THREADS: two consumer warpgroups and the producer warp
	// swMaxRows is the most rows (tokens) linear_swap takes: wgmma's N of
	// its widest instance.
	swMaxRows = 64
	// swMaxSplits is the most blocks a tile's k-steps are split over.
	swMaxSplits = 32
	// swCounters is the split tiles' counters kept (one a tile): a problem
	// of more tiles runs unsplit.
	swCounters = 4096
)

// swConfig is an instance of linear_swap: x's rows rounded up to Rows
// (wgmma's N), through Stages stages.
type swConfig struct {
	Rows, Stages int
}

func (c swConfig) name(kernel string) string {
	return fmt.Sprintf("%s_r%d_s%d", kernel, c.Rows, c.Stages)
}

// kernel is the plain instance writing out of dtype out (bf16 or f32).
func (c swConfig) kernel(out kernels.DType) string {
	return c.name("linear_swap") + "_" + out.String()
}

// swigluKernel is the instance with SwiGLU in its epilogue (bf16 out).
func (c swConfig) swigluKernel() string { return c.name("linear_swap_swiglu") }

func (c swConfig) kernels() []string {
	return []string{c.kernel(kernels.BF16), c.kernel(kernels.F32), c.swigluKernel()}
}

// clusterKernels are the norm's halves of the instance with a split tile's
// sums in its cluster of cl (LINEAR_SWAP_CLUSTER): the producer's and the
// consumer's plain.
func (c swConfig) clusterKernels(cl int) []string {
	return []string{fmt.Sprintf("%s_c%d", c.name("linear_swap_addnorm"), cl), fmt.Sprintf("%s_bf16_c%d", c.name("linear_swap_rstd"), cl)}
}

// normKernels are the norm's halves of the instance (LINEAR_SWAP_NORM):
// the producer's, the consumer's plain (bf16 out) and with SwiGLU.
func (c swConfig) normKernels() []string {
	return []string{c.name("linear_swap_addnorm"), c.name("linear_swap_rstd") + "_bf16", c.name("linear_swap_rstd_swiglu")}
}

// shared is SwLayout<ROWS, STAGES>::SMEM: a stage's w tile and x tile.
func (c swConfig) shared() int { return c.Stages*(swBM+c.Rows)*swK*2 + hopperAlign }

// swConfigs are the instances compiled (LINEAR_SWAP in linear_swap.cu): 16,
// 32 and 64 token rows, each with as many stages as an H200 block's 227 KiB
// hold (16 KiB of w a stage, and 2, 4 or 8 KiB of x): 192, 176 and 144 KiB
// of weights in flight an SM, several times what the copy rate needs over
// the memory's latency, so that the stages requested before the grid wait
// cover the small matrices whole.
var swConfigs = []swConfig{{16, 12}, {32, 11}, {64, 9}}

// swNormConfigs are the instances with the norm's halves across a block
// boundary (linear_add_rms_norm_linear at 16 rows, swapChain): the 16-row
// one, Qwen2-7B's decode at batch 16.
var swNormConfigs = []swConfig{{16, 12}}

// swClusters are the clusters of the cluster instances: the splits of a
// tile they sum in distributed shared memory (Qwen2-7B's qkv at 16 rows
// splits 3 ways, o and down 4).
var swClusters = []int{3, 4}

// clusterable reports whether a cluster instance can run plan p: all its
// tiles split, in a count of swClusters, one unit a block (rank = split).
func (p swPlan) clusterable() bool {
	return p.whole == 0 && p.units() == p.blocks && slices.Contains(swClusters, p.splits)
}

// swClusterOn is whether swapChain takes the cluster instances where a plan
// allows them; a variable, so that a test can hold one to the other.
var swClusterOn = true

// swSqTiles is the most tiles the first projection of swapChain may have:
// SW_SQ_LANE's eight lanes (a row's sums of squares, each lane's loads in
// flight at once); 8,192 outputs.
const swSqTiles = 8 * 8

// swConfigFor is the instance for m rows: the fewest token rows that hold
// them.
func swConfigFor(m int) (swConfig, bool) {
	i := slices.IndexFunc(swConfigs, func(c swConfig) bool { return m <= c.Rows })
	if m < 1 || i < 0 {
		return swConfig{}, false
	}
	return swConfigs[i], true
}

// swPlan is how linear_swap covers a problem: tiles of swBM weight rows
// (swBM/2 output columns with SwiGLU), whole of them a unit each of all
// ktiles k-steps (the last whole tiles), the rest each split into splits
// ranges of per steps, on blocks blocks.
type swPlan struct {
	cfg                               swConfig
	tiles, ktiles, whole, splits, per int
	blocks                            int
}

func (p swPlan) String() string {
	return fmt.Sprintf("rows=%d stages=%d shared=%d tiles=%d k-steps=%d whole=%d splits=%d of %d blocks=%d",
		p.cfg.Rows, p.cfg.Stages, p.cfg.shared(), p.tiles, p.ktiles, p.whole, p.splits, p.per, p.blocks)
}

// units is the plan's units of work: the whole tiles, then the split
// tiles' ranges.
func (p swPlan) units() int { return p.whole + (p.tiles-p.whole)*p.splits }

// planSwap plans m rows of x over cols outputs (w's rows, or with SwiGLU
// out's columns, half of w's rows) of k inputs on sms SMs whose blocks may
// hold maxShared bytes, or says why linear_swap cannot run it.
func planSwap(m, cols, k, sms, maxShared int, swiglu bool) (swPlan, error) {
	c, ok := swConfigFor(m)
	switch {
	case !ok:
		return swPlan{}, fmt.Errorf("M=%d rows: linear_swap takes 1 to %d", m, swMaxRows)
	case k < 1 || k%cudaset.VecWidth != 0:
		return swPlan{}, fmt.Errorf("K=%d: w's rows are not on the 16-byte boundaries tensor copies need", k)
	case cols < 1:
		return swPlan{}, fmt.Errorf("%d outputs", cols)
	case c.shared() > maxShared:
		return swPlan{}, fmt.Errorf("needs %d bytes of shared memory, a block gets %d", c.shared(), maxShared)
	}
	per := swBM
	if swiglu {
		per = swBM / 2
	}
	p := swPlan{cfg: c, tiles: (cols + per - 1) / per, ktiles: (k + swK - 1) / swK}
	p.whole, p.splits, p.per = swSplits(p.tiles, p.ktiles, m, max(1, sms))
	p.blocks = min(p.units(), max(1, sms))
	return p, nil
}

// swSplitSteps is what a split unit costs beyond its k-steps, in k-steps
// (half a µs each at 16 rows on an H200): its partial sums' stores, the
// fence and count, and for the tile's last block the other splits' sums
// read back, latencies its consumers spend off the weight stream. An
// estimate: the first measurements lost about 3s k-steps a unit of s splits
// while the last block read the splits' sums one load after another; those
// loads now go out a split at a time.
const swSplitSteps = 4

// swSMShare is the most an SM streams, in its share of the copy rate (the
// rate over the SMs): a wave of fewer units than SMs/swSMShare runs no
// faster. An estimate, kept under what an SM's path from L2 carries (64
// bytes a cycle, about 4 shares of an H200's 4.2 TB/s over 132 SMs) and
// what its ring of 150 to 200 KiB in flight sustains over the memory's
// latency, and under what one measured: capped at 2.5 shares, Qwen2-7B's
// down at 16 rows ran in 2 splits on 56 SMs, each drawing about 1.5; at 1.5
// it runs in 4 on 112 SMs, faster, as do o_proj and gate/up
// (bench/RESULTS.md, linear_swap).
const swSMShare = 1.5

// swSplits is how a problem of tiles tiles of ktiles k-steps each and m rows
// cuts its tiles' k-steps over sms SMs: whole tiles unsplit (whole waves of
// them, or none), the rest in splits ranges of per steps (at most
// swMaxSplits, and no more split tiles than swCounters), whichever makes the
// least of the waves' costs. A wave of a units of p k-steps costs p times
// a/sms (the copy rate shared), at least p/swSMShare; a split unit adds
// swSplitSteps and its partial sums (m × swBM f32, written and read back:
// m/16 k-steps of weights). So a tile is split only where its waves would be
// short, into few long ranges: the tiles past the last whole wave (Qwen2-7B's
// gate_up at 16 rows: two waves of whole tiles, and 32 tiles in two ranges
// of 28 k-steps, which the kernel runs first so that their epilogues hide
// under the whole tiles' stream), or a problem of fewer tiles than SMs
// (Qwen2-7B's o and qkv: two ranges of 28). Ties go to more whole tiles,
// then fewer splits.
func swSplits(tiles, ktiles, m, sms int) (whole, splits, per int) {
	// wave is the cost of units of p steps, a wave of sms after another.
	wave := func(units, p int, extra float64) float64 {
		full, rest := units/sms, units%sms
		c := float64(full) * (float64(p) + extra)
		if rest > 0 {
			c += float64(p)*max(float64(rest)/float64(sms), 1.0/swSMShare) + extra
		}
		return c
	}
	whole, splits, per = 0, 1, ktiles
	best := wave(tiles, ktiles, 0)
	for _, w := range []int{tiles / sms * sms, 0} { // after the whole waves, or none
		if tiles-w > swCounters || w == tiles {
			continue
		}
		for s := 2; s <= min(ktiles, swMaxSplits); s++ {
			p := (ktiles + s - 1) / s
			if (ktiles+p-1)/p != s {
				continue // the same cut as fewer splits
			}
			cost := wave(w, ktiles, 0) + wave((tiles-w)*s, p, swSplitSteps+float64(m)/16)
			if cost < best {
				best, whole, splits, per = cost, w, s, p
			}
		}
	}
	return whole, splits, per
}

// Without a tuning choice linear_swap runs the problems of linSwapMinRows to
// linMaxRows rows, at least linSwapMinK inputs and more than
// linStreamNarrow outputs that linear_stream is not the default for (the
// narrow ones, linear_stream's at 16 rows where it plans them, are untimed
// on swap in a model): Qwen2-7B's qkv, o, gate/up (SwiGLU in its epilogue),
// down and lm_head at 16 rows, where skinny ran the big streams and cuBLAS
// the rest: W2 at 16 rows gained at each step of moving them
// (bench/RESULTS.md, Decode). DeepSeek-V2-Lite's K = 2,048 matrices stay
// off it: there swap lost to skinny on the lm_head and to cuBLAS on the
// shared gate/up. Swap has not been timed in a model below 16 rows, hence
// linSwapMinRows. Where
// linSwapDefault is true every problem of linSwapMinRows to swMaxRows rows
// that linear_stream is not the default for runs it. Variables, so that
// tests and measurements can turn them.
var (
	linSwapDefault = false
	linSwapMinRows = 9
	linSwapMinK    = 3072
)

// swModule is linear_swap's NVRTC module.
func swModule() cudaset.Module {
	return module("linear_swap.cu", cudaset.Names(swInstances(), swNormInstances(), swClusterInstances()))
}

// swKit is linear_swap on one device.
type swKit struct {
	err    error           // why it cannot run here; nil when it can
	status *kernels.Tensor // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
	// clusters is, for each cluster instance, how many of its clusters
	// run at once on the device (one block an SM): a plan of more tiles
	// counts its splits as before.
	clusters map[string]int
	counters *kernels.Tensor // i32 [swCounters]: finished splits of each tile, zero between launches
}

// newLinearSwap compiles linear_swap into k where the device allows it,
// readies each instance's shared memory, launches them overlapped and
// allocates the split counters, zeroed once here (no launch clears them: a
// captured graph replays). It never fails: what went wrong is kept in the
// kit.
func newLinearSwap(k *cudaset.Kit) *swKit {
	l := &swKit{}
	if l.err = addHopperModule(k, "linear "+linSwap, "linear_swap", swModule()); l.err != nil {
		return l
	}
	fit := func(cs []swConfig, names func(swConfig) []string) error {
		for _, c := range cs {
			for _, name := range names(c) {
				if err := k.FitShared(name, c.shared()); err != nil {
					return fmt.Errorf("fused: linear %s: %s: %w", linSwap, name, err)
				}
			}
		}
		return nil
	}
	if l.err = fit(swConfigs, swConfig.kernels); l.err != nil {
		return l
	}
	if l.err = fit(swNormConfigs, swConfig.normKernels); l.err != nil {
		return l
	}
	l.clusters = map[string]int{}
	for _, c := range swNormConfigs {
		for _, cl := range swClusters {
			for _, name := range c.clusterKernels(cl) {
				if k.FitShared(name, c.shared()) != nil {
					continue // not taken: the counters sum its plans' splits
				}
				grid := k.SMs / cl * cl
				if n, err := k.Func(name).MaxActiveClusters(cuda.Dim3{X: uint32(grid)}, cuda.Dim3{X: swThreads}, c.shared()); err == nil {
					l.clusters[name] = n
				}
			}
		}
	}
	k.Overlap(swModule().Funcs...)
	l.status = newWaitStatus(k)
	l.counters = newCounters(k, swCounters)
	return l
}

// ready is nil where linear_swap runs, else why not.
func (l *swKit) ready() error {
	if l == nil {
		return fmt.Errorf("fused: linear %s: not built", linSwap)
	}
	return l.err
}

// swapTakes reports whether linear_swap's tensor maps fit x and w (bf16,
// rows on 16-byte boundaries) and it has an instance for out's dtype.
func (o *ops) swapTakes(out, x, w *kernels.Tensor) bool {
	return o.sw.ready() == nil && decodeLinearOut(out) && cudaset.IsBF16(x) && cudaset.IsBF16(w) &&
		x.Pitch%cudaset.VecWidth == 0 && w.Pitch%cudaset.VecWidth == 0 && o.D.Ptr(x)%16 == 0 && o.D.Ptr(w)%16 == 0
}

// swapPlan is the plan of m rows over cols outputs of k inputs on o's
// device (streamTarget's SMs and shared memory, as linear_stream plans).
func (o *ops) swapPlan(m, cols, k int, swiglu bool) (swPlan, error) {
	sms, shared := streamTarget(o)
	return planSwap(m, cols, k, sms, shared, swiglu)
}

// swapMaps are x's tensor map (box: the instance's token rows) and the
// partial sums' scratch of plan p for m rows (nothing when unsplit).
func (o *ops) swapMaps(op kernels.Op, p swPlan, x *kernels.Tensor) (*cuda.TensorMap, uintptr) {
	m, k := x.Rows(), x.Cols()
	xm := o.Mat(x)
	xmap, err := o.D.EncodeTiled(cuda.Tiled{Addr: xm.P, Elem: 2, Dims: []uint64{uint64(k), uint64(m)},
		Strides: []uint64{uint64(xm.Pitch * 2)}, Box: []uint32{swK, uint32(p.cfg.Rows)}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "x's tensor map: %v", err)
	var part uintptr
	if p.splits > 1 {
		part = o.Scratch("linear.swap.part", kernels.F32, (p.tiles-p.whole)*p.splits*m, swBM).P
	}
	return xmap, part
}

// swapWMap is w's tensor map for linear_swap: w [N, K], a box swBM rows of
// swK; with SwiGLU w's N = 2I rows as [2][I][K], a box 8 gate rows and
// their 8 up rows.
func (o *ops) swapWMap(op kernels.Op, w *kernels.Tensor, swiglu bool) *cuda.TensorMap {
	wm := o.Mat(w)
	wmap, err := o.D.EncodeTiled(swapWTiled(wm.P, wm.Pitch, w.Rows(), w.Cols(), swiglu))
	o.Need(err == nil, op, "w's tensor map: %v", err)
	return wmap
}

// swapWTiled is swapWMap's layout of a bf16 w [n, k] at addr, rows pitch
// elements apart.
func swapWTiled(addr uintptr, pitch, n, k int, swiglu bool) cuda.Tiled {
	row := uint64(pitch * 2)
	if swiglu {
		return cuda.Tiled{Addr: addr, Elem: 2, Dims: []uint64{uint64(k), uint64(n / 2), 2}, Strides: []uint64{row, uint64(n/2) * row},
			Box: []uint32{swK, 8, 2}, Swizzle: hopperSwizzle}
	}
	return cuda.Tiled{Addr: addr, Elem: 2, Dims: []uint64{uint64(k), uint64(n)}, Strides: []uint64{row}, Box: []uint32{swK, swBM}, Swizzle: hopperSwizzle}
}

// swap launches linear_swap as planSwap cuts the problem, or reports false,
// launching nothing, where it cannot (the caller runs another variant).
func (o *ops) swap(out, x, w, bias *kernels.Tensor) bool {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	p, err := o.swapPlan(m, n, k, false)
	if err != nil || !o.swapTakes(out, x, w) {
		return false
	}
	op := kernels.OpLinear
	xmap, part := o.swapMaps(op, p, x)
	wmap := o.swapWMap(op, w, false)
	bp, biasType := o.linBias(bias)
	om := o.Mat(out)
	o.LaunchShared(p.cfg.kernel(out.DType), p.blocks, swThreads, p.cfg.shared(),
		xmap, wmap, om.P, int32(om.Pitch), bp, biasType, part, o.D.Ptr(o.sw.counters),
		int32(m), int32(n), int32(k), int32(p.whole), int32(p.splits), int32(p.per), o.D.Ptr(o.sw.status))
	return true
}

// swapSwiGLU launches linear_swap with SwiGLU in its epilogue, out [m, I] =
// swiglu(x·wᵀ) with w's I gate rows then its I up rows, as planSwap cuts
// the problem, or reports false, launching nothing, where it cannot (bf16
// out only).
func (o *ops) swapSwiGLU(out, x, w *kernels.Tensor) bool {
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	inter := n / 2
	p, err := o.swapPlan(m, inter, k, true)
	if err != nil || n%2 != 0 || out.DType != kernels.BF16 || !o.swapTakes(out, x, w) {
		return false
	}
	op := kernels.OpLinearSwiGLU
	xmap, part := o.swapMaps(op, p, x)
	wmap := o.swapWMap(op, w, true)
	om := o.Mat(out)
	o.LaunchShared(p.cfg.swigluKernel(), p.blocks, swThreads, p.cfg.shared(),
		xmap, wmap, om.P, int32(om.Pitch), part, o.D.Ptr(o.sw.counters),
		int32(m), int32(inter), int32(k), int32(p.whole), int32(p.splits), int32(p.per), o.D.Ptr(o.sw.status))
	return true
}

// planSwapChain plans swapChain's two launches for m rows on sms SMs whose
// blocks hold shared bytes: the first projection [n0, k0], the second [n,
// n0] (with SwiGLU n = 2I rows, I output columns), or says why it cannot
// run them: a plan planSwap refuses, rows past the instances of
// swNormConfigs (both plans' instance is the rows'), or a first projection
// of more than swSqTiles tiles.
func planSwapChain(m, k0, n0, n int, swiglu bool, sms, shared int) (p0, p1 swPlan, err error) {
	if swiglu && n%2 != 0 {
		return p0, p1, fmt.Errorf("N=%d: not gate and up rows of equal count", n)
	}
	if p0, err = planSwap(m, n0, k0, sms, shared, false); err != nil {
		return p0, p1, err
	}
	if p1, err = planSwap(m, swPlan{}.cols(n, swiglu), n0, sms, shared, swiglu); err != nil {
		return p0, p1, err
	}
	switch {
	case !slices.Contains(swNormConfigs, p0.cfg):
		return p0, p1, fmt.Errorf("M=%d rows: the norm's halves are built for %v", m, swNormConfigs)
	case p0.tiles > swSqTiles:
		return p0, p1, fmt.Errorf("N0=%d: %d tiles, the second projection sums at most %d of each row's squares", n0, p0.tiles, swSqTiles)
	}
	return p0, p1, nil
}

// cols is a second projection's output columns: n, or with SwiGLU n/2.
func (swPlan) cols(n int, swiglu bool) int {
	if swiglu {
		return n / 2
	}
	return n
}

// swapChain launches linear_add_rms_norm_linear (swiglu false; bias is the
// second projection's) or its SwiGLU twin as two linear_swap launches, the
// norm split between them (linear_swap.cu, MODE): the first projection
// mid = x·w0ᵀ + bias0 with resid += mid and u = bf16(norm·resid) and each
// tile's sums of squares in its epilogue (u into h, which the op may use
// as it likes), then out from u with each row's sums scaled by its 1/rms.
// It reports false, launching nothing, where it cannot: rows past the
// instances of swNormConfigs, a first projection of more than swSqTiles
// tiles or of another output than
// bf16, operands the tensor maps do not take, or a problem planSwap
// refuses.
func (o *ops) swapChain(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor, swiglu bool) bool {
	m, k0, n0, n := x.Rows(), x.Cols(), w0.Rows(), w.Rows()
	sms, shared := streamTarget(o)
	p0, p1, err := planSwapChain(m, k0, n0, n, swiglu, sms, shared)
	if err != nil || (swiglu && out.DType != kernels.BF16) ||
		!o.swapTakes(mid, x, w0) || !o.swapTakes(out, h, w) || mid.DType != kernels.BF16 || !cudaset.IsBF16(resid) || !cudaset.IsBF16(norm) {
		return false
	}
	cols := p1.cols(n, swiglu)
	op := kernels.OpLinearNormLinear
	if swiglu {
		op = kernels.OpLinearNormSwiGLU
	}
	names := p0.cfg.normKernels()
	// clustered is the cluster instance (index i of clusterKernels) for
	// plan p where one runs it, else plain.
	clustered := func(p swPlan, i int, plain string) string {
		if !swClusterOn || !p.clusterable() {
			return plain
		}
		name := p.cfg.clusterKernels(p.splits)[i]
		if n := o.sw.clusters[name]; n < p.tiles {
			return plain
		}
		return name
	}
	names[0] = clustered(p0, 0, names[0])
	if !swiglu {
		names[1] = clustered(p1, 1, names[1])
	}
	sq := o.Scratch("linear.swap.sq", kernels.F32, p0.tiles, m)
	// Both launches' split sums share the scratch: sized for the larger
	// first, so that the second's does not grow it under the first.
	partRows := func(p swPlan) int { return (p.tiles - p.whole) * p.splits * m }
	o.Scratch("linear.swap.part", kernels.F32, max(partRows(p0), partRows(p1)), swBM)

	xmap, part := o.swapMaps(op, p0, x)
	wmap0 := o.swapWMap(op, w0, false)
	bp0, biasType0 := o.linBias(bias0)
	mm, rm, hm := o.Mat(mid), o.Mat(resid), o.Mat(h)
	o.LaunchShared(names[0], p0.blocks, swThreads, p0.cfg.shared(),
		xmap, wmap0, mm.P, int32(mm.Pitch), bp0, biasType0, part, o.D.Ptr(o.sw.counters),
		int32(m), int32(n0), int32(k0), int32(p0.whole), int32(p0.splits), int32(p0.per), o.D.Ptr(o.sw.status),
		rm.P, int32(rm.Pitch), o.D.Ptr(norm), hm.P, int32(hm.Pitch), sq.P)

	umap, part := o.swapMaps(op, p1, h)
	wmap := o.swapWMap(op, w, swiglu)
	om := o.Mat(out)
	if swiglu {
		o.LaunchShared(names[2], p1.blocks, swThreads, p1.cfg.shared(),
			umap, wmap, om.P, int32(om.Pitch), part, o.D.Ptr(o.sw.counters),
			int32(m), int32(cols), int32(n0), int32(p1.whole), int32(p1.splits), int32(p1.per), o.D.Ptr(o.sw.status),
			sq.P, int32(p0.tiles), eps)
		return true
	}
	bp, biasType := o.linBias(bias)
	o.LaunchShared(names[1], p1.blocks, swThreads, p1.cfg.shared(),
		umap, wmap, om.P, int32(om.Pitch), bp, biasType, part, o.D.Ptr(o.sw.counters),
		int32(m), int32(n), int32(n0), int32(p1.whole), int32(p1.splits), int32(p1.per), o.D.Ptr(o.sw.status),
		sq.P, int32(p0.tiles), eps)
	return true
}

// linearSwapWaits reports a wait of linear_swap that timed out since the
// last call (synchronizing with the device), and clears the record.
func (o *ops) linearSwapWaits() error {
	if o.sw == nil {
		return nil
	}
	st, err := o.takeWait(o.sw.status)
	if st == nil {
		return err
	}
	what := map[int32]string{1: "a full stage (full)", 2: "a free stage (empty)"}[st[0]]
	return fmt.Errorf("fused: linear_swap: a wait for %s timed out: block %d, thread %d, k-step %d, parity %d (the kernel gave up; its output and split counters are garbage)",
		what, st[1], st[4], st[5], st[6])
}

// swapValid is linear's variant swap for shape s on t, or why it cannot run
// it: offered on hopperArch only.
func swapValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	if t.Arch != hopperArch {
		return "", "", false
	}
	p, err := planSwap(s["M"], s["N"], s["K"], t.SMs, t.SharedPerBlock, false)
	if err != nil {
		return "", err.Error(), true
	}
	return fmt.Sprintf("warps=8+1 wgmma=m64n%dk16 (w as A, x as B) tma=128B-swizzle, w before the grid wait, %v", p.cfg.Rows, p), "", true
}

// swapSwiGLUValid is linear_swiglu's variant swap (linear_swap with SwiGLU
// in its epilogue) for shape s (N = 2I) on t, or why it cannot run it:
// offered on hopperArch only.
func swapSwiGLUValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	if t.Arch != hopperArch {
		return "", "", false
	}
	if s["N"]%2 != 0 {
		return "", fmt.Sprintf("N=%d: not gate and up rows of equal count", s["N"]), true
	}
	p, err := planSwap(s["M"], s["N"]/2, s["K"], t.SMs, t.SharedPerBlock, true)
	if err != nil {
		return "", err.Error(), true
	}
	return fmt.Sprintf("warps=8+1 wgmma=m64n%dk16 (w as A, x as B) tma=128B-swizzle, w before the grid wait, %v, a tile the gate and up rows of %d columns; SwiGLU in the epilogue",
		p.cfg.Rows, p, swBM/2), "", true
}

// swapUse is the use of linear_swap's variant of linear (swiglu false) or
// linear_swiglu: nil where planSwap takes the key's problem on o's device
// and linear_swap is built, else why not.
func swapUse(swiglu bool) func(o *ops, key string) error {
	return func(o *ops, key string) error {
		k, _ := parseLinearKey(key)
		cols := k.n
		if swiglu {
			cols = k.n / 2
		}
		if _, err := o.swapPlan(k.m, cols, k.k, swiglu); err != nil {
			return fmt.Errorf("linear_swap: %w", err)
		}
		return o.sw.ready() // why linear_swap cannot run here, NVRTC's log included
	}
}
