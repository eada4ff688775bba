package fused

import (
	"fmt"
	"strings"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The fused set's kernel instances, one table per macro of its sources:
// instances.cuh lists them for the .cu files, and the modules' Funcs and
// the launchers take their names (and, for tilings, their shapes and shared
// memory) from the same tables. The modules compile the header made from
// the tables (cudaset.InstancesModule), not the checked-in file, so that an
// edited table can never launch kernels of the old one; TestInstancesHeader
// keeps the file current, for reading and for compiling a .cu by itself.

// instancesRegen is how instances.cuh is written again after a table
// changes.
const instancesRegen = "go test ./kernels/fused -run TestInstancesHeader -update"

// instances are every table, in the order of instances.cuh.
func instances() []cudaset.Instances {
	return []cudaset.Instances{
		rmsNormInstances(), addAddRMSNormInstances(), ropeInstances(), rmsNormRopeInstances(), swigluInstances(), addInstances(), argmaxInstances(),
		flashPrefillInstances(), flashDecodeInstances(), flashDecodeRopeInstances(), flashDecodeRopeClusterInstances(),
		mlaPrefillInstances(), mlaDecodeInstances(), mlaAbsorbInstances(), mlaKeysInstances(), mlaFlatInstances(), mlaQLatRopeInstances(),
		groupGemmInstances(), groupGemmDynInstances(), moeFoldInstances(), moeFoldDynInstances(), moeOneInstances(), linearInstances(),
		hopperInstances(), mlaHopperInstances(), gwInstances(), lwInstances(), lsInstances(),
		lsSwiGLUInstances(), lsAddInstances(), lsNormInstances(), lsNormSwiGLUInstances(), swInstances(), swNormInstances(), swClusterInstances(),
	}
}

// normKernel is kernel's (rms_norm, add_rms_norm or add_add_rms_norm)
// instance for weights of w, vec-wide accesses and items of them per
// thread.
func normKernel(kernel string, w kernels.DType, vec, items int) string {
	return fmt.Sprintf("%s_%s_v%d_n%d", kernel, w, vec, items)
}

func rmsNormInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "RMS_NORM"}
	for _, v := range []int{1, cudaset.VecWidth} {
		for _, w := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			for _, n := range normItems {
				f.Kernels = append(f.Kernels, cudaset.Of(normKernel("rms_norm", w, v, n), false, cudaset.CType(w), v, n),
					cudaset.Of(normKernel("add_rms_norm", w, v, n), true, cudaset.CType(w), v, n))
			}
		}
	}
	return f
}

// addAddRMSNormInstances are add_add_rms_norm's: rms_norm's shapes and
// weight types, with the residual add of a second addend.
func addAddRMSNormInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ADD_ADD_RMS_NORM"}
	for _, v := range []int{1, cudaset.VecWidth} {
		for _, w := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			for _, n := range normItems {
				f.Kernels = append(f.Kernels, cudaset.Of(normKernel("add_add_rms_norm", w, v, n), false, cudaset.CType(w), v, n))
			}
		}
	}
	for _, n := range normItems {
		f.Kernels = append(f.Kernels, cudaset.Of(normKernel("add_add_rms_norm_rf", kernels.BF16, cudaset.VecWidth, n), true, cudaset.CType(kernels.BF16), cudaset.VecWidth, n))
	}
	return f
}

func ropeInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ROPE"}
	for _, v := range []int{1, ropeVec} {
		f.Kernels = append(f.Kernels, cudaset.Of(vname("rope_half", v), false, v), cudaset.Of(vname("rope_interleaved", v), true, v))
	}
	return f
}

// rmsNormRopeShape is the one rms_norm shape rms_norm_rope is instantiated
// for: a row in one 16-byte access a thread (a latent of up to
// maxNormThreads·VecWidth, DeepSeek's 512 among them).
var rmsNormRopeShape = normShape{vec: cudaset.VecWidth, items: 1}

// rmsNormRopeKernel is rms_norm_rope's instance for pairs interleaved or
// not and norm weights of w.
func rmsNormRopeKernel(interleaved bool, w kernels.DType) string {
	pairs := "half"
	if interleaved {
		pairs = "interleaved"
	}
	return fmt.Sprintf("rms_norm_rope_%s_%s", pairs, w)
}

