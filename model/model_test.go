package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/loader"
)

// The invariants below run on the f32 fixtures of both architectures, whose
// logits the CPU reproduces to ~1e-6 of HF's (TestHFReference).
var f32Fixtures = []string{"qwen2-tiny", "deepseek-v2-tiny", "deepseek-v2-tiny-qlora"}

// testPrompts are prompts of different lengths within the fixtures' vocabulary.
var testPrompts = [][]int{
	{17, 300, 4, 88, 250, 9, 121},
	{5, 6},
	{400, 401, 402, 33, 2, 78, 190, 77, 300, 12, 44},
	{99},
}

// prefillLogits runs prompts as one batch through prefill and returns the
// logits of each prompt's last token.
func prefillLogits(t *testing.T, m Model, prompts [][]int) [][]float32 {
	t.Helper()
	if err := prefill(m.base(), prompts); err != nil {
		t.Fatal(err)
	}
	return readLogits(t, m, len(prompts))
}

// decodeLogits feeds tokens[b] to row b, whose cache holds past[b] tokens,
// and returns the logits.
func decodeLogits(t *testing.T, m Model, tokens []int, past []int) [][]float32 {
	t.Helper()
	e := m.base()
	in := make([][]int, len(tokens))
	for b, tok := range tokens {
		in[b] = []int{tok}
	}
	s, err := e.newStep(0, in, past, true, len(tokens))
	if err != nil {
		t.Fatal(err)
	}
	decodeOne(e, s, false)
	return readLogits(t, m, len(tokens))
}

// expectClose checks two runs of the same model on one device agree: to
// f32 rounding, or within bf16's when activations are bf16 (kernels may
// split work differently for different batches).
func expectClose(t *testing.T, m Model, what string, got, want []float32) {
	t.Helper()
	tol := 1e-5
	if m.Device().ActDType() != kernels.F32 {
		tol = 2e-2
	}
	if re := relErr(got, want); !(re <= tol) {
		t.Errorf("%s: relative error %.3g > %g", what, re, tol)
	}
}

// A row's logits do not depend on the other rows of its batch: a batch of
// prompts of different lengths gives each row what it gets alone, in the
// prefill and in the decode steps after it.
func TestBatchEqualsAlone(t *testing.T) {
	for _, name := range f32Fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			m := load(t, cfg, w, LoadOptions{MaxRows: len(testPrompts), MaxSeq: 16})
			batch := prefillLogits(t, m, testPrompts)
			next := []int{3, 500, 42, 7}
			past := make([]int, len(testPrompts))
			for b, p := range testPrompts {
				past[b] = len(p)
			}
			batchNext := decodeLogits(t, m, next, past)

			one := load(t, cfg, w, LoadOptions{MaxRows: 1, MaxSeq: 16})
			for b, p := range testPrompts {
				expectClose(t, one, fmt.Sprintf("prefill of row %d", b), prefillLogits(t, one, [][]int{p})[0], batch[b])
				expectClose(t, one, fmt.Sprintf("decode of row %d", b), decodeLogits(t, one, next[b:b+1], past[b:b+1])[0], batchNext[b])
			}
		})
	}
}

// Decoding a token after a prefill gives the logits a prefill of the prompt
// with that token gives.
func TestPrefillThenDecode(t *testing.T) {
	for _, name := range f32Fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			m := load(t, cfg, w, LoadOptions{MaxRows: len(testPrompts), MaxSeq: 16})
			next := []int{8, 9, 10, 11}
			var longer [][]int
			past := make([]int, len(testPrompts))
			for b, p := range testPrompts {
				longer = append(longer, append(slices.Clone(p), next[b]))
				past[b] = len(p)
			}
			want := prefillLogits(t, m, longer)
			prefillLogits(t, m, testPrompts)
			got := decodeLogits(t, m, next, past)
			for b := range got {
				expectClose(t, m, fmt.Sprintf("row %d", b), got[b], want[b])
			}
		})
	}
}

// Splitting the prefill into steps of a few tokens (rows split across steps)
// changes nothing.
func TestPrefillChunks(t *testing.T) {
	for _, name := range f32Fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			whole := prefillLogits(t, load(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 16}), testPrompts)
			for _, chunk := range []int{1, 3, 5, 11} {
				m := load(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 16, PrefillChunk: chunk})
				got := prefillLogits(t, m, testPrompts)
				for b := range got {
					expectClose(t, m, fmt.Sprintf("chunk %d, row %d", chunk, b), got[b], whole[b])
				}
			}
		})
	}
}

