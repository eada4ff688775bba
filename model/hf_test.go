package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/cuda"
	_ "github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/kbench"
	_ "github.com/fuselm/fuselm/kernels/naive"
	"github.com/fuselm/fuselm/loader"
)

// The HF fixtures (scripts/hf_fixtures.py): tiny random-weight checkpoints
// saved by transformers 5.17, with HF's logits for every prompt run alone.
var hfFixtures = []string{"qwen2-tiny", "qwen2-tiny-bf16", "deepseek-v2-tiny", "deepseek-v2-tiny-qlora", "deepseek-v2-tiny-bf16"}

// reference is a fixture's reference.json.
type reference struct {
	Prompts [][]int        `json:"prompts"`
	Steps   int            `json:"steps"`
	DType   string         `json:"dtype"`
	Rows    []referenceRow `json:"rows"`
}

// referenceRow is HF's run of one prompt.
type referenceRow struct {
	PrefillLogits []float32   `json:"prefill_logits"`
	Tokens        []int       `json:"tokens"`
	DecodeLogits  [][]float32 `json:"decode_logits"`
}

func (r *reference) bf16() bool { return strings.Contains(r.DType, "bfloat16") }

// repeated is r with its prompts and rows n times over, in order: row
// b + i·len(r.Rows) is row b (the logits shared, not copied).
func (r *reference) repeated(n int) *reference {
	out := &reference{Steps: r.Steps, DType: r.DType}
	for range n {
		out.Prompts = append(out.Prompts, r.Prompts...)
		out.Rows = append(out.Rows, r.Rows...)
	}
	return out
}

// step returns HF's logits of row b at step i (0: after the prompt, i: after
// feeding Tokens[i-1]) and the token HF chose from them (-1 after the last
// step).
func (r *reference) step(b, i int) ([]float32, int) {
	row := r.Rows[b]
	logits := row.PrefillLogits
	if i > 0 {
		logits = row.DecodeLogits[i-1]
	}
	if i >= r.Steps {
		return logits, -1
	}
	return logits, row.Tokens[i]
}

// tolerance is the relative error allowed against HF on a device with
// activations of type act. An f32 checkpoint on an f32 device runs HF's math
// (1e-4). HF ran the bf16 checkpoints with bf16 activations, rounding to 8
// bits of mantissa where torch's eager ops do: a bf16 device repeats that
// within the bound, 1e-2 (the cpu set rounds where HF does; see
// TestHFReferenceBF16OnF32 for what f32 activations give instead). An f32
// checkpoint on a bf16 device (the CUDA sets) adds bf16's rounding to HF's
// f32 math: 3e-2.
func (r *reference) tolerance(act kernels.DType) float64 {
	switch {
	case !r.bf16() && act == kernels.F32:
		return 1e-4
	case r.bf16() && act == kernels.BF16:
		return 1e-2
	}
	return 3e-2
}

// mixed reports whether a device with activations of type act rounds an f32
// checkpoint's activations to bf16, which HF's f32 reference does not.
func (r *reference) mixed(act kernels.DType) bool { return !r.bf16() && act == kernels.BF16 }

// nearTie reports whether HF's logits of tokens a and b differ by less than
// the error allowed there (tol relative to the logits' rms): a run with bf16
// activations of an f32 checkpoint cannot order them.
func nearTie(want []float32, a, b int, tol float64) bool {
	var n float64
	for _, x := range want {
		n += float64(x) * float64(x)
	}
	return math.Abs(float64(want[a])-float64(want[b])) <= tol*math.Sqrt(n/float64(len(want)))
}

// tie reports whether HF's logits of tokens a and b are equal, which bf16
// logits (8 bits of mantissa) can be: then HF's argmax, the lower index,
// cannot order them for us, and ours may be either.
func tie(want []float32, a, b int) bool { return want[a] == want[b] }

func fixtureDir(name string) string { return filepath.Join("..", "testdata", "models", name) }