func rmsNormRopeInstances() cudaset.Instances {
	return normRopeInstances("RMS_NORM_ROPE", rmsNormRopeKernel)
}

// mlaQLatRopeKernel is mla_qlat_rope's instance (mla_flat.cu): rms_norm_rope's
// and mla_qlat's blocks in one grid, for pairs interleaved or not and norm
// weights of w.
func mlaQLatRopeKernel(interleaved bool, w kernels.DType) string {
	return "mla_qlat_rope" + strings.TrimPrefix(rmsNormRopeKernel(interleaved, w), "rms_norm_rope")
}

func mlaQLatRopeInstances() cudaset.Instances {
	return normRopeInstances("MLA_QLAT_ROPE", mlaQLatRopeKernel)
}

// normRopeInstances are a macro's instances of rms_norm_rope's device
// function: pairs interleaved or not, each weight dtype, rmsNormRopeShape.
func normRopeInstances(macro string, name func(bool, kernels.DType) string) cudaset.Instances {
	f := cudaset.Instances{Macro: macro}
	for _, il := range []bool{false, true} {
		for _, w := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			f.Kernels = append(f.Kernels, cudaset.Of(name(il, w), il, cudaset.CType(w),
				rmsNormRopeShape.vec, rmsNormRopeShape.items, ropeVec))
		}
	}
	return f
}

func swigluInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "SWIGLU"}
	for _, v := range []int{1, cudaset.VecWidth} {
		f.Kernels = append(f.Kernels, cudaset.Of(vname("swiglu", v), v))
	}
	return f
}

func addInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ADD"}
	for _, v := range []int{1, cudaset.VecWidth} {
		f.Kernels = append(f.Kernels, cudaset.Of(vname("add", v), v))
	}
	return f
}

// argmaxKernel is argmax_split's instance for logits of dt.
func argmaxKernel(dt kernels.DType) string { return "argmax_split_" + dt.String() }

func argmaxInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "ARGMAX_SPLIT"}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		f.Kernels = append(f.Kernels, cudaset.Of(argmaxKernel(dt), cudaset.CType(dt)))
	}
	return f
}

func flashPrefillInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "FLASH_PREFILL"}
	for _, d := range headDims {
		for _, c := range flashConfigs {
			f.Kernels = append(f.Kernels, cudaset.Of(prefillKernel(d, c), d, c.Warps, c.MTiles))
		}
	}
	return f
}

func flashDecodeInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "FLASH_DECODE_KEYS"}
	for _, d := range headDims {
		f.Kernels = append(f.Kernels, cudaset.Of(decodeKernel(d), d))
	}
	return f
}

func flashDecodeRopeInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "FLASH_DECODE_ROPE"}
	for _, d := range headDims {
		f.Kernels = append(f.Kernels, cudaset.Of(decodeRopeKernel(d), d))
	}
	return f
}

func flashDecodeRopeClusterInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "FLASH_DECODE_ROPE_CLUSTER"}
	for cl := 2; cl <= decodeMaxCluster; cl++ {
		for _, d := range headDims {
			f.Kernels = append(f.Kernels, cudaset.Of(decodeClusterKernel(cl, d), cl, d))
		}
	}
	return f
}

func mlaPrefillInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "MLA_PREFILL"}
	for _, d := range mlaPrefillDims {
		for _, c := range flashConfigs {
			f.Kernels = append(f.Kernels, cudaset.Of(mlaPrefillKernel(d, c), d.Nope, d.Rope, d.V, c.Warps, c.MTiles))
		}
	}
	return f
}

func mlaDecodeInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "MLA_DECODE"}
	for _, d := range mlaDecodeDims {
		f.Kernels = append(f.Kernels, cudaset.Of(mlaDecodeKernel(d), d.Rank, d.Rope))
	}
	return f
}

// mlaAbsorbInstances are mla_absorb's (mla.cu): mlaAbsorbConfigs, transB
// as 1 or 0.
func mlaAbsorbInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "MLA_ABSORB"}
	for _, c := range mlaAbsorbConfigs {
		bt := 0
		if c.transB {
			bt = 1
		}
		f.Kernels = append(f.Kernels, cudaset.Of(c.name, bt, c.cols, c.ksplit))
	}
	return f
}

