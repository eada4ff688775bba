package fused

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// variants lists fused's kernels for an op, shape and target, valid or not
// (kernels.SetInfo.Variants): flash_prefill's tilings, flash_decode,
// linear_skinny and cuBLAS for linear, mla_prefill's tilings, mla_decode,
// and the single elementwise and MoE kernels (the grouped GEMM's tiling
// follows the rows per group; the params say which the shape gets).
func variants(op kernels.Op, s kernels.Shape, t kernels.Target) []kernels.Variant {
	var why []string
	if !archAtLeast(t.Arch, 80) {
		why = append(why, fmt.Sprintf("mma.sync on bf16 needs sm_80 or later, the target is %s", t.Arch))
	}
	d := s["D"]
	headDim := func() {
		if !slices.Contains(headDims, d) {
			why = append(why, fmt.Sprintf("head dim %d: the kernels are instantiated for %v", d, headDims))
		}
	}
	fits := func(shared int) string {
		if shared > t.SharedPerBlock {
			return fmt.Sprintf("needs %d bytes of shared memory, a block gets %d on %s", shared, t.SharedPerBlock, t.Arch)
		}
		return ""
	}
	join := func(extra ...string) string {
		all := append(slices.Clone(why), extra...)
		all = slices.DeleteFunc(all, func(s string) bool { return s == "" })
		return strings.Join(all, "; ")
	}
	switch op {
	case kernels.OpAttnPrefill:
		headDim()
		dt := s.DType(actType)
		var onlyBF16 string
		if dt != actType {
			onlyBF16 = fmt.Sprintf("%v operands: flash_prefill's mma.sync tiles take bf16 only (flash_hopper, on %s, takes %v)",
				dt, hopperArch, hopperDTypes)
		}
		var vs []kernels.Variant
		for _, c := range flashConfigs {
			shared := prefillShared(d, c)
			vs = append(vs, kernels.Variant{Name: c.String(),
				Params: fmt.Sprintf("warps=%d m_tiles=%d rows=%d key_tile=%d stages=2 shared=%d", c.Warps, c.MTiles, c.rows(), keyTile, shared),
				Why:    join(onlyBF16, fits(shared))})
		}
		if v, ok := hopperVariantOf(dt, d, t); ok {
			vs = append(vs, v)
		}
		return vs
	case kernels.OpAttnDecode:
		headDim()
		if kvh := s["KVH"]; kvh > 0 && s["H"]/kvh > maxGroup {
			why = append(why, fmt.Sprintf("%d query heads per kv head, at most %d", s["H"]/kvh, maxGroup))
		}
		shared := decodeShared(d)
		return []kernels.Variant{{Name: decodeVariant,
			Params: fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d splits=one wave; warps split the keys, attn_merge merges",
				decodeWarps, keyTile, decodeStages, shared),
			Why: join(fits(shared))}}
	case kernels.OpMLAPrefill:
		d := mlaHeads{s["Dn"], s["Dr"], s["Dv"]}
		if !slices.Contains(mlaPrefillDims, d) {
			why = append(why, fmt.Sprintf("heads of nope %d, rope %d, v %d: the kernels are instantiated for %v", d.Nope, d.Rope, d.V, mlaPrefillDims))
		}
		var vs []kernels.Variant
		for _, c := range flashConfigs {
			shared := mlaPrefillShared(d, c)
			vs = append(vs, kernels.Variant{Name: c.String(),
				Params: fmt.Sprintf("warps=%d m_tiles=%d rows=%d key_tile=%d stages=2 shared=%d; kv_b_proj up front (cuBLAS)",
					c.Warps, c.MTiles, c.rows(), keyTile, shared),
				Why: join(fits(shared))})
		}
		if v, ok := mlaHopperVariantOf(d, t); ok {
			vs = append(vs, v)
		}
		return vs
	case kernels.OpMLADecode:
		d := mlaLatent{s["R"], s["Dr"]}
		if !slices.Contains(mlaDecodeDims, d) {
			why = append(why, fmt.Sprintf("latents of rank %d, rope %d: the kernel is instantiated for %v", d.Rank, d.Rope, mlaDecodeDims))
		}
		if s["H"] > maxMLAHeads {
			why = append(why, fmt.Sprintf("%d heads, at most %d", s["H"], maxMLAHeads))
		}
		shared := mlaDecodeShared(d)
		stages := mlaKeysStages(d, t.SharedPerSM)
		keysShared := mlaKeysShared(d, stages)
		return []kernels.Variant{{Name: mlaDecodeVariant,
			Params: fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d splits=one wave; absorbed: W_UK and W_UV by cuBLAS, warps split q·k by dims and p·c by output dims, attn_merge merges",
				decodeWarps, keyTile, mlaStages, shared),
			Why: join(fits(shared))},
			{Name: mlaKeysVariant,
				Params: fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d blocks_per_sm=%d splits=one wave; absorbed: W_UK and W_UV by cuBLAS, warps score their own keys, one max per tile, p·c by output dims, attn_merge merges",
					decodeWarps, mlkTile, stages, keysShared, blocksPerSM(keysShared, t.SharedPerSM)),
				Why: join(fits(keysShared))}}
	case kernels.OpRMSNorm, kernels.OpAddRMSNorm:
		return []kernels.Variant{{Name: "row_per_block", Params: fmt.Sprintf("vector=16B rows_in_registers threads<=%d", maxNormThreads),
			Why: join()}}
	case kernels.OpRoPE:
		return []kernels.Variant{{Name: "token_per_block", Params: fmt.Sprintf("pairs_per_thread=%d", ropeVec), Why: join()}}
	case kernels.OpSwiGLU:
		return []kernels.Variant{{Name: "one_pass", Params: "vector=16B grid_stride", Why: join()}}
	case kernels.OpMoERoute:
		return []kernels.Variant{{Name: "warp_per_token",
			Params: fmt.Sprintf("experts<=%d groups<=32 topk<=32", 32*routePerLane), Why: join()}}
	case kernels.OpGroupGemm, kernels.OpMoEExperts:
		c := configFor(s["M"], s["E"])
		if op == kernels.OpMoEExperts {
			c = configFor(s["N"]*s["topk"], s["E"])
		}
		vs := []kernels.Variant{{Name: "grouped_mma", Params: c.params() + " (" + c.regime + ")", Why: join(fits(c.shared()))}}
		if op == kernels.OpMoEExperts && c.Name == prefillTiling {
			vs = []kernels.Variant{{Name: "cublas_per_expert",
				Params: "moe_align, cuBLAS per expert for gate/up and down, swiglu, moe_combine (reads the offsets: a sync)", Why: join()}}
		}
		if v, ok := wgmmaVariantOf(t, op == kernels.OpMoEExperts && wgmmaGather); ok && c.Name == prefillTiling {
			vs = append(vs, v)
		}
		return vs
	case kernels.OpLinear:
		return linearVariantsOf(s, t, slices.Clone(why))
	}
	return nil
}