func generate(t *testing.T, m Model, prompts [][]int, opt GenerateOptions) *Generation {
	t.Helper()
	g, err := Generate(m, prompts, opt)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Sampling is deterministic for a seed, differs between seeds, and a row's
// tokens depend on its own logits, seed and index only.
func TestSamplingDeterministic(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	m := loadCPU(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
	opt := GenerateOptions{MaxNewTokens: 12, EOS: []int{}, Sampling: Sampling{Temperature: 1.5, TopK: 50, TopP: 0.95, Seed: 7}}
	a := generate(t, m, testPrompts, opt)
	b := generate(t, m, testPrompts, opt)
	if !slices.EqualFunc(a.Tokens, b.Tokens, slices.Equal) {
		t.Errorf("seed 7 twice: %v, then %v", a.Tokens, b.Tokens)
	}
	alone := generate(t, m, testPrompts[:1], opt)
	if !slices.Equal(alone.Tokens[0], a.Tokens[0]) {
		t.Errorf("row 0 alone %v, in the batch %v", alone.Tokens[0], a.Tokens[0])
	}
	opt.Sampling.Seed = 8
	c := generate(t, m, testPrompts, opt)
	if slices.EqualFunc(a.Tokens, c.Tokens, slices.Equal) {
		t.Errorf("seeds 7 and 8 gave the same tokens %v", a.Tokens)
	}
	greedy := generate(t, m, testPrompts, GenerateOptions{MaxNewTokens: 12, EOS: []int{}})
	if slices.EqualFunc(a.Tokens, greedy.Tokens, slices.Equal) {
		t.Errorf("sampling at temperature 1.5 gave the greedy tokens %v", a.Tokens)
	}
}

// The samplers keep what HF's warpers keep.
func TestSampler(t *testing.T) {
	logits := []float32{0, 3, 1, 3, -1, 2}
	count := func(s Sampling) map[int]int {
		seen := map[int]int{}
		sm := newSampler(s, 0)
		for range 2000 {
			seen[sm.sample(slices.Clone(logits))]++
		}
		return seen
	}
	// top-k 2 keeps the two 3s; top-k 3 keeps them and the 2.
	if got := count(Sampling{Temperature: 1, TopK: 2}); len(got) != 2 || got[1] == 0 || got[3] == 0 {
		t.Errorf("top-k 2 drew %v", got)
	}
	if got := count(Sampling{Temperature: 1, TopK: 3}); len(got) != 3 || got[5] == 0 {
		t.Errorf("top-k 3 drew %v", got)
	}
	// probabilities ≈ .02 .39 .05 .39 .01 .14: top-p 0.7 keeps the two 3s
	// (cumulative from below .08, .22 ≤ .3 removed; .61 > .3 kept).
	if got := count(Sampling{Temperature: 1, TopP: 0.7}); len(got) != 2 || got[1] == 0 || got[3] == 0 {
		t.Errorf("top-p 0.7 drew %v", got)
	}
	if got := count(Sampling{Temperature: 1, TopP: 0.8}); len(got) != 3 || got[5] == 0 {
		t.Errorf("top-p 0.8 drew %v", got)
	}
	// a very low temperature is greedy among the best.
	if got := count(Sampling{Temperature: 1e-3}); len(got) != 2 {
		t.Errorf("temperature 1e-3 drew %v", got)
	}
	for i, want := range map[int]float64{1: 3, 2: 3, 3: 2, 4: 1, 6: -1} {
		c := make([]candidate, len(logits))
		for j, l := range logits {
			c[j] = candidate{j, float64(l)}
		}
		if got := kthLargest(c, i); got != want {
			t.Errorf("kthLargest(%d) = %g, want %g", i, got, want)
		}
	}
}

// A row ends at its first end-of-sequence token (kept in its tokens); the
// others go on.
func TestEOS(t *testing.T) {
	cfg, w, _ := openFixture(t, "deepseek-v2-tiny")
	m := loadCPU(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
	free := generate(t, m, testPrompts, GenerateOptions{MaxNewTokens: 10, EOS: []int{}})
	eos := free.Tokens[0][3]
	g := generate(t, m, testPrompts, GenerateOptions{MaxNewTokens: 10, EOS: []int{eos}})
	for b, toks := range free.Tokens {
		want, stop := toks, StopLength
		if i := slices.Index(toks, eos); i >= 0 {
			want, stop = toks[:i+1], StopEOS
		}
		if !slices.Equal(g.Tokens[b], want) || g.Stop[b] != stop {
			t.Errorf("row %d: %v (%s), want %v (%s)", b, g.Tokens[b], g.Stop[b], want, stop)
		}
	}
	if len(g.Tokens[0]) > 4 {
		t.Errorf("row 0 went on after its end-of-sequence token: %v", g.Tokens[0])
	}
}

// Until MinNewTokens, end-of-sequence tokens are never chosen (HF masks
// them): greedy takes the best other token.
func TestMinNewTokens(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	m := loadCPU(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
	first := prefillLogits(t, m, testPrompts)
	eos := argmax(first[0])
	masked := slices.Clone(first[0])
	masked[eos] = -1e30
	for _, sp := range []Sampling{{}, {Temperature: 1, Seed: 3}} {
		g := generate(t, m, testPrompts, GenerateOptions{MaxNewTokens: 8, MinNewTokens: 3, EOS: []int{eos}, Sampling: sp})
		for b, toks := range g.Tokens {
			if len(toks) < 3 || slices.Contains(toks[:3], eos) {
				t.Errorf("sampling %+v, row %d: %v ends before 3 tokens or holds the end-of-sequence %d in them", sp, b, toks, eos)
			}
		}
		if sp.Temperature == 0 && g.Tokens[0][0] != argmax(masked) {
			t.Errorf("row 0's first token %d, want the best other than %d: %d", g.Tokens[0][0], eos, argmax(masked))
		}
	}
	g := generate(t, m, testPrompts, GenerateOptions{MaxNewTokens: 8, MinNewTokens: 8, EOS: []int{eos}})
	for b, toks := range g.Tokens {
		if len(toks) != 8 || g.Stop[b] != StopLength {
			t.Errorf("MinNewTokens = MaxNewTokens: row %d has %d tokens (%s)", b, len(toks), g.Stop[b])
		}
	}
}

// recordingOps queues every op while a capture is on instead of running it,
// as a CUDA graph records kernels: a replay runs the recorded calls with the
// arguments of the captured step, so it is right only if the decode step
// reads everything that changes from the device tensors newStep writes.
type recordingOps struct {
	kernels.Ops
	rec *[]func()
}

func (o *recordingOps) do(f func()) {
	if o.rec != nil {
		*o.rec = append(*o.rec, f)
		return
	}
	f()
}

func (o *recordingOps) Embedding(out, table, ids *kernels.Tensor) {
	o.do(func() { o.Ops.Embedding(out, table, ids) })
}
func (o *recordingOps) Linear(out, x, w, bias *kernels.Tensor) {
	o.do(func() { o.Ops.Linear(out, x, w, bias) })
}
func (o *recordingOps) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	o.do(func() { o.Ops.RMSNorm(out, x, w, eps) })
}
func (o *recordingOps) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	o.do(func() { o.Ops.AddRMSNorm(out, resid, x, w, eps) })
}
func (o *recordingOps) Add(out, a, b *kernels.Tensor) { o.do(func() { o.Ops.Add(out, a, b) }) }
func (o *recordingOps) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	o.do(func() { o.Ops.AddAddRMSNorm(out, resid, x, y, w, eps) })
}
func (o *recordingOps) RoPE(x *kernels.Tensor, heads, stride, off int, pos *kernels.Tensor, r *kernels.Rope) {
	o.do(func() { o.Ops.RoPE(x, heads, stride, off, pos, r) })
}
func (o *recordingOps) SwiGLU(out, gateUp *kernels.Tensor) {
	o.do(func() { o.Ops.SwiGLU(out, gateUp) })
}
func (o *recordingOps) LinearSwiGLU(out, x, w *kernels.Tensor) {
	o.do(func() { o.Ops.LinearSwiGLU(out, x, w) })
}
func (o *recordingOps) RMSNormRoPE(q, kv, w *kernels.Tensor, eps float32, heads, stride, off int, pos *kernels.Tensor, r *kernels.Rope) {
	o.do(func() { o.Ops.RMSNormRoPE(q, kv, w, eps, heads, stride, off, pos, r) })
}

func (o *recordingOps) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	o.do(func() { o.Ops.LinearAdd(out, x, w, bias, addend) })
}
func (o *recordingOps) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.do(func() { o.Ops.AddRMSNormLinear(out, h, resid, x, norm, eps, w, bias) })
}
func (o *recordingOps) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	o.do(func() { o.Ops.AddRMSNormLinearSwiGLU(out, h, resid, x, norm, eps, w) })
}
func (o *recordingOps) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.do(func() { o.Ops.LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm, eps, w, bias) })
}
func (o *recordingOps) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	o.do(func() { o.Ops.LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm, eps, w) })
}
func (o *recordingOps) RoPEAttentionDecode(a *kernels.AttnArgs, pos *kernels.Tensor, r *kernels.Rope) {
	o.do(func() { o.Ops.RoPEAttentionDecode(a, pos, r) })
}
func (o *recordingOps) AttentionPrefill(a *kernels.AttnArgs) {
	o.do(func() { o.Ops.AttentionPrefill(a) })
}
func (o *recordingOps) AttentionDecode(a *kernels.AttnArgs) {
	o.do(func() { o.Ops.AttentionDecode(a) })
}
func (o *recordingOps) DecodeAdvance(ids, pos, past, choice *kernels.Tensor) {
	o.do(func() { o.Ops.DecodeAdvance(ids, pos, past, choice) })
}
func (o *recordingOps) MLAPrefill(a *kernels.MLAArgs) { o.do(func() { o.Ops.MLAPrefill(a) }) }
func (o *recordingOps) MLADecode(a *kernels.MLAArgs)  { o.do(func() { o.Ops.MLADecode(a) }) }
func (o *recordingOps) MLADecodeRoPE(a *kernels.MLAArgs, w *kernels.Tensor, eps float32, pos *kernels.Tensor, r *kernels.Rope) {
	o.do(func() { o.Ops.MLADecodeRoPE(a, w, eps, pos, r) })
}
func (o *recordingOps) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	o.do(func() { o.Ops.MoERoute(idx, weight, logits, r) })
}
func (o *recordingOps) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	o.do(func() { o.Ops.MoEExperts(out, x, idx, weight, gateUp, down) })
}
func (o *recordingOps) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	o.do(func() { o.Ops.MoERouted(out, idx, weight, x, logits, gateUp, down, r) })
}
func (o *recordingOps) GroupGemm(out, x, w, first *kernels.Tensor) {
	o.do(func() { o.Ops.GroupGemm(out, x, w, first) })
}
func (o *recordingOps) Argmax(out, logits *kernels.Tensor) {
	o.do(func() { o.Ops.Argmax(out, logits) })
}

