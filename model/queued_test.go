package model

import (
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// hiddenLater is a device without ReadI32Later: Generate then reads each
// step's choice before it queues the next, as it does when sampling.
type hiddenLater struct{ kernels.Device }

// countedAdvance counts the DecodeAdvance calls of its ops.
type countedAdvance struct {
	kernels.Ops
	n *int
}

func (o countedAdvance) DecodeAdvance(ids, pos, past, choice *kernels.Tensor) {
	*o.n++
	o.Ops.DecodeAdvance(ids, pos, past, choice)
}

// Greedy decode with each step's inputs made on the device and the next
// step queued before the host reads the choice (decodeQueued) gives the
// tokens and stops of reading every choice first: rows ending early (at
// most one step run past the last needed, none past MaxNewTokens - 1), and
// a row whose argmax is an end-of-sequence token it may not take yet (the
// step after it run again from the host's choice).
func TestDecodeQueued(t *testing.T) {
	for _, name := range []string{"qwen2-tiny", "deepseek-v2-tiny"} {
		cfg, w, _ := openFixture(t, name)
		dev, ops := cpuOps(t)
		var advances int
		queued := loadOn(t, dev, countedAdvance{ops, &advances}, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
		dev2, ops2 := cpuOps(t)
		read := loadOn(t, hiddenLater{dev2}, ops2, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
		free := generate(t, read, testPrompts, GenerateOptions{MaxNewTokens: 12, EOS: []int{}})
		eos := free.Tokens[0][3]
		for _, opt := range []GenerateOptions{
			{MaxNewTokens: 12, EOS: []int{}},
			{MaxNewTokens: 12, EOS: []int{eos}},                  // row 0 ends at its fourth token
			{MaxNewTokens: 12, MinNewTokens: 8, EOS: []int{eos}}, // its argmax there is overridden
			{MaxNewTokens: 1, EOS: []int{}},
		} {
			advances = 0
			want := generate(t, read, testPrompts, opt)
			got := generate(t, queued, testPrompts, opt)
			if !slices.EqualFunc(got.Tokens, want.Tokens, slices.Equal) || !slices.Equal(got.Stop, want.Stop) {
				t.Errorf("%s %+v: queued %v (%v), read step by step %v (%v)", name, opt, got.Tokens, got.Stop, want.Tokens, want.Stop)
			}
			if got.DecodeSteps != want.DecodeSteps {
				t.Errorf("%s %+v: %d decode steps, read step by step %d", name, opt, got.DecodeSteps, want.DecodeSteps)
			}
			// Each decode step queued once, one past the last needed at most,
			// none past MaxNewTokens - 1; and a step run again where a
			// choice was overridden.
			most := min(want.DecodeSteps+1, opt.MaxNewTokens-1)
			if advances < want.DecodeSteps || opt.MinNewTokens == 0 && advances > most {
				t.Errorf("%s %+v: %d steps queued for %d decode steps (at most %d)", name, opt, advances, want.DecodeSteps, most)
			}
		}
	}
}
