// Package fused is the optimized CUDA kernel set: flash attention on tensor
// cores for prefill, flash-decoding for decode, both also for DeepSeek-V2's
// latent attention (MLA, absorbed at decode), one-pass RMSNorm (with the
// residual add), RoPE and SwiGLU kernels (and MLA's norm and ropes as one), a weight-streaming linear for
// decode's few rows and a Hopper GEMM for prefill's many (cuBLAS for the
// rest, and for prefill until that GEMM reaches it), and DeepSeek-V2's MoE (a router
// kernel, and the experts as grouped GEMMs on tensor cores over tokens
// sorted by expert; at decode the router and the sort folded into the
// first GEMM), an argmax over many blocks a row, and an add that
// overlaps the kernel before it. The op it has no kernel of its own for
// (embedding) runs the registry's baseline CUDA set's (naive's), and the
// profile says so. The .cu sources are embedded and compiled by NVRTC
// (through cudaset) when the set is built for a device.
package fused

import (
	"embed"
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// sources are the set's kernels, one module per .cu file, and the headers
// they include.
//
//go:embed *.cu *.cuh
var sources embed.FS

// module is the set's module of file, which defines kernels funcs, with
// instances.cuh made from the Go tables (cudaset.InstancesModule): the
// kernels are compiled with the tilings the launchers size them by.
func module(file string, funcs []string) cudaset.Module {
	return cudaset.InstancesModule(file, sources, "instances.cuh", instancesRegen, instances(), funcs)
}

// owned are the ops fused has kernels of its own for.
var owned = []kernels.Op{
	kernels.OpRMSNorm, kernels.OpAddRMSNorm, kernels.OpAddAddRMSNorm, kernels.OpRoPE, kernels.OpSwiGLU, kernels.OpLinearSwiGLU, kernels.OpRMSNormRoPE, kernels.OpLinearAdd,
	kernels.OpAttnPrefill, kernels.OpAttnDecode, kernels.OpRoPEAttnDecode,
	kernels.OpMoERoute, kernels.OpMoEExperts, kernels.OpMoERouted, kernels.OpGroupGemm, kernels.OpLinear,
	kernels.OpMLAPrefill, kernels.OpMLADecode, kernels.OpMLADecodeRoPE, kernels.OpArgmax, kernels.OpAdd,
	kernels.OpNormLinear, kernels.OpNormSwiGLU, kernels.OpLinearNormLinear, kernels.OpLinearNormSwiGLU, kernels.OpAddAddNormLinear,
}

func init() {
	kernels.Register(kernels.SetInfo{Name: "fused", Device: "cuda", Own: owned, Rank: 2,
		Fuses: []kernels.Op{kernels.OpAddAddRMSNorm, kernels.OpLinearSwiGLU, kernels.OpRMSNormRoPE, kernels.OpMoERouted, kernels.OpLinearAdd, kernels.OpMLADecodeRoPE, kernels.OpRoPEAttnDecode,
			kernels.OpNormLinear, kernels.OpNormSwiGLU, kernels.OpLinearNormLinear, kernels.OpLinearNormSwiGLU, kernels.OpAddAddNormLinear},
		New: New, Variants: variants})
}

// Tile shapes of the kernels, named as in the .cu sources.
const (
	// keyTile is BN: the keys of one tile of flash_prefill and flash_decode.
	keyTile = 64
	// decodeWarps and decodeStages are flash_decode's DEC_WARPS (each takes
	// a slice of the output dims) and DEC_STAGES (tiles in flight).
	decodeWarps  = 4
	decodeStages = 3
	// mergeDims and mergeWarps are attn_merge's MERGE_DIMS (the dims of a
	// block) and MERGE_WARPS (each takes every MERGE_WARPS-th split).
	mergeDims  = 128
	mergeWarps = 8
	// maxGroup is the most query heads per kv head flash_decode takes: the
	// 16 rows of one mma m-tile.
	maxGroup = 16
	// maxNormThreads is the largest block of rms_norm.
	maxNormThreads = 1024
	// ropeVec is the pairs one thread of rope rotates when rows allow it.
	ropeVec = 4
)

// headDims are the head dims the attention kernels are instantiated for
// (multiples of the mma's k of 16, up to what registers hold).
var headDims = []int{16, 32, 64, 80, 96, 128}

// normItems are rms_norm's NV instances: vector accesses per thread.
var normItems = []int{1, 2, 4, 8}

// flashConfig is a tiling of flash_prefill: Warps warps of MTiles m-tiles of
// 16 query rows each.
type flashConfig struct{ Warps, MTiles int }

// rows is the queries of one block (BM).
func (c flashConfig) rows() int { return c.Warps * 16 * c.MTiles }

func (c flashConfig) String() string { return fmt.Sprintf("w%d_m%d", c.Warps, c.MTiles) }

// flashConfigs are the flash_prefill tilings compiled; prefillConfig is the
// one AttentionPrefill launches unless a tuning choice names another for
// the head dim (a variable, so that tests can run the others).
var (
	flashConfigs  = []flashConfig{{4, 1}, {8, 1}, {4, 2}, {8, 2}}
	prefillConfig = flashConfig{4, 2}
)

// flashConfigNamed is the tiling called name.
func flashConfigNamed(name string) (flashConfig, bool) {
	for _, c := range flashConfigs {
		if c.String() == name {
			return c, true
		}
	}
	return flashConfig{}, false
}

func prefillKernel(d int, c flashConfig) string { return fmt.Sprintf("flash_prefill_d%d_%s", d, c) }

// decodeVariant is flash_decode_keys's name as a variant of attn_decode, its
// only one (each warp scores its own keys, a shared max per tile, attn_merge
// a second launch when split).
const decodeVariant = "keys"

func decodeKernel(d int) string { return fmt.Sprintf("flash_decode_keys_d%d", d) }

// decodeRopeKernel is flash_decode_keys with the rotary embedding folded in
// (rope_attn_decode): the same kernel, shared memory and launch.
func decodeRopeKernel(d int) string { return fmt.Sprintf("flash_decode_rope_d%d", d) }

// rowBytes is a shared-memory tile row of head dim d: Tile<D>::ROW_BYTES.
func rowBytes(d int) int { return (d/8 + 7) / 8 * 8 * 16 }

// prefillShared and decodeShared are the kernels' dynamic shared memory.
func prefillShared(d int, c flashConfig) int { return (c.rows() + 4*keyTile) * rowBytes(d) }
func decodeShared(d int) int                 { return (16 + 2*decodeStages*keyTile) * rowBytes(d) }

// decodeSharedFor is flash_decode's shared memory for splits of chunk keys:
// the stages their tiles use (fewer than decodeStages where a split has
// fewer tiles), and at least what its epilogue's sums take (the queries,
// then each warp's sums and f32 outputs of 16 rows). A smaller block lets
// the kernel after it (linear_stream's, near a whole SM) start beside it.
func decodeSharedFor(d, chunk int) int {
	stages := min(decodeStages, max(1, (chunk+keyTile-1)/keyTile))
	epilogue := 16*rowBytes(d) + decodeWarps*16*4 + decodeWarps*16*d*4
	return max((16+2*stages*keyTile)*rowBytes(d), epilogue)
}

func modules() []cudaset.Module {
	return []cudaset.Module{
		elementwiseModule(),
		module("attention.cu", append(cudaset.Names(flashPrefillInstances(), flashDecodeInstances(), flashDecodeRopeInstances()), "attn_merge")),
		module("mla.cu", cudaset.Names(mlaPrefillInstances(), mlaDecodeInstances(), mlaAbsorbInstances())),
		mlaKeysModule(),
		moeModule(),
		module("linear.cu", linearKernels()),
	}
}

// elementwiseModule is elementwise.cu's module: the norms (add_add_rms_norm
// among them), ropes, swiglu, add and argmax.
func elementwiseModule() cudaset.Module {
	return module("elementwise.cu", cudaset.Names(rmsNormInstances(), addAddRMSNormInstances(), ropeInstances(), rmsNormRopeInstances(), swigluInstances(),
		addInstances(), argmaxInstances()))
}

var vname = cudaset.VName

// overlapKernels are the kernels launched to overlap the kernel before them
// (cudaset.Kit.Overlap): those of a decode step, each of which calls
// grid_wait before it touches another kernel's data. A decode step is a
// chain of short kernels; overlapped, each one's launch and prologue (the
// linears' first weights) run under the previous one's tail.
func overlapKernels() []string {
	ks := append([]string{"attn_merge"}, moeFuncs()...)
	ks = append(ks, mlaAbsorbKernels...)
	ks = append(ks, linearKernels()...)
	for _, m := range modules() {
		if m.File == "elementwise.cu" {
			ks = append(ks, m.Funcs...)
		}
	}
	for _, d := range headDims {
		ks = append(ks, decodeKernel(d), decodeRopeKernel(d))
	}
	for _, d := range mlaDecodeDims {
		ks = append(ks, mlaDecodeKernel(d))
		for _, s := range mlaKeysStageCounts {
			ks = append(ks, mlaKeysKernel(d, s))
		}
	}
	return ks
}

// New compiles the set's kernels for dev, which must be a *cuda.Device.
func New(dev kernels.Device) (kernels.Ops, error) {
	if err := checkGemmConfigs(); err != nil {
		return nil, fmt.Errorf("fused: %w", err)
	}
	kit, err := cudaset.New(dev, "fused", modules())
	if err != nil {
		return nil, err
	}
	o := &ops{Kit: kit, NotOwned: kernels.NotOwned{Set: "fused"}, choice: map[choiceKey]string{}}
	sizes := gemmShared() // the dynamic shared memory of every kernel that takes more than 48 KiB
	for _, d := range headDims {
		sizes[decodeKernel(d)] = decodeShared(d)
		sizes[decodeRopeKernel(d)] = decodeShared(d)
		for _, c := range flashConfigs {
			sizes[prefillKernel(d, c)] = prefillShared(d, c)
		}
	}
	for name, bytes := range sizes {
		if err := o.FitShared(name, bytes); err != nil {
			return nil, fmt.Errorf("fused: %s: %w", name, err)
		}
	}
	o.Overlap(overlapKernels()...)
	o.argmaxCounters = newCounters(o.Kit, argmaxMaxRows)
	o.decodeCounters = newCounters(o.Kit, decodeCountersN)
	if err := o.initMoE(); err != nil {
		return nil, err
	}
	if err := o.initLinear(); err != nil {
		return nil, err
	}
	if err := o.prepareMLA(); err != nil {
		return nil, err
	}
	o.hopper = newHopper(kit)       // never fails: an error stays in o.hopper.err
	o.mlaHopper = newMLAHopper(kit) // nor does this: o.mlaHopper.err
	o.gw = newGroupWgmma(kit)       // nor does group_wgmma's build
	o.lw = newLinearWgmma(kit)      // nor linear_wgmma's
	o.mlaFlat = newMLAFlat(kit)     // nor mla_decode's flat variant
	o.ls = newLinearStream(kit)     // nor linear_stream
	o.sw = newLinearSwap(kit)       // nor linear_swap
	o.ms = newMoESplit(kit)         // nor moe_routed_split
	o.dc = newDecodeCluster(kit)    // nor flash_decode_rope's cluster kernel
	return o, nil
}

// ops is the fused set on one device.
type ops struct {
	*cudaset.Kit
	kernels.NotOwned

	choice   map[choiceKey]string // tuning choices: the variant of table an op runs for a tuning key (UseVariant)
	lin      linearState
	moeFirst *kernels.Tensor // see moeFirstFor

	noRoom    map[string]string // MLA kernels the device's shared memory cannot hold, and why
	hopper    *hopperKit        // flash_hopper, or why it is absent (hopper.go)
	gw        *gwKit            // group_wgmma, or why it is absent (group_wgmma.go)
	lw        *lwKit            // linear_wgmma, or why it is absent (linear_wgmma.go)
	mlaHopper *mlaHopperKit     // mla_hopper, or why it is absent (mla_hopper.go)
	mlaFlat   *mlaFlatKit       // mla_decode's flat variant, or why it is absent (mla_flat.go)
	ls        *lsKit            // linear_stream, or why it is absent (linear_stream.go)
	sw        *swKit            // linear_swap, or why it is absent (linear_swap.go)
	ms        *msKit            // moe_routed_split, or why it is absent (moe_split.go)
	dc        *dcKit            // flash_decode_rope's cluster kernel, or why it is absent (attention_cluster.go)

	argmaxCounters *kernels.Tensor // i32: argmax_split's finished blocks per row, zero between launches
	decodeCounters *kernels.Tensor // i32 [decodeCountersN]: flash_decode's finished splits per (row, kv head), zero between launches
	moeCounters    *kernels.Tensor // i32 [foldCounters]: group_gemm_fold's finished blocks per n-tile, zero between launches
	dynCounters    *kernels.Tensor // i32 [dynCountersN]: the persistent grids' counter pairs (dynGateUpPair, dynDownPair, dynOnePair), zero between launches
	oneDone        *kernels.Tensor // i32 [oneDoneN]: moe_one's finished gate/up tiles per m-tile, zero between launches
	dynPerSM       map[string]int  // blocks of each group_gemm_dyn kernel an SM holds
	absorbRuns     int             // MLADecode's projections mla_absorb ran (tests)
}

// Modules are every NVRTC module of the set: the ones New cannot do without,
// then the Hopper ones it adds where the device allows; for compile checks
// apart from a device.
func Modules() []cudaset.Module { return append(modules(), hopperModules()...) }

// ModulesFor are the modules New compiles on a device whose NVRTC target
// is arch: the Hopper ones only for hopperArch (addHopperModule).
func ModulesFor(arch string) []cudaset.Module {
	if arch != hopperArch {
		return modules()
	}
	return Modules()
}

// hopperModules are the modules New adds only where the target is hopperArch.
func hopperModules() []cudaset.Module {
	return []cudaset.Module{hopperModule(), mlaHopperModule(), gwModule(), lwModule(), mlaFlatModule(), lsModule(), swModule(), msModule(), decodeClusterModule()}
}
