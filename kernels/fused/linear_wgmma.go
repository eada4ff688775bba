package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The Hopper dense GEMM (linear_wgmma.cu): linear's variants of lwConfigs
// for prefill's many rows, compiled by NVRTC only where the device's target
// is hopperArch, as a module apart (like group_wgmma): when it cannot be
// built New still succeeds, the error is kept in lwKit.err, and asking for
// the variants returns it.

// Tiles of linear_wgmma, as linear_wgmma.cu names them.
const (
	lwRows         = 128 // LW_BM: rows of a tile, 64 per consumer warpgroup
	lwK            = 64  // HG_BK: k of a stage
	lwThreads      = 384 // LW_THREADS
	lwProducerRegs = 40  // LW_PRODUCER_REGS
	lwConsumerRegs = 232 // LW_CONSUMER_REGS
	lwConsumers    = 2   // HG_CONSUMERS
	lwOutBufs      = 2   // LW_OUT_BUFS: output boxes a consumer stages at once
	lwOutBox       = 64 * hopperBox * 2
)

// lwGroup is the m-tiles of a swath of linear_wgmma's tile order (LwTiles):
// the blocks running at once cover about lwGroup m-tiles and SMs/lwGroup
// n-tiles, whose rows of x and w stay in L2 while every tile that reads them
// runs. 16 makes that patch about square in bytes for 128×256 tiles on 132
// SMs (16 × 128 rows of x, 8 × 256 of w), and keeps a swath's x (16 × 128
// rows × K) to 15 MB at K = 3,584. A variable, so that tests and
// measurements can change it.
var lwGroup = 16

// lwConfig is an instance of linear_wgmma: BN columns a tile through Stages
// stages, in clusters of Cluster blocks (1: none) that share each stage's w
// by multicast, with the epilogue that holds the tile's last stage for its
// output boxes and stores them all at once (Hold: HOLD in linear_wgmma.cu)
// or the one that stores them box by box, named Variant among linear's
// variants.
type lwConfig struct {
	Variant             string
	BN, Stages, Cluster int
	Hold                bool
}

func (c lwConfig) kernel() string { return c.name("linear_wgmma") }

// swigluKernel is the instance with SwiGLU in its epilogue (LwSwiGLU), the
// variant of linear_swiglu of the same name: BN rows of w a tile, BN/2 of
// gate and BN/2 of up, BN/2 output columns.
func (c lwConfig) swigluKernel() string { return c.name("linear_wgmma_swiglu") }

// name is kernel's instance for c: tile, stages, cluster when there is
// one, and _h for the holding epilogue.
func (c lwConfig) name(kernel string) string {
	s := fmt.Sprintf("%s_n%d_s%d", kernel, c.BN, c.Stages)
	if c.Cluster > 1 {
		s += fmt.Sprintf("_c%d", c.Cluster)
	}
	if c.Hold {
		s += "_h"
	}
	return s
}

// hold is c.Hold as linear_wgmma.cu's HOLD.
func (c lwConfig) hold() int {
	if c.Hold {
		return 1
	}
	return 0
}

// wRows is the rows of w a tensor copy brings (wmap's box), with SwiGLU in
// the epilogue or not: a tile's BN rows (BN/2 of gate and BN/2 of up with
// SwiGLU), cut into Cluster copies where the blocks of a cluster share them
// (W_ROWS in linear_wgmma.cu).
func (c lwConfig) wRows(swiglu bool) int {
	boxes := 1
	if swiglu {
		boxes = 2
	}
	return c.BN / max(boxes, c.Cluster)
}

// units is the units of work of m rows and cols output columns (its
// SwiGLU's, BN/2, or BN a tile): tiles, or with clusters the groups of
// Cluster m-tiles of one n-tile that a cluster's blocks take together.
func (c lwConfig) units(m, cols int, swiglu bool) int {
	tn := c.BN
	if swiglu {
		tn = c.BN / 2
	}
	cl := max(1, c.Cluster)
	mtiles := (m + lwRows - 1) / lwRows
	return (mtiles + cl - 1) / cl * ((cols + tn - 1) / tn)
}

