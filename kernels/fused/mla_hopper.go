package fused

import (
	"fmt"
	"maps"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// MLA prefill on Hopper (mla_hopper.cu, mla_hopper): the mla_prefill
// variant mlaHopperVariant, compiled by NVRTC only where the device's target
// is hopperArch, as a module of its own (hopper.cuh and hop_attention.cuh, shared
// with flash_hopper): when it cannot be compiled or loaded, New still
// succeeds, flash_hopper included, and asking for the variant returns why.

// mlaHopperVariant is mla_hopper's name among mla_prefill's variants.
const mlaHopperVariant = hopperVariant

// mlaHopperConfig is an instance of mla_hopper: its head dims, key tile and
// the stages of its K ring and of its V ring (as many each).
type mlaHopperConfig struct {
	Heads        mlaHeads
	Keys, Stages int
}

func (c mlaHopperConfig) kernel() string {
	return fmt.Sprintf("mla_hopper_n%d_r%d_v%d_k%d_s%d", c.Heads.Nope, c.Heads.Rope, c.Heads.V, c.Keys, c.Stages)
}

// shared is HopLayout<DN+DR, DV, BN, STAGES, STAGES, 1>::SMEM: the Q tile, a
// K and a V tile per stage, and the slack that aligns them to the swizzle's
// period.
func (c mlaHopperConfig) shared() int {
	qk := c.Heads.Nope + c.Heads.Rope
	return (hopperRows*qk+c.Stages*c.Keys*(qk+c.Heads.V))*2 + hopperAlign
}

// mlaHopperConfigs are the instances compiled (MLA_HOPPER in mla_hopper.cu),
// in order of preference: per head dims New runs the first that fits the
// device's shared memory per block. Key tiles of 128 with 2 stages first
// (209 KiB: S is 64 registers a thread, as flash_hopper's D=128), then 64
// keys with 4 stages (the same bytes in flight, half S's registers, twice
// the softmax rescales), then 3 stages of 64 (169 KiB) for smaller blocks.
var mlaHopperConfigs = []mlaHopperConfig{
	{mlaHeads{128, 64, 128}, 128, 2},
	{mlaHeads{128, 64, 128}, 64, 4},
	{mlaHeads{128, 64, 128}, 64, 3},
}

// mlaPrefillHopper makes MLAPrefill run mla_hopper, where it can, for the
// head dims no tuning choice covers: 1.8–2.5× w8_m2 (infer bench
// mla_prefill; bench/RESULTS.md, MLA prefill). Tests set it.
var mlaPrefillHopper = true

// mlaHopperModule is mla_hopper's NVRTC module.
func mlaHopperModule() cudaset.Module {
	return module("mla_hopper.cu", cudaset.Names(mlaHopperInstances()))
}

// mlaHopperKit is mla_hopper on one device.
type mlaHopperKit struct {
	err     error                        // why it cannot run here; nil when it can
	configs map[mlaHeads]mlaHopperConfig // the instance run per head dims
	status  *kernels.Tensor              // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
}

// newMLAHopper compiles mla_hopper into k where the device allows it. It
// never fails: what went wrong is kept in the kit's err.
func newMLAHopper(k *cudaset.Kit) *mlaHopperKit {
	m := &mlaHopperKit{configs: map[mlaHeads]mlaHopperConfig{}}
	what := "mla_prefill " + mlaHopperVariant
	if m.err = addHopperModule(k, what, "mla_hopper", mlaHopperModule()); m.err != nil {
		return m
	}
	fit, err := fitInstances(k, what, mlaHopperConfigs)
	if err != nil {
		m.err = err
		return m
	}
	for _, c := range fit {
		if _, ok := m.configs[c.Heads]; !ok {
			m.configs[c.Heads] = c
		}
	}
	m.status = newWaitStatus(k)
	return m
}

// config is the instance for head dims d, or why there is none.
func (m *mlaHopperKit) config(d mlaHeads) (mlaHopperConfig, error) {
	if m == nil {
		return mlaHopperConfig{}, fmt.Errorf("fused: mla_prefill %s: not built", mlaHopperVariant)
	}
	if m.err != nil {
		return mlaHopperConfig{}, m.err
	}
	c, ok := m.configs[d]
	if !ok {
		return c, fmt.Errorf("fused: mla_prefill %s: head dims %v: mla_hopper runs %v here", mlaHopperVariant, d,
			slices.SortedFunc(maps.Keys(m.configs), func(a, b mlaHeads) int { return a.Nope - b.Nope }))
	}
	return c, nil
}

// mlaHopperVariantOf is the Variant entry of mla_hopper for head dims d on
// target t; absent (ok false) where the target is not hopperArch.
func mlaHopperVariantOf(d mlaHeads, t kernels.Target) (v kernels.Variant, ok bool) {
	if t.Arch != hopperArch {
		return v, false
	}
	v.Name = mlaHopperVariant
	var best *mlaHopperConfig
	instantiated := false
	for i, c := range mlaHopperConfigs {
		if c.Heads != d {
			continue
		}
		instantiated = true
		if best == nil && c.shared() <= t.SharedPerBlock {
			best = &mlaHopperConfigs[i]
		}
	}
	switch {
	case !instantiated:
		v.Why = fmt.Sprintf("heads of nope %d, rope %d, v %d: mla_hopper is instantiated for DeepSeek-V2's (128, 64, 128)", d.Nope, d.Rope, d.V)
	case best == nil:
		v.Why = fmt.Sprintf("no instance of mla_hopper fits %d bytes of shared memory a block", t.SharedPerBlock)
	default:
		v.Params = fmt.Sprintf("warpgroups=1+2 rows=%d key_tile=%d stages=%d shared=%d regs=%d/%d wgmma=m64n%dk16,m64n%dk16 tma=128B-swizzle; kv_b_proj up front (cuBLAS)",
			hopperRows, best.Keys, best.Stages, best.shared(), hopperProducerRegs, hopperConsumerRegs, best.Keys, d.V)
	}
	return v, true
}

// mlaHopperLaunch launches mla_hopper instance c over rows [r0, r1) of a's
// batch, whose decompressed keys and values are kv's keys rows (packed, or
// row r's at (r - r0)·kstride where kstride > 0) and whose longest row
// has longest new tokens: the tensor maps of q, kv and the cache's k_pe,
// made for this call, are the kernel's first parameters.
func (o *ops) mlaHopperLaunch(c mlaHopperConfig, a *kernels.MLAArgs, kv cudaset.Mat, keys, kstride, r0, r1, longest int) {
	op := kernels.OpMLAPrefill
	b := a.Batch
	blocks := (longest + hopperRows - 1) / hopperRows
	if blocks == 0 || r1 <= r0 {
		return
	}
	const es = 2 // bytes of a bf16
	d := c.Heads
	tiled := func(what string, t cuda.Tiled) *cuda.TensorMap {
		m, err := o.D.EncodeTiled(t)
		o.Need(err == nil, op, "%s's tensor map: %v", what, err)
		return m
	}
	qm := tiled("q", cuda.Tiled{Addr: o.D.Ptr(a.Q), Elem: es,
		Dims: []uint64{uint64(a.Heads * (d.Nope + d.Rope)), uint64(a.Q.Rows())}, Strides: []uint64{uint64(a.Q.Pitch * es)},
		Box: []uint32{hopperBox, hopperRows}, Swizzle: hopperSwizzle})
	kvm := tiled("the decompressed kv", cuda.Tiled{Addr: kv.P, Elem: es,
		Dims: []uint64{uint64(a.Heads * (d.Nope + d.V)), uint64(keys)}, Strides: []uint64{uint64(kv.Pitch * es)},
		Box: []uint32{hopperBox, uint32(c.Keys)}, Swizzle: hopperSwizzle})
	rows := a.Cache.Rows() / b.MaxSeq
	pem := tiled("the cache's k_pe", cuda.Tiled{Addr: o.D.Ptr(a.Cache) + uintptr(a.Rank*es), Elem: es,
		Dims:    []uint64{uint64(d.Rope), uint64(b.MaxSeq), uint64(rows)},
		Strides: []uint64{uint64(a.Cache.Pitch * es), uint64(b.MaxSeq * a.Cache.Pitch * es)},
		Box:     []uint32{hopperBox, uint32(c.Keys), 1}, Swizzle: hopperSwizzle})
	om, ostore, err := o.hopperOutMap(o.D.Ptr(a.Out), a.Out.Pitch, a.Heads*d.V, a.Out.Rows(), es)
	o.Need(err == nil, op, "out's tensor map: %v", err)
	o.LaunchGrid(c.kernel(), cuda.Dim3{X: uint32(blocks), Y: uint32(a.Heads), Z: uint32(r1 - r0)},
		cuda.Dim3{X: hopperThreads}, c.shared(),
		qm, kvm, pem, om, ostore, o.D.Ptr(a.Out), int32(a.Out.Pitch), o.D.Ptr(b.StartDev), o.D.Ptr(b.PastDev), int32(r0),
		scaleLog2(a.Scale), int32(kstride), o.D.Ptr(o.mlaHopper.status))
}

// mlaHopperWaits reports a wait of mla_hopper that timed out since the last
// call (synchronizing with the device), and clears the record.
func (o *ops) mlaHopperWaits() error {
	if o.mlaHopper == nil {
		return nil
	}
	return o.hopWaits("mla_hopper", o.mlaHopper.status)
}
