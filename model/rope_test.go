package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/fuselm/fuselm/loader"
)

// hfRope is testdata/hf_rope.json, written by testdata/hf_rope_tables.py
// with transformers 5.17 on the H200.
type hfRope struct {
	Transformers string `json:"transformers"`
	Cases        []struct {
		Name         string          `json:"name"`
		Config       json.RawMessage `json:"config"`
		Positions    []int           `json:"positions"`
		Cos          [][]float64     `json:"cos"`
		Sin          [][]float64     `json:"sin"`
		SoftmaxScale *float64        `json:"softmax_scale"`
	} `json:"cases"`
}

// The rotary tables are HF's at positions up to 32767, for the default and
// YaRN types of both architectures, and DeepSeek-V2's softmax scale is
// DeepseekV2Attention.scaling. Tables computed in float64 instead of HF's
// float32 steps are off by up to 4.8e-4 on these cases.
func TestRopeMatchesHF(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "hf_rope.json"))
	if err != nil {
		t.Skipf("no HF rope tables (write them with testdata/hf_rope_tables.py): %v", err)
	}
	var ref hfRope
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg, err := loader.ParseConfig(c.Config)
			if err != nil {
				t.Fatal(err)
			}
			dim := cfg.HeadDim
			if cfg.DeepSeek != nil {
				dim = cfg.DeepSeek.QKRopeHeadDim
			}
			inv, factor, err := ropeInvFreq(&cfg.Rope, dim)
			if err != nil {
				t.Fatal(err)
			}
			maxPos := c.Positions[len(c.Positions)-1] + 1
			cos, sin := ropeTables(inv, factor, maxPos)
			half := dim / 2
			worst := 0.0
			for j, p := range c.Positions {
				for k := range half {
					for _, pair := range [][2]float64{
						{float64(cos[p*half+k]), c.Cos[j][k]},
						{float64(sin[p*half+k]), c.Sin[j][k]},
					} {
						worst = max(worst, math.Abs(pair[0]-pair[1]))
					}
				}
			}
			// CUDA's and Go's cos and sin of the same float32 angle differ by
			// a unit in the last place or two, and torch's float32 pow may
			// differ from the correctly rounded one by one: at position
			// 32767 that moves the angle by one unit (9.5e-7).
			if worst > 2e-6 {
				t.Errorf("largest difference from HF's table %.3g", worst)
			}
			if c.SoftmaxScale != nil {
				got := yarnSoftmaxScale(&cfg.Rope, cfg.DeepSeek.QKNopeHeadDim+cfg.DeepSeek.QKRopeHeadDim)
				if math.Abs(got-*c.SoftmaxScale) > 1e-12 {
					t.Errorf("softmax scale %.17g, HF %.17g", got, *c.SoftmaxScale)
				}
			}
		})
	}
}
