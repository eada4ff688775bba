// Package naive is the baseline CUDA kernel set: every op the way PyTorch
// eager runs it, one plain kernel or cuBLAS call per torch op, attention with
// its scores materialized. The .cu sources are embedded and compiled by NVRTC
// (through cudaset) when the set is built for a device.
package naive

import (
	"embed"
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// sources are the set's kernels, one module per .cu file, and the header
// listing their instances.
//
//go:embed *.cu *.cuh
var sources embed.FS

// Launch shapes.
const (
	// argmaxThreads is the block of the per-row argmax over a vocabulary.
	argmaxThreads = 1024
	// routeThreads is moe_route's block: one thread per expert, so the most
	// experts a router may have.
	routeThreads = 256
	// maxTopK is the most experts a token may choose.
	maxTopK = 16
	// expertRows is the rows of one expert moe_expert_gemm multiplies per
	// pass over its weights (registers per thread), expertCols the output
	// columns of each warp of its expertWarps.
	expertRows  = 16
	expertCols  = 4
	expertWarps = 8
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
	// anything on the host (moe_expert_gemm), so that decode steps of up to
	// this many rows can be captured in a CUDA graph. Larger calls (prefill)
	// read the per-expert offsets back once, as HF's expert loop does, and
	// run cuBLAS GEMMs.
	moeGraphTokens = 64
)

// Scratch buffers (cudaset.Kit.Scratch), by what they hold.
const (
	scrRstd      = "rms.rstd"       // RMSNorm: rstd f32 [N]
	scrGateUp    = "mlp.gate_up"    // LinearSwiGLU: gate and up projections bf16 [N, 2I]
	scrLinear    = "linear_add.lin" // LinearAdd: the projection bf16 [N, M]
	scrScores    = "attn.scores"    // attention: scores f32 [heads*queries, keys]
	scrProbs     = "attn.probs"     // attention: probabilities bf16 (f16 for f16 operands) [heads*queries, keys]
	scrAttnAcc   = "attn.acc"       // attention: P·V of the softmax numerators f32 [queries, heads*dim]
	scrAttnSum   = "attn.sums"      // attention: the numerators' sums f32 [heads*queries]
	scrMaskedKV  = "attn.masked_kv" // decode: the cache with unused positions zeroed
	scrLatentKV  = "mla.kv"         // MLA: decompressed keys and values bf16 [positions, Heads*(NopeDim+VDim)]
	scrLatentF32 = "mla.kv_f32"     // MLA, math-backend dims: the decompressed keys and values as f32
	scrMoESlot   = "moe.slots"      // MoE: sorted row of every choice i32 [N*K]
	scrMoEX      = "moe.x"          // MoE: gathered tokens, then expert outputs bf16 [N*K, H]
	scrMoEH      = "moe.gate_up"    // MoE: gate and up projections bf16 [N*K, 2I]
	scrMoEAct    = "moe.act"        // MoE: SwiGLU activations bf16 [N*K, I]
)

func init() {
	kernels.Register(kernels.SetInfo{Name: "naive", Device: "cuda", Rank: 1, New: New})
}

// modules are the set's NVRTC modules, each with instances.cuh made from
// the Go tables (cudaset.InstancesModule).
func modules() []cudaset.Module {
	module := func(file string, funcs []string) cudaset.Module {
		return cudaset.InstancesModule(file, sources, "instances.cuh", instancesRegen, instances(), funcs)
	}
	moe := module("moe.cu", append(cudaset.Names(expertGemmInstances()), "moe_route", "iota_i32", "moe_count", "moe_offsets",
		"moe_assign"))
	moe.Opts = []string{fmt.Sprintf("-DROUTE_THREADS=%d", routeThreads), fmt.Sprintf("-DMAX_TOPK=%d", maxTopK),
		fmt.Sprintf("-DEXPERT_ROWS=%d", expertRows), fmt.Sprintf("-DEXPERT_COLS=%d", expertCols)}
	return []cudaset.Module{
		module("elementwise.cu", append(cudaset.Names(binaryInstances(), siluInstances(), rmsRstdInstances(), rmsScaleInstances(),
			ropeInstances(), argmaxInstances()), "decode_advance")),
		module("attention.cu", cudaset.Names(kvMaskedCopyInstances(), softmaxInstances(), normalizeInstances())),
		moe,
	}
}

var vname = cudaset.VName

// New compiles the set's kernels for dev, which must be a *cuda.Device.
func New(dev kernels.Device) (kernels.Ops, error) {
	kit, err := cudaset.New(dev, "naive", modules())
	if err != nil {
		return nil, err
	}
	o := &ops{Kit: kit, maxShared: kit.MaxShared}
	// The dynamic shared memory softmax_mask_smem may have: what a block may
	// opt in to, less the kernel's own static shared memory.
	for _, dt := range floats {
		name := softmaxKernel(true, dt)
		sm := o.Func(name)
		attrs, err := sm.Attrs()
		if err == nil {
			o.maxShared = min(o.maxShared, kit.MaxShared-attrs.StaticShared)
			err = sm.SetMaxDynamicShared(kit.MaxShared - attrs.StaticShared)
		}
		if err != nil {
			return nil, fmt.Errorf("naive: %s: %w", name, err)
		}
	}
	return o, nil
}

// ops is the naive set on one device.
type ops struct {
	*cudaset.Kit
	maxShared int // bytes of dynamic shared memory softmax_mask_smem may have

	// moeMeta holds MoE's per-expert counts, offsets and cursors (see
	// MoEExperts); allocated at the first call, grown with the expert count.
	moeMeta *kernels.Tensor
}

// chunkRows is how many of n queries one step of materialized attention
// takes so that heads×queries×keys scores (f32) and probabilities (bf16) fit
// in chunkBudget, and at most queryChunk; at least 1.
func chunkRows(heads, keys, n int) int {
	per := int64(heads) * int64(keys) * int64(kernels.F32.Size()+kernels.BF16.Size())
	return int(max(1, min(int64(n), int64(queryChunk), chunkBudget/per)))
}

// Modules are the set's NVRTC modules, for compile checks apart from a
// device.
func Modules() []cudaset.Module { return modules() }
