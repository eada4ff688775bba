package fused

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// variant is one of fused's kernels for an op, as kbench lists it and the
// tuning cache names it. The launch stays in the op's launcher (its
// arguments differ from op to op); which variant it launches comes from
// variantFor.
type variant struct {
	op   kernels.Op
	name string
	// valid is the variant's params for shape s on target t and why it
	// cannot run it ("" when it can); offered is false where it is not one
	// of op's variants for s on t at all (the Hopper kernels off sm_90a, the
	// grouped GEMM's variants of another tiling).
	valid func(s kernels.Shape, t kernels.Target) (params, why string, offered bool)
	// use is why a tuning choice of the variant for key (parsed) cannot run
	// on o, nil when it can; a nil use accepts every key.
	use func(o *ops, key string) error
}

// tuning is how the variant of an op that has several is chosen.
type tuning struct {
	// key is the tuning key of a problem of shape s.
	key func(s kernels.Shape) string
	// parse is key in the form key gives it, or why it is not one of op's.
	parse func(key string) (string, error)
	// pick is the variant problems of key run, given the tuning choice for
	// key (chosen, "" when there is none): the op's default rule.
	pick func(o *ops, key, chosen string) string
}

// choiceKey is where a tuning choice applies: an op's problems of a key.
type choiceKey struct {
	op  kernels.Op
	key string
}

