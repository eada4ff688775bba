package model

import (
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// A generation keeps its decode graph for the next one of the same batch,
// which replays it from its first decode step without recording one
// (from its second with EagerFirstStep, which an events profile asks): the
// tokens are an eager generation's, for other prompts too (the decode ops
// read lengths and positions on the device). A graph is recorded again
// where the kept one does not fit: after the ops change their kernels
// (Switch), after device memory was given back (a Free), for another way of
// choosing tokens or another number of rows, and under a profile that
// traces kernels. Every graph is closed once, the last when the model is.
func TestGraphKept(t *testing.T) {
	for _, name := range f32Fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			eager := loadCPU(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})

			m, dev, built, prof := loadGraphed(t, cfg, w, false)
			spec, _ := kernels.ParseSpec("cpu")
			greedy := GenerateOptions{MaxNewTokens: 9, EOS: []int{}, Profile: prof}
			sampled := greedy
			sampled.Sampling = Sampling{Temperature: 1, Seed: 3}
			eagerFirst := greedy
			eagerFirst.EagerFirstStep = true
			other := [][]int{{3, 9, 27, 81}, {200, 100}, {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}, {42, 43}}

			steps := []struct {
				what     string
				prompts  [][]int
				opt      GenerateOptions
				before   func()
				kept     bool
				captures int // by the end of the step
			}{
				{what: "first", prompts: testPrompts, opt: greedy, captures: 1},
				{what: "same prompts", prompts: testPrompts, opt: greedy, kept: true, captures: 1},
				{what: "other prompts", prompts: other, opt: greedy, kept: true, captures: 1},
				{what: "first step eager", prompts: testPrompts, opt: eagerFirst, kept: true, captures: 1},
				{what: "after Switch", prompts: testPrompts, opt: greedy, captures: 2,
					before: func() {
						if err := built.Switch(spec); err != nil {
							t.Fatal(err)
						}
					}},
				{what: "after a Free", prompts: testPrompts, opt: greedy, captures: 3,
					before: func() { dev.Free(dev.Alloc(kernels.F32, 4)) }},
				{what: "sampled", prompts: testPrompts, opt: sampled, captures: 4},
				{what: "sampled again", prompts: other, opt: sampled, kept: true, captures: 4},
				{what: "greedy again", prompts: testPrompts, opt: greedy, captures: 5},
				{what: "three rows", prompts: other[:3], opt: greedy, captures: 6},
				{what: "three rows again", prompts: testPrompts[:3], opt: greedy, kept: true, captures: 6},
			}
			for _, st := range steps {
				if st.before != nil {
					st.before()
				}
				want := generate(t, eager, st.prompts, st.opt)
				got := generate(t, m, st.prompts, st.opt)
				if !slices.EqualFunc(got.Tokens, want.Tokens, slices.Equal) {
					t.Errorf("%s: tokens %v, eager %v", st.what, got.Tokens, want.Tokens)
				}
				// A kept graph replays every step; one recorded in the
				// generation, or EagerFirstStep, leaves the first eager.
				replays := got.DecodeSteps - 1
				if st.kept && !st.opt.EagerFirstStep {
					replays = got.DecodeSteps
				}
				if got.GraphKept != st.kept || dev.captures != st.captures || got.GraphReplays != replays {
					t.Errorf("%s: kept %v, %d graphs recorded, %d replays of %d steps; want kept %v, %d recorded, %d replayed",
						st.what, got.GraphKept, dev.captures, got.GraphReplays, got.DecodeSteps, st.kept, st.captures, replays)
				}
				if dev.closes != dev.captures-1 {
					t.Errorf("%s: %d of %d graphs closed, want all but the one kept", st.what, dev.closes, dev.captures)
				}
			}

			// A profile that traces kernels attributes a replay's kernels to
			// the calls captured in its own generation: every generation
			// records its graph, and keeps none.
			traced := profile.New(tracingDevice{dev})
			if err := traced.TraceKernels(); err != nil {
				t.Fatal(err)
			}
			opt := greedy
			opt.Profile = traced
			for i := range 2 {
				was := dev.captures
				got := generate(t, m, testPrompts, opt)
				if got.GraphKept || dev.captures != was+1 || dev.closes != dev.captures {
					t.Errorf("traced generation %d: kept %v, %d graphs recorded, %d closed", i, got.GraphKept, dev.captures-was, dev.closes)
				}
			}
			generate(t, m, testPrompts, greedy) // one to keep
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if dev.closes != dev.captures {
				t.Errorf("after Close: %d of %d graphs closed", dev.closes, dev.captures)
			}
		})
	}
}

// tracingDevice is a graphDevice that says it traces kernels and records
// none.
type tracingDevice struct{ *graphDevice }

func (tracingDevice) StartKernelTrace() error { return nil }
func (tracingDevice) TraceID(uint64)          {}
func (tracingDevice) KernelRecords() ([]profile.KernelRecord, string, error) {
	return nil, "", nil
}
func (tracingDevice) StopKernelTrace() error { return nil }