// openFixture reads a fixture's config, weights and reference, or skips.
func openFixture(t *testing.T, name string) (*loader.Config, *loader.Weights, *reference) {
	t.Helper()
	dir := fixtureDir(name)
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Skipf("no HF fixture %s (write it with scripts/hf_fixtures.py): %v", name, err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	cfg, w := openCheckpoint(t, dir)
	return cfg, w, &ref
}

// openCheckpoint reads a checkpoint's config and opens its weights, closed at
// the end of the test.
func openCheckpoint(t *testing.T, dir string) (*loader.Config, *loader.Weights) {
	t.Helper()
	cfg, err := loader.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := loader.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return cfg, w
}

// cpuOps returns a CPU device and the cpu kernel set, through the registry
// as the CLI builds it.
func cpuOps(t *testing.T) (kernels.Device, kernels.Ops) {
	t.Helper()
	return cpuOpsAct(t, kernels.F32)
}

// cpuOpsAct is cpuOps with activations of type act.
func cpuOpsAct(t *testing.T, act kernels.DType) (kernels.Device, kernels.Ops) {
	t.Helper()
	dev, err := cpu.NewDeviceAct(act)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := kernels.ParseSpec("cpu")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := spec.Build(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dev, ops
}

// The tests that hold the model against HF and against itself run on the
// kernel spec in $FUSELM_TEST_KERNELS ("naive", "fused,attn=naive", ...; the
// cpu set when unset), on CUDA device 0 for the CUDA sets, skipping without
// one. With $FUSELM_TEST_TUNING set they run the choices of the device's
// tuning cache too, as infer does (infer bench --optimize writes it beside
// the kernel cache): so a variant no default runs can be held against HF.
// The device and its ops are made once and shared.
var testBackend struct {
	once   sync.Once
	dev    kernels.Device
	ops    kernels.Ops
	tuning []string // what the tuning cache changed, a line a choice
	err    error
	skip   string
}

// backendOps returns the device and ops of $FUSELM_TEST_KERNELS.
func backendOps(t *testing.T) (kernels.Device, kernels.Ops) {
	t.Helper()
	text := os.Getenv("FUSELM_TEST_KERNELS")
	if text == "" || text == "cpu" {
		return cpuOps(t)
	}
	b := &testBackend
	b.once.Do(func() {
		spec, err := kernels.ParseSpec(text)
		if err != nil {
			b.err = err
			return
		}
		kind, err := spec.DeviceKind()
		if err != nil {
			b.err = err
			return
		}
		if kind != "cuda" {
			b.err = fmt.Errorf("FUSELM_TEST_KERNELS=%s: device kind %q", text, kind)
			return
		}
		if err := cuda.Probe(); err != nil {
			b.skip = "no CUDA device for FUSELM_TEST_KERNELS=" + text + ": " + err.Error()
			return
		}
		dev, err := cuda.Open(0)
		if err != nil {
			b.err = err
			return
		}
		b.dev = dev
		ops, err := spec.Build(dev, nil)
		if err != nil {
			b.err = err
			return
		}
		b.ops = ops
		if os.Getenv("FUSELM_TEST_TUNING") != "" {
			b.tuning, b.err = applyTestTuning(dev, ops)
		}
	})
	if b.skip != "" {
		t.Skip(b.skip)
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	for _, line := range b.tuning {
		t.Log(line)
	}
	return b.dev, b.ops
}

// applyTestTuning applies the tuning cache of dev to ops and says what it
// changed; a cache that is missing, stale or changes nothing is an error,
// since the test was asked to run its choices.
func applyTestTuning(dev *cuda.Device, ops *kernels.Dispatch) ([]string, error) {
	path, cache, stale, err := kbench.DeviceCache(dev)
	switch {
	case err != nil:
		return nil, fmt.Errorf("FUSELM_TEST_TUNING: %w", err)
	case stale != "":
		return nil, fmt.Errorf("FUSELM_TEST_TUNING: %s not applied: %s", path, stale)
	}
	applied, skipped := ops.ApplyTuning(cache.Choices())
	var lines []string
	for _, c := range applied {
		lines = append(lines, fmt.Sprintf("tuning: %s %s %s runs %s (from %s)", c.Set, c.Op, c.Key, c.Variant, path))
	}
	for _, err := range skipped {
		lines = append(lines, fmt.Sprintf("tuning: not applied: %v", err))
	}
	if len(applied) == 0 {
		return nil, fmt.Errorf("FUSELM_TEST_TUNING: %s holds no choice for this spec (%d entries)", path, len(cache.Entries))
	}
	return lines, nil
}

// load loads a model on the test backend, closed at the end of the test.
func load(t *testing.T, cfg *loader.Config, w *loader.Weights, opt LoadOptions) Model {
	t.Helper()
	dev, ops := backendOps(t)
	return loadOn(t, dev, ops, cfg, w, opt)
}

// hfOps returns the device and ops a fixture is held against HF on: the
// test backend, whose cpu set runs a bf16 checkpoint with bf16 activations,
// as HF does.
func hfOps(t *testing.T, ref *reference) (kernels.Device, kernels.Ops) {
	t.Helper()
	if text := os.Getenv("FUSELM_TEST_KERNELS"); (text == "" || text == "cpu") && ref.bf16() {
		return cpuOpsAct(t, kernels.BF16)
	}
	return backendOps(t)
}

// loadCPU loads a model on the CPU: for the tests of the generation loop,
// which want exactly reproducible logits.
func loadCPU(t *testing.T, cfg *loader.Config, w *loader.Weights, opt LoadOptions) Model {
	t.Helper()
	dev, ops := cpuOps(t)
	return loadOn(t, dev, ops, cfg, w, opt)
}

func loadOn(t *testing.T, dev kernels.Device, ops kernels.Ops, cfg *loader.Config, w *loader.Weights, opt LoadOptions) Model {
	t.Helper()
	m, err := Load(cfg, w, dev, ops, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// relErr is ‖got − want‖ / ‖want‖.
var relErr = kernels.RelErr

// readLogits returns the logits of rows [0, B).
func readLogits(t *testing.T, m Model, B int) [][]float32 {
	t.Helper()
	e := m.base()
	all, err := e.dev.ReadF32(e.logits.Slice(0, B))
	if err != nil {
		t.Fatal(err)
	}
	V := e.cfg.VocabSize
	rows := make([][]float32, B)
	for b := range rows {
		rows[b] = all[b*V : (b+1)*V]
	}
	return rows
}

// teacherForce runs ref's prompts through m as one batch of different
// lengths, then ref.Steps decode steps fed HF's greedy tokens, and calls
// visit with every row's logits after the prefill (step 0) and after each
// decode step.
func teacherForce(t *testing.T, m Model, ref *reference, visit func(step int, got [][]float32)) {
	t.Helper()
	e, B := m.base(), len(ref.Prompts)
	if err := prefill(e, ref.Prompts); err != nil {
		t.Fatal(err)
	}
	visit(0, readLogits(t, m, B))
	tokens, past := make([][]int, B), make([]int, B)
	for i := range ref.Steps {
		for b, p := range ref.Prompts {
			tokens[b] = []int{ref.Rows[b].Tokens[i]}
			past[b] = len(p) + i
		}
		s, err := e.newStep(0, tokens, past, true, B)
		if err != nil {
			t.Fatal(err)
		}
		decodeOne(e, s, false)
		visit(i+1, readLogits(t, m, B))
	}
}

// TestHFReference holds every fixture's model against HF: all prompts as one
// batch of different lengths through prefill, then decode steps fed HF's
// greedy tokens (teacher forcing), comparing every step's logits; then free
// greedy generation, whose tokens must be HF's. It runs with the prefill in
// one step and split into small chunks.
func TestHFReference(t *testing.T) {
	for _, name := range hfFixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, ref := openFixture(t, name)
			B, steps := len(ref.Prompts), ref.Steps
			longest := 0
			for _, p := range ref.Prompts {
				longest = max(longest, len(p))
			}
			dev, ops := hfOps(t, ref)
			for _, chunk := range []int{0, 4} {
				m := loadOn(t, dev, ops, cfg, w, LoadOptions{MaxRows: B, MaxSeq: longest + steps, PrefillChunk: chunk})
				e := m.base()
				tol := ref.tolerance(e.dev.ActDType())
				// agree[b] is how many of HF's greedy tokens row b must
				// reproduce: all, unless a tie in HF's bf16 logits let its
				// argmax differ from HF's (then the continuations part
				// there).
				agree := make([]int, B)
				for b := range agree {
					agree[b] = steps
				}

				worst := 0.0
				teacherForce(t, m, ref, func(step int, got [][]float32) {
					for b := range B {
						want, tok := ref.step(b, step)
						re := relErr(got[b], want)
						worst = max(worst, re)
						if re > tol || math.IsNaN(re) {
							t.Errorf("chunk %d, row %d, step %d: relative error %.3g > %g", chunk, b, step, re, tol)
						}
						switch our := argmax(got[b]); {
						case tok < 0 || our == tok:
						case tie(want, our, tok):
							t.Logf("chunk %d, row %d, step %d: argmax %d, HF %d: tied in HF's logits", chunk, b, step, our, tok)
							agree[b] = min(agree[b], step)
						case ref.mixed(e.dev.ActDType()) && nearTie(want, our, tok, tol):
							t.Logf("chunk %d, row %d, step %d: argmax %d, HF %d: HF's f32 logits %g and %g are closer than bf16 activations can order",
								chunk, b, step, our, tok, want[our], want[tok])
							agree[b] = min(agree[b], step)
						default:
							t.Errorf("chunk %d, row %d, step %d: argmax %d, HF %d (HF's logits %g and %g)",
								chunk, b, step, our, tok, want[our], want[tok])
						}
					}
				})

				t.Logf("chunk %d on %s: largest relative error %.3g (tolerance %g)", chunk, e.dev.Name(), worst, tol)

				gen, err := Generate(m, ref.Prompts, GenerateOptions{MaxNewTokens: steps, EOS: []int{}})
				if err != nil {
					t.Fatal(err)
				}
				replays := steps - 2 // all but the first, or all of them from a kept graph
				if gen.GraphKept {
					replays = steps - 1
				}
				if _, ok := e.dev.(kernels.Grapher); ok && (gen.GraphReplays != replays || gen.Graph != "") {
					t.Errorf("chunk %d: %d of %d decode steps replayed from a graph (%q, kept %v), want %d",
						chunk, gen.GraphReplays, gen.DecodeSteps, gen.Graph, gen.GraphKept, replays)
				}
				for b := range B {
					if n := agree[b]; !slices.Equal(gen.Tokens[b][:n], ref.Rows[b].Tokens[:n]) {
						t.Errorf("chunk %d, row %d: greedy generation %v, HF %v (the first %d must agree)",
							chunk, b, gen.Tokens[b], ref.Rows[b].Tokens, n)
					}
				}
			}
		})
	}
}

// TestHFReferenceBF16OnF32 measures what f32 activations (NewDevice, the
// CLI's) give on the bf16 checkpoints, which HF ran with bf16 activations:
// HF's own rounding, which TestHFReference's bf16 activations reproduce.
// It is logged, not bounded.
func TestHFReferenceBF16OnF32(t *testing.T) {
	for _, name := range hfFixtures {
		t.Run(name, func(t *testing.T) {
			cfg, w, ref := openFixture(t, name)
			if !ref.bf16() {
				t.Skip("an f32 checkpoint: TestHFReference holds it on f32 activations")
			}
			longest := 0
			for _, p := range ref.Prompts {
				longest = max(longest, len(p))
			}
			m := loadCPU(t, cfg, w, LoadOptions{MaxRows: len(ref.Prompts), MaxSeq: longest + ref.Steps})
			worst, differ := 0.0, 0
			teacherForce(t, m, ref, func(step int, got [][]float32) {
				for b := range got {
					want, tok := ref.step(b, step)
					worst = max(worst, relErr(got[b], want))
					if tok >= 0 && argmax(got[b]) != tok {
						differ++
					}
				}
			})
			t.Logf("f32 activations against HF's bf16 run: largest relative error %.3g; %d of HF's greedy tokens not our argmax", worst, differ)
		})
	}
}

// repeated lays the copies out prompt by prompt in order and shares HF's
// rows: row b + i·B is row b.
func TestReferenceRepeated(t *testing.T) {
	r := &reference{Prompts: [][]int{{1, 2}, {3}}, Steps: 1, DType: "torch.bfloat16",
		Rows: []referenceRow{{Tokens: []int{7}}, {Tokens: []int{8}}}}
	got := r.repeated(3)
	if len(got.Prompts) != 6 || len(got.Rows) != 6 || got.Steps != 1 || !got.bf16() {
		t.Fatalf("repeated(3): %d prompts, %d rows, %d steps, dtype %q", len(got.Prompts), len(got.Rows), got.Steps, got.DType)
	}
	for b := range got.Rows {
		if !slices.Equal(got.Prompts[b], r.Prompts[b%2]) || got.Rows[b].Tokens[0] != r.Rows[b%2].Tokens[0] {
			t.Errorf("row %d: prompt %v, token %d; want row %d's", b, got.Prompts[b], got.Rows[b].Tokens[0], b%2)
		}
	}
}