// table is fused's variants, op by op, in the order kbench lists them:
// flash_prefill's tilings and flash_hopper for attn_prefill, flash_decode,
// mla_prefill's tilings and mla_hopper, mla_decode's four, the single
// elementwise and router kernels, the grouped GEMM's (its tiling follows
// the rows per group; the params say which the shape gets),
// moe_routed's unfused pair and its gate/up that routes, linear_skinny,
// linear_stream, linear_swap, cuBLAS and linear_wgmma's instances for
// linear, the unfused pair, linear_stream, linear_swap and linear_wgmma's
// instances with SwiGLU in the epilogue for linear_swiglu, and the unfused pair and linear_stream with the add
// in its epilogue for linear_add.
var table = func() []variant {
	var vs []variant
	for _, c := range flashConfigs {
		vs = append(vs, variant{op: kernels.OpAttnPrefill, name: c.String(), valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
			d, dt := s["D"], s.DType(actType)
			var onlyBF16 string
			if dt != actType {
				onlyBF16 = fmt.Sprintf("%v operands: flash_prefill's mma.sync tiles take bf16 only (flash_hopper, on %s, takes %v)",
					dt, hopperArch, hopperDTypes)
			}
			shared := prefillShared(d, c)
			return fmt.Sprintf("warps=%d m_tiles=%d rows=%d key_tile=%d stages=2 shared=%d", c.Warps, c.MTiles, c.rows(), keyTile, shared),
				join(archWhy(t), headDimWhy(d), onlyBF16, fits(shared, t)), true
		}, use: func(_ *ops, key string) error {
			if _, dt, _ := parsePrefillKey(key); dt != actType {
				return fmt.Errorf("%s: %s: flash_prefill's tilings take bf16 only; %v operands run %q", key, c, dt, hopperVariant)
			}
			return nil
		}})
	}
	vs = append(vs, variant{op: kernels.OpAttnPrefill, name: hopperVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		v, ok := hopperVariantOf(s.DType(actType), s["D"], t)
		return v.Params, v.Why, ok
	}, use: func(o *ops, key string) error {
		d, dt, _ := parsePrefillKey(key)
		_, err := o.hopper.config(dt, d) // why flash_hopper cannot run here, NVRTC's log included
		return err
	}})
	decodeValid := func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		d := s["D"]
		var group string
		if kvh := s["KVH"]; kvh > 0 && s["H"]/kvh > maxGroup {
			group = fmt.Sprintf("%d query heads per kv head, at most %d", s["H"]/kvh, maxGroup)
		}
		shared := decodeShared(d)
		return fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d splits=one wave; warps split the keys, attn_merge merges",
			decodeWarps, keyTile, decodeStages, shared), join(archWhy(t), headDimWhy(d), group, fits(shared, t)), true
	}
	vs = append(vs, variant{op: kernels.OpAttnDecode, name: decodeVariant, valid: decodeValid})
	// rope_attn_decode is flash_decode_keys rotating q and the new k as it
	// loads them (flash_decode_rope).
	vs = append(vs, variant{op: kernels.OpRoPEAttnDecode, name: "rope_on_load", valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		params, why, ok := decodeValid(s, t)
		return "rotate_half over all D as q and the new key load; " + params, why, ok
	}})
	for _, c := range flashConfigs {
		vs = append(vs, variant{op: kernels.OpMLAPrefill, name: c.String(), valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
			d := mlaHeads{s["Dn"], s["Dr"], s["Dv"]}
			shared := mlaPrefillShared(d, c)
			return fmt.Sprintf("warps=%d m_tiles=%d rows=%d key_tile=%d stages=2 shared=%d; kv_b_proj up front (cuBLAS)",
				c.Warps, c.MTiles, c.rows(), keyTile, shared), join(archWhy(t), mlaHeadsWhy(d), fits(shared, t)), true
		}})
	}
	vs = append(vs, variant{op: kernels.OpMLAPrefill, name: mlaHopperVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		v, ok := mlaHopperVariantOf(mlaHeads{s["Dn"], s["Dr"], s["Dv"]}, t)
		return v.Params, v.Why, ok
	}, use: func(o *ops, key string) error {
		d, _ := parseMLAHeads(key)
		_, err := o.mlaHopper.config(d) // why mla_hopper cannot run here, NVRTC's log included
		return err
	}})
	vs = append(vs, variant{op: kernels.OpMLADecode, name: mlaDecodeVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		d := mlaLatent{s["R"], s["Dr"]}
		shared := mlaDecodeShared(d)
		return fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d splits=one wave; absorbed: W_UK and W_UV by cuBLAS, warps split q·k by dims and p·c by output dims, attn_merge merges",
			decodeWarps, keyTile, mlaStages, shared), join(archWhy(t), mlaLatentWhy(d, s["H"]), fits(shared, t)), true
	}}, variant{op: kernels.OpMLADecode, name: mlaKeysVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		d := mlaLatent{s["R"], s["Dr"]}
		stages := mlaKeysStages(d, t.SharedPerSM)
		shared := mlaKeysShared(d, stages)
		return fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d blocks_per_sm=%d splits=one wave; absorbed: W_UK and W_UV by cuBLAS, warps score their own keys, one max per tile, p·c by output dims, attn_merge merges",
			decodeWarps, mlkTile, stages, shared, blocksPerSM(shared, t.SharedPerSM)), join(archWhy(t), mlaLatentWhy(d, s["H"]), fits(shared, t)), true
	}}, variant{op: kernels.OpMLADecode, name: mlaFlatVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		if t.Arch != hopperArch {
			return "", "", false
		}
		d := mlaLatent{s["R"], s["Dr"]}
		stages := mlaFlatStages(d, t.SharedPerSM)
		shared := mlaFlatShared(d, stages)
		return fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d blocks_per_sm=%d cluster=%d splits=every cluster at once; mla_qlat and mla_out (merge and W_UV) overlapped, clusters merge in shared memory",
			decodeWarps, mlkTile, stages, shared, blocksPerSM(shared, t.SharedPerSM), mlfCluster), join(mlaFlatWhy(d, s["H"], s["Dn"]), fits(shared, t)), true
	}, use: func(o *ops, _ string) error { return o.mlaFlat.ready() }}, variant{op: kernels.OpMLADecode, name: mlaKeysOwnVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		if t.Arch != hopperArch { // mla_qlat and mla_out come with flat's module
			return "", "", false
		}
		d := mlaLatent{s["R"], s["Dr"]}
		stages := mlaKeysStages(d, t.SharedPerSM)
		shared := mlaKeysShared(d, stages)
		return fmt.Sprintf("warps=%d key_tile=%d stages=%d shared=%d blocks_per_sm=%d splits=one wave, 2 to %d a row; mla_qlat, keys's splits and mla_out (merge and W_UV) overlapped, no cuBLAS",
			decodeWarps, mlkTile, stages, shared, blocksPerSM(shared, t.SharedPerSM), moMaxPerRow), join(mlaFlatWhy(d, s["H"], s["Dn"]), fits(shared, t)), true
	}, use: func(o *ops, _ string) error {
		if err := o.mlaFlat.ready(); err != nil {
			return fmt.Errorf("fused: mla_decode %s takes mla_qlat and mla_out from the %s variant's module: %w", mlaKeysOwnVariant, mlaFlatVariant, err)
		}
		return nil
	}})
	single := func(op kernels.Op, name, params string) variant {
		return variant{op: op, name: name, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
			return params, archWhy(t), true
		}}
	}
	vs = append(vs,
		single(kernels.OpRMSNorm, "row_per_block", fmt.Sprintf("vector=16B rows_in_registers threads<=%d", maxNormThreads)),
		single(kernels.OpAddRMSNorm, "row_per_block", fmt.Sprintf("vector=16B rows_in_registers threads<=%d", maxNormThreads)),
		single(kernels.OpAddAddRMSNorm, "row_per_block", fmt.Sprintf("vector=16B rows_in_registers threads<=%d x+y_on_load", maxNormThreads)),
		single(kernels.OpRoPE, "token_per_block", fmt.Sprintf("pairs_per_thread=%d", ropeVec)),
		single(kernels.OpRMSNormRoPE, "one_launch", fmt.Sprintf("blocks=kv_row,q_row a token; latent<=%d in registers; pairs_per_thread=%d",
			maxNormThreads*rmsNormRopeShape.vec, ropeVec)),
		variant{op: kernels.OpMLADecodeRoPE, name: "one_launch", valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
			why := archWhy(t)
			if t.Arch != hopperArch {
				why = join(why, fmt.Sprintf("mla_qlat_rope is in mla_decode's %s module, built for %s only", mlaFlatVariant, hopperArch))
			}
			return fmt.Sprintf("mla_qlat_rope (rms_norm_rope's blocks beside mla_qlat's, %d threads), then mla_flat and mla_out; "+
				"where mla_decode runs %s, else rms_norm_rope and mla_decode", qlThreads, mlaFlatVariant), why, true
		}},
		single(kernels.OpSwiGLU, "one_pass", "vector=16B grid_stride"),
		single(kernels.OpMoERoute, "warp_per_token", fmt.Sprintf("experts<=%d groups<=32 topk<=32", 32*routePerLane)))
	for _, op := range []kernels.Op{kernels.OpGroupGemm, kernels.OpMoEExperts} {
		// atDefault is use of a variant that runs only where it is op's
		// default at the key's tiling.
		atDefault := func(name string) func(*ops, string) error {
			return func(_ *ops, key string) error {
				if c, _ := gemmTilingOfKey(key); name != defaultGemmVariant(op, c) {
					return fmt.Errorf("fused has no variant %q of %s at %s", name, op, key)
				}
				return nil
			}
		}
		// unfolded is grouped_mma where it runs beside the default: moe_experts'
		// four launches at the tiling where the folded two are the default,
		// and a block a tile where the persistent grid is.
		unfolded := func(c gemmConfig) bool {
			d := defaultGemmVariant(op, c)
			return d == "grouped_mma" || d == foldedVariant || d == dynVariant
		}
		vs = append(vs, variant{op: op, name: "grouped_mma", valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
			c := gemmTiling(op, s)
			return c.params() + " (" + c.regime + ")", join(archWhy(t), fits(c.shared(), t)), unfolded(c)
		}, use: func(_ *ops, key string) error {
			if c, _ := gemmTilingOfKey(key); !unfolded(c) {
				return fmt.Errorf("fused has no variant %q of %s at %s", "grouped_mma", op, key)
			}
			return nil
		}})
		vs = append(vs, variant{op: op, name: dynVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
			c := gemmTiling(op, s)
			if c.Name == dynTiling {
				c.Stages = dynConfig().Stages
			}
			return c.params() + fmt.Sprintf(" (%s); a persistent grid of the blocks the SMs hold, tiles from an atomic counter", c.regime),
				join(archWhy(t), fits(c.shared(), t)), c.Name == dynTiling
		}, use: func(_ *ops, key string) error {
			if c, _ := gemmTilingOfKey(key); c.Name != dynTiling {
				return fmt.Errorf("fused has no variant %q of %s at %s", dynVariant, op, key)
			}
			return nil
		}})
		if op == kernels.OpMoEExperts {
			vs = append(vs, variant{op: op, name: foldedVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
				c := gemmTiling(op, s)
				return fmt.Sprintf("grouped_mma with moe_align in every gate/up block and moe_combine in down's last block of an n-tile "+
						"(two launches up to %d tokens, a block a tile; up to %d on the persistent grid in one, as %s; and %d choices; "+
						"else %s's four)", foldTokens, foldDynTokens, oneVariant, foldMax, dynVariant),
					join(archWhy(t), fits(c.shared(), t)), defaultGemmVariant(op, c) == foldedVariant
			}, use: atDefault(foldedVariant)})
			// whereFoldDyn is use of a variant on the persistent grid's
			// folded path (foldDynVariant, oneVariant): where it is
			// offered (foldDynOffered).
			whereFoldDyn := func(name string) func(*ops, string) error {
				return func(_ *ops, key string) error {
					if c, _ := gemmTilingOfKey(key); !foldDynOffered(op, c) {
						return fmt.Errorf("fused has no variant %q of %s at %s", name, op, key)
					}
					return nil
				}
			}
			vs = append(vs, variant{op: op, name: foldDynVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
				c := gemmTiling(op, s)
				d := dynConfig()
				return d.params() + fmt.Sprintf(" (%s); %s on %s's persistent grid: every block ranks the choices, then takes tiles "+
						"from an atomic counter; the last tile of a down n-tile sums its columns (two launches at any token count "+
						"up to %d choices, else %s's four)", c.regime, foldedVariant, dynVariant, foldMax, dynVariant),
					join(archWhy(t), fits(d.shared(), t)), foldDynOffered(op, c)
			}, use: whereFoldDyn(foldDynVariant)})
			vs = append(vs, variant{op: op, name: oneVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
				c := gemmTiling(op, s)
				d := dynConfig()
				return d.params() + fmt.Sprintf(" (%s); %s in one launch (moe_one): the gate/up tiles, then the down tiles "+
						"from one atomic counter, each down tile waiting on its rows' gate/up tiles instead of a second launch "+
						"(at any token count up to %d choices, else %s's four)", c.regime, foldDynVariant, foldMax, dynVariant),
					join(archWhy(t), fits(d.shared(), t)), foldDynOffered(op, c)
			}, use: whereFoldDyn(oneVariant)})
			vs = append(vs, variant{op: op, name: "cublas_per_expert", valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
				return "moe_align, cuBLAS per expert for gate/up and down, swiglu, moe_combine (reads the offsets: a sync)", archWhy(t),
					defaultGemmVariant(op, gemmTiling(op, s)) == "cublas_per_expert"
			}, use: atDefault("cublas_per_expert")})
		}
		vs = append(vs, variant{op: op, name: wgmmaVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
			v, ok := wgmmaVariantOf(t, op == kernels.OpMoEExperts && wgmmaGather)
			return v.Params, v.Why, ok && gemmTiling(op, s).Name == prefillTiling
		}, use: func(o *ops, key string) error {
			if c, _ := gemmTilingOfKey(key); c.Name != prefillTiling {
				return fmt.Errorf("fused has no variant %q of %s at %s", wgmmaVariant, op, key)
			}
			return o.gw.ready() // why group_wgmma cannot run here, NVRTC's log included
		}})
	}
	vs = append(vs, variant{op: kernels.OpMoERouted, name: routedUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: moe_route, then moe_experts (its variant), two ops", archWhy(t), true
	}}, variant{op: kernels.OpMoERouted, name: routedVariant, valid: func(s kernels.Shape, t kernels.Target) (string, string, bool) {
		c := gemmTiling(kernels.OpMoERouted, s)
		return fmt.Sprintf("%s with moe_route in every gate/up block, a warp a token (two launches after the router; "+
				"up to %d tokens unless chosen, and where moe_experts folds, on its grid: %s's or %s's; else the two ops)",
				foldedVariant, routeFoldTokens, foldedVariant, foldDynVariant),
			join(archWhy(t), fits(c.shared(), t)), c.Name == foldTiling
	}, use: func(_ *ops, key string) error {
		if c, _ := gemmTilingOfKey(key); c.Name != foldTiling {
			return fmt.Errorf("fused has no variant %q of %s at %s", routedVariant, kernels.OpMoERouted, key)
		}
		return nil
	}}, variant{op: kernels.OpMoERouted, name: splitVariant, valid: splitValid, use: func(o *ops, key string) error {
		if c, _ := gemmTilingOfKey(key); c.Name != foldTiling {
			return fmt.Errorf("fused has no variant %q of %s at %s", splitVariant, kernels.OpMoERouted, key)
		}
		return o.ms.ready() // why moe_routed_split cannot run here, NVRTC's log included
	}})
	vs = append(vs, variant{op: kernels.OpLinear, name: linSkinny, valid: skinnyValid, use: func(_ *ops, key string) error {
		if k, _ := parseLinearKey(key); k.m > linMaxRows {
			return fmt.Errorf("linear_skinny takes at most %d rows, the key has %d", linMaxRows, k.m)
		}
		return nil
	}}, variant{op: kernels.OpLinear, name: linStream, valid: streamValid, use: streamUse("linear_stream")},
		variant{op: kernels.OpLinear, name: linSwap, valid: swapValid, use: swapUse(false)}, variant{op: kernels.OpLinear, name: linCuBLAS, valid: func(kernels.Shape, kernels.Target) (string, string, bool) {
			return "cuBLAS GEMM over bias rows (beta=1), as naive", "", true
		}})
	lwUse := func(c lwConfig) func(o *ops, key string) error {
		return func(o *ops, key string) error {
			if k, _ := parseLinearKey(key); k.k%cudaset.VecWidth != 0 {
				return fmt.Errorf("linear_wgmma takes K a multiple of %d (rows on 16-byte boundaries), the key has %d", cudaset.VecWidth, k.k)
			}
			_, err := o.lw.config(c.Variant) // why linear_wgmma cannot run here, NVRTC's log included
			return err
		}
	}
	for _, c := range lwConfigs {
		vs = append(vs, variant{op: kernels.OpLinear, name: c.Variant, valid: lwValid(c, false), use: lwUse(c)})
	}
	vs = append(vs, variant{op: kernels.OpLinearSwiGLU, name: linSwiGLUUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: linear (its variant for M,N,K) into an intermediate [M, N], then swiglu, two ops", archWhy(t), true
	}}, variant{op: kernels.OpLinearSwiGLU, name: linStream, valid: streamSwiGLUValid, use: streamSwiGLUUse("linear_stream with SwiGLU")},
		variant{op: kernels.OpLinearSwiGLU, name: linSwap, valid: swapSwiGLUValid, use: swapUse(true)})
	for _, c := range lwConfigs {
		vs = append(vs, variant{op: kernels.OpLinearSwiGLU, name: c.Variant, valid: lwValid(c, true), use: lwUse(c)})
	}
	vs = append(vs, variant{op: kernels.OpLinearAdd, name: linAddUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: linear (its variant for M,N,K) into an intermediate [M, N], then add, two ops", archWhy(t), true
	}}, variant{op: kernels.OpLinearAdd, name: linStream, valid: streamValid, use: streamUse("linear_stream with the add")})
	vs = append(vs, variant{op: kernels.OpNormLinear, name: linNormUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: add_rms_norm into h, then linear (its variant for M,N,K), two ops", archWhy(t), true
	}}, variant{op: kernels.OpNormLinear, name: linStream, valid: streamValid, use: streamUse("linear_stream normalising x")})
	vs = append(vs, variant{op: kernels.OpAddAddNormLinear, name: linNormUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: add_add_rms_norm into h, then linear (its variant for M,N,K), two ops", archWhy(t), true
	}}, variant{op: kernels.OpAddAddNormLinear, name: linStream, valid: streamValid, use: streamUse("add_add_rms_norm releasing first, then linear_stream")})
	vs = append(vs, variant{op: kernels.OpNormSwiGLU, name: linNormUnfused, valid: func(_ kernels.Shape, t kernels.Target) (string, string, bool) {
		return "declined to the Dispatch: add_rms_norm into h, then linear_swiglu (its variant for M,N,K), two ops or three", archWhy(t), true
	}}, variant{op: kernels.OpNormSwiGLU, name: linStream, valid: streamSwiGLUValid, use: streamSwiGLUUse("linear_stream normalising x, SwiGLU")})
	return vs
}()

