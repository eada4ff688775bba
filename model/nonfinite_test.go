package model

import (
	"math"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// poisonNorm writes NaN into the final norm's weight of a model on the f32
// cpu device, as a checkpoint with NaN in model.norm.weight has it.
func poisonNorm(t *testing.T, m Model) {
	t.Helper()
	w := cpu.F32(m.base().norm.Weight)
	for i := range w {
		w[i] = float32(math.NaN())
	}
}

// Non-finite logits stop generation with an error naming the step, greedy
// or sampled, whether they appear at the prefill or later.
func TestNonFiniteLogits(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	for _, c := range []struct {
		name     string
		sampling Sampling
		at       int // the step after which the norm turns NaN; 0: from the start
		want     string
		stepwise bool // on a device without ReadI32Later: greedy reads each choice before it queues the next step
	}{
		{"greedy", Sampling{}, 0, "step 1 (prefill): row 0's logits are not finite (the largest is NaN)", false},
		{"sampled", Sampling{Temperature: 0.8, Seed: 1}, 0, "step 1 (prefill): row 0's logits are not finite", false},
		// Greedy decode queues a step before it reads the choice of the one
		// before (decodeQueued): what OnStep changes after token 3 reaches
		// the step that chooses token 5, unless it reads step by step.
		{"greedy later", Sampling{}, 3, "step 5 (decode): row 0's logits are not finite", false},
		{"greedy later, step by step", Sampling{}, 3, "step 4 (decode): row 0's logits are not finite", true},
		{"sampled later", Sampling{Temperature: 0.8, TopK: 5}, 2, "step 3 (decode): row 0's logits are not finite", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev, ops := cpuOps(t)
			var d kernels.Device = dev
			if c.stepwise {
				d = hiddenLater{dev}
			}
			m := loadOn(t, d, ops, cfg, w, LoadOptions{MaxRows: 2, MaxSeq: 32})
			if c.at == 0 {
				poisonNorm(t, m)
			}
			opt := GenerateOptions{MaxNewTokens: 10, EOS: []int{}, Sampling: c.sampling,
				OnStep: func(e StepEvent) {
					if e.Step == c.at {
						poisonNorm(t, m)
					}
				}}
			gen, err := Generate(m, [][]int{{5, 6, 7}, {9}}, opt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Generate: %v, %v; want an error with %q", gen, err, c.want)
			}
		})
	}
}

// The sampler refuses logits with a NaN or +inf, or none above -inf.
func TestSamplerNonFinite(t *testing.T) {
	sm := newSampler(Sampling{Temperature: 1}, 0)
	inf := float32(math.Inf(1))
	for _, logits := range [][]float32{
		{0, float32(math.NaN()), 1},
		{0, inf, 1},
		{-inf, -inf},
	} {
		if got := sm.sample(logits); got != -1 {
			t.Errorf("sample(%v) = %d, want -1", logits, got)
		}
	}
	if got := sm.sample([]float32{-inf, 2, -inf}); got != 1 {
		t.Errorf("sample with masked logits = %d, want 1", got)
	}
}

// argmax counts a NaN as the largest, as torch.argmax does.
func TestArgmaxNaN(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		v    []float32
		want int
	}{
		{[]float32{1, 3, 3, 2}, 1},
		{[]float32{1, nan, 2, nan}, 1},
		{[]float32{nan, 5}, 0},
		{[]float32{1, inf, nan}, 2},
		{[]float32{-inf, -inf}, 0},
	} {
		if got := argmax(c.v); got != c.want {
			t.Errorf("argmax(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}
