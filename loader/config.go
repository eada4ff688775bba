// Package loader finds a Hugging Face model directory (a path or an offline
// HF-cache lookup), reads its config.json / generation_config.json into typed
// configs, and maps its safetensors weights read-only into memory. The
// tokenizer.json of the same directory is package tokenizer's.
//
// Nothing here downloads anything.
package loader

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The architectures LoadConfig understands (config.json "architectures"[0]).
const (
	ArchQwen2      = "Qwen2ForCausalLM"
	ArchDeepseekV2 = "DeepseekV2ForCausalLM"
)

// SupportedArchitectures lists the architectures LoadConfig accepts.
var SupportedArchitectures = []string{ArchQwen2, ArchDeepseekV2}

// The model_type values of the supported architectures, used when
// config.json has no "architectures".
const (
	ModelTypeQwen2      = "qwen2"
	ModelTypeDeepseekV2 = "deepseek_v2"
)

// RoPE types (Rope.Type).
const (
	RopeDefault = "default"
	RopeYarn    = "yarn"
)

// SupportedRopeTypes lists the rope types LoadConfig accepts.
var SupportedRopeTypes = []string{RopeDefault, RopeYarn}

// MoE expert-selection methods (DeepseekV2Config.TopkMethod).
const (
	TopkGreedy             = "greedy"
	TopkGroupLimitedGreedy = "group_limited_greedy"
)

// Config is config.json of a supported causal LM, validated, with every field
// that changes the math. Exactly one of Qwen2 and DeepSeek is non-nil.
type Config struct {
	Arch      string // ArchQwen2 or ArchDeepseekV2
	ModelType string // ModelTypeQwen2 or ModelTypeDeepseekV2

	// DType is the checkpoint's declared dtype ("torch_dtype" in
	// transformers 4.x, "dtype" in 5.x): "bfloat16", "float16", "float32",
	// or "" when config.json names none (then the weights' own dtype rules).
	DType string

	VocabSize        int
	HiddenSize       int
	IntermediateSize int // dense MLP width (DeepSeek-V2: the first_k_dense_replace layers)
	NumLayers        int // num_hidden_layers
	NumHeads         int // num_attention_heads
	NumKVHeads       int // num_key_value_heads (default NumHeads; DeepSeek-V2: always NumHeads)
	// HeadDim is the query/key width of one head. Qwen2: head_dim, or
	// hidden_size/num_attention_heads. DeepSeek-V2: qk_nope_head_dim +
	// qk_rope_head_dim (config.json's own "head_dim" is ignored there:
	// transformers 5.x writes qk_rope_head_dim into it). The value width is
	// HeadDim for Qwen2 and DeepSeek.VHeadDim for DeepSeek-V2.
	HeadDim           int
	MaxPositions      int // max_position_embeddings
	RMSNormEps        float64
	TieWordEmbeddings bool
	HiddenAct         string // always "silu" (anything else is rejected)

	Rope Rope

	BOS *int  // bos_token_id; nil when null or absent
	EOS []int // eos_token_id (int or list); empty when null or absent
	PAD *int  // pad_token_id; nil when null or absent

	Qwen2    *Qwen2Config
	DeepSeek *DeepseekV2Config
}

// Qwen2Config holds what is specific to Qwen2ForCausalLM.
type Qwen2Config struct {
	// QKVBias is always true and OBias always false: HF Qwen2 gives q_proj,
	// k_proj and v_proj a bias and o_proj none, whatever the config says.
	QKVBias bool
	OBias   bool
	// There is no sliding-window field: configs with use_sliding_window
	// true (or any "sliding_attention" layer type) are rejected, so every
	// layer uses full attention and sliding_window / max_window_layers
	// change nothing.
}