// streamSwiGLUUse is streamUse for a variant that runs linear_stream with
// SwiGLU in its epilogue (planStreamSwiGLU over the key's N = 2I).
func streamSwiGLUUse(what string) func(o *ops, key string) error {
	return func(o *ops, key string) error {
		k, _ := parseLinearKey(key)
		sms, shared := streamTarget(o)
		if _, err := planStreamSwiGLU(k.m, k.n/2, k.k, sms, shared); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return o.ls.ready() // why linear_stream cannot run here, NVRTC's log included
	}
}

// streamUse is the use of a variant that runs linear_stream (what, in its
// errors): nil where planStream takes the key's problem on o's device and
// linear_stream is built, else why not.
func streamUse(what string) func(o *ops, key string) error {
	return func(o *ops, key string) error {
		k, _ := parseLinearKey(key)
		sms, shared := streamTarget(o)
		if _, err := planStream(k.m, k.n, k.k, sms, shared); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return o.ls.ready() // why linear_stream cannot run here, NVRTC's log included
	}
}

// tunings are the ops whose variant is chosen per tuning key: attention
// prefill's per head dim and element type (prefillKey), linear's per shape
// (M, N, K), linear_swiglu's per its stacked GEMM's (M, N = 2I, K),
// linear_add's per its projection's (M, N, K), add_rms_norm_linear's and
// add_rms_norm_linear_swiglu's as linear's and linear_swiglu's,
// mla_prefill's per head dims, the grouped GEMM's (group_gemm,
// moe_experts, moe_routed) per tiling, mla_decode's by batch
// (mlaDecodeKey); the other ops have one variant.
var tunings = map[kernels.Op]tuning{
	kernels.OpAttnPrefill: {
		key: func(s kernels.Shape) string { return prefillKey(s["D"], s.DType(actType)) },
		parse: func(key string) (string, error) {
			d, dt, err := parsePrefillKey(key)
			return prefillKey(d, dt), err
		},
		pick: prefillPick,
	},
	kernels.OpMLAPrefill: {
		key: func(s kernels.Shape) string { return mlaHeadsKey(mlaHeads{s["Dn"], s["Dr"], s["Dv"]}) },
		parse: func(key string) (string, error) {
			_, err := parseMLAHeads(key)
			return key, err
		},
		pick: mlaPrefillPick,
	},
	kernels.OpMLADecode: {
		key: func(s kernels.Shape) string { return mlaDecodeKey(s["B"]) },
		parse: func(key string) (string, error) {
			if key != "" && key != mlaDecodeKey(1) && key != mlaDecodeKey(mlaKeysMinRows) {
				return "", fmt.Errorf("tuning key %q is not %q, %q or empty", key, mlaDecodeKey(1), mlaDecodeKey(mlaKeysMinRows))
			}
			return key, nil
		},
		pick: mlaDecodePick,
	},
	// linearFor, linearSwiGLUFor and linearAddFor are the rules; Linear,
	// LinearSwiGLU and LinearAdd call them with the problem's linearKey,
	// parsing no key on every call.
	kernels.OpLinear:           linearTuning((*ops).linearFor),
	kernels.OpLinearSwiGLU:     linearTuning((*ops).linearSwiGLUFor),
	kernels.OpLinearAdd:        linearTuning((*ops).linearAddFor),
	kernels.OpNormLinear:       linearTuning((*ops).normLinearFor),
	kernels.OpAddAddNormLinear: linearTuning((*ops).addAddNormLinearFor),
	kernels.OpNormSwiGLU:       linearTuning((*ops).normSwiGLUFor),
	kernels.OpGroupGemm:        gemmTuning(kernels.OpGroupGemm),
	kernels.OpMoEExperts:       gemmTuning(kernels.OpMoEExperts),
	kernels.OpMoERouted:        routedTuning,
}