// archAtLeast reports whether NVRTC's target arch ("sm_90a", "compute_90")
// is compute capability cc (as 10·major + minor) or later.
func archAtLeast(arch string, cc int) bool {
	var n int
	digits := strings.TrimRight(strings.TrimPrefix(strings.TrimPrefix(arch, "sm_"), "compute_"), "af")
	if _, err := fmt.Sscanf(digits, "%d", &n); err != nil {
		return false
	}
	return n >= cc
}

// TuningKey is the key of op's problems of shape s: attention's variants
// are chosen per head dim (and attn_prefill's per element type, prefillKey),
// linear's per shape (M, N, K), mla_prefill's per head dims, the grouped
// GEMM's (group_gemm, moe_experts) per tiling, mla_decode's by batch
// (mlaDecodeKey); the other kernels have one variant.
func (o *ops) TuningKey(op kernels.Op, s kernels.Shape) string {
	switch op {
	case kernels.OpAttnPrefill:
		return prefillKey(s["D"], s.DType(actType))
	case kernels.OpLinear:
		return linearKey{s["M"], s["N"], s["K"]}.String()
	case kernels.OpMLAPrefill:
		return fmt.Sprintf("Dn=%d,Dr=%d,Dv=%d", s["Dn"], s["Dr"], s["Dv"])
	case kernels.OpGroupGemm:
		return wgmmaKey(configFor(s["M"], s["E"]))
	case kernels.OpMoEExperts:
		return wgmmaKey(configFor(s["N"]*s["topk"], s["E"]))
	case kernels.OpMLADecode:
		return mlaDecodeKey(s["B"])
	}
	return ""
}

