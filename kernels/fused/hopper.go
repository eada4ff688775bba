package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The Hopper flash attention (hopper.cu, flash_hopper): the attn_prefill
// variant hopperVariant, compiled by NVRTC only where the device's target is
// hopperArch. It is a module apart from the set's others: when it cannot be
// compiled or loaded, New still succeeds, the error (with NVRTC's log) is
// kept in hopperKit.err, and asking for the variant returns it.

const (
	// hopperVariant is flash_hopper's name among attn_prefill's variants.
	hopperVariant = "wgmma"
	// hopperArch is the only NVRTC target flash_hopper compiles for: wgmma
	// and setmaxnreg are sm_90a's own (NVRTC 12 or later on a 9.0 device).
	hopperArch = "sm_90a"
)

// Tiles of flash_hopper, as hopper.cu names them.
const (
	hopperRows    = 128 // HOP_BM: queries of a block, 64 per consumer warpgroup
	hopperKeys    = 128 // HOP_BN: keys of a K or V tile
	hopperThreads = 384 // HOP_THREADS: one producer and two consumer warpgroups
	hopperBox     = 64  // HOP_BOX: columns of a tensor-copy box, 128 bytes of bf16 or f16
	hopperSwizzle = 128 // bytes: the copies' and the wgmma descriptors' swizzle
	hopperAlign   = 1024
	// hopperStoreRows are the rows of an output tensor store: a consumer
	// warpgroup's 64 queries.
	hopperStoreRows = hopperRows / 2
	// hopperProducerRegs and hopperConsumerRegs are HOP_PRODUCER_REGS and
	// HOP_CONSUMER_REGS: setmaxnreg's registers per thread of each role.
	hopperProducerRegs = 24
	hopperConsumerRegs = 240
	// hopperStatusLen is the i32 words of the kernels' timed-out-wait record.
	hopperStatusLen = 8
)

// hopperHead is what an instance of flash_hopper is chosen for: the element
// type of the operands and the head dim.
type hopperHead struct {
	DT kernels.DType
	D  int
}

// hopperConfig is an instance of flash_hopper: its element type and head
// dim, the stages of its K ring and of its V ring, and its Q buffers.
type hopperConfig struct {
	hopperHead
	KStages, VStages, QBufs int
}

// kernel is the instance's name (instances.cuh gives it to FLASH_HOPPER).
func (c hopperConfig) kernel() string {
	t := ""
	if c.DT == kernels.F16 {
		t = "f16_"
	}
	return fmt.Sprintf("flash_hopper_%sd%d_k%dv%dq%d", t, c.D, c.KStages, c.VStages, c.QBufs)
}

// shared is HopLayout<D, D, HOP_BN, KST, VST, QBUF>::SMEM: the Q tiles, the
// K and V rings, and the slack that aligns them to the swizzle's period.
func (c hopperConfig) shared() int {
	return (c.QBufs*hopperRows*c.D+(c.KStages+c.VStages)*hopperKeys*c.D)*c.DT.Size() + hopperAlign
}

// hopperDTypes are the element types flash_hopper is instantiated for: the
// activations' bf16, and f16 for the kernel benchmarks' fp16 rows (issue 9).
var hopperDTypes = []kernels.DType{kernels.BF16, kernels.F16}

// hopperConfigs are the instances compiled (FLASH_HOPPER in hopper.cu: each
// head dim's shapes in both element types), per element type and head dim
// in the order of preference: the first that fits the device's shared
// memory per block runs (see newHopper). D=128: 2 K stages, 2 V stages and
// 2 Q tiles take 193 KiB, 2, 2 and 1 take 161 KiB; D=64: 4, 4, 2 take 161
// KiB, 2, 2, 1 take 81. At D=128, 2, 2, 2 ran 0–2% above 3, 2, 2 (225 KiB)
// and 2, 3, 2, and 9–14% above 3, 3, 1 at 1K–2K, kernel alone
// (bench/TRIED.md).
var hopperConfigs = func() []hopperConfig {
	var cs []hopperConfig
	for _, dt := range hopperDTypes {
		for _, c := range []struct{ d, k, v, q int }{{128, 2, 2, 2}, {128, 2, 2, 1}, {64, 4, 4, 2}, {64, 2, 2, 1}} {
			cs = append(cs, hopperConfig{hopperHead{dt, c.d}, c.k, c.v, c.q})
		}
	}
	return cs
}()

