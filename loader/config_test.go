package loader

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// cfgTestDir is the repository's shared testdata.
const cfgTestDir = "../testdata"

func cfgIntp(v int) *int           { return &v }
func cfgFloatp(v float64) *float64 { return &v }
func cfgBoolp(v bool) *bool        { return &v }
func cfgTestRead(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cfgTestDir, "configs", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// cfgTestLoad writes data as config.json of a fresh directory and loads it.
func cfgTestLoad(t *testing.T, data []byte) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadConfig(dir)
}

var cfgQwen27B = &Config{
	Arch: ArchQwen2, ModelType: ModelTypeQwen2, DType: "bfloat16",
	VocabSize: 152064, HiddenSize: 3584, IntermediateSize: 18944,
	NumLayers: 28, NumHeads: 28, NumKVHeads: 4, HeadDim: 128, MaxPositions: 131072,
	RMSNormEps: 1e-6, TieWordEmbeddings: false, HiddenAct: "silu",
	Rope: Rope{Type: RopeDefault, Theta: 1e6, Dim: 128, Factor: 1, OriginalMaxPositions: 131072},
	BOS:  cfgIntp(151643), EOS: []int{151643},
	Qwen2: &Qwen2Config{QKVBias: true, OBias: false},
}

var cfgDeepseekV2Lite = &Config{
	Arch: ArchDeepseekV2, ModelType: ModelTypeDeepseekV2, DType: "bfloat16",
	VocabSize: 102400, HiddenSize: 2048, IntermediateSize: 10944,
	NumLayers: 27, NumHeads: 16, NumKVHeads: 16, HeadDim: 192, MaxPositions: 163840,
	RMSNormEps: 1e-6, TieWordEmbeddings: false, HiddenAct: "silu",
	Rope: Rope{
		Type: RopeYarn, Theta: 10000, Dim: 64, Factor: 40, OriginalMaxPositions: 4096,
		BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDim: 0.707, HasMScale: true, HasMScaleAllDim: true,
	},
	BOS: cfgIntp(100000), EOS: []int{100001},
	DeepSeek: &DeepseekV2Config{
		QLoraRank: 0, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, QKHeadDim: 192, VHeadDim: 128,
		AttentionBias: false, FirstKDenseReplace: 1, MoELayerFreq: 1, NRoutedExperts: 64, NSharedExperts: 2,
		NumExpertsPerTok: 6, MoEIntermediateSize: 1408, TopkMethod: TopkGreedy, NGroup: 1, TopkGroup: 1,
		NormTopkProb: false, RoutedScalingFactor: 1, ScoringFunc: "softmax",
	},
}

// TestLoadConfigHub loads the hub's config.json of Qwen2-7B and
// DeepSeek-V2-Lite (transformers 4.x dialect) and their transformers 5.x
// rewrites; both dialects must give the same Config.
func TestLoadConfigHub(t *testing.T) {
	for _, tc := range []struct {
		files []string
		want  *Config
	}{
		{[]string{"qwen2-7b.json", "qwen2-7b.v5.json"}, cfgQwen27B},
		{[]string{"deepseek-v2-lite.json", "deepseek-v2-lite.v5.json"}, cfgDeepseekV2Lite},
	} {
		for _, f := range tc.files {
			t.Run(f, func(t *testing.T) {
				c, err := cfgTestLoad(t, cfgTestRead(t, f))
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(c, tc.want) {
					gj, _ := json.MarshalIndent(c, "", " ")
					wj, _ := json.MarshalIndent(tc.want, "", " ")
					t.Errorf("got\n%s\nwant\n%s", gj, wj)
				}
			})
		}
	}
	d := cfgDeepseekV2Lite.DeepSeek
	if d.IsMoELayer(0) || !d.IsMoELayer(1) || !d.IsMoELayer(26) {
		t.Error("IsMoELayer: want layer 0 dense, 1..26 MoE")
	}
}