// shared is LwLayout<BN, STAGES>::SMEM.
func (c lwConfig) shared() int {
	return c.Stages*(lwRows+c.BN)*lwK*2 + lwConsumers*lwOutBufs*lwOutBox + hopperAlign
}

// lwConfigs are the instances compiled (LINEAR_WGMMA in linear_wgmma.cu),
// each a variant of linear: 128×256 tiles in 4 stages (225 KiB with the
// output boxes), the reuse of group_wgmma's tile, and 128×128 in 6 (the
// same bytes), which reads a third more of L2 per FLOP but cuts a shape
// into twice the tiles, for the shapes whose last wave of 128×256 tiles
// would leave most SMs idle (M = 10,816, N = 3,584: 1,190 tiles on 132
// SMs); and both again in clusters of two blocks (the _mc2 variants) that
// take two m-tiles of one n-tile, each block copying half of a stage's w to
// both by multicast, so that w crosses from L2 once a cluster. The _hold
// variants are the 128×256 ones with the epilogue that never waits for a
// store within a tile (HOLD in linear_wgmma.cu): a consumer's four boxes go
// two into its own buffers and two into the stage of the tile's last
// k-step, which it releases a k-step into the next tile, once the stores
// have read it; the tensor cores idle through the epilogue of every tile
// in the cooperative kernel, and this shortens it (not measured).
var lwConfigs = []lwConfig{{"wgmma", 256, 4, 1, false}, {"wgmma_n128", 128, 6, 1, false}, {"wgmma_mc2", 256, 4, 2, false},
	{"wgmma_n128_mc2", 128, 6, 2, false}, {"wgmma_hold", 256, 4, 1, true}, {"wgmma_hold_mc2", 256, 4, 2, true}}

// lwConfigNamed is the instance of variant name.
func lwConfigNamed(name string) (lwConfig, bool) {
	i := slices.IndexFunc(lwConfigs, func(c lwConfig) bool { return c.Variant == name })
	if i < 0 {
		return lwConfig{}, false
	}
	return lwConfigs[i], true
}

// Without a tuning choice, problems of at least linWgmmaRows rows run the
// variant linWgmmaDefault where it can run, else cuBLAS. "" (as now) keeps
// cuBLAS the default until linear_wgmma has been measured against it on the
// model's prefill shapes; tests set both to run every linear case through
// an instance.
var (
	linWgmmaDefault = ""
	linWgmmaRows    = 128
)

// lwModule is linear_wgmma's NVRTC module.
func lwModule() cudaset.Module { return module("linear_wgmma.cu", cudaset.Names(lwInstances())) }

// lwKit is linear_wgmma on one device.
type lwKit struct {
	err      error               // why it cannot run here; nil when it can
	fit      map[string]lwConfig // the instances whose shared memory fits, by variant
	why      map[string]error    // and why each other cannot run
	clusters map[string]int      // per variant in clusters: the clusters the device runs at once
	status   *kernels.Tensor     // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
}

// newLinearWgmma compiles linear_wgmma into k where the device allows it,
// readies each instance's shared memory and asks the driver how many
// clusters of each clustered instance run at once. It never fails: what
// went wrong is kept in the kit.
func newLinearWgmma(k *cudaset.Kit) *lwKit {
	l := &lwKit{fit: map[string]lwConfig{}, why: map[string]error{}, clusters: map[string]int{}}
	if l.err = addHopperModule(k, lwConfigs[0].Variant, "linear_wgmma", lwModule()); l.err != nil {
		return l
	}
	for _, c := range lwConfigs {
		if err := l.ready(k, c); err != nil {
			l.why[c.Variant] = fmt.Errorf("fused: linear %s: %w", c.Variant, err)
			continue
		}
		l.fit[c.Variant] = c
	}
	l.status = newWaitStatus(k)
	return l
}

// ready readies instance c's kernels on k: their shared memory, and for
// clusters the most that run at once (both kernels alike: the fewer).
func (l *lwKit) ready(k *cudaset.Kit, c lwConfig) error {
	for _, name := range []string{c.kernel(), c.swigluKernel()} {
		if err := k.FitShared(name, c.shared()); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if c.Cluster <= 1 {
			continue
		}
		n, err := k.Func(name).MaxActiveClusters(cuda.Dim3{X: uint32(c.Cluster)}, cuda.Dim3{X: lwThreads}, c.shared())
		if err != nil {
			return err
		}
		if n < 1 {
			return fmt.Errorf("%s: the device runs no cluster of %d blocks of it", name, c.Cluster)
		}
		if have, ok := l.clusters[c.Variant]; !ok || n < have {
			l.clusters[c.Variant] = n
		}
	}
	return nil
}