// routedTuning is moe_routed's: keyed as moe_experts' (the tiling, which
// decides whether it folds); at foldTiling splitVariant where
// moe_routed_split is built (it takes one token and runs the rest as
// routedVariant), else routedVariant, unless chosen otherwise;
// routedUnfused elsewhere.
var routedTuning = tuning{
	key:   gemmTuning(kernels.OpMoERouted).key,
	parse: gemmTuning(kernels.OpMoERouted).parse,
	pick: func(o *ops, key, chosen string) string {
		if chosen != "" {
			return chosen
		}
		if c, ok := gemmTilingOfKey(key); ok && c.Name == foldTiling {
			if o != nil && o.ms.ready() == nil {
				return splitVariant
			}
			return routedVariant
		}
		return routedUnfused
	},
}

// linearTuning is the tuning of an op keyed by a linear problem's shape
// (M, N, K), whose variant for a key is rule's.
func linearTuning(rule func(*ops, linearKey) string) tuning {
	return tuning{
		key: func(s kernels.Shape) string { return linearKey{s["M"], s["N"], s["K"]}.String() },
		parse: func(key string) (string, error) {
			_, err := parseLinearKey(key)
			return key, err
		},
		pick: func(o *ops, key, _ string) string {
			k, err := parseLinearKey(key)
			if err != nil {
				return ""
			}
			return rule(o, k)
		},
	}
}

