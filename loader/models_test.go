package loader

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

// modelsTestWants lists the tensors a Hugging Face checkpoint of c holds,
// with their shapes, as transformers names them.
func modelsTestWants(c *Config) []Want {
	H, V := c.HiddenSize, c.VocabSize
	ws := []Want{{"model.embed_tokens.weight", []int{V, H}}, {"model.norm.weight", []int{H}}}
	if !c.TieWordEmbeddings {
		ws = append(ws, Want{"lm_head.weight", []int{V, H}})
	}
	mlp := func(prefix string, inter int) {
		ws = append(ws,
			Want{prefix + ".gate_proj.weight", []int{inter, H}},
			Want{prefix + ".up_proj.weight", []int{inter, H}},
			Want{prefix + ".down_proj.weight", []int{H, inter}})
	}
	for i := range c.NumLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		ws = append(ws, Want{p + "input_layernorm.weight", []int{H}}, Want{p + "post_attention_layernorm.weight", []int{H}})
		a := p + "self_attn."
		switch {
		case c.Qwen2 != nil:
			q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
			ws = append(ws,
				Want{a + "q_proj.weight", []int{q, H}}, Want{a + "q_proj.bias", []int{q}},
				Want{a + "k_proj.weight", []int{kv, H}}, Want{a + "k_proj.bias", []int{kv}},
				Want{a + "v_proj.weight", []int{kv, H}}, Want{a + "v_proj.bias", []int{kv}},
				Want{a + "o_proj.weight", []int{H, q}})
			mlp(p+"mlp", c.IntermediateSize)
		case c.DeepSeek != nil:
			d := c.DeepSeek
			if d.QLoraRank > 0 {
				ws = append(ws,
					Want{a + "q_a_proj.weight", []int{d.QLoraRank, H}},
					Want{a + "q_a_layernorm.weight", []int{d.QLoraRank}},
					Want{a + "q_b_proj.weight", []int{c.NumHeads * d.QKHeadDim, d.QLoraRank}})
				if d.AttentionBias {
					ws = append(ws, Want{a + "q_a_proj.bias", []int{d.QLoraRank}})
				}
			} else {
				ws = append(ws, Want{a + "q_proj.weight", []int{c.NumHeads * d.QKHeadDim, H}})
			}
			ws = append(ws,
				Want{a + "kv_a_proj_with_mqa.weight", []int{d.KVLoraRank + d.QKRopeHeadDim, H}},
				Want{a + "kv_a_layernorm.weight", []int{d.KVLoraRank}},
				Want{a + "kv_b_proj.weight", []int{c.NumHeads * (d.QKNopeHeadDim + d.VHeadDim), d.KVLoraRank}},
				Want{a + "o_proj.weight", []int{H, c.NumHeads * d.VHeadDim}})
			if d.AttentionBias {
				ws = append(ws,
					Want{a + "kv_a_proj_with_mqa.bias", []int{d.KVLoraRank + d.QKRopeHeadDim}},
					Want{a + "o_proj.bias", []int{H}})
			}
			if !d.IsMoELayer(i) {
				mlp(p+"mlp", c.IntermediateSize)
				continue
			}
			ws = append(ws, Want{p + "mlp.gate.weight", []int{d.NRoutedExperts, H}})
			for e := range d.NRoutedExperts {
				mlp(fmt.Sprintf("%smlp.experts.%d", p, e), d.MoEIntermediateSize)
			}
			if d.NSharedExperts > 0 {
				mlp(p+"mlp.shared_experts", d.MoEIntermediateSize*d.NSharedExperts)
			}
		}
	}
	return ws
}

// TestModels loads every tiny checkpoint of testdata/models (written by
// transformers save_pretrained): config, generation config and weights,
// which must be exactly the tensors the config implies.
func TestModels(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(cfgTestDir, "models", "*"))
	n := 0
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			continue
		}
		n++
		t.Run(filepath.Base(dir), func(t *testing.T) {
			got, err := Resolve(dir)
			if err != nil || got != dir {
				t.Fatalf("Resolve: %q, %v", got, err)
			}
			c, err := LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			g, err := LoadGenerationConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			if g != nil && !reflect.DeepEqual(g.EOS, c.EOS) {
				t.Errorf("generation_config eos %v, config eos %v", g.EOS, c.EOS)
			}
			w, err := OpenWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			wants := modelsTestWants(c)
			if err := w.Check(wants); err != nil {
				t.Error(err)
			}
			var names []string
			for _, wt := range wants {
				names = append(names, wt.Name)
			}
			sort.Strings(names)
			if !reflect.DeepEqual(names, w.Names()) {
				t.Errorf("tensors differ from those the config implies: %d wanted, %d present", len(names), len(w.Names()))
			}
			wantDType := map[string]string{"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[c.DType]
			for _, name := range w.Names() {
				if ti, _ := w.Get(name); ti.SafeDType != wantDType {
					t.Errorf("%s: dtype %s, config says %s", name, ti.SafeDType, c.DType)
					break
				}
			}
			t.Logf("%s %s dtype=%s rope=%s tied=%v: %d tensors, %d bytes", c.Arch, filepath.Base(dir), c.DType,
				c.Rope.Type, c.TieWordEmbeddings, len(w.Names()), w.TotalBytes())
		})
	}
	if n == 0 {
		t.Skip("no checkpoints under testdata/models")
	}
}
