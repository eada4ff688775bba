package model

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/layers"
	"github.com/fuselm/fuselm/loader"
)

// DeepseekV2 is DeepseekV2ForCausalLM as transformers 5.17 has it
// (models/deepseek_v2/modeling_deepseek_v2.py), which differs from
// DeepSeek's own modeling code (the hub's trust_remote_code file) in a few
// places; this follows HF:
//
//   - A layer has the MoE block when layer_idx >= first_k_dense_replace
//     (DeepseekV2DecoderLayer.__init__); moe_layer_freq is not read. The
//     original code also asks layer_idx % moe_layer_freq == 0, the same for
//     every released checkpoint (moe_layer_freq 1).
//   - The router (DeepseekV2TopkRouter) takes softmax scores in f32, the
//     top-k (greedy or group_limited_greedy), and multiplies the weights by
//     routed_scaling_factor; norm_topk_prob is never read. The original
//     divides by the sum instead when norm_topk_prob is true and top_k > 1
//     (false in every released V2 checkpoint).
//   - The attention scale is qk_head_dim^-0.5 · yarn_get_mscale(factor,
//     mscale_all_dim)² under YaRN (yarn_apply_mscale), as in the original.
//   - q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps
//     says: DeepseekV2RMSNorm(config.q_lora_rank) is built without eps.
type DeepseekV2 struct {
	*engine
	Cache *LatentCache
}

// latentNormEps is the eps of q_a_layernorm and kv_a_layernorm, the default
// of DeepseekV2RMSNorm.
const latentNormEps = 1e-6

// buildDeepseekV2 is DeepseekV2ForCausalLM.__init__, the weights taken from
// s. The routed experts are read in either layout: transformers 5.x's fused
// mlp.experts.gate_up_proj / down_proj, or the hub's one module per expert.
func buildDeepseekV2(cfg *loader.Config, s *weightSet, cache *LatentCache, rope *kernels.Rope) decoder {
	ds := cfg.DeepSeek
	H, V, eps := cfg.HiddenSize, cfg.VocabSize, cfg.RMSNormEps
	heads, qkHeadDim := cfg.NumHeads, ds.QKNopeHeadDim+ds.QKRopeHeadDim
	var d decoder
	d.embedTokens = layers.Embedding{Weight: s.matrix("model.embed_tokens.weight", V, H)}
	for i := range cfg.NumLayers {
		p := fmt.Sprintf("model.layers.%d", i)
		a := p + ".self_attn"
		kvaOut := ds.KVLoraRank + ds.QKRopeHeadDim
		selfAttn := &layers.MLA{
			KVALayernorm: s.rmsNorm(a+".kv_a_layernorm", ds.KVLoraRank, latentNormEps),
			KVBProj:      s.linear(a+".kv_b_proj", heads*(ds.QKNopeHeadDim+ds.VHeadDim), ds.KVLoraRank, false),
			OProj:        s.linear(a+".o_proj", H, heads*ds.VHeadDim, ds.AttentionBias),
			Heads:        heads,
			NopeDim:      ds.QKNopeHeadDim,
			RopeDim:      ds.QKRopeHeadDim,
			VDim:         ds.VHeadDim,
			Rank:         ds.KVLoraRank,
			Scale:        float32(yarnSoftmaxScale(&cfg.Rope, qkHeadDim)),
			Rope:         rope,
			Cache:        cache.C[i],
		}
		if ds.QLoraRank == 0 {
			qkva := qKVAProj(s, a, heads*qkHeadDim, kvaOut, H, ds.AttentionBias)
			selfAttn.QKVAProjWithMQA = &qkva
		} else {
			qa := s.linear(a+".q_a_proj", ds.QLoraRank, H, ds.AttentionBias)
			qaNorm := s.rmsNorm(a+".q_a_layernorm", ds.QLoraRank, latentNormEps)
			qb := s.linear(a+".q_b_proj", heads*qkHeadDim, ds.QLoraRank, false)
			kva := s.linear(a+".kv_a_proj_with_mqa", kvaOut, H, ds.AttentionBias)
			selfAttn.QAProj, selfAttn.QALayernorm, selfAttn.QBProj, selfAttn.KVAProjWithMQA = &qa, &qaNorm, &qb, &kva
		}
		var mlp layers.FFN
		if i >= ds.FirstKDenseReplace {
			mlp = buildMoE(cfg, s, p+".mlp")
		} else {
			mlp = s.mlp(p+".mlp", H, cfg.IntermediateSize)
		}
		d.layers = append(d.layers, &layers.DecoderLayer{
			InputLayernorm:         s.rmsNorm(p+".input_layernorm", H, eps),
			SelfAttn:               selfAttn,
			PostAttentionLayernorm: s.rmsNorm(p+".post_attention_layernorm", H, eps),
			MLP:                    mlp,
		})
	}
	d.norm = s.rmsNorm("model.norm", H, eps)
	d.lmHead = lmHead(cfg, s, d.embedTokens)
	return d
}