// hopperHeadDims are the head dims flash_hopper is instantiated for.
var hopperHeadDims = []int{64, 128}

// prefillHopper makes AttentionPrefill run flash_hopper, where it can (a
// 9.0 device, head dims 64 and 128), for the head dims no tuning choice
// covers: 1.7–1.9× flash_prefill w4_m2 (infer bench attn_prefill;
// bench/RESULTS.md, attention prefill). Tests set it.
var prefillHopper = true

// hopperModule is flash_hopper's NVRTC module.
func hopperModule() cudaset.Module { return module("hopper.cu", cudaset.Names(hopperInstances())) }

// hopperKit is flash_hopper on one device.
type hopperKit struct {
	err     error                       // why it cannot run here; nil when it can
	configs map[hopperHead]hopperConfig // the instance run per element type and head dim
	status  *kernels.Tensor             // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
}

// newHopper compiles flash_hopper into k where the device allows it. It
// never fails: what went wrong is kept in the kit's err.
func newHopper(k *cudaset.Kit) *hopperKit {
	h := &hopperKit{configs: map[hopperHead]hopperConfig{}}
	if h.err = addHopperModule(k, hopperVariant, "flash_hopper", hopperModule()); h.err != nil {
		return h
	}
	fit, err := fitInstances(k, hopperVariant, hopperConfigs)
	if err != nil {
		h.err = err
		return h
	}
	for _, c := range fit {
		if _, ok := h.configs[c.hopperHead]; !ok {
			h.configs[c.hopperHead] = c
		}
	}
	h.status = newWaitStatus(k)
	return h
}

// addHopperModule compiles m into k where the device's NVRTC target is
// hopperArch, or says why it cannot (what: the variant, as errors name
// it; kernel: the module's kernels).
func addHopperModule(k *cudaset.Kit, what, kernel string, m cudaset.Module) error {
	if p := k.D.Props(); p.Arch != hopperArch {
		return notHopper(p, what, kernel)
	}
	if err := k.AddModule(m); err != nil {
		return fmt.Errorf("fused: %s: %w", what, err)
	}
	return nil
}

// fitInstances readies the dynamic shared memory of each instance's kernel
// on k: those that fit, in order, or why none does.
func fitInstances[C interface {
	kernel() string
	shared() int
}](k *cudaset.Kit, what string, cs []C) ([]C, error) {
	var fit []C
	var why []string
	for _, c := range cs {
		if err := k.FitShared(c.kernel(), c.shared()); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", c.kernel(), err))
			continue
		}
		fit = append(fit, c)
	}
	if len(fit) == 0 {
		return nil, fmt.Errorf("fused: %s: no instance fits this device: %v", what, why)
	}
	return fit, nil
}

// notHopper is why the variant's kernel cannot be built on a device of
// properties p, whose NVRTC target is not hopperArch.
func notHopper(p cuda.Props, variant, kernel string) error {
	return fmt.Errorf("fused: %s: %s needs NVRTC's target %s (a compute capability 9.0 device, NVRTC 12 or later); %s, compute capability %d.%d, NVRTC %d.%d targets %s",
		variant, kernel, hopperArch, p.Name, p.CCMajor, p.CCMinor, p.NVRTCVersion/1000, p.NVRTCVersion%1000/10, p.Arch)
}

// newWaitStatus is a Hopper kernel's record of a timed-out wait, i32
// [hopperStatusLen], zero while there is none.
func newWaitStatus(k *cudaset.Kit) *kernels.Tensor { return newCounters(k, hopperStatusLen) }

// newCounters is n i32 counters on k's device, zeroed once here: the
// kernels that count on them leave them at zero, so that no launch clears
// them and a captured graph replays it.
func newCounters(k *cudaset.Kit, n int) *kernels.Tensor {
	c := k.D.Alloc(kernels.I32, n)
	k.D.Zero(c)
	return c
}

