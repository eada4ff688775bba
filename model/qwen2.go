package model

import (
	"fmt"
	"math"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/layers"
	"github.com/fuselm/fuselm/loader"
)

// Qwen2 is Qwen2ForCausalLM (transformers' models/qwen2/modeling_qwen2.py).
type Qwen2 struct {
	*engine
	Cache *KVCache
}

// buildQwen2 is Qwen2ForCausalLM.__init__: the weights of every module,
// taken from s, with q/k/v and gate/up fused at load.
func buildQwen2(cfg *loader.Config, s *weightSet, cache *KVCache, rope *kernels.Rope) decoder {
	H, V, I, eps := cfg.HiddenSize, cfg.VocabSize, cfg.IntermediateSize, cfg.RMSNormEps
	heads, kvHeads, headDim := cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim
	var d decoder
	d.embedTokens = layers.Embedding{Weight: s.matrix("model.embed_tokens.weight", V, H)}
	for i := range cfg.NumLayers {
		p := fmt.Sprintf("model.layers.%d", i)
		selfAttn := &layers.Attention{
			// q_proj, k_proj, v_proj = nn.Linear(hidden, heads*head_dim, bias=True), ...
			QKVProj: s.stackedLinear(p+".self_attn", []string{"q_proj", "k_proj", "v_proj"},
				[]int{heads * headDim, kvHeads * headDim, kvHeads * headDim}, H, cfg.Qwen2.QKVBias),
			OProj:   s.linear(p+".self_attn.o_proj", H, heads*headDim, cfg.Qwen2.OBias),
			Heads:   heads,
			KVHeads: kvHeads,
			HeadDim: headDim,
			Scale:   float32(math.Pow(float64(headDim), -0.5)), // self.scaling = self.head_dim**-0.5
			Rope:    rope,
			KCache:  cache.K[i],
			VCache:  cache.V[i],
		}
		d.layers = append(d.layers, &layers.DecoderLayer{
			InputLayernorm:         s.rmsNorm(p+".input_layernorm", H, eps),
			SelfAttn:               selfAttn,
			PostAttentionLayernorm: s.rmsNorm(p+".post_attention_layernorm", H, eps),
			MLP:                    s.mlp(p+".mlp", H, I),
		})
	}
	d.norm = s.rmsNorm("model.norm", H, eps)
	d.lmHead = lmHead(cfg, s, d.embedTokens)
	return d
}

// loadQwen2 is Load for Qwen2, planned as p.
func loadQwen2(cfg *loader.Config, w *loader.Weights, dev kernels.Device, ops kernels.Ops, opt LoadOptions, p *plan) (Model, error) {
	e, err := newEngine(cfg, w, dev, ops, opt, p)
	if err != nil {
		return nil, err
	}
	cache := newKVCache(dev, cfg, opt.MaxRows, opt.MaxSeq)
	e.cacheTensors = cache.tensors()
	e.decoder = buildQwen2(cfg, e.weights, cache, e.rope)
	if err := e.finish(); err != nil {
		e.Close()
		return nil, err
	}
	return &Qwen2{engine: e, Cache: cache}, nil
}