// variants lists fused's variants of op for shape s on target t, valid or
// not (kernels.SetInfo.Variants): table's entries that t offers for s.
func variants(op kernels.Op, s kernels.Shape, t kernels.Target) []kernels.Variant {
	var vs []kernels.Variant
	for _, v := range table {
		if v.op != op {
			continue
		}
		if params, why, ok := v.valid(s, t); ok {
			vs = append(vs, kernels.Variant{Name: v.name, Params: params, Why: why})
		}
	}
	return vs
}

// namesOf is the names of op's variants in table.
func namesOf(op kernels.Op) []string {
	var names []string
	for _, v := range table {
		if v.op == op {
			names = append(names, v.name)
		}
	}
	return names
}

// TuningKey is the key of op's problems of shape s (tunings); "" for an op
// of one variant.
func (o *ops) TuningKey(op kernels.Op, s kernels.Shape) string {
	if tu, ok := tunings[op]; ok {
		return tu.key(s)
	}
	return ""
}

// UseVariant makes op run variant name for problems of key: for an op of
// tunings, a key it parses and a variant of table whose use accepts it here
// (for mla_decode, key "" chooses for every batch); the other ops take
// their single variant's name.
func (o *ops) UseVariant(op kernels.Op, key, name string) error {
	tu, ok := tunings[op]
	if !ok {
		if cur := o.VariantFor(op, key); cur == "" || name != cur {
			return fmt.Errorf("fused has no variant %q of %s (it has %q)", name, op, cur)
		}
		return nil
	}
	key, err := tu.parse(key)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(table, func(v variant) bool { return v.op == op && v.name == name })
	if i < 0 {
		return fmt.Errorf("fused has no %s variant %q (it has %v)", op, name, namesOf(op))
	}
	if use := table[i].use; use != nil {
		if err := use(o, key); err != nil {
			return err
		}
	}
	if o.choice == nil {
		o.choice = map[choiceKey]string{}
	}
	o.choice[choiceKey{op, key}] = name
	return nil
}

