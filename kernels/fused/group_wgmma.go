package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The Hopper grouped GEMM (group_wgmma.cu): the variant wgmmaVariant of
// group_gemm and moe_experts at the prefill tiling, compiled by NVRTC only
// where the device's target is hopperArch, as a module apart (like
// flash_hopper): when it cannot be built New still succeeds, the error is
// kept in gwKit.err, and asking for the variant returns it.

// wgmmaVariant is group_wgmma's name among group_gemm's and moe_experts'
// variants.
const wgmmaVariant = "grouped_wgmma"

// Tiles of group_wgmma, as group_wgmma.cu names them.
const (
	gwRows         = 128 // GW_BM: rows of a tile, 64 per consumer warpgroup
	gwK            = 64  // GW_BK: k of a stage
	gwThreads      = 384 // GW_THREADS
	gwProducerRegs = 56  // GW_PRODUCER_REGS
	gwConsumerRegs = 224 // GW_CONSUMER_REGS
	gwOutBufs      = 2   // GW_OUT_BUFS: output boxes a consumer warpgroup stages at once (OUT_TMA)
)

// gwConfig is an instance of group_wgmma: BN columns a tile through Stages
// stages.
type gwConfig struct{ BN, Stages int }

func (c gwConfig) suffix() string { return fmt.Sprintf("n%d_s%d", c.BN, c.Stages) }

// shared is GwLayout<BN, STAGES>::SMEM.
func (c gwConfig) shared() int { return c.Stages*(gwRows+c.BN)*gwK*2 + hopperAlign }

// kernels are the instance's four kernels: the plain GEMM, the plain GEMM
// with tensor stores (over groups padded to whole m-tiles), gate/up with
// SwiGLU over packed rows, and gate/up gathering its rows.
func (c gwConfig) kernels() (plain, plainTMA, gateUp, gather string) {
	s := c.suffix()
	return "group_wgmma_" + s, "group_wgmma_tma_" + s, "gate_up_wgmma_" + s, "gate_up_wgmma_gather_" + s
}

// sharedTMA is GwLayout<BN, STAGES>::SMEM_TMA: shared plus gwOutBufs output
// boxes for each of the HG_CONSUMERS consumer warpgroups, each box 64 rows
// of hopperBox columns (lwOutBox, linear_wgmma's).
func (c gwConfig) sharedTMA() int { return c.shared() + lwConsumers*gwOutBufs*lwOutBox }

// gwConfigs are the instances compiled (GROUP_WGMMA in group_wgmma.cu),
// best first: the first that fits the device's shared memory per block
// runs. 128×256 tiles take 193 KiB in 4 stages (an H100/H200 block may
// have 227); 128×128 tiles read twice the L2 bytes per FLOP.
var gwConfigs = []gwConfig{{256, 4}, {128, 6}}

// wgmmaGather makes moe_experts' grouped_wgmma gather the tokens inside
// gate/up's producer (cp.async) rather than into a packed buffer first
// (CopyRows, then tensor copies); which is faster is for the device to say.
var wgmmaGather = true

// wgmmaTMAOut makes moe_experts' down projection on group_wgmma (over
// moe_align's padded rows) leave by tensor stores from shared memory
// rather than by stores from registers; tests set it both ways.
var wgmmaTMAOut = true

// prefillWgmma makes group_gemm and moe_experts run group_wgmma at the
// prefill tiling where it can: 610 and 576 TFLOP/s on W3's gate/up and down
// shapes, 2.2× grouped_mma and 1.0–1.3× cuBLAS per group (infer bench
// group_gemm; bench/RESULTS.md, group GEMM). Tests and `infer bench --optimize` set it
// per op.
var prefillWgmma = true

// gwModule is group_wgmma's NVRTC module.
func gwModule() cudaset.Module {
	m := module("group_wgmma.cu", cudaset.Names(gwInstances()))
	m.Opts = append(m.Opts, gwOpts...)
	return m
}