// grid is the blocks of a persistent launch of instance c over units of
// work (lwConfig.units): one block an SM and a unit, or with clusters
// Cluster blocks a unit, as many clusters as run at once at most.
func (l *lwKit) grid(c lwConfig, sms, units int) uint32 {
	if c.Cluster <= 1 {
		return uint32(min(units, sms))
	}
	return uint32(c.Cluster * min(units, l.clusters[c.Variant]))
}

// config is the instance of variant name, or why it cannot run here.
func (l *lwKit) config(name string) (lwConfig, error) {
	c, ok := lwConfigNamed(name)
	switch {
	case !ok:
		return c, fmt.Errorf("fused: linear has no linear_wgmma variant %q", name)
	case l == nil:
		return c, fmt.Errorf("fused: linear %s: not built", name)
	case l.err != nil:
		return c, l.err
	case l.why[name] != nil:
		return c, l.why[name]
	}
	return l.fit[name], nil
}

// runs is the instance of variant name where it can run here (config
// says why not, where it cannot).
func (l *lwKit) runs(name string) (lwConfig, bool) {
	if l == nil || l.err != nil {
		return lwConfig{}, false
	}
	c, ok := l.fit[name]
	return c, ok
}

// lwValid is the variant entry of instance c for shape s on target t, with
// SwiGLU in the epilogue (linear_swiglu, N = 2I) or the plain one (linear):
// absent (offered false) where t is not hopperArch.
func lwValid(c lwConfig, swiglu bool) func(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	return func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		if t.Arch != hopperArch {
			return "", "", false
		}
		var vec string
		if k := s["K"]; k%cudaset.VecWidth != 0 {
			vec = fmt.Sprintf("K=%d: w's rows are not on the 16-byte boundaries tensor copies need; cublas runs it", k)
		}
		epi := "bias"
		if swiglu {
			epi = fmt.Sprintf("swiglu (w as %d gate and %d up rows a stage, %d columns out)", c.BN/2, c.BN/2, c.BN/2)
		}
		store := fmt.Sprintf("stmatrix into %d boxes a consumer, tensor stores box by box", lwOutBufs)
		if c.Hold {
			store = fmt.Sprintf("stmatrix into %d boxes a consumer and the rest into the held last stage, tensor stores all at once", lwOutBufs)
		}
		params := fmt.Sprintf("persistent warpgroups=1+2 tile=%dx%dx%d stages=%d shared=%d regs=%d/%d wgmma=m64n%dk16 tma=128B-swizzle order=swaths of %d m-tiles epilogue=%s, %s",
			lwRows, c.BN, lwK, c.Stages, c.shared(), lwProducerRegs, lwConsumerRegs, c.BN, lwGroup, epi, store)
		if c.Cluster > 1 {
			params += fmt.Sprintf(" cluster=%dx1 (m-tiles %d·i+rank of one n-tile; each block multicasts %d of a stage's %d w rows to the cluster)",
				c.Cluster, c.Cluster, c.wRows(swiglu), c.BN)
		}
		return params, join(vec, fits(c.shared(), t)), true
	}
}

// lwTakes reports whether linear_wgmma's tensor maps fit the operands: bf16
// out, x and w, K at least 1, every pitch a multiple of 8 elements and
// every matrix on a 16-byte boundary.
func (o *ops) lwTakes(out, x, w *kernels.Tensor) bool {
	for _, t := range []*kernels.Tensor{out, x, w} {
		if !cudaset.IsBF16(t) || t.Pitch%cudaset.VecWidth != 0 || o.D.Ptr(t)%16 != 0 {
			return false
		}
	}
	return x.Cols() > 0
}