// Version is the version of the ops recorded (kernels.Versioned), 0 where
// they have none.
func (o *recordingOps) Version() uint64 {
	if v, ok := o.Ops.(kernels.Versioned); ok {
		return v.Version()
	}
	return 0
}

// graphDevice is the CPU device with recordingOps as its graphs.
type graphDevice struct {
	*cpu.Device
	ops     *recordingOps
	failing bool // BeginCapture fails
	// captures, closes and frees count BeginCapture, the graphs' first
	// Close and the device's Free.
	captures, closes, frees int
}

// recordedGraph is a graphDevice's graph: current while no Free has come
// since its recording began.
type recordedGraph struct {
	d      *graphDevice
	calls  []func()
	frees  int // the device's when the recording began
	closed bool
}

func (g *recordedGraph) Replay() error {
	if g.closed {
		return errors.New("replay of a closed graph")
	}
	for _, f := range g.calls {
		f()
	}
	return nil
}
func (g *recordedGraph) Close() error {
	if !g.closed {
		g.closed = true
		g.d.closes++
	}
	return nil
}
func (g *recordedGraph) Current() bool { return !g.closed && g.frees == g.d.frees }

func (d *graphDevice) BeginCapture() error {
	if d.failing {
		return errors.New("no graphs today")
	}
	d.captures++
	d.ops.rec = &[]func(){}
	return nil
}