// DeepseekV2Config holds what is specific to DeepseekV2ForCausalLM
// (multi-head latent attention and the MoE).
type DeepseekV2Config struct {
	QLoraRank     int // 0 when q_lora_rank is null: q_proj is one dense projection
	KVLoraRank    int
	QKNopeHeadDim int
	QKRopeHeadDim int // the rotary part; equals Rope.Dim
	QKHeadDim     int // QKNopeHeadDim + QKRopeHeadDim (== Config.HeadDim)
	VHeadDim      int
	AttentionBias bool // bias on q_a_proj / kv_a_proj_with_mqa / o_proj (HF layout)

	FirstKDenseReplace  int // layers [0, FirstKDenseReplace) use the dense MLP
	MoELayerFreq        int // moe_layer_freq, default 1
	NRoutedExperts      int // 0: no MoE layer at all
	NSharedExperts      int // null -> 0
	NumExpertsPerTok    int
	MoEIntermediateSize int
	TopkMethod          string // TopkGreedy or TopkGroupLimitedGreedy
	NGroup              int    // null -> 1
	TopkGroup           int    // null -> NGroup
	NormTopkProb        bool
	RoutedScalingFactor float64 // default 1
	ScoringFunc         string  // always "softmax"
}

// IsMoELayer reports whether decoder layer i has the MoE block (the rule of
// the original DeepSeek-V2 code: n_routed_experts set, i >=
// first_k_dense_replace and i % moe_layer_freq == 0).
func (d *DeepseekV2Config) IsMoELayer(i int) bool {
	return d.NRoutedExperts > 0 && i >= d.FirstKDenseReplace && i%d.MoELayerFreq == 0
}

// Rope is the rotary embedding of either config dialect: transformers 4.x
// (top-level rope_theta + rope_scaling {type|rope_type, ...}) and 5.x
// (rope_parameters {rope_type, rope_theta, ...}) load into the same value.
type Rope struct {
	Type  string  // RopeDefault or RopeYarn
	Theta float64 // rope_theta (default 10000)
	// Dim is the number of rotated dimensions of one head: HeadDim for
	// Qwen2, qk_rope_head_dim for DeepSeek-V2.
	Dim int

	// YaRN (Type == RopeYarn). For RopeDefault, Factor is 1,
	// OriginalMaxPositions is Config.MaxPositions and the rest are zero.
	Factor               float64 // factor; when absent, max_position_embeddings / original_max_position_embeddings
	OriginalMaxPositions int     // original_max_position_embeddings; when absent, max_position_embeddings
	BetaFast             float64 // beta_fast, default 32
	BetaSlow             float64 // beta_slow, default 1
	MScale               float64 // mscale, valid when HasMScale
	MScaleAllDim         float64 // mscale_all_dim, valid when HasMScaleAllDim
	HasMScale            bool
	HasMScaleAllDim      bool
	AttentionFactor      *float64 // attention_factor, nil when absent
	Truncate             *bool    // truncate, nil when absent (HF default: true)
}

// configFile is the name of the model config in a model directory.
const configFile = "config.json"