func mlaKeysInstances() cudaset.Instances {
	return mlaStagedInstances("MLA_DECODE_KEYS", mlaKeysKernel)
}
func mlaFlatInstances() cudaset.Instances { return mlaStagedInstances("MLA_FLAT", mlaFlatKernel) }

// mlaStagedInstances are a macro's instances of the MLA tile loop both
// mla_decode_keys and mla_flat run (MlaKeyTiles): every latent dims of
// mlaDecodeDims with every stage count of mlaKeysStageCounts.
func mlaStagedInstances(macro string, name func(mlaLatent, int) string) cudaset.Instances {
	f := cudaset.Instances{Macro: macro}
	for _, d := range mlaDecodeDims {
		for _, s := range mlaKeysStageCounts {
			f.Kernels = append(f.Kernels, cudaset.Of(name(d, s), d.Rank, d.Rope, s))
		}
	}
	return f
}

func groupGemmInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "GROUP_GEMM"}
	for _, c := range gemmConfigs {
		f.Kernels = append(f.Kernels, cudaset.Instance{Names: []string{c.gemmKernel(), c.gateUpKernel()},
			Args: []any{c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages}})
	}
	return f
}

// groupGemmDynInstances are the grouped GEMM's persistent-grid kernels
// (moe.cu's GROUP_GEMM_DYN), at the tiling they run in (dynTiling).
func groupGemmDynInstances() cudaset.Instances {
	c := dynConfig()
	return cudaset.Instances{Macro: "GROUP_GEMM_DYN", Kernels: []cudaset.Instance{{Names: []string{c.dynGemmKernel(), c.dynGateUpKernel()},
		Args: []any{c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages}}}}
}

// moeFoldInstances are the folded decode path's kernels (moe.cu's
// MOE_FOLD), at the tiling it runs in (foldTiling): gate/up, down, and
// moe_routed's gate/up that routes too.
func moeFoldInstances() cudaset.Instances {
	c := foldConfig()
	return cudaset.Instances{Macro: "MOE_FOLD", Kernels: []cudaset.Instance{{Names: []string{c.foldGateUpKernel(), c.foldGemmKernel(), c.routeGateUpKernel()},
		Args: []any{c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages}}}}
}

// moeFoldDynInstances are the folded decode path's kernels on the
// persistent grid (moe.cu's MOE_FOLD_DYN), at the persistent grid's tiling
// (dynConfig): gate/up, down, and moe_routed's gate/up that routes too.
func moeFoldDynInstances() cudaset.Instances {
	c := dynConfig()
	return cudaset.Instances{Macro: "MOE_FOLD_DYN", Kernels: []cudaset.Instance{{Names: []string{c.foldDynGateUpKernel(), c.foldDynGemmKernel(), c.routeDynGateUpKernel()},
		Args: []any{c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages}}}}
}

// moeOneInstances is the folded path in one launch on the persistent grid
// (moe.cu's MOE_ONE), at the persistent grid's tiling (dynConfig).
func moeOneInstances() cudaset.Instances {
	c := dynConfig()
	return cudaset.Instances{Macro: "MOE_ONE", Kernels: []cudaset.Instance{{Names: []string{c.oneKernel()},
		Args: []any{c.BM, c.BN, c.WarpsM, c.WarpsN, c.BK, c.Stages}}}}
}

func linearInstances() cudaset.Instances { return decodeLinearInstances("LINEAR_SKINNY", linearKernel) }

// decodeLinearInstances are a decode linear's (linear_skinny's,
// linear_stream's) instances, kernel(nt, out) for n-tiles of 8 rows up to
// linMaxRows and bf16 or f32 out (decodeLinearOut).
func decodeLinearInstances(macro string, kernel func(nt int, out kernels.DType) string) cudaset.Instances {
	f := cudaset.Instances{Macro: macro}
	for _, out := range []kernels.DType{kernels.BF16, kernels.F32} {
		for nt := 1; nt <= linMaxRows/8; nt++ {
			f.Kernels = append(f.Kernels, cudaset.Of(kernel(nt, out), nt, cudaset.CType(out)))
		}
	}
	return f
}

func hopperInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "FLASH_HOPPER"}
	for _, c := range hopperConfigs {
		f.Kernels = append(f.Kernels, cudaset.Of(c.kernel(), cudaset.CType(c.DT), c.D, c.KStages, c.VStages, c.QBufs))
	}
	return f
}

func mlaHopperInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "MLA_HOPPER"}
	for _, c := range mlaHopperConfigs {
		f.Kernels = append(f.Kernels, cudaset.Of(c.kernel(), c.Heads.Nope, c.Heads.Rope, c.Heads.V, c.Keys, c.Stages))
	}
	return f
}

func gwInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "GROUP_WGMMA"}
	for _, c := range gwConfigs {
		p, pt, g, x := c.kernels()
		f.Kernels = append(f.Kernels, cudaset.Instance{Names: []string{p, pt, g, x}, Args: []any{c.BN, c.Stages}})
	}
	return f
}

func lsInstances() cudaset.Instances {
	return decodeLinearInstances("LINEAR_STREAM", linearStreamKernel)
}

// lsSwiGLUInstances are linear_stream's with SwiGLU in the epilogue
// (linear_swiglu's), lsAddInstances those with the residual add
// (linear_add's): bf16 out, n-tiles of 8 rows up to linMaxRows.
func lsSwiGLUInstances() cudaset.Instances {
	return lsEpilogueInstances("LINEAR_STREAM_SWIGLU", linearStreamSwiGLUKernel)
}
func lsAddInstances() cudaset.Instances {
	return lsEpilogueInstances("LINEAR_STREAM_ADD", linearStreamAddKernel)
}

// lsNormInstances and lsNormSwiGLUInstances are linear_stream's that
// normalise x as they load it (add_rms_norm_linear's and
// add_rms_norm_linear_swiglu's): bf16 out, n-tiles of 8 rows up to
// linMaxRows.
func lsNormInstances() cudaset.Instances {
	return lsEpilogueInstances("LINEAR_STREAM_NORM", linearStreamNormKernel)
}
func lsNormSwiGLUInstances() cudaset.Instances {
	return lsEpilogueInstances("LINEAR_STREAM_NORM_SWIGLU", linearStreamNormSwiGLUKernel)
}

func lsEpilogueInstances(macro string, kernel func(nt int) string) cudaset.Instances {
	f := cudaset.Instances{Macro: macro}
	for nt := 1; nt <= linMaxRows/8; nt++ {
		f.Kernels = append(f.Kernels, cudaset.Of(kernel(nt), nt))
	}
	return f
}

func lwInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "LINEAR_WGMMA"}
	for _, c := range lwConfigs {
		f.Kernels = append(f.Kernels, cudaset.Instance{Names: []string{c.kernel(), c.swigluKernel()}, Args: []any{c.BN, c.Stages, c.Cluster, c.hold()}})
	}
	return f
}

// swNormInstances are the norm's halves of linear_swap (SW_ADDNORM,
// SW_RSTD plain and with SwiGLU) per instance of swNormConfigs.
func swNormInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "LINEAR_SWAP_NORM"}
	for _, c := range swNormConfigs {
		f.Kernels = append(f.Kernels, cudaset.Instance{Names: c.normKernels(), Args: []any{c.Rows, c.Stages}})
	}
	return f
}

// swClusterInstances are the norm's halves of linear_swap with a split
// tile's sums in its cluster (SW_ADDNORM and SW_RSTD plain) per instance of
// swNormConfigs and cluster of swClusters.
func swClusterInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "LINEAR_SWAP_CLUSTER"}
	for _, c := range swNormConfigs {
		for _, cl := range swClusters {
			f.Kernels = append(f.Kernels, cudaset.Instance{Names: c.clusterKernels(cl), Args: []any{c.Rows, c.Stages, cl}})
		}
	}
	return f
}

// swInstances are linear_swap's: per instance of swConfigs, the plain
// kernel with bf16 and with f32 out and the one with SwiGLU in the epilogue.
func swInstances() cudaset.Instances {
	f := cudaset.Instances{Macro: "LINEAR_SWAP"}
	for _, c := range swConfigs {
		f.Kernels = append(f.Kernels, cudaset.Instance{Names: c.kernels(), Args: []any{c.Rows, c.Stages}})
	}
	return f
}