// VariantFor is the variant op runs for problems of key.
func (o *ops) VariantFor(op kernels.Op, key string) string {
	tu, ok := tunings[op]
	if !ok {
		if names := namesOf(op); len(names) == 1 {
			return names[0]
		}
		return ""
	}
	if k, err := tu.parse(key); err == nil {
		key = k
	}
	return o.variantFor(op, key)
}

// variantFor is the variant op (one of tunings) runs for problems of key, as
// its launcher asks: the op's rule given the tuning choice for key.
func (o *ops) variantFor(op kernels.Op, key string) string {
	return tunings[op].pick(o, key, o.choice[choiceKey{op, key}])
}

// prefillPick is attn_prefill's rule: flash_hopper where it is chosen, or
// nothing is chosen and prefillHopper is set, and it can run here; else,
// for bf16, the tiling chosen or prefillConfig; else none of fused's ("":
// AttentionPrefill declines, naive runs).
func prefillPick(o *ops, key, chosen string) string {
	if d, dt, err := parsePrefillKey(key); err == nil {
		if chosen == hopperVariant || chosen == "" && prefillHopper {
			if _, err := o.hopper.config(dt, d); err == nil {
				return hopperVariant
			}
		}
		if dt != actType {
			return ""
		}
	}
	if _, ok := flashConfigNamed(chosen); ok {
		return chosen
	}
	return prefillConfig.String()
}