// LoadConfig reads dir/config.json into a validated Config.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, configFile)
	data, err := ReadJSONFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("loader: %s: no config.json in the model directory", dir)
		}
		return nil, fmt.Errorf("loader: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses the bytes of a config.json (LoadConfig without the
// file). Its errors carry no "loader:" prefix or file name.
func ParseConfig(data []byte) (*Config, error) {
	o, err := cfgParseObject(data)
	if err != nil {
		return nil, err
	}
	c := &Config{}

	// Architecture.
	var archs []string
	if err := o.decode("architectures", &archs); err != nil {
		return nil, err
	}
	modelType, err := o.str("model_type", "")
	if err != nil {
		return nil, err
	}
	switch {
	case len(archs) > 0:
		c.Arch = archs[0]
	case modelType == ModelTypeQwen2:
		c.Arch = ArchQwen2
	case modelType == ModelTypeDeepseekV2:
		c.Arch = ArchDeepseekV2
	case modelType == "":
		return nil, fmt.Errorf("neither architectures nor model_type is set (supported: %s)",
			strings.Join(SupportedArchitectures, ", "))
	default:
		return nil, fmt.Errorf("model_type %q is not supported (supported architectures: %s)",
			modelType, strings.Join(SupportedArchitectures, ", "))
	}
	wantType := ""
	switch c.Arch {
	case ArchQwen2:
		wantType = ModelTypeQwen2
	case ArchDeepseekV2:
		wantType = ModelTypeDeepseekV2
	default:
		return nil, fmt.Errorf("architecture %q is not supported (supported: %s)",
			c.Arch, strings.Join(SupportedArchitectures, ", "))
	}
	if modelType != "" && modelType != wantType {
		return nil, fmt.Errorf("model_type %q does not match architecture %s (want %q)", modelType, c.Arch, wantType)
	}
	c.ModelType = wantType

	// DType: "dtype" (5.x) wins over "torch_dtype" (4.x).
	dt, err := o.str("dtype", "")
	if err != nil {
		return nil, err
	}
	dtField := "dtype"
	if dt == "" {
		dtField = "torch_dtype"
		if dt, err = o.str("torch_dtype", ""); err != nil {
			return nil, err
		}
	}
	dt = strings.TrimPrefix(dt, "torch.")
	switch dt {
	case "", "bfloat16", "float16", "float32":
		c.DType = dt
	default:
		return nil, fmt.Errorf("%s: %q is not supported (supported: bfloat16, float16, float32)", dtField, dt)
	}

	// Common sizes.
	for _, f := range []struct {
		name string
		dst  *int
	}{
		{"vocab_size", &c.VocabSize},
		{"hidden_size", &c.HiddenSize},
		{"intermediate_size", &c.IntermediateSize},
		{"num_hidden_layers", &c.NumLayers},
		{"num_attention_heads", &c.NumHeads},
		{"max_position_embeddings", &c.MaxPositions},
	} {
		if *f.dst, err = o.reqInt(f.name); err != nil {
			return nil, err
		}
		if *f.dst <= 0 {
			return nil, fmt.Errorf("%s: must be positive, got %d", f.name, *f.dst)
		}
	}
	if c.NumKVHeads, err = o.optInt("num_key_value_heads", c.NumHeads); err != nil {
		return nil, err
	}
	if c.NumKVHeads <= 0 {
		return nil, fmt.Errorf("num_key_value_heads: must be positive, got %d", c.NumKVHeads)
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return nil, fmt.Errorf("num_attention_heads (%d) is not divisible by num_key_value_heads (%d)", c.NumHeads, c.NumKVHeads)
	}
	if c.RMSNormEps, err = o.optFloat("rms_norm_eps", 1e-6); err != nil {
		return nil, err
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return nil, fmt.Errorf("rms_norm_eps: must be positive, got %v", c.RMSNormEps)
	}
	if c.TieWordEmbeddings, err = o.optBool("tie_word_embeddings", false); err != nil {
		return nil, err
	}
	if c.HiddenAct, err = o.str("hidden_act", "silu"); err != nil {
		return nil, err
	}
	if c.HiddenAct != "silu" {
		return nil, fmt.Errorf("hidden_act: %q is not supported (supported: silu)", c.HiddenAct)
	}
	if c.BOS, err = o.optTokenID("bos_token_id"); err != nil {
		return nil, err
	}
	if c.EOS, err = o.tokenIDs("eos_token_id"); err != nil {
		return nil, err
	}
	if c.PAD, err = o.optTokenID("pad_token_id"); err != nil {
		return nil, err
	}

	switch c.Arch {
	case ArchQwen2:
		err = c.parseQwen2(o)
	case ArchDeepseekV2:
		err = c.parseDeepseekV2(o)
	}
	if err != nil {
		return nil, err
	}
	if err := c.parseRope(o); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) parseQwen2(o cfgObject) error {
	var err error
	c.Qwen2 = &Qwen2Config{QKVBias: true, OBias: false}
	if c.HeadDim, err = o.optInt("head_dim", 0); err != nil {
		return err
	}
	if c.HeadDim == 0 {
		if c.HiddenSize%c.NumHeads != 0 {
			return fmt.Errorf("hidden_size (%d) is not divisible by num_attention_heads (%d) and head_dim is not set", c.HiddenSize, c.NumHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if c.HeadDim <= 0 {
		return fmt.Errorf("head_dim: must be positive, got %d", c.HeadDim)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim: must be even for RoPE, got %d", c.HeadDim)
	}
	sliding, err := o.optBool("use_sliding_window", false)
	if err != nil {
		return err
	}
	if sliding {
		return errors.New("use_sliding_window: true is not supported (sliding-window attention)")
	}
	var layerTypes []string
	if err := o.decode("layer_types", &layerTypes); err != nil {
		return err
	}
	if layerTypes != nil && len(layerTypes) != c.NumLayers {
		return fmt.Errorf("layer_types: %d entries for %d layers", len(layerTypes), c.NumLayers)
	}
	for i, lt := range layerTypes {
		if lt != "full_attention" {
			return fmt.Errorf("layer_types[%d]: %q is not supported (only full_attention)", i, lt)
		}
	}
	return nil
}

func (c *Config) parseDeepseekV2(o cfgObject) error {
	var err error
	d := &DeepseekV2Config{}
	c.DeepSeek = d
	if c.NumKVHeads != c.NumHeads {
		return fmt.Errorf("num_key_value_heads (%d) must equal num_attention_heads (%d) for DeepSeek-V2 latent attention", c.NumKVHeads, c.NumHeads)
	}
	if d.QLoraRank, err = o.optInt("q_lora_rank", 0); err != nil {
		return err
	}
	if d.QLoraRank < 0 {
		return fmt.Errorf("q_lora_rank: must be null or positive, got %d", d.QLoraRank)
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{
		{"kv_lora_rank", &d.KVLoraRank},
		{"qk_nope_head_dim", &d.QKNopeHeadDim},
		{"qk_rope_head_dim", &d.QKRopeHeadDim},
		{"v_head_dim", &d.VHeadDim},
	} {
		if *f.dst, err = o.reqInt(f.name); err != nil {
			return err
		}
		if *f.dst <= 0 {
			return fmt.Errorf("%s: must be positive, got %d", f.name, *f.dst)
		}
	}
	if d.QKRopeHeadDim%2 != 0 {
		return fmt.Errorf("qk_rope_head_dim: must be even for RoPE, got %d", d.QKRopeHeadDim)
	}
	d.QKHeadDim = d.QKNopeHeadDim + d.QKRopeHeadDim
	c.HeadDim = d.QKHeadDim
	if qk, err := o.optInt("qk_head_dim", d.QKHeadDim); err != nil {
		return err
	} else if qk != d.QKHeadDim {
		return fmt.Errorf("qk_head_dim (%d) is not qk_nope_head_dim + qk_rope_head_dim (%d)", qk, d.QKHeadDim)
	}
	if d.AttentionBias, err = o.optBool("attention_bias", false); err != nil {
		return err
	}
	mlpBias, err := o.optBool("mlp_bias", false)
	if err != nil {
		return err
	}
	if mlpBias {
		return errors.New("mlp_bias: true is not supported")
	}

	// MoE.
	if d.NRoutedExperts, err = o.optInt("n_routed_experts", 0); err != nil {
		return err
	}
	if d.NRoutedExperts < 0 {
		return fmt.Errorf("n_routed_experts: must be null or positive, got %d", d.NRoutedExperts)
	}
	if d.FirstKDenseReplace, err = o.optInt("first_k_dense_replace", 0); err != nil {
		return err
	}
	if d.FirstKDenseReplace < 0 || d.FirstKDenseReplace > c.NumLayers {
		return fmt.Errorf("first_k_dense_replace: must be in [0, num_hidden_layers=%d], got %d", c.NumLayers, d.FirstKDenseReplace)
	}
	if d.MoELayerFreq, err = o.optInt("moe_layer_freq", 1); err != nil {
		return err
	}
	if d.MoELayerFreq <= 0 {
		return fmt.Errorf("moe_layer_freq: must be positive, got %d", d.MoELayerFreq)
	}
	if d.NSharedExperts, err = o.optInt("n_shared_experts", 0); err != nil {
		return err
	}
	if d.NSharedExperts < 0 {
		return fmt.Errorf("n_shared_experts: must be null or >= 0, got %d", d.NSharedExperts)
	}
	if d.NumExpertsPerTok, err = o.optInt("num_experts_per_tok", 0); err != nil {
		return err
	}
	if d.MoEIntermediateSize, err = o.optInt("moe_intermediate_size", 0); err != nil {
		return err
	}
	if d.TopkMethod, err = o.str("topk_method", TopkGreedy); err != nil {
		return err
	}
	if d.NGroup, err = o.optInt("n_group", 1); err != nil {
		return err
	}
	if d.TopkGroup, err = o.optInt("topk_group", d.NGroup); err != nil {
		return err
	}
	if d.NormTopkProb, err = o.optBool("norm_topk_prob", false); err != nil {
		return err
	}
	if d.RoutedScalingFactor, err = o.optFloat("routed_scaling_factor", 1); err != nil {
		return err
	}
	if d.ScoringFunc, err = o.str("scoring_func", "softmax"); err != nil {
		return err
	}
	if d.ScoringFunc != "softmax" {
		return fmt.Errorf("scoring_func: %q is not supported (supported: softmax)", d.ScoringFunc)
	}
	if d.NRoutedExperts > 0 {
		if d.NumExpertsPerTok <= 0 || d.NumExpertsPerTok > d.NRoutedExperts {
			return fmt.Errorf("num_experts_per_tok: must be in [1, n_routed_experts=%d], got %d", d.NRoutedExperts, d.NumExpertsPerTok)
		}
		if d.MoEIntermediateSize <= 0 {
			return fmt.Errorf("moe_intermediate_size: must be positive, got %d", d.MoEIntermediateSize)
		}
		switch d.TopkMethod {
		case TopkGreedy:
		case TopkGroupLimitedGreedy:
			if d.NGroup <= 0 || d.NRoutedExperts%d.NGroup != 0 {
				return fmt.Errorf("n_group: must be positive and divide n_routed_experts (%d), got %d", d.NRoutedExperts, d.NGroup)
			}
			if d.TopkGroup <= 0 || d.TopkGroup > d.NGroup {
				return fmt.Errorf("topk_group: must be in [1, n_group=%d], got %d", d.NGroup, d.TopkGroup)
			}
			if d.NumExpertsPerTok > d.TopkGroup*(d.NRoutedExperts/d.NGroup) {
				return fmt.Errorf("num_experts_per_tok (%d) exceeds the experts of topk_group (%d) groups of %d", d.NumExpertsPerTok, d.TopkGroup, d.NRoutedExperts/d.NGroup)
			}
		default:
			return fmt.Errorf("topk_method: %q is not supported (supported: %s, %s)", d.TopkMethod, TopkGreedy, TopkGroupLimitedGreedy)
		}
		if !(d.RoutedScalingFactor > 0) || math.IsInf(d.RoutedScalingFactor, 0) {
			return fmt.Errorf("routed_scaling_factor: must be positive, got %v", d.RoutedScalingFactor)
		}
	}
	if d.NSharedExperts > 0 && d.MoEIntermediateSize <= 0 {
		return fmt.Errorf("moe_intermediate_size: must be positive with n_shared_experts %d, got %d", d.NSharedExperts, d.MoEIntermediateSize)
	}
	return nil
}

// parseRope reads either dialect: rope_parameters (5.x) when present and not
// null, otherwise rope_theta + rope_scaling (4.x).
func (c *Config) parseRope(o cfgObject) error {
	r := &c.Rope
	r.Dim = c.HeadDim
	if c.DeepSeek != nil {
		r.Dim = c.DeepSeek.QKRopeHeadDim
	}
	topTheta, err := o.optFloat("rope_theta", 10000)
	if err != nil {
		return err
	}

	var p cfgObject
	field := ""
	if o.present("rope_parameters") {
		field = "rope_parameters"
		if p, err = o.object(field); err != nil {
			return err
		}
		// Per-layer-type form {"full_attention": {...}}: every layer here is
		// full attention.
		if !p.present("rope_type") && !p.present("type") && !p.present("rope_theta") && p.present("full_attention") {
			field = "rope_parameters.full_attention"
			if p, err = p.object("full_attention"); err != nil {
				return err
			}
		}
	} else if o.present("rope_scaling") {
		field = "rope_scaling"
		if p, err = o.object(field); err != nil {
			return err
		}
	}

	r.Theta = topTheta
	r.Type = RopeDefault
	if p.m != nil {
		if r.Theta, err = p.optFloat("rope_theta", topTheta); err != nil {
			return err
		}
		t, err := p.str("rope_type", "")
		if err != nil {
			return err
		}
		if t == "" {
			if t, err = p.str("type", RopeDefault); err != nil {
				return err
			}
		}
		r.Type = t
		prf, err := p.optFloat("partial_rotary_factor", 1)
		if err != nil {
			return err
		}
		if prf != 1 {
			return fmt.Errorf("%s.partial_rotary_factor: %v is not supported (only 1)", field, prf)
		}
	}
	if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
		return fmt.Errorf("rope_theta: must be positive, got %v", r.Theta)
	}
	switch r.Type {
	case RopeDefault:
		r.Factor = 1
		r.OriginalMaxPositions = c.MaxPositions
		return nil
	case RopeYarn:
	default:
		return fmt.Errorf("%s: rope type %q is not supported (supported: %s)", field, r.Type, strings.Join(SupportedRopeTypes, ", "))
	}

	if r.OriginalMaxPositions, err = p.optInt("original_max_position_embeddings", c.MaxPositions); err != nil {
		return err
	}
	if r.OriginalMaxPositions <= 0 {
		return fmt.Errorf("%s.original_max_position_embeddings: must be positive, got %d", field, r.OriginalMaxPositions)
	}
	if r.Factor, err = p.optFloat("factor", float64(c.MaxPositions)/float64(r.OriginalMaxPositions)); err != nil {
		return err
	}
	if !(r.Factor > 0) || math.IsInf(r.Factor, 0) {
		return fmt.Errorf("%s.factor: must be positive, got %v", field, r.Factor)
	}
	if r.BetaFast, err = p.optFloat("beta_fast", 32); err != nil {
		return err
	}
	if r.BetaSlow, err = p.optFloat("beta_slow", 1); err != nil {
		return err
	}
	if !(r.BetaFast > 0) || !(r.BetaSlow > 0) {
		return fmt.Errorf("%s: beta_fast (%v) and beta_slow (%v) must be positive", field, r.BetaFast, r.BetaSlow)
	}
	if r.MScale, r.HasMScale, err = p.maybeFloat("mscale"); err != nil {
		return err
	}
	if r.MScaleAllDim, r.HasMScaleAllDim, err = p.maybeFloat("mscale_all_dim"); err != nil {
		return err
	}
	if v, ok, err := p.maybeFloat("attention_factor"); err != nil {
		return err
	} else if ok {
		r.AttentionFactor = &v
	}
	if p.present("truncate") {
		v, err := p.optBool("truncate", true)
		if err != nil {
			return err
		}
		r.Truncate = &v
	}
	return nil
}

// cfgObject is one JSON object of a config file, its members kept raw so
// that every field can be read with its own error.
type cfgObject struct {
	m      map[string]json.RawMessage
	prefix string // "rope_scaling." for nested objects, "" at the top
}

func cfgParseObject(data []byte) (cfgObject, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return cfgObject{}, fmt.Errorf("bad JSON: %w", err)
	}
	if m == nil {
		return cfgObject{}, errors.New("bad JSON: not an object")
	}
	return cfgObject{m: m}, nil
}

// present reports whether key is there and not null.
func (o cfgObject) present(key string) bool {
	raw, ok := o.m[key]
	return ok && !cfgIsNull(raw)
}

func cfgIsNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func (o cfgObject) fail(key, format string, args ...any) error {
	return fmt.Errorf("%s%s: %s", o.prefix, key, fmt.Sprintf(format, args...))
}

// decode unmarshals key into dst when present and not null.
func (o cfgObject) decode(key string, dst any) error {
	if !o.present(key) {
		return nil
	}
	if err := json.Unmarshal(o.m[key], dst); err != nil {
		return o.fail(key, "bad value %s: %v", cfgShort(o.m[key]), err)
	}
	return nil
}

func (o cfgObject) object(key string) (cfgObject, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(o.m[key], &m); err != nil || m == nil {
		return cfgObject{}, o.fail(key, "want an object, got %s", cfgShort(o.m[key]))
	}
	return cfgObject{m: m, prefix: o.prefix + key + "."}, nil
}

func (o cfgObject) str(key, def string) (string, error) {
	if !o.present(key) {
		return def, nil
	}
	var s string
	if err := json.Unmarshal(o.m[key], &s); err != nil {
		return "", o.fail(key, "want a string, got %s", cfgShort(o.m[key]))
	}
	return s, nil
}

func (o cfgObject) optBool(key string, def bool) (bool, error) {
	if !o.present(key) {
		return def, nil
	}
	var b bool
	if err := json.Unmarshal(o.m[key], &b); err != nil {
		return false, o.fail(key, "want true or false, got %s", cfgShort(o.m[key]))
	}
	return b, nil
}

// maybeFloat returns the number at key and whether it is there (not null).
func (o cfgObject) maybeFloat(key string) (float64, bool, error) {
	if !o.present(key) {
		return 0, false, nil
	}
	n, ok := cfgNumber(o.m[key])
	if !ok {
		return 0, false, o.fail(key, "want a number, got %s", cfgShort(o.m[key]))
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil || math.IsNaN(f) {
		return 0, false, o.fail(key, "want a number, got %s", n)
	}
	return f, true, nil
}

func (o cfgObject) optFloat(key string, def float64) (float64, error) {
	f, ok, err := o.maybeFloat(key)
	if !ok || err != nil {
		return def, err
	}
	return f, nil
}

func (o cfgObject) maybeInt(key string) (int, bool, error) {
	f, ok, err := o.maybeFloat(key)
	if !ok || err != nil {
		return 0, ok, err
	}
	if f != math.Trunc(f) {
		return 0, false, o.fail(key, "want an integer, got %s", cfgShort(o.m[key]))
	}
	// Sizes and ids reach the kernels as 32-bit integers; bounding them here
	// also keeps the products of two of them (a matrix's elements) in an int.
	if f < math.MinInt32 || f > math.MaxInt32 {
		return 0, false, o.fail(key, "%s is beyond 32-bit integers", cfgShort(o.m[key]))
	}
	return int(f), true, nil
}

func (o cfgObject) optInt(key string, def int) (int, error) {
	v, ok, err := o.maybeInt(key)
	if !ok || err != nil {
		return def, err
	}
	return v, nil
}

func (o cfgObject) reqInt(key string) (int, error) {
	v, ok, err := o.maybeInt(key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, o.fail(key, "missing")
	}
	return v, nil
}

// tokenIDs reads a token id field that may be an int, a list of ints, or
// null/absent (nil).
func (o cfgObject) tokenIDs(key string) ([]int, error) {
	if !o.present(key) {
		return nil, nil
	}
	raw := bytes.TrimSpace(o.m[key])
	elems := []json.RawMessage{raw}
	if len(raw) > 0 && raw[0] == '[' {
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, o.fail(key, "want a token id or a list of them, got %s", cfgShort(raw))
		}
	}
	ids := make([]int, 0, len(elems))
	for _, e := range elems {
		n, ok := cfgNumber(e)
		if !ok {
			return nil, o.fail(key, "want a token id or a list of them, got %s", cfgShort(raw))
		}
		v, err := strconv.ParseInt(n.String(), 10, 32)
		if err != nil || v < 0 {
			return nil, o.fail(key, "bad token id %s", n)
		}
		ids = append(ids, int(v))
	}
	return ids, nil
}

// cfgNumber reads a JSON number (not a string holding one, which
// json.Number would accept).
func cfgNumber(raw json.RawMessage) (json.Number, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == '"' {
		return "", false
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil || n == "" {
		return "", false
	}
	return n, true
}

// optTokenID reads a single token id (an int, a one-element list, or
// null/absent -> nil).
func (o cfgObject) optTokenID(key string) (*int, error) {
	ids, err := o.tokenIDs(key)
	if err != nil {
		return nil, err
	}
	switch len(ids) {
	case 0:
		return nil, nil
	case 1:
		return &ids[0], nil
	}
	return nil, o.fail(key, "want one token id, got %d", len(ids))
}

// cfgShort is raw JSON cut to a length fit for an error message.
func cfgShort(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if s == "" {
		return "(missing)"
	}
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

// cfgSortedKeys is the keys of m, sorted.
func cfgSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
