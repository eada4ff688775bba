package model

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/loader"
)

// KVCache is Qwen2's cache, allocated once for MaxRows rows of MaxSeq
// tokens: per layer, the rotated keys and the values of every cached token.
// The rows' lengths are the generation loop's to track.
type KVCache struct {
	K, V []*kernels.Tensor // per layer, [MaxRows, KVHeads, MaxSeq, HeadDim] act
}

// newKVCache allocates the cache on dev; with dev nil it only has the
// per-layer slots (for planning).
func newKVCache(dev kernels.Device, cfg *loader.Config, rows, seq int) *KVCache {
	c := &KVCache{K: make([]*kernels.Tensor, cfg.NumLayers), V: make([]*kernels.Tensor, cfg.NumLayers)}
	if dev == nil {
		return c
	}
	for i := range c.K {
		c.K[i] = dev.Alloc(dev.ActDType(), rows, cfg.NumKVHeads, seq, cfg.HeadDim)
		c.V[i] = dev.Alloc(dev.ActDType(), rows, cfg.NumKVHeads, seq, cfg.HeadDim)
	}
	return c
}

func (c *KVCache) tensors() []*kernels.Tensor {
	return append(append([]*kernels.Tensor(nil), c.K...), c.V...)
}

// LatentCache is DeepSeek-V2's cache: per layer and token, the compressed
// kv (kv_lora_rank values, after kv_a_layernorm) then the rotated shared key
// (qk_rope_head_dim values), as HF 5.x caches them.
type LatentCache struct {
	C []*kernels.Tensor // per layer, [MaxRows, MaxSeq, kv_lora_rank+qk_rope_head_dim] act
}

// newLatentCache is newKVCache for DeepSeek-V2.
func newLatentCache(dev kernels.Device, cfg *loader.Config, rows, seq int) *LatentCache {
	c := &LatentCache{C: make([]*kernels.Tensor, cfg.NumLayers)}
	if dev == nil {
		return c
	}
	d := cfg.DeepSeek
	for i := range c.C {
		c.C[i] = dev.Alloc(dev.ActDType(), rows, seq, d.KVLoraRank+d.QKRopeHeadDim)
	}
	return c
}