// gwOpts are extra NVRTC options of group_wgmma's module, empty but in
// tests: TestWgmmaProbe builds it with what FUSELM_GW_PROBE_OPTS names.
var gwOpts []string

// gwKit is group_wgmma on one device.
type gwKit struct {
	err    error           // why it cannot run here; nil when it can
	config gwConfig        // the instance run
	status *kernels.Tensor // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
}

// newGroupWgmma compiles group_wgmma into k where the device allows it. It
// never fails: what went wrong is kept in the kit's err.
func newGroupWgmma(k *cudaset.Kit) *gwKit {
	g := &gwKit{}
	if g.err = addHopperModule(k, wgmmaVariant, "group_wgmma", gwModule()); g.err != nil {
		return g
	}
	var why []string
	for _, c := range gwConfigs {
		p, pt, gu, x := c.kernels()
		var err error
		for _, name := range []string{p, pt, gu, x} {
			size := c.shared()
			if name == pt {
				size = c.sharedTMA()
			}
			if err = k.FitShared(name, size); err != nil {
				why = append(why, fmt.Sprintf("%s: %v", name, err))
				break
			}
		}
		if err == nil {
			g.config = c
			g.status = newWaitStatus(k)
			return g
		}
	}
	g.err = fmt.Errorf("fused: %s: no instance fits this device: %v", wgmmaVariant, why)
	return g
}

// ready is nil when group_wgmma can run, else why not.
func (g *gwKit) ready() error {
	if g == nil {
		return fmt.Errorf("fused: %s: not built", wgmmaVariant)
	}
	return g.err
}

// wgmmaVariantOf is the Variant entry of group_wgmma on target t; absent
// (ok false) where the target is not hopperArch.
func wgmmaVariantOf(t kernels.Target, gather bool) (v kernels.Variant, ok bool) {
	if t.Arch != hopperArch {
		return v, false
	}
	v.Name = wgmmaVariant
	for _, c := range gwConfigs {
		if c.sharedTMA() <= t.SharedPerBlock {
			a := "x rows by tensor copies"
			if gather {
				a = "gate/up gathers its x rows by cp.async in the producer"
			}
			v.Params = fmt.Sprintf("persistent warpgroups=1+2 tile=%dx%dx%d stages=%d shared=%d regs=%d/%d wgmma=m64n%dk16 tma=128B-swizzle; %s; "+
				"moe_experts' down stores %dx64 boxes by tensor copies (shared=%d)",
				gwRows, c.BN, gwK, c.Stages, c.shared(), gwProducerRegs, gwConsumerRegs, c.BN, a, hopperBox, c.sharedTMA())
			return v, true
		}
	}
	v.Why = fmt.Sprintf("no instance fits %d bytes of shared memory a block", t.SharedPerBlock)
	return v, true
}