func (d *graphDevice) EndCapture() (kernels.Graph, error) {
	g := &recordedGraph{d: d, calls: *d.ops.rec, frees: d.frees}
	d.ops.rec = nil
	return g, nil
}

func (d *graphDevice) Free(t *kernels.Tensor) {
	d.frees++
	d.Device.Free(t)
}

// loadGraphed loads the checkpoint with the cpu set on a graphDevice (its
// BeginCapture failing where failing says), for at most 4 rows of 32
// tokens: the model, closed when the test ends, the device, the Dispatch
// and the profile it reports to.
func loadGraphed(t *testing.T, cfg *loader.Config, w *loader.Weights, failing bool) (Model, *graphDevice, *kernels.Dispatch, *profile.Profile) {
	t.Helper()
	inner := cpu.NewDevice()
	spec, _ := kernels.ParseSpec("cpu")
	prof := profile.New(inner)
	built, err := spec.Build(inner, prof)
	if err != nil {
		t.Fatal(err)
	}
	dev := &graphDevice{Device: inner, ops: &recordingOps{Ops: built}, failing: failing}
	return loadOn(t, dev, dev.ops, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32}), dev, built, prof
}

// Decode steps replayed from a graph captured once give the tokens eager
// steps give; a capture that fails falls back to eager steps.
func TestGraphReplay(t *testing.T) {
	for _, name := range f32Fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			opts := []GenerateOptions{
				{MaxNewTokens: 9, EOS: []int{}},
				{MaxNewTokens: 9, EOS: []int{}, Sampling: Sampling{Temperature: 1, Seed: 1}},
			}
			for _, failing := range []bool{false, true} {
				for _, opt := range opts {
					want := generate(t, loadCPU(t, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32}), testPrompts, opt)
					if want.GraphReplays != 0 || !strings.Contains(want.Graph, "records no graphs") {
						t.Errorf("on the CPU: %d replays, graph note %q", want.GraphReplays, want.Graph)
					}

					m, _, _, prof := loadGraphed(t, cfg, w, failing)
					opt.Profile = prof
					var logged []string
					opt.Logf = func(f string, a ...any) { logged = append(logged, f) }
					got := generate(t, m, testPrompts, opt)
					if !slices.EqualFunc(got.Tokens, want.Tokens, slices.Equal) {
						t.Errorf("failing capture %v, sampling %+v: tokens %v, eager %v", failing, opt.Sampling, got.Tokens, want.Tokens)
					}
					wantReplays := got.DecodeSteps - 1
					if failing {
						wantReplays = 0
						if !strings.Contains(got.Graph, "no graphs today") || len(logged) != 1 {
							t.Errorf("failed capture: graph note %q, logged %q", got.Graph, logged)
						}
					}
					if got.GraphReplays != wantReplays || got.DecodeSteps != 8 {
						t.Errorf("failing capture %v: %d replays of %d decode steps", failing, got.GraphReplays, got.DecodeSteps)
					}
					// The profile holds the prefill and every decode step as
					// host spans, and each replay under its step.
					rec := prof.Recording()
					spans, replays := rec.Host, rec.Replays
					if len(spans) != 9 || spans[0].Name != "prefill" || spans[8].Name != "decode step 8" || spans[8].Step != 8 {
						t.Errorf("host spans %+v", spans)
					}
					if len(replays) != wantReplays || wantReplays > 0 && (replays[0].Step != 2 || replays[len(replays)-1].Step != 8) {
						t.Errorf("replays %+v", replays)
					}
				}
			}
		})
	}
}