// config is the instance for element type dt and head dim d, or why there
// is none.
func (h *hopperKit) config(dt kernels.DType, d int) (hopperConfig, error) {
	if h == nil {
		return hopperConfig{}, fmt.Errorf("fused: %s: not built", hopperVariant)
	}
	if h.err != nil {
		return hopperConfig{}, h.err
	}
	c, ok := h.configs[hopperHead{dt, d}]
	if !ok {
		var have []string
		for k := range h.configs {
			have = append(have, fmt.Sprintf("%v D=%d", k.DT, k.D))
		}
		slices.Sort(have)
		return c, fmt.Errorf("fused: %s: %v, head dim %d: flash_hopper runs %v here", hopperVariant, dt, d, have)
	}
	return c, nil
}

// hopperVariantOf is the Variant entry of flash_hopper for element type dt
// and head dim d on target t; absent (ok false) where the target is not
// hopperArch.
func hopperVariantOf(dt kernels.DType, d int, t kernels.Target) (v kernels.Variant, ok bool) {
	if t.Arch != hopperArch {
		return v, false
	}
	v.Name = hopperVariant
	var best *hopperConfig
	for _, c := range hopperConfigs {
		if best == nil && c.hopperHead == (hopperHead{dt, d}) && c.shared() <= t.SharedPerBlock {
			best = &c
		}
	}
	switch {
	case !slices.Contains(hopperDTypes, dt):
		v.Why = fmt.Sprintf("%v operands: flash_hopper is instantiated for %v", dt, hopperDTypes)
	case !slices.Contains(hopperHeadDims, d):
		v.Why = fmt.Sprintf("head dim %d: flash_hopper is instantiated for %v", d, hopperHeadDims)
	case best == nil:
		v.Why = fmt.Sprintf("no instance of head dim %d fits %d bytes of shared memory a block", d, t.SharedPerBlock)
	default:
		v.Params = fmt.Sprintf("warpgroups=1+2 rows=%d key_tile=%d k_stages=%d v_stages=%d q_tiles=%d shared=%d regs=%d/%d wgmma=m64n%dk16,m64n%dk16 dtype=%v tma=128B-swizzle grid=persistent",
			hopperRows, hopperKeys, best.KStages, best.VStages, best.QBufs, best.shared(), hopperProducerRegs, hopperConsumerRegs, hopperKeys, d, dt)
	}
	return v, true
}

// hopperPrefill launches flash_hopper instance c for rows of at most
// longest new tokens: the tensor maps of q and the caches, made for this
// call, are the kernel's first parameters.
func (o *ops) hopperPrefill(c hopperConfig, a *kernels.AttnArgs, longest int, causal bool) {
	op := kernels.OpAttnPrefill
	b := a.Batch
	blocks := (longest + hopperRows - 1) / hopperRows
	if blocks == 0 || b.Rows == 0 {
		return
	}
	d := a.HeadDim
	es := a.Q.DType.Size() // the maps move 2-byte elements as they are, bf16 or f16
	qm, err := o.D.EncodeTiled(cuda.Tiled{Addr: o.D.Ptr(a.Q), Elem: es,
		Dims: []uint64{uint64(a.Heads * d), uint64(a.Q.Rows())}, Strides: []uint64{uint64(a.Q.Pitch * es)},
		Box: []uint32{hopperBox, hopperRows}, Swizzle: hopperSwizzle})
	if err != nil { // kv_append has run: too late to decline the call
		panic(fmt.Sprintf("fused: %s: q's tensor map: %v", op, err))
	}
	cacheMap := func(t *kernels.Tensor) *cuda.TensorMap {
		m, err := o.D.EncodeTiled(cuda.Tiled{Addr: o.D.Ptr(t), Elem: es,
			Dims:    []uint64{uint64(d), uint64(b.MaxSeq), uint64(t.Rows() / b.MaxSeq)},
			Strides: []uint64{uint64(t.Pitch * es), uint64(b.MaxSeq * t.Pitch * es)},
			Box:     []uint32{hopperBox, hopperKeys, 1}, Swizzle: hopperSwizzle})
		if err != nil {
			panic(fmt.Sprintf("fused: %s: the cache's tensor map: %v", op, err))
		}
		return m
	}
	km, vm := cacheMap(a.KCache), cacheMap(a.VCache)
	om, ostore, err := o.hopperOutMap(o.D.Ptr(a.Out), a.Out.Pitch, a.Heads*d, a.Out.Rows(), es)
	if err != nil {
		panic(fmt.Sprintf("fused: %s: out's tensor map: %v", op, err))
	}
	causalArg := int32(0)
	if causal {
		causalArg = 1
	}
	units := (blocks + 1) / 2 * a.Heads * b.Rows // HopGrid's
	grid := min(units, o.SMs)                    // a block a multiprocessor: the most its shared memory lets run
	if hopperGridCap > 0 {
		grid = min(grid, hopperGridCap)
	}
	o.LaunchGrid(c.kernel(), cuda.Dim3{X: uint32(grid)}, cuda.Dim3{X: hopperThreads}, c.shared(),
		qm, km, vm, om, ostore, o.D.Ptr(a.Out), int32(a.Out.Pitch), o.D.Ptr(b.StartDev), o.D.Ptr(b.PastDev),
		int32(a.Heads), int32(a.KVHeads), int32(b.Rows), int32(blocks), scaleLog2(a.Scale), causalArg,
		o.D.Ptr(o.hopper.status))
}