// mlaPrefillPick is mla_prefill's rule: mla_hopper where it is chosen, or
// nothing is chosen and mlaPrefillHopper is set, and it can run here; else
// the tiling chosen, else mlaPrefillConfig.
func mlaPrefillPick(o *ops, key, chosen string) string {
	var d mlaHeads
	if _, err := fmt.Sscanf(key, "Dn=%d,Dr=%d,Dv=%d", &d.Nope, &d.Rope, &d.V); err == nil {
		if chosen == mlaHopperVariant || chosen == "" && mlaPrefillHopper {
			if _, err := o.mlaHopper.config(d); err == nil {
				return mlaHopperVariant
			}
		}
	}
	if _, ok := flashConfigNamed(chosen); ok {
		return chosen
	}
	return mlaPrefillConfig.String()
}

// mlaDecodePick is mla_decode's rule for key (mlaDecodeKey): the tuning
// choice for that key, else one made for every batch (key ""), else
// mlaDecodeDefault, else keys from mlaKeysMinRows rows and latent_split
// below.
func mlaDecodePick(o *ops, key, chosen string) string {
	if chosen != "" {
		return chosen
	}
	if v, ok := o.choice[choiceKey{kernels.OpMLADecode, ""}]; ok {
		return v
	}
	if mlaDecodeDefault != "" {
		return mlaDecodeDefault
	}
	if key == mlaDecodeKey(mlaKeysMinRows) {
		return mlaKeysVariant
	}
	if o.mlaFlat.ready() == nil {
		return mlaFlatVariant
	}
	return mlaDecodeVariant
}

// gemmTuning is group_gemm's or moe_experts' (op's) tuning: keyed by the
// tiling (wgmmaKey); group_wgmma where it is chosen at the prefill tiling,
// or nothing is chosen and prefillWgmma is set, and it can run here;
// grouped_mma or dynVariant where chosen at dynTiling, foldDynVariant or
// oneVariant where chosen and offered (foldDynOffered); else the tiling's default
// (defaultGemmVariant).
func gemmTuning(op kernels.Op) tuning {
	return tuning{
		key: func(s kernels.Shape) string { return wgmmaKey(gemmTiling(op, s)) },
		parse: func(key string) (string, error) {
			if _, ok := gemmTilingOfKey(key); !ok {
				return "", fmt.Errorf("tuning key %q of %s is not tiling=<one of the grouped GEMM's tilings>", key, op)
			}
			return key, nil
		},
		pick: func(o *ops, key, chosen string) string {
			c, ok := gemmTilingOfKey(key)
			if !ok {
				return ""
			}
			if c.Name == prefillTiling && (chosen == wgmmaVariant || chosen == "" && prefillWgmma) && o.gw.ready() == nil {
				return wgmmaVariant
			}
			if (chosen == "grouped_mma" || chosen == dynVariant) && c.Name == dynTiling ||
				(chosen == foldDynVariant || chosen == oneVariant) && foldDynOffered(op, c) {
				return chosen
			}
			return defaultGemmVariant(op, c)
		},
	}
}