// Bad requests fail with an error naming the problem.
func TestGenerateErrors(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	m := loadCPU(t, cfg, w, LoadOptions{MaxRows: 2, MaxSeq: 16})
	ok := GenerateOptions{MaxNewTokens: 4}
	for _, c := range []struct {
		prompts [][]int
		opt     GenerateOptions
		want    string
	}{
		{nil, ok, "no prompts"},
		{[][]int{{1}, {2}, {3}}, ok, "at most 2"},
		{[][]int{{1}, {}}, ok, "prompt 1 is empty"},
		{[][]int{{1, 512}}, ok, "token 512 at position 1 is outside the vocabulary"},
		{[][]int{{-1}}, ok, "token -1"},
		{[][]int{make([]int, 13)}, ok, "exceed the cache's 16"},
		{[][]int{{1}}, GenerateOptions{}, "MaxNewTokens is 0"},
		{[][]int{{1}}, GenerateOptions{MaxNewTokens: math.MaxInt}, "exceed max_position_embeddings"},
		{[][]int{{1}}, GenerateOptions{MaxNewTokens: 2, Sampling: Sampling{Temperature: 1, TopP: 1.5}}, "top-p"},
	} {
		_, err := Generate(m, c.prompts, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Generate(%v, %+v): %v, want an error with %q", c.prompts, c.opt, err, c.want)
		}
	}
	big := loadCPU(t, cfg, w, LoadOptions{MaxRows: 1, MaxSeq: 400})
	if _, err := Generate(big, [][]int{make([]int, 250)}, GenerateOptions{MaxNewTokens: 10}); err == nil ||
		!strings.Contains(err.Error(), "max_position_embeddings (256)") {
		t.Errorf("beyond max_position_embeddings: %v", err)
	}
}