// qKVAProj is q_proj [qOut, hidden] and kv_a_proj_with_mqa [kvaOut, hidden]
// of the attention module a stacked into one Linear, q_proj's rows first:
// both read the layer's input, so a step runs one GEMM for the two. q_proj
// has no bias in HF; with attention_bias, the stack's bias is zero over
// q_proj's outputs and kv_a_proj_with_mqa's bias after them.
func qKVAProj(s *weightSet, a string, qOut, kvaOut, hidden int, bias bool) layers.Linear {
	l := s.stackedLinear(a, []string{"q_proj", "kv_a_proj_with_mqa"}, []int{qOut, kvaOut}, hidden, false)
	if bias {
		l.Bias = s.load(false, []int{qOut + kvaOut},
			part{shape: []int{qOut}}, part{name: a + ".kv_a_proj_with_mqa.bias", shape: []int{kvaOut}})
	}
	return l
}

// buildMoE is DeepseekV2Moe: the router mlp.gate, the routed experts
// stacked [E, 2I, H] and [E, H, I], and shared_experts of width
// moe_intermediate_size · n_shared_experts.
func buildMoE(cfg *loader.Config, s *weightSet, prefix string) *layers.MoE {
	ds := cfg.DeepSeek
	E, I, H := ds.NRoutedExperts, ds.MoEIntermediateSize, cfg.HiddenSize
	m := &layers.MoE{
		Gate: s.linear(prefix+".gate", E, H, false),
		Routing: kernels.Routing{
			Method:     kernels.RouteGreedy,
			TopK:       ds.NumExpertsPerTok,
			Groups:     ds.NGroup,
			TopKGroups: ds.TopkGroup,
			NormTopK:   false, // HF 5.17 never reads norm_topk_prob (see DeepseekV2)
			Scale:      float32(ds.RoutedScalingFactor),
		},
	}
	if ds.TopkMethod == loader.TopkGroupLimitedGreedy {
		m.Routing.Method = kernels.RouteGroupLimited
	}
	if fused := prefix + ".experts.gate_up_proj"; s.has(fused) {
		m.ExpertsGateUp = s.matrix(fused, E, 2*I, H)
		m.ExpertsDown = s.matrix(prefix+".experts.down_proj", E, H, I)
	} else {
		var gateUp, down []part
		for e := range E {
			ep := fmt.Sprintf("%s.experts.%d", prefix, e)
			gateUp = append(gateUp, part{ep + ".gate_proj.weight", []int{I, H}}, part{ep + ".up_proj.weight", []int{I, H}})
			down = append(down, part{ep + ".down_proj.weight", []int{H, I}})
		}
		m.ExpertsGateUp = s.load(false, []int{E, 2 * I, H}, gateUp...)
		m.ExpertsDown = s.load(false, []int{E, H, I}, down...)
	}
	if ds.NSharedExperts > 0 {
		m.SharedExperts = s.mlp(prefix+".shared_experts", H, I*ds.NSharedExperts)
	}
	return m
}

// loadDeepseekV2 is Load for DeepSeek-V2, planned as p.
func loadDeepseekV2(cfg *loader.Config, w *loader.Weights, dev kernels.Device, ops kernels.Ops, opt LoadOptions, p *plan) (Model, error) {
	e, err := newEngine(cfg, w, dev, ops, opt, p)
	if err != nil {
		return nil, err
	}
	cache := newLatentCache(dev, cfg, opt.MaxRows, opt.MaxSeq)
	e.cacheTensors = cache.C
	e.decoder = buildDeepseekV2(cfg, e.weights, cache, e.rope)
	if err := e.finish(); err != nil {
		e.Close()
		return nil, err
	}
	return &DeepseekV2{engine: e, Cache: cache}, nil
}