// foldDynOffered reports whether op has foldDynVariant and oneVariant at
// tiling c: moe_experts where its default is the folded path and the
// persistent grid runs.
func foldDynOffered(op kernels.Op, c gemmConfig) bool {
	return op == kernels.OpMoEExperts && defaultGemmVariant(op, c) == foldedVariant && c.Name == dynTiling
}

// gemmTiling is the grouped GEMM's tiling for op's problems of shape s: by
// the rows per group, M over E for group_gemm, N·topk over E for
// moe_experts and moe_routed.
func gemmTiling(op kernels.Op, s kernels.Shape) gemmConfig {
	if op == kernels.OpMoEExperts || op == kernels.OpMoERouted {
		return configFor(s["N"]*s["topk"], s["E"])
	}
	return configFor(s["M"], s["E"])
}

// gemmTilingOfKey is the tiling a grouped GEMM tuning key (wgmmaKey) names.
func gemmTilingOfKey(key string) (gemmConfig, bool) {
	for _, c := range gemmConfigs {
		if wgmmaKey(c) == key {
			return c, true
		}
	}
	return gemmConfig{}, false
}

// mlaHeadsKey is mla_prefill's tuning key for head dims d.
func mlaHeadsKey(d mlaHeads) string { return fmt.Sprintf("Dn=%d,Dr=%d,Dv=%d", d.Nope, d.Rope, d.V) }

// parseMLAHeads reads mla_prefill's tuning key: head dims it is
// instantiated for.
func parseMLAHeads(key string) (mlaHeads, error) {
	var d mlaHeads
	if _, err := fmt.Sscanf(key, "Dn=%d,Dr=%d,Dv=%d", &d.Nope, &d.Rope, &d.V); err != nil || !slices.Contains(mlaPrefillDims, d) {
		return d, fmt.Errorf("tuning key %q is not Dn=,Dr=,Dv= of head dims of %v", key, mlaPrefillDims)
	}
	return d, nil
}

// archWhy is why fused's kernels cannot run on t: mma.sync on bf16 needs
// sm_80; "" when they can.
func archWhy(t kernels.Target) string {
	if !archAtLeast(t.Arch, 80) {
		return fmt.Sprintf("mma.sync on bf16 needs sm_80 or later, the target is %s", t.Arch)
	}
	return ""
}

// headDimWhy is why the attention kernels have no instance of head dim d.
func headDimWhy(d int) string {
	if !slices.Contains(headDims, d) {
		return fmt.Sprintf("head dim %d: the kernels are instantiated for %v", d, headDims)
	}
	return ""
}

// mlaHeadsWhy is why mla_prefill has no instance of head dims d.
func mlaHeadsWhy(d mlaHeads) string {
	if !slices.Contains(mlaPrefillDims, d) {
		return fmt.Sprintf("heads of nope %d, rope %d, v %d: the kernels are instantiated for %v", d.Nope, d.Rope, d.V, mlaPrefillDims)
	}
	return ""
}

// mlaLatentWhy is why mla_decode cannot take latents d with heads heads.
func mlaLatentWhy(d mlaLatent, heads int) string {
	var why []string
	if !slices.Contains(mlaDecodeDims, d) {
		why = append(why, fmt.Sprintf("latents of rank %d, rope %d: the kernel is instantiated for %v", d.Rank, d.Rope, mlaDecodeDims))
	}
	if heads > maxMLAHeads {
		why = append(why, fmt.Sprintf("%d heads, at most %d", heads, maxMLAHeads))
	}
	return join(why...)
}

// fits is why a block of shared bytes of shared memory cannot run on t.
func fits(shared int, t kernels.Target) string {
	if shared > t.SharedPerBlock {
		return fmt.Sprintf("needs %d bytes of shared memory, a block gets %d on %s", shared, t.SharedPerBlock, t.Arch)
	}
	return ""
}

// join is the reasons that are not empty, joined by "; ".
func join(why ...string) string {
	return strings.Join(slices.DeleteFunc(why, func(s string) bool { return s == "" }), "; ")
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