// hopperGridCap, when above 0, caps flash_hopper's grid: tests set it so
// that each block takes many items.
var hopperGridCap = 0

// hopperOutMap is the tensor map through which flash_hopper and mla_hopper
// store their output out ([rows, cols] of es-byte elements, pitch
// elements apart), and the kernels' ostore 1; or, where out's rows do not
// start on the 16-byte boundaries a map needs, an empty map and 0: the
// kernel then stores directly.
func (o *ops) hopperOutMap(out uintptr, pitch, cols, rows, es int) (*cuda.TensorMap, int32, error) {
	if out%16 != 0 || pitch*es%16 != 0 {
		return &cuda.TensorMap{}, 0, nil
	}
	m, err := o.D.EncodeTiled(cuda.Tiled{Addr: out, Elem: es,
		Dims: []uint64{uint64(cols), uint64(rows)}, Strides: []uint64{uint64(pitch * es)},
		Box: []uint32{hopperBox, hopperStoreRows}, Swizzle: hopperSwizzle})
	if err != nil {
		return nil, 0, err
	}
	return m, 1, nil
}

// Faults reports, and clears, every wait of the set's Hopper kernels
// (flash_hopper, mla_hopper, group_wgmma, linear_wgmma, linear_swap,
// linear_stream) that timed out since the last call: kernels.Faulter, so
// that a generation whose kernels gave up fails instead of printing
// garbage.
func (o *ops) Faults() error {
	return kernels.JoinFaults(o.hopperWaits(), o.mlaHopperWaits(), o.wgmmaWaits(), o.linearWgmmaWaits(), o.linearSwapWaits(), o.linearStreamWaits(), o.moeSplitWaits())
}

// hopperWaits reports a wait of flash_hopper that timed out since the last
// call (synchronizing with the device), and clears the record.
func (o *ops) hopperWaits() error {
	if o.hopper == nil {
		return nil
	}
	return o.hopWaits("flash_hopper", o.hopper.status)
}

// takeWait reads a Hopper kernel's timed-out-wait record st (hopper.cuh's
// status; none where st is nil), synchronizing with the device, and clears
// it: the record's words where a wait timed out, else nil.
func (o *ops) takeWait(st *kernels.Tensor) ([]int32, error) {
	if st == nil {
		return nil, nil
	}
	w, err := o.D.ReadI32(st)
	if err != nil || w[0] == 0 {
		return nil, err
	}
	o.D.Zero(st)
	return w, nil
}

// hopWaits reads kernel's timed-out-wait record st (hopper.cuh's status)
// and clears it: an error naming the wait when there is one.
func (o *ops) hopWaits(kernel string, st *kernels.Tensor) error {
	w, err := o.takeWait(st)
	if w == nil {
		return err
	}
	what := map[int32]string{1: "a Q tile (qfull)", 2: "a K tile (kfull)", 3: "a V tile (vfull)", 4: "a free K stage (kfree)",
		5: "a free V stage (vfree)", 6: "a free Q tile (qfree)"}[w[0]]
	return fmt.Errorf("fused: %s: a wait for %s timed out: block (%d, %d, %d), thread %d, tile %d, parity %d (the kernel gave up; its output is garbage)",
		kernel, what, w[1], w[2], w[3], w[4], w[5], w[6])
}