// xMap is the tensor map of A's rows (x bf16 [rows, K] of pitch elements):
// boxes of gwK columns by gwRows rows.
func (o *ops) xMap(op kernels.Op, x cudaset.Mat, rows, k int) *cuda.TensorMap {
	const es = 2
	m, err := o.D.EncodeTiled(cuda.Tiled{Addr: x.P, Elem: es, Dims: []uint64{uint64(k), uint64(rows)},
		Strides: []uint64{uint64(x.Pitch * es)}, Box: []uint32{gwK, gwRows}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "x's tensor map: %v", err)
	return m
}

// outMap is the tensor map of group_wgmma's output out (bf16 [rows, n] of
// pitch elements) for its tensor stores: boxes of hopperBox columns by a
// consumer warpgroup's 64 rows.
func (o *ops) outMap(op kernels.Op, out cudaset.Mat, rows, n int) *cuda.TensorMap {
	const es = 2
	m, err := o.D.EncodeTiled(cuda.Tiled{Addr: out.P, Elem: es, Dims: []uint64{uint64(n), uint64(rows)},
		Strides: []uint64{uint64(out.Pitch * es)}, Box: []uint32{hopperBox, 64}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "the output's tensor map: %v", err)
	return m
}

// wMap is the tensor map of the weights w bf16 [groups, n, k] packed:
// boxes of gwK columns by half a tile's weight rows.
func (o *ops) wMap(op kernels.Op, w uintptr, groups, n, k int, c gwConfig) *cuda.TensorMap {
	const es = 2
	m, err := o.D.EncodeTiled(cuda.Tiled{Addr: w, Elem: es, Dims: []uint64{uint64(k), uint64(n), uint64(groups)},
		Strides: []uint64{uint64(k * es), uint64(n * k * es)}, Box: []uint32{gwK, uint32(c.BN / 2), 1}, Swizzle: hopperSwizzle})
	o.Need(err == nil, op, "the weights' tensor map: %v", err)
	return m
}

// wgmmaGemm launches group_wgmma's plain or gate/up kernel: out [m, ·] =
// the rows of x (xRows of them; through gather when not 0) times their
// group's w [groups, n, k]. A persistent grid of one block per SM walks the
// m-tiles the device offsets make. With padded (the plain GEMM only), every
// group's rows are whole m-tiles (as moe_align pads them), and the output
// leaves by tensor stores.
func (o *ops) wgmmaGemm(op kernels.Op, swiglu, padded bool, out, x cudaset.Mat, xRows int, gather uintptr, gdiv int, w, first uintptr,
	groups, m, n, k int) {
	c := o.gw.config
	plain, plainTMA, gateUp, gath := c.kernels()
	wm := o.wMap(op, w, groups, n, k, c)
	grid := cuda.Dim3{X: uint32(o.SMs)}
	block := cuda.Dim3{X: gwThreads}
	tail := []any{o.D.Ptr(o.gw.status)}
	switch {
	case gather != 0:
		o.LaunchGrid(gath, grid, block, c.shared(), append([]any{wm, out.P, int32(out.Pitch), x.P, int32(x.Pitch), gather,
			int32(gdiv), first, int32(groups), int32(m), int32(n), int32(k)}, tail...)...)
	case padded && !swiglu:
		o.LaunchGrid(plainTMA, grid, block, c.sharedTMA(), append([]any{o.xMap(op, x, xRows, k), wm, o.outMap(op, out, m, n), first,
			int32(groups), int32(m), int32(n), int32(k)}, tail...)...)
	default:
		name := plain
		if swiglu {
			name = gateUp
		}
		o.LaunchGrid(name, grid, block, c.shared(), append([]any{o.xMap(op, x, xRows, k), wm, out.P, int32(out.Pitch), first,
			int32(groups), int32(m), int32(n), int32(k)}, tail...)...)
	}
}

// wgmmaWaits reports a wait of group_wgmma that timed out since the last
// call (synchronizing with the device), and clears the record.
func (o *ops) wgmmaWaits() error {
	if o.gw == nil {
		return nil
	}
	st, err := o.takeWait(o.gw.status)
	if st == nil {
		return err
	}
	what := map[int32]string{1: "a full stage (full)", 2: "a free stage (empty)"}[st[0]]
	return fmt.Errorf("fused: group_wgmma: a wait for %s timed out: block %d, thread %d, k-step %d, parity %d (the kernel gave up; its output is garbage)",
		what, st[1], st[4], st[5], st[6])
}

// wgmmaKey is the tuning key of group_gemm's and moe_experts' problems at
// the tiling c: group_wgmma is a choice at the prefill tiling only.
func wgmmaKey(c gemmConfig) string { return "tiling=" + c.Name }

// defaultGemmVariant is the variant op runs at tiling c without group_wgmma:
// at decode's tiling moe_experts' folded (past the fold, the persistent
// grid) and group_gemm's persistent grid.
func defaultGemmVariant(op kernels.Op, c gemmConfig) string {
	if op == kernels.OpMoEExperts && c.Name == prefillTiling {
		return "cublas_per_expert"
	}
	if op == kernels.OpMoEExperts && c.Name == foldTiling {
		return foldedVariant
	}
	if c.Name == dynTiling {
		return dynVariant
	}
	return "grouped_mma"
}