// cfgEdit loads a testdata config as a map, applies edits (a nil value
// deletes the key; "a.b" reaches into an object), and returns the JSON.
func cfgEdit(t *testing.T, file string, edits map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(cfgTestRead(t, file), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range edits {
		obj := m
		if i := strings.IndexByte(k, '.'); i >= 0 {
			obj = m[k[:i]].(map[string]any)
			k = k[i+1:]
		}
		if v == nil {
			delete(obj, k)
		} else if v == "null" {
			obj[k] = nil
		} else {
			obj[k] = v
		}
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestLoadConfigVariants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		edits map[string]any
		check func(t *testing.T, c *Config)
	}{
		{"eos list", "qwen2-7b.json", map[string]any{"eos_token_id": []int{151643, 151645}, "bos_token_id": "null"},
			func(t *testing.T, c *Config) {
				if !reflect.DeepEqual(c.EOS, []int{151643, 151645}) || c.BOS != nil {
					t.Errorf("EOS %v BOS %v", c.EOS, c.BOS)
				}
			}},
		{"ids absent", "qwen2-7b.json", map[string]any{"eos_token_id": nil, "bos_token_id": nil},
			func(t *testing.T, c *Config) {
				if c.EOS != nil || c.BOS != nil {
					t.Errorf("EOS %v BOS %v", c.EOS, c.BOS)
				}
			}},
		{"model_type fallback qwen2", "qwen2-7b.json", map[string]any{"architectures": nil},
			func(t *testing.T, c *Config) {
				if c.Arch != ArchQwen2 {
					t.Errorf("Arch %q", c.Arch)
				}
			}},
		{"model_type fallback deepseek", "deepseek-v2-lite.json", map[string]any{"architectures": []string{}},
			func(t *testing.T, c *Config) {
				if c.Arch != ArchDeepseekV2 {
					t.Errorf("Arch %q", c.Arch)
				}
			}},
		{"kv heads default", "qwen2-7b.json", map[string]any{"num_key_value_heads": nil},
			func(t *testing.T, c *Config) {
				if c.NumKVHeads != 28 {
					t.Errorf("NumKVHeads %d", c.NumKVHeads)
				}
			}},
		{"explicit head_dim", "qwen2-7b.json", map[string]any{"head_dim": 64},
			func(t *testing.T, c *Config) {
				if c.HeadDim != 64 || c.Rope.Dim != 64 {
					t.Errorf("HeadDim %d Rope.Dim %d", c.HeadDim, c.Rope.Dim)
				}
			}},
		{"no dtype", "qwen2-7b.json", map[string]any{"torch_dtype": nil},
			func(t *testing.T, c *Config) {
				if c.DType != "" {
					t.Errorf("DType %q", c.DType)
				}
			}},
		{"dtype wins over torch_dtype", "qwen2-7b.json", map[string]any{"dtype": "float16"},
			func(t *testing.T, c *Config) {
				if c.DType != "float16" {
					t.Errorf("DType %q", c.DType)
				}
			}},
		{"qwen2 yarn 4.x", "qwen2-7b.json", map[string]any{"rope_scaling": map[string]any{
			"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
			func(t *testing.T, c *Config) {
				want := Rope{Type: RopeYarn, Theta: 1e6, Dim: 128, Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1}
				if !reflect.DeepEqual(c.Rope, want) {
					t.Errorf("Rope %+v, want %+v", c.Rope, want)
				}
			}},
		{"yarn 5.x optional fields", "qwen2-7b.v5.json", map[string]any{"rope_parameters": map[string]any{
			"rope_type": "yarn", "rope_theta": 5e5, "original_max_position_embeddings": 32768,
			"attention_factor": 1.25, "truncate": false, "beta_fast": 16, "beta_slow": 2}},
			func(t *testing.T, c *Config) {
				want := Rope{Type: RopeYarn, Theta: 5e5, Dim: 128, Factor: 4, OriginalMaxPositions: 32768,
					BetaFast: 16, BetaSlow: 2, AttentionFactor: cfgFloatp(1.25), Truncate: cfgBoolp(false)}
				if !reflect.DeepEqual(c.Rope, want) {
					t.Errorf("Rope %+v, want %+v", c.Rope, want)
				}
			}},
		{"rope_parameters per layer type", "qwen2-7b.v5.json", map[string]any{"rope_parameters": map[string]any{
			"full_attention": map[string]any{"rope_type": "default", "rope_theta": 123.0}}},
			func(t *testing.T, c *Config) {
				if c.Rope.Theta != 123 || c.Rope.Type != RopeDefault {
					t.Errorf("Rope %+v", c.Rope)
				}
			}},
		{"rope_scaling rope_type key", "deepseek-v2-lite.json", map[string]any{"rope_scaling.type": nil, "rope_scaling.rope_type": "yarn"},
			func(t *testing.T, c *Config) {
				if !reflect.DeepEqual(c.Rope, cfgDeepseekV2Lite.Rope) {
					t.Errorf("Rope %+v", c.Rope)
				}
			}},
		{"rope absent", "qwen2-7b.json", map[string]any{"rope_theta": nil},
			func(t *testing.T, c *Config) {
				if c.Rope.Theta != 10000 || c.Rope.Type != RopeDefault {
					t.Errorf("Rope %+v", c.Rope)
				}
			}},
		{"deepseek q_lora and group limited", "deepseek-v2-lite.json", map[string]any{
			"q_lora_rank": 1536, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
			"n_shared_experts": "null", "moe_layer_freq": nil, "scoring_func": nil, "routed_scaling_factor": 16.0,
			"norm_topk_prob": true, "attention_bias": true, "first_k_dense_replace": 0},
			func(t *testing.T, c *Config) {
				d := c.DeepSeek
				if d.QLoraRank != 1536 || d.TopkMethod != TopkGroupLimitedGreedy || d.NGroup != 8 || d.TopkGroup != 3 ||
					d.NSharedExperts != 0 || d.MoELayerFreq != 1 || d.ScoringFunc != "softmax" || d.RoutedScalingFactor != 16 ||
					!d.NormTopkProb || !d.AttentionBias || !d.IsMoELayer(0) {
					t.Errorf("%+v", d)
				}
			}},
		{"deepseek moe_layer_freq", "deepseek-v2-lite.json", map[string]any{"moe_layer_freq": 2},
			func(t *testing.T, c *Config) {
				d := c.DeepSeek
				if d.IsMoELayer(0) || d.IsMoELayer(1) || !d.IsMoELayer(2) || d.IsMoELayer(3) {
					t.Errorf("IsMoELayer wrong for freq 2")
				}
			}},
		{"deepseek dense", "deepseek-v2-lite.json", map[string]any{"n_routed_experts": "null", "num_experts_per_tok": "null"},
			func(t *testing.T, c *Config) {
				if c.DeepSeek.IsMoELayer(5) {
					t.Error("MoE layer without routed experts")
				}
			}},
		{"deepseek yarn without factor", "deepseek-v2-lite.v5.json", map[string]any{"rope_parameters.factor": nil, "rope_parameters.mscale": nil},
			func(t *testing.T, c *Config) {
				if c.Rope.Factor != 40 || c.Rope.HasMScale || !c.Rope.HasMScaleAllDim {
					t.Errorf("Rope %+v", c.Rope)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cfgTestLoad(t, cfgEdit(t, tc.file, tc.edits))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		edits map[string]any
		want  []string // substrings of the error
	}{
		{"sliding window", "qwen2-7b.json", map[string]any{"use_sliding_window": true}, []string{"use_sliding_window", "not supported"}},
		{"sliding layer type", "qwen2-7b.v5.json", map[string]any{"layer_types": append(make([]any, 27), "sliding_attention")}, []string{"layer_types"}},
		{"hidden_act", "qwen2-7b.json", map[string]any{"hidden_act": "gelu"}, []string{"hidden_act", "gelu", "silu"}},
		{"architecture", "qwen2-7b.json", map[string]any{"architectures": []string{"LlamaForCausalLM"}}, []string{"LlamaForCausalLM", ArchQwen2, ArchDeepseekV2}},
		{"model_type only", "qwen2-7b.json", map[string]any{"architectures": nil, "model_type": "llama"}, []string{"llama", ArchQwen2, ArchDeepseekV2}},
		{"model_type mismatch", "qwen2-7b.json", map[string]any{"model_type": "qwen2_moe"}, []string{"model_type", "qwen2_moe"}},
		{"rope dynamic", "qwen2-7b.json", map[string]any{"rope_scaling": map[string]any{"type": "dynamic", "factor": 2.0}}, []string{"dynamic", "default, yarn"}},
		{"rope llama3", "qwen2-7b.v5.json", map[string]any{"rope_parameters.rope_type": "llama3"}, []string{"rope_parameters", "llama3", "default, yarn"}},
		{"partial rotary", "qwen2-7b.v5.json", map[string]any{"rope_parameters.partial_rotary_factor": 0.5}, []string{"partial_rotary_factor"}},
		{"rope theta", "qwen2-7b.json", map[string]any{"rope_theta": -1}, []string{"rope_theta"}},
		{"yarn factor", "deepseek-v2-lite.json", map[string]any{"rope_scaling.factor": 0}, []string{"rope_scaling.factor"}},
		{"topk noaux_tc", "deepseek-v2-lite.json", map[string]any{"topk_method": "noaux_tc"}, []string{"topk_method", "noaux_tc", "greedy"}},
		{"scoring sigmoid", "deepseek-v2-lite.json", map[string]any{"scoring_func": "sigmoid"}, []string{"scoring_func", "sigmoid"}},
		{"heads vs kv heads", "qwen2-7b.json", map[string]any{"num_key_value_heads": 5}, []string{"num_attention_heads", "num_key_value_heads"}},
		{"deepseek kv heads", "deepseek-v2-lite.json", map[string]any{"num_key_value_heads": 8}, []string{"num_key_value_heads"}},
		{"negative hidden", "qwen2-7b.json", map[string]any{"hidden_size": -8}, []string{"hidden_size", "positive"}},
		{"missing vocab", "qwen2-7b.json", map[string]any{"vocab_size": nil}, []string{"vocab_size", "missing"}},
		{"string layers", "qwen2-7b.json", map[string]any{"num_hidden_layers": "28"}, []string{"num_hidden_layers"}},
		{"fractional size", "qwen2-7b.json", map[string]any{"intermediate_size": 1.5}, []string{"intermediate_size", "integer"}},
		{"huge size", "qwen2-7b.json", map[string]any{"hidden_size": 1e12}, []string{"hidden_size", "beyond 32-bit"}},
		{"huge positions", "qwen2-7b.json", map[string]any{"max_position_embeddings": 1 << 40}, []string{"max_position_embeddings", "beyond 32-bit"}},
		{"huge eos", "qwen2-7b.json", map[string]any{"eos_token_id": []int64{1, 1 << 33}}, []string{"eos_token_id"}},
		{"dtype", "qwen2-7b.json", map[string]any{"torch_dtype": "float64"}, []string{"torch_dtype", "float64"}},
		{"eps", "qwen2-7b.json", map[string]any{"rms_norm_eps": 0}, []string{"rms_norm_eps"}},
		{"qk_head_dim", "deepseek-v2-lite.json", map[string]any{"qk_head_dim": 128}, []string{"qk_head_dim"}},
		{"kv_lora_rank", "deepseek-v2-lite.json", map[string]any{"kv_lora_rank": nil}, []string{"kv_lora_rank", "missing"}},
		{"q_lora_rank", "deepseek-v2-lite.json", map[string]any{"q_lora_rank": -1}, []string{"q_lora_rank"}},
		{"experts per tok", "deepseek-v2-lite.json", map[string]any{"num_experts_per_tok": 65}, []string{"num_experts_per_tok"}},
		{"n_group", "deepseek-v2-lite.json", map[string]any{"topk_method": "group_limited_greedy", "n_group": 3}, []string{"n_group"}},
		{"topk_group", "deepseek-v2-lite.json", map[string]any{"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 9}, []string{"topk_group"}},
		{"first_k_dense", "deepseek-v2-lite.json", map[string]any{"first_k_dense_replace": 28}, []string{"first_k_dense_replace"}},
		{"mlp_bias", "deepseek-v2-lite.v5.json", map[string]any{"mlp_bias": true}, []string{"mlp_bias"}},
		{"bos list", "qwen2-7b.json", map[string]any{"bos_token_id": []int{1, 2}}, []string{"bos_token_id"}},
		{"eos bad", "qwen2-7b.json", map[string]any{"eos_token_id": "x"}, []string{"eos_token_id"}},
		{"rope_scaling not object", "qwen2-7b.json", map[string]any{"rope_scaling": 3}, []string{"rope_scaling"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cfgTestLoad(t, cfgEdit(t, tc.file, tc.edits))
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "loader: ") || !strings.Contains(msg, "config.json") {
				t.Errorf("error %q: want the loader: prefix and the file", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q: want %q in it", msg, w)
				}
			}
		})
	}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadConfig(dir)
	if err == nil || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("no config.json: %v", err)
	}
	for _, bad := range []string{"", "{", "[1,2]", "null"} {
		if _, err := cfgTestLoad(t, []byte(bad)); err == nil || !strings.Contains(err.Error(), "bad JSON") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestLoadGenerationConfig(t *testing.T) {
	dir := t.TempDir()
	g, err := LoadGenerationConfig(dir)
	if g != nil || err != nil {
		t.Fatalf("absent: %v, %v", g, err)
	}
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
		"eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
		"top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}`)
	g, err = LoadGenerationConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := &GenerationConfig{BOS: cfgIntp(151643), PAD: cfgIntp(151643), EOS: []int{151645, 151643},
		DoSample: cfgBoolp(true), RepetitionPenalty: cfgFloatp(1.05), Temperature: cfgFloatp(0.7),
		TopP: cfgFloatp(0.8), TopK: cfgIntp(20)}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("got %+v, want %+v", g, want)
	}
	write(`{"bos_token_id": 100000, "eos_token_id": 100001, "pad_token_id": null}`)
	if g, err = LoadGenerationConfig(dir); err != nil || *g.BOS != 100000 || !reflect.DeepEqual(g.EOS, []int{100001}) || g.PAD != nil {
		t.Errorf("got %+v, %v", g, err)
	}
	write(`{"eos_token_id": "x"}`)
	if _, err = LoadGenerationConfig(dir); err == nil || !strings.Contains(err.Error(), "eos_token_id") ||
		!strings.Contains(err.Error(), "generation_config.json") {
		t.Errorf("bad eos: %v", err)
	}
	write(`{`)
	if _, err = LoadGenerationConfig(dir); err == nil {
		t.Error("bad JSON: no error")
	}
}
