package naive

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The naive set's kernel instances, one table per macro of its sources:
// instances.cuh lists them for the .cu files, and the modules' Funcs and
// the launchers take their names (and, for tilings, their shapes and shared
// memory) from the same tables. The modules compile the header made from
// the tables (cudaset.InstancesModule), not the checked-in file, so that an
// edited table can never launch kernels of the old one; TestInstancesHeader
// keeps the file current, for reading and for compiling a .cu by itself.

// instancesRegen is how instances.cuh is written again after a table
// changes.
const instancesRegen = "go test ./kernels/naive -run TestInstancesHeader -update"

// instances are every table, in the order of instances.cuh.
func instances() []cudaset.Instances {
	return []cudaset.Instances{
		binaryInstances(), siluInstances(), rmsRstdInstances(), rmsScaleInstances(), ropeInstances(), argmaxInstances(),
		kvMaskedCopyInstances(), softmaxInstances(), normalizeInstances(),
		expertGemmInstances(),
	}
}

var (
	vecs   = []int{1, cudaset.VecWidth}
	floats = []kernels.DType{kernels.BF16, kernels.F16, kernels.F32}
)

// vecInstances are kernel's instances for each access width, named by
// vname, with args after the width.
func vecInstances(macro, kernel string, args ...any) cudaset.Instances {
	f := cudaset.Instances{Macro: macro}
	for _, v := range vecs {
		f.Kernels = append(f.Kernels, cudaset.Of(vname(kernel, v), append(append([]any(nil), args...), v)...))
	}
	return f
}

func binaryInstances() cudaset.Instances {
	add, mul := vecInstances("BINARY", "add", "AddOp"), vecInstances("BINARY", "mul", "MulOp")
	return cudaset.Instances{Macro: "BINARY", Kernels: append(add.Kernels, mul.Kernels...)}
}

func siluInstances() cudaset.Instances    { return vecInstances("SILU", "silu") }
func rmsRstdInstances() cudaset.Instances { return vecInstances("RMS_RSTD", "rms_rstd") }

// rmsScaleKernel is rms_scale's instance for weights of w and vec-wide
// accesses.
func rmsScaleKernel(w kernels.DType, vec int) string { return fmt.Sprintf("rms_scale_%s_v%d", w, vec) }

func rmsScaleInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "RMS_SCALE"}
	for _, v := range vecs {
		for _, w := range floats {
			f.Kernels = append(f.Kernels, cudaset.Of(rmsScaleKernel(w, v), cudaset.CType(w), v))
		}
	}
	return f
}

func ropeInstances() cudaset.Instances {
	return cudaset.Instances{Macro: "ROPE", Kernels: []cudaset.Instance{
		cudaset.Of("rope_half", false), cudaset.Of("rope_interleaved", true)}}
}

// argmaxKernel is argmax's instance for logits of dt.
func argmaxKernel(dt kernels.DType) string { return "argmax_" + dt.String() }

func argmaxInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ARGMAX"}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		f.Kernels = append(f.Kernels, cudaset.Of(argmaxKernel(dt), cudaset.CType(dt)))
	}
	return f
}

func kvMaskedCopyInstances() cudaset.Instances {
	return vecInstances("KV_MASKED_COPY", "kv_masked_copy")
}

// softmaxKernel is softmax_mask's instance for probabilities of p, the row
// in shared memory (smem) or read from global memory again.
func softmaxKernel(smem bool, p kernels.DType) string {
	if smem {
		return "softmax_mask_smem_" + p.String()
	}
	return "softmax_mask_global_" + p.String()
}

// softmaxInstances: the f16 ones are an f16 prefill's, as SDPA's fused
// kernels round p to f16.
func softmaxInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "SOFTMAX_MASK"}
	for _, p := range floats {
		for _, smem := range []bool{false, true} {
			f.Kernels = append(f.Kernels, cudaset.Of(softmaxKernel(smem, p), smem, cudaset.CType(p)))
		}
	}
	return f
}

// normalizeKernel is attn_normalize's instance for outputs of dt.
func normalizeKernel(dt kernels.DType) string { return "attn_normalize_" + dt.String() }

func normalizeInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ATTN_NORMALIZE"}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		f.Kernels = append(f.Kernels, cudaset.Of(normalizeKernel(dt), cudaset.CType(dt)))
	}
	return f
}

func expertGemmInstances() cudaset.Instances {
	return vecInstances("MOE_EXPERT_GEMM", "moe_expert_gemm")
}
