package model

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/fuselm/fuselm/loader"
)

// checkpointReference is the reference.json scripts/hf_qwen2_7b.py writes
// beside a full-size checkpoint: HF's greedy tokens per prompt, with the
// logits of the last prompt position and of every decode step in a float32
// file ([rows][1+steps][vocab]).
type checkpointReference struct {
	Prompts    [][]int `json:"prompts"`
	Steps      int     `json:"steps"`
	Vocab      int     `json:"vocab"`
	LogitsFile string  `json:"logits_file"`
	Rows       []struct {
		Tokens []int `json:"tokens"`
	} `json:"rows"`
	logits []float32
}

// at returns HF's logits of row b at step i (0: the last prompt position).
func (r *checkpointReference) at(b, i int) []float32 {
	off := (b*(r.Steps+1) + i) * r.Vocab
	return r.logits[off : off+r.Vocab]
}

// The bounds the 7B comparison must meet on the GPU.
const (
	checkpointMaxRelErr = 2e-2
	checkpointMinAgree  = 0.99
)

// TestHFCheckpoint holds a full-size checkpoint ($FUSELM_HF_CHECKPOINT, e.g.
// the random-weight Qwen2-7B of scripts/hf_qwen2_7b.py) on the kernel set of
// $FUSELM_TEST_KERNELS against HF: all prompts as one batch of different
// lengths through prefill, then decode steps fed HF's tokens. Every
// position's logits must be within 2e-2 relative error of HF's, and the
// argmax must agree on at least 99% of positions.
func TestHFCheckpoint(t *testing.T) {
	dir := os.Getenv("FUSELM_HF_CHECKPOINT")
	if dir == "" {
		t.Skip("FUSELM_HF_CHECKPOINT is unset (a checkpoint directory with reference.json from scripts/hf_qwen2_7b.py)")
	}
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref checkpointReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, ref.LogitsFile))
	if err != nil {
		t.Fatal(err)
	}
	B, steps := len(ref.Prompts), ref.Steps
	if len(raw) != 4*B*(steps+1)*ref.Vocab {
		t.Fatalf("%s: %d bytes, want %d rows × %d positions × %d logits", ref.LogitsFile, len(raw), B, steps+1, ref.Vocab)
	}
	ref.logits = make([]float32, len(raw)/4)
	for i := range ref.logits {
		ref.logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}

	cfg, err := loader.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := loader.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	longest := 0
	for _, p := range ref.Prompts {
		longest = max(longest, len(p))
	}
	m := load(t, cfg, w, LoadOptions{MaxRows: B, MaxSeq: longest + steps + 1})
	e := m.base()
	t.Logf("%s on %s: %d prompts of %d..%d tokens, %d decode steps", cfg.Arch, e.dev.Name(), B, len(ref.Prompts[0]), longest, steps)

	var positions, agree int
	var worst, sum float64
	check := func(step int) {
		got := readLogits(t, m, B)
		for b := range B {
			want := ref.at(b, step)
			re := relErr(got[b], want)
			worst, sum = max(worst, re), sum+re
			positions++
			if re > checkpointMaxRelErr || math.IsNaN(re) {
				t.Errorf("row %d (%d prompt tokens), step %d: relative error %.3g > %g", b, len(ref.Prompts[b]), step, re, checkpointMaxRelErr)
			}
			our, hf := argmax(got[b]), argmax(want)
			if our == hf {
				agree++
			} else {
				t.Logf("row %d, step %d: argmax %d, HF %d (HF's logits %.4g and %.4g)", b, step, our, hf, want[our], want[hf])
			}
		}
	}
	if err := prefill(e, ref.Prompts); err != nil {
		t.Fatal(err)
	}
	check(0)
	tokens, past := make([][]int, B), make([]int, B)
	for i := range steps {
		for b, p := range ref.Prompts {
			tokens[b] = []int{ref.Rows[b].Tokens[i]}
			past[b] = len(p) + i
		}
		s, err := e.newStep(0, tokens, past, true, B)
		if err != nil {
			t.Fatal(err)
		}
		decodeOne(e, s, false)
		check(i + 1)
	}
	frac := float64(agree) / float64(positions)
	t.Logf("%d positions: relative error mean %.3g, largest %.3g (bound %g); argmax agrees on %d (%.2f%%, bound %.0f%%)",
		positions, sum/float64(positions), worst, checkpointMaxRelErr, agree, 100*frac, 100*checkpointMinAgree)
	if frac < checkpointMinAgree {
		t.Errorf("argmax agrees with HF on %.2f%% of positions, want at least %.0f%%", 100*frac, 100*checkpointMinAgree)
	}
}