// Load reports every missing or misshaped tensor before uploading any.
func TestLoadChecksFirst(t *testing.T) {
	dir := fixtureDir("qwen2-tiny")
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Skip(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	raw["num_hidden_layers"] = 3
	raw["layer_types"] = []string{"full_attention", "full_attention", "full_attention"}
	raw["intermediate_size"] = 180
	data, _ = json.Marshal(raw)
	cfg, err := loader.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	w, err := loader.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dev, ops := cpuOps(t)
	uploads := 0
	_, err = Load(cfg, w, dev, ops, LoadOptions{MaxRows: 1, MaxSeq: 8, Progress: func(done, total int64) { uploads++ }})
	var ce *loader.CheckError
	if !errors.As(err, &ce) || uploads != 0 {
		t.Fatalf("Load of 3 layers from a 2-layer checkpoint: %v (%d uploads)", err, uploads)
	}
	for _, want := range []string{
		`"model.layers.2.self_attn.q_proj.weight": missing`,
		`"model.layers.0.mlp.gate_proj.weight" (model.safetensors): shape [176 64], want [180 64]`,
	} {
		if !slices.ContainsFunc(ce.Problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("no problem %q in %q", want, ce.Problems)
		}
	}
}

// ParamCount counts what the checkpoint holds; Memory and the progress
// report add up.
func TestSizes(t *testing.T) {
	for _, name := range hfFixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, _ := openFixture(t, name)
			var n, bytes int64
			for _, name := range w.Names() {
				info, _ := w.Get(name)
				n += int64(numel(info.Shape))
				bytes += int64(len(info.Data))
			}
			if got := ParamCount(cfg); got != n {
				t.Errorf("ParamCount %d, the checkpoint holds %d", got, n)
			}
			dev, ops := cpuOps(t)
			var last, total int64
			opt := LoadOptions{MaxRows: 3, MaxSeq: 20, Progress: func(d, t int64) { last, total = d, t }}
			m, err := Load(cfg, w, dev, ops, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if last != bytes || total != bytes {
				t.Errorf("progress ended at %d of %d, the checkpoint has %d bytes", last, total, bytes)
			}
			if got, want := m.Memory().Cache, Bytes(3*20*KVBytesPerToken(cfg, dev.ActDType())); got != want {
				t.Errorf("cache of %d bytes, want %d", got, want)
			}
			// What Load checks against the device's memory is what it takes.
			for _, act := range []kernels.DType{kernels.F32, kernels.BF16} {
				d, ops := cpuOpsAct(t, act)
				m, err := Load(cfg, w, d, ops, opt)
				if err != nil {
					t.Fatal(err)
				}
				est, err := Estimate(cfg, w, act, opt)
				if err != nil || est != m.Memory() {
					t.Errorf("%s activations: Estimate %v (%v), Load allocated %v", act, est, err, m.Memory())
				}
				m.Close()
			}
		})
	}
}

// A profiled generation counts every call under its decoder layer (-1
// outside the layers) and step, and keeps the prefill's logits when asked.
func TestGenerateProfile(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	dev := cpu.NewDevice()
	prof := profile.New(dev)
	spec, _ := kernels.ParseSpec("cpu")
	ops, err := spec.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	m := loadOn(t, dev, ops, cfg, w, LoadOptions{MaxRows: 2, MaxSeq: 16})
	g := generate(t, m, testPrompts[:2], GenerateOptions{MaxNewTokens: 3, EOS: []int{}, Profile: prof, KeepPrefillLogits: true})
	if len(g.PrefillLogits) != 2 || len(g.PrefillLogits[1]) != cfg.VocabSize || argmax(g.PrefillLogits[1]) != g.Tokens[1][0] {
		t.Errorf("prefill logits: %d rows", len(g.PrefillLogits))
	}
	layers := map[int]bool{}
	steps := map[int]bool{}
	for _, c := range prof.Recording().Calls {
		layers[c.Layer] = true
		steps[c.Step] = true
		if c.Op == kernels.OpEmbedding && c.Layer != -1 || c.Op == kernels.OpAttnPrefill && c.Phase != "prefill" {
			t.Errorf("call %+v", c)
		}
	}
	if len(layers) != cfg.NumLayers+1 || !layers[-1] || !layers[cfg.NumLayers-1] || len(steps) != 3 {
		t.Errorf("layers %v, steps %v", layers, steps)
	}
}