// linearWgmma launches instance c: out [m, n] = x [m, k] · w [n, k]ᵀ + bias
// on a persistent grid of at most one block per SM (lwKit.grid).
func (o *ops) linearWgmma(c lwConfig, out, x, w, bias *kernels.Tensor) {
	op := kernels.OpLinear
	m, k, n := x.Rows(), x.Cols(), w.Rows()
	xm, wm := o.Mat(x), o.Mat(w)
	xmap := o.xMap(op, xm, m, k)
	wmap, err := o.D.EncodeTiled(cuda.Tiled{Addr: wm.P, Elem: 2, Dims: []uint64{uint64(k), uint64(n)},
		Strides: []uint64{uint64(wm.Pitch * 2)}, Box: []uint32{lwK, uint32(c.wRows(false))}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "w's tensor map: %v", err)
	omap, _, err := o.hopperOutMap(o.D.Ptr(out), out.Pitch, n, m, 2)
	o.Need(err == nil, op, "out's tensor map: %v", err)
	grid := o.lw.grid(c, o.SMs, c.units(m, n, false))
	o.LaunchGrid(c.kernel(), cuda.Dim3{X: grid}, cuda.Dim3{X: lwThreads}, c.shared(),
		xmap, wmap, omap, o.lwBias(bias), int32(m), int32(n), int32(k), int32(max(1, lwGroup)), o.D.Ptr(o.lw.status))
}

// linearSwiGLUWgmma launches instance c with SwiGLU in its epilogue: out
// [m, inter] = swiglu(x [m, k] · w [2·inter, k]ᵀ), w's gate rows then its up
// rows, each stage's w as two tensor copies of BN/2 rows.
func (o *ops) linearSwiGLUWgmma(c lwConfig, out, x, w *kernels.Tensor) {
	op := kernels.OpLinearSwiGLU
	m, k, inter := x.Rows(), x.Cols(), out.Cols()
	xm, wm := o.Mat(x), o.Mat(w)
	xmap := o.xMap(op, xm, m, k)
	wmap, err := o.D.EncodeTiled(cuda.Tiled{Addr: wm.P, Elem: 2, Dims: []uint64{uint64(k), uint64(2 * inter)},
		Strides: []uint64{uint64(wm.Pitch * 2)}, Box: []uint32{lwK, uint32(c.wRows(true))}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "w's tensor map: %v", err)
	omap, _, err := o.hopperOutMap(o.D.Ptr(out), out.Pitch, inter, m, 2)
	o.Need(err == nil, op, "out's tensor map: %v", err)
	grid := o.lw.grid(c, o.SMs, c.units(m, inter, true))
	o.LaunchGrid(c.swigluKernel(), cuda.Dim3{X: grid}, cuda.Dim3{X: lwThreads}, c.shared(),
		xmap, wmap, omap, int32(m), int32(inter), int32(k), int32(max(1, lwGroup)), o.D.Ptr(o.lw.status))
}

// lwBias is bias as linear_wgmma reads it (0 for none): bf16 pairs from a
// 4-byte boundary, readable to an even length. A bias that is not so is
// copied into a bf16 row of scratch first, one longer than it, rounded to
// bf16 as the addmm path rounds the bias rows it copies into out.
func (o *ops) lwBias(bias *kernels.Tensor) uintptr {
	if bias == nil {
		return 0
	}
	n, p := bias.Numel(), o.D.Ptr(bias)
	if cudaset.IsBF16(bias) && n%2 == 0 && p%4 == 0 {
		return p
	}
	s := o.Scratch("linear.bias", kernels.BF16, 1, n+1)
	b := o.Mat(bias)
	b.Pitch = 0
	o.CopyRows(s, 0, b, 0, 1, 1, 1, n)
	return s.P
}

// linearWgmmaWaits reports a wait of linear_wgmma that timed out since the
// last call (synchronizing with the device), and clears the record.
func (o *ops) linearWgmmaWaits() error {
	if o.lw == nil {
		return nil
	}
	st, err := o.takeWait(o.lw.status)
	if st == nil {
		return err
	}
	what := map[int32]string{1: "a full stage (full)", 2: "a free stage (empty)"}[st[0]]
	return fmt.Errorf("fused: linear_wgmma: a wait for %s timed out: block %d, thread %d, k-step %d, parity %d (the kernel gave up; its output is garbage)",
		what, st[1], st[4], st[5], st[6])
}