// UseVariant chooses attention's variants for a head dim, linear's for a
// shape, mla_prefill's tiling for head dims and mla_decode's variant (for
// a side of mlaKeysMinRows rows, or for every batch with key ""); the other
// ops take their single variant's name.
func (o *ops) UseVariant(op kernels.Op, key, name string) error {
	if op == kernels.OpLinear {
		return o.useLinear(key, name)
	}
	if op == kernels.OpGroupGemm || op == kernels.OpMoEExperts {
		return o.useGemmVariant(op, key, name)
	}
	if op == kernels.OpMLAPrefill {
		var d mlaHeads
		if _, err := fmt.Sscanf(key, "Dn=%d,Dr=%d,Dv=%d", &d.Nope, &d.Rope, &d.V); err != nil || !slices.Contains(mlaPrefillDims, d) {
			return fmt.Errorf("tuning key %q is not Dn=,Dr=,Dv= of head dims of %v", key, mlaPrefillDims)
		}
		if o.mlaHopperOn == nil {
			o.mlaHopperOn = map[string]bool{}
		}
		if name == mlaHopperVariant {
			if _, err := o.mlaHopper.config(d); err != nil {
				return err // why mla_hopper cannot run here, NVRTC's log included
			}
			o.mlaHopperOn[key] = true
			return nil
		}
		c, ok := flashConfigNamed(name)
		if !ok {
			return fmt.Errorf("fused has no mla_prefill tiling %q (nor is it %q)", name, mlaHopperVariant)
		}
		o.mlaPrefill[key] = c
		o.mlaHopperOn[key] = false
		return nil
	}
	if op == kernels.OpMLADecode {
		return o.useMLADecode(key, name)
	}
	if op != kernels.OpAttnPrefill {
		if cur := o.VariantFor(op, key); cur == "" || name != cur {
			return fmt.Errorf("fused has no variant %q of %s (it has %q)", name, op, cur)
		}
		return nil
	}
	d, dt, err := parsePrefillKey(key)
	if err != nil {
		return err
	}
	key = prefillKey(d, dt)
	if o.hopperOn == nil {
		o.hopperOn = map[string]bool{}
	}
	if name == hopperVariant {
		if _, err := o.hopper.config(dt, d); err != nil {
			return err // why flash_hopper cannot run here, NVRTC's log included
		}
		o.hopperOn[key] = true
		return nil
	}
	c, ok := flashConfigNamed(name)
	if !ok {
		return fmt.Errorf("fused has no flash_prefill tiling %q (nor is it %q)", name, hopperVariant)
	}
	if dt != actType {
		return fmt.Errorf("%s: %s: flash_prefill's tilings take bf16 only; %v operands run %q", key, name, dt, hopperVariant)
	}
	o.prefill[key] = c
	o.hopperOn[key] = false
	return nil
}

// prefillKey is attn_prefill's tuning key for head dim d and operands of
// type dt: "D=128", and "D=128,dt=f16" for the kernel benchmarks' f16
// (a shape's String, which parsePrefillKey reads).
func prefillKey(d int, dt kernels.DType) string {
	s := kernels.Shape{"D": d}
	if dt != actType {
		s[kernels.ShapeDType] = int(dt)
	}
	return s.String()
}

// parsePrefillKey reads a tuning key of attn_prefill (prefillKey): its head
// dim, one fused has kernels for, and its element type, bf16 when unnamed.
func parsePrefillKey(key string) (d int, dt kernels.DType, err error) {
	s, err := kernels.ParseShape(key)
	d, dt = s["D"], s.DType(actType)
	delete(s, "D")
	delete(s, kernels.ShapeDType)
	if err != nil || len(s) > 0 || !slices.Contains(headDims, d) || dt != actType && !slices.Contains(hopperDTypes, dt) {
		return 0, 0, fmt.Errorf("tuning key %q is not D=<a head dim of %v>[,dt=f16]", key, headDims)
	}
	return d, dt, nil
}

// VariantFor is the variant op runs for problems of key.
func (o *ops) VariantFor(op kernels.Op, key string) string {
	switch op {
	case kernels.OpAttnPrefill:
		d, dt, err := parsePrefillKey(key)
		if err == nil {
			key = prefillKey(d, dt)
			if _, ok := o.hopperFor(key, dt, d); ok {
				return hopperVariant
			}
			if dt != actType {
				return "" // no kernel of fused's: AttentionPrefill declines, naive runs
			}
		}
		return o.prefillFor(key).String()
	case kernels.OpLinear:
		return o.linearFor(key)
	case kernels.OpMLAPrefill:
		var d mlaHeads
		if _, err := fmt.Sscanf(key, "Dn=%d,Dr=%d,Dv=%d", &d.Nope, &d.Rope, &d.V); err == nil {
			if _, ok := o.mlaHopperFor(key, d); ok {
				return mlaHopperVariant
			}
		}
		return o.mlaPrefillFor(key).String()
	case kernels.OpGroupGemm, kernels.OpMoEExperts:
		return o.gemmVariantFor(op, key)
	case kernels.OpMLADecode:
		return o.mlaDecodeFor(key)
	}
	if vs := variants(op, kernels.Shape{}, kernels.Targets["sm_90a"]); len(vs) == 1 {
		return vs[0].Name
	}
	return ""
}

// prefillFor is the tiling flash_prefill runs for tuning key.
func (o *ops) prefillFor(key string) flashConfig {
	if c, ok := o.prefill[key]; ok {
		return c
	}
	return prefillConfig
}

// hopperFor is the flash_hopper instance AttentionPrefill runs for tuning
// key, element type dt and head dim d, if it runs flash_hopper: when a
// choice for key names it, or none names anything and prefillHopper is set;
// and it can run here.
func (o *ops) hopperFor(key string, dt kernels.DType, d int) (hopperConfig, bool) {
	on, chosen := o.hopperOn[key]
	if !chosen {
		on = prefillHopper
	}
	if !on {
		return hopperConfig{}, false
	}
	c, err := o.hopper.config(dt, d)
	return c, err == nil
}
