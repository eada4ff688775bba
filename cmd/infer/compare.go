package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/measure"
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/outfile"
	"github.com/fuselm/fuselm/report"
	"github.com/fuselm/fuselm/spread"
)

// compareFlags are infer compare's flags: those it shares with generation,
// and its own.
type compareFlags struct {
	gen                 genFlags
	baseline, candidate string
	ops                 string
	jsonOut             bool
	plotPath            string
	checkTokens         int
	tolerance           float64
}

func newCompareCmd() *cobra.Command {
	var cf compareFlags
	cmd := &cobra.Command{
		Use:   "compare --model M [--prompt S | --prompt-file F | --prompts F.jsonl] [flags]",
		Short: "Run one prompt with naive, fused and every single-op ablation on weights loaded once, and compare them",
		Long: `compare loads a checkpoint once, then generates the same prompt and batch with
the baseline kernel spec (--baseline, naive), the candidate (--candidate,
fused), and every single-op ablation: the candidate with one op on the
baseline's set, and the baseline with one op on the candidate's (for each
op, or group such as attn, that runs on different sets under the two and
that the model calls; --ops limits them).

Each variant first runs one untimed generation whose greedy tokens and
prefill logits are held against the baseline's: a variant passes when its
first --check-tokens tokens of every row are the baseline's, or when its
prefill logits are within --tolerance of the baseline's (relative error;
default 1e-4 with f32 activations, 0.1 with bf16, where two kernels that
round in different orders differ by about 5% on random-weight Qwen2-7B).
Then --warmup untimed and --repeat timed generations, as infer runs them;
the median is reported.

The tokens/s come from those untraced runs. The per-op times of the
baseline and the candidate come from one more generation each, traced by
CUPTI where it loads (--cupti, on by default), so that every kernel, those
of CUDA graph replays and cuBLAS's included, is charged to its op. Where
kernels are not traced (--cupti=false, CUPTI missing, or the cpu device),
the ops are timed by events and each graph replay (every decode step after
the first two) is timed whole: that time is in no op's row.

It prints each variant's summary line, a table of every op (baseline ms,
candidate ms, speedup, the op's share of the end-to-end gain, and the
tokens/s of its two ablations) closed by two rows that hold the rest of the
gain (device time charged to no op, and wall time outside the device's
timed work), and each variant's peak memory. --json makes stdout one JSON
document of all of it (the tables then go to stderr, unless --quiet),
--plot writes a PNG of per-op time and tokens/s per variant. When a
variant fails the check, compare says which and exits 1 after writing its
output.

` + promptsRule + `

compare needs nothing but two kernel specs of one device: on a machine
with no GPU, compare the cpu set with a test set, or run it where a CUDA
device is found (the defaults, naive and fused, are CUDA sets).

` + exitRule,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCompare(cmd, &cf) },
	}
	f := &cf.gen
	fl := cmd.Flags()
	f.workloadFlags(cmd)
	fl.StringVar(&f.device, "device", "", "cpu or cuda (default: the device of the kernel sets)")
	fl.BoolVar(&f.noGraphs, "no-graphs", false, "run decode steps eagerly instead of replaying a CUDA graph (ignored on the cpu device, which records none)")
	fl.BoolVar(&f.cupti, "cupti", true, "time the per-op table by CUPTI where it loads, in one more traced generation of the baseline "+
		"and the candidate (graph replays and cuBLAS's kernels included; tokens/s stay the untraced runs'); --cupti=false times ops by events")
	fl.IntVar(&f.warmup, "warmup", 0, "untimed generations per variant after the checked one")
	fl.IntVar(&f.repeat, "repeat", 1, "timed generations per variant; the one of median wall time is reported")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar or logs on stderr")
	fl.StringVar(&cf.baseline, "baseline", "naive", "the baseline kernel spec")
	fl.StringVar(&cf.candidate, "candidate", "fused", "the candidate kernel spec")
	fl.StringVar(&cf.ops, "ops", "", "comma-separated ops or groups to ablate (default: every one that differs)")
	fl.BoolVar(&cf.jsonOut, "json", false, "stdout is one JSON document of every variant's results; the tables go to stderr")
	fl.StringVar(&cf.plotPath, "plot", "", "draw per-op time and tokens/s per variant to this PNG file")
	fl.IntVar(&cf.checkTokens, "check-tokens", 8, "leading greedy tokens of every row that must be the baseline's")
	fl.Float64Var(&cf.tolerance, "tolerance", 0, "prefill logits' relative error to the baseline's that passes (default: by dtype)")
	return silence(cmd)
}

// check rejects flag values that cannot run; it returns the two specs and
// the ablations --ops names.
func (cf *compareFlags) check(cmd *cobra.Command) (base, cand kernels.Spec, only []string, err error) {
	bad := func(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }
	cf.gen.kernels = cf.baseline
	if err := cf.gen.check(cmd); err != nil {
		return base, cand, nil, err
	}
	switch {
	case cf.checkTokens < 0:
		return base, cand, nil, bad("--check-tokens must not be negative (%d)", cf.checkTokens)
	case !(cf.tolerance >= 0 && cf.tolerance <= math.MaxFloat64):
		return base, cand, nil, bad("--tolerance must be a finite number ≥ 0, not %g", cf.tolerance)
	}
	if base, err = kernels.ParseSpec(cf.baseline); err != nil {
		return base, cand, nil, usageError{fmt.Errorf("--baseline: %w", err)}
	}
	if cand, err = kernels.ParseSpec(cf.candidate); err != nil {
		return base, cand, nil, usageError{fmt.Errorf("--candidate: %w", err)}
	}
	bk, err1 := base.DeviceKind()
	ck, err2 := cand.DeviceKind()
	switch {
	case err1 != nil || err2 != nil:
		return base, cand, nil, usageError{errors.Join(err1, err2)}
	case bk != ck:
		return base, cand, nil, bad("--baseline %s runs on %s, --candidate %s on %s: compare needs one device", base, bk, cand, ck)
	case base.String() == cand.String():
		return base, cand, nil, bad("--baseline and --candidate are the same spec (%s)", base)
	}
	for _, name := range strings.Split(cf.ops, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		ops, err := opsOf(name)
		if err != nil {
			return base, cand, nil, usageError{fmt.Errorf("--ops: %w", err)}
		}
		if !slices.ContainsFunc(ops, func(o kernels.Op) bool { return base.Runner(o) != cand.Runner(o) }) {
			return base, cand, nil, bad("--ops: %s runs on %s under both %s and %s: there is nothing to ablate", name, base.Runner(ops[0]), base, cand)
		}
		only = append(only, name)
	}
	return base, cand, only, nil
}

// opsOf is the ops an op or group name stands for.
func opsOf(name string) ([]kernels.Op, error) {
	if g, ok := kernels.OpGroups[name]; ok {
		return g, nil
	}
	// The spec parser knows the op names and says what they are.
	s, err := kernels.ParseSpec("cpu," + name + "=cpu")
	if err != nil {
		return nil, errors.Unwrap(err)
	}
	for op := range s.Overrides {
		return []kernels.Op{op}, nil
	}
	return nil, fmt.Errorf("unknown op %q", name)
}

// ablationUnits are the ops and groups that run on different sets under
// base and cand and that the model called (used): a group (attn, mla,
// moe) when all its used ops differ, else each op; only, when given,
// names them.
func ablationUnits(base, cand kernels.Spec, used map[kernels.Op]bool, only []string) []string {
	if len(only) > 0 {
		return only
	}
	differs := func(o kernels.Op) bool { return used[o] && base.Runner(o) != cand.Runner(o) }
	var units []string
	done := map[kernels.Op]bool{}
	for _, info := range kernels.OpTable() {
		if done[info.Op] || !differs(info.Op) {
			continue
		}
		if g := kernels.OpGroups[info.Group]; info.Group != "" && !slices.ContainsFunc(g, func(o kernels.Op) bool { return used[o] && !differs(o) }) {
			units = append(units, info.Group)
			for _, o := range g {
				done[o] = true
			}
			continue
		}
		units = append(units, string(info.Op))
	}
	return units
}

// withOps is s with ops run as from asks.
func withOps(s kernels.Spec, ops []kernels.Op, from kernels.Spec) kernels.Spec {
	out := kernels.Spec{Base: s.Base, Overrides: maps.Clone(s.Overrides)}
	for _, o := range ops {
		out.Overrides[o] = from.SetFor(o)
	}
	return out
}

// compareReport is what infer compare reports; --json writes it.
type compareReport struct {
	report.Provenance
	Model        string `json:"model"`
	DType        string `json:"dtype"`
	Batch        int    `json:"batch"`
	PromptTokens int    `json:"prompt_tokens"` // the longest row's
	// RowPromptTokens are each row's prompt tokens (rows differ with --prompts).
	RowPromptTokens []int           `json:"row_prompt_tokens"`
	MaxNew          int             `json:"max_new_tokens"`
	Baseline        string          `json:"baseline"`
	Candidate       string          `json:"candidate"`
	Warmup          int             `json:"warmup_runs"`
	Repeat          int             `json:"timed_runs"`
	CheckTokens     int             `json:"check_tokens"`
	Tolerance       float64         `json:"tolerance"`
	GainMs          float64         `json:"gain_ms"` // the baseline's wall time less the candidate's
	Variants        []variantReport `json:"variants"`
	Ops             []opComparison  `json:"ops"`
	// The rest of the gain, beside Ops': device time charged to no op
	// (Unattributed: under events, the graph replays, timed whole), and
	// wall time outside the device's timed work (Outside: the host,
	// launch gaps, what ran concurrently). The op rows' shares and these
	// two add up to the whole gain.
	Unattributed gainPart `json:"unattributed_device"`
	Outside      gainPart `json:"outside_device"`
}

// gainPart is a part of the baseline's and the candidate's time and its
// share of the end-to-end gain (null when there is no gain).
type gainPart struct {
	BaselineMs  float64  `json:"baseline_ms"`
	CandidateMs float64  `json:"candidate_ms"`
	GainShare   *float64 `json:"gain_share"`
}

// variantReport is one kernel spec's run.
type variantReport struct {
	Spec string `json:"spec"`
	// Role is "baseline", "candidate", or the ablation: "candidate, OP on
	// baseline" or "baseline, OP on candidate".
	Role         string         `json:"role"`
	Ablated      *string        `json:"ablated"` // the op or group an ablation moves; null for the two specs
	Summary      string         `json:"summary"`
	TokensPerSec float64        `json:"tokens_per_s"`
	WallS        float64        `json:"wall_s"`
	RunsWallS    []float64      `json:"runs_wall_s"`
	WallSpread   spread.Summary `json:"wall_s_spread"`
	report.Phases
	// ComputeMs is the summed device time of the run Ops come from (the
	// traced one where kernels were traced), UnattributedMs the part of it
	// charged to no op.
	ComputeMs      float64          `json:"compute_ms"`
	UnattributedMs float64          `json:"unattributed_ms"`
	ProfileSource  string           `json:"profile_source"`
	ProfileNote    *string          `json:"profile_note"`
	Memory         *report.Memory   `json:"memory"`
	SameTokens     int              `json:"same_leading_tokens"` // the fewest leading tokens any row shares with the baseline's
	LogitsRelErr   float64          `json:"prefill_logits_rel_err"`
	OK             bool             `json:"ok"`
	Check          string           `json:"check"` // why it passed or failed
	Ops            []profile.OpStat `json:"ops"`
	tokens         [][]int
	logits         [][]float32
}

// opComparison is one op's row: its time under the baseline and the
// candidate, and the tokens/s of its two ablations (null when not run).
type opComparison struct {
	Op           kernels.Op `json:"op"`
	BaselineSet  string     `json:"baseline_set"`
	CandidateSet string     `json:"candidate_set"`
	BaselineMs   float64    `json:"baseline_ms"`
	CandidateMs  float64    `json:"candidate_ms"`
	Speedup      *float64   `json:"speedup"` // null when the candidate's time is 0
	// GainShare is the op's time saved over the end-to-end gain (the
	// baseline's wall time less the candidate's); null without a gain.
	GainShare *float64 `json:"gain_share"`
	// AloneTokensPerSec is the baseline with this op (or its group) on
	// the candidate's set; WithoutTokensPerSec the candidate with it on the
	// baseline's.
	Unit                *string  `json:"ablation"`
	AloneTokensPerSec   *float64 `json:"baseline_with_op_tokens_per_s"`
	WithoutTokensPerSec *float64 `json:"candidate_without_op_tokens_per_s"`
}

func runCompare(cmd *cobra.Command, cf *compareFlags) error {
	base, cand, only, err := cf.check(cmd)
	if err != nil {
		return err
	}
	f := &cf.gen
	if err := checkOutputs([]namedPath{{"--plot", cf.plotPath}}, f.model, f.inputs()...); err != nil {
		return err
	}
	logf := f.logger(cmd)
	in, err := f.readInputs(cmd)
	if err != nil {
		return err
	}
	defer in.weights.Close()
	if in.kind == "cuda" {
		if err := cuda.Probe(); err != nil {
			return fmt.Errorf("compare needs a CUDA device for --baseline %s and --candidate %s (the cpu set alone leaves nothing to compare): %w",
				base, cand, err)
		}
	}
	// The timed runs are not traced: runVariant traces a run of its own.
	untraced := *f
	untraced.cupti = false
	dev, prof, ops, closeRun, err := openRun(&untraced, in, base)
	if err != nil {
		return err
	}
	defer closeRun()
	logf("infer compare: %s (%s) on %s, %s against %s", filepath.Base(in.dir), in.cfg.Arch, dev.Name(), cand, base)
	ignoredOnCPU(cmd, dev, logf)
	tracer := newVariantTracer(dev, prof, f.cupti)
	m, _, err := loadModel(cmd, f, in, dev, ops, time.Now())
	if err != nil {
		return err
	}
	defer m.Close()

	rep := &compareReport{
		Provenance: newProvenance(dev.Name()),
		Model:      modelName(f.model, in.dir), DType: dev.ActDType().String(), Batch: f.batch,
		PromptTokens: in.longest(), RowPromptTokens: rowLengths(in.rows(f.batch)), MaxNew: f.maxNew, Baseline: base.String(), Candidate: cand.String(),
		Warmup: f.warmup, Repeat: f.repeat, CheckTokens: min(cf.checkTokens, f.maxNew), Tolerance: cf.tolerance,
	}
	if rep.Tolerance == 0 {
		rep.Tolerance = 1e-4
		if dev.ActDType() != kernels.F32 {
			rep.Tolerance = 0.1
		}
	}
	prompts := in.rows(f.batch)
	opts := model.GenerateOptions{MaxNewTokens: f.maxNew, MinNewTokens: f.minNew, EOS: in.tok.EOS(), NoGraphs: f.noGraphs, Profile: prof, Logf: logf}
	perVariant := int64(1 + f.warmup + f.repeat)
	traced := int64(0)
	if tracer != nil {
		traced = 2
	}
	bar := newProgress(cmd.ErrOrStderr(), f.quiet, 2*perVariant+traced, "comparing", false)
	var done int64
	progress := func(int, bool) (func(model.StepEvent), func()) {
		return func(model.StepEvent) {}, func() { done++; bar.Set(done) }
	}
	run := func(spec kernels.Spec, role, unit string) error {
		var t *variantTracer
		if unit == "" {
			t = tracer // the table's two variants
		}
		v, err := runVariant(m, dev, ops, prof, prompts, opts, spec, f, progress, t)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", spec, role, err)
		}
		v.Role, v.Ablated = role, report.NullString(unit)
		r := report.Run{Model: rep.Model, Kernels: v.Spec, DType: rep.DType,
			Timings: report.Timings{TokensPerSec: v.TokensPerSec, WallS: v.WallS, ComputeMs: v.ComputeMs}}
		r.ProfileSource = v.ProfileSource
		v.Summary = r.SummaryLine()
		rep.Variants = append(rep.Variants, *v)
		return nil
	}
	if err := run(base, "baseline", ""); err != nil {
		return err
	}
	if err := run(cand, "candidate", ""); err != nil {
		return err
	}
	used := map[kernels.Op]bool{}
	for _, v := range rep.Variants {
		for _, o := range v.Ops {
			used[o.Op] = used[o.Op] || o.Calls > 0
		}
	}
	units := ablationUnits(base, cand, used, only)
	bar.SetMax(int64(2+2*len(units))*perVariant + traced)
	for _, u := range units {
		uops, _ := opsOf(u)
		without, alone := withOps(cand, uops, base), withOps(base, uops, cand)
		if err := run(without, "candidate, "+u+" on baseline", u); err != nil {
			return err
		}
		if err := run(alone, "baseline, "+u+" on candidate", u); err != nil {
			return err
		}
	}
	bar.Done()
	rep.check()
	rep.compareOps(base, cand, units)

	if cf.plotPath != "" {
		png, err := comparePlot(rep)
		if err != nil {
			return err
		}
		if err := outfile.Write(cf.plotPath, png); err != nil {
			return fmt.Errorf("--plot %w", err)
		}
	}
	if cf.jsonOut {
		b, err := report.JSON(rep)
		if err != nil {
			return err
		}
		if !f.quiet {
			rep.writeText(cmd.ErrOrStderr())
		}
		if _, err := cmd.OutOrStdout().Write(b); err != nil {
			return err
		}
	} else {
		rep.writeText(cmd.OutOrStdout())
	}
	var wrong []string
	for _, v := range rep.Variants {
		if !v.OK {
			wrong = append(wrong, v.Spec)
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("compare: %s: tokens and prefill logits differ from the baseline's (%s); see the check column", strings.Join(wrong, "; "), rep.Baseline)
	}
	return nil
}

// runVariant runs spec on the loaded model: one checked generation (its
// tokens and prefill logits kept), then the warm-up and timed ones, then,
// with a tracer, one traced generation whose profile gives the op times.
// On a CUDA device the scratch memory of earlier variants is freed first,
// so that the peak is the variant's own.
func runVariant(m model.Model, dev kernels.Device, ops *kernels.Dispatch, prof *profile.Profile, prompts [][]int, opts model.GenerateOptions,
	spec kernels.Spec, f *genFlags, progress func(int, bool) (func(model.StepEvent), func()), tracer *variantTracer) (*variantReport, error) {
	if err := ops.Switch(spec); err != nil {
		return nil, err
	}
	if d, ok := dev.(*cuda.Device); ok {
		if err := d.ReleaseScratch(); err != nil {
			return nil, err
		}
	}
	prof.SetEnabled(false)
	check := opts
	check.KeepPrefillLogits = true
	onStep, done := progress(-1, false)
	check.OnStep = onStep
	first, err := model.Generate(m, prompts, check)
	done()
	if err != nil {
		return nil, err
	}
	runs, walls, err := measure.Generations(m, prompts, opts, prof, f.warmup, f.repeat, false, progress)
	if err != nil {
		return nil, err
	}
	med := runs[len(runs)/2]
	profiled := med
	if tracer != nil {
		if profiled, err = tracer.run(m, prompts, opts, progress, med); err != nil {
			return nil, err
		}
	}
	v := &variantReport{
		Spec:          spec.String(),
		TokensPerSec:  float64(med.Gen.NewTokens) / (med.Gen.WallMs / 1000),
		WallS:         med.Gen.WallMs / 1000,
		RunsWallS:     walls,
		WallSpread:    spread.Of(walls),
		Phases:        report.PhasesOf(med.Gen, len(prompts)),
		ComputeMs:     profiled.Report.ComputeMs,
		ProfileSource: profiled.Report.Source,
		ProfileNote:   report.NullString(profiled.Report.Note),
		Memory:        report.NewMemory(dev, m.Memory(), profiled.Profile),
		Ops:           profiled.Profile,
		tokens:        first.Tokens,
		logits:        first.PrefillLogits,
	}
	v.UnattributedMs = v.ComputeMs
	for _, o := range v.Ops {
		v.UnattributedMs -= o.Ms
	}
	if math.Abs(v.UnattributedMs) < 1e-9*max(1, v.ComputeMs) { // rounding in the sums
		v.UnattributedMs = 0
	}
	return v, nil
}

// variantTracer traces one more generation of a variant with the device's
// kernel trace (CUPTI), for its per-op times: the timed runs stay
// untraced. It starts and stops the trace around each generation it
// traces; once the trace fails to start it tries no more, and the variants
// keep their events profile, whose note says why.
type variantTracer struct {
	prof *profile.Profile
	why  string // why the trace could not start; "" before any try or on success
}

// newVariantTracer is the tracer of compare's profile on dev when asked
// for (--cupti) and the device has a kernel trace; nil otherwise.
func newVariantTracer(dev kernels.Device, prof *profile.Profile, asked bool) *variantTracer {
	if _, ok := dev.(profile.KernelTracer); !ok || !asked {
		return nil
	}
	return &variantTracer{prof: prof}
}

// run traces one generation and returns it; where the trace cannot start,
// it returns untraced, the run the events timed.
func (t *variantTracer) run(m model.Model, prompts [][]int, opts model.GenerateOptions,
	progress func(int, bool) (func(model.StepEvent), func()), untraced measure.Run) (measure.Run, error) {
	if t.why == "" {
		if err := t.prof.TraceKernels(); err != nil {
			t.why = fmt.Sprintf("kernels not traced (%v): times are events around each op", err)
		}
	}
	if t.why != "" {
		_, done := progress(-1, false)
		done()
		// Runs timed before the trace failed do not say why yet.
		if rep := *untraced.Report; !strings.Contains(rep.Note, t.why) {
			rep.Note = strings.TrimSuffix(t.why+"; "+rep.Note, "; ")
			untraced.Report = &rep
		}
		return untraced, nil
	}
	runs, _, err := measure.Generations(m, prompts, opts, t.prof, 0, 1, false, progress)
	if cerr := t.prof.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return measure.Run{}, fmt.Errorf("the traced generation: %w", err)
	}
	return runs[0], nil
}

// check holds every variant's tokens and prefill logits against the
// baseline's (the first variant).
func (r *compareReport) check() {
	ref := r.Variants[0]
	for i := range r.Variants {
		v := &r.Variants[i]
		v.SameTokens = sameLeading(v.tokens, ref.tokens)
		v.LogitsRelErr = kernels.RelErr(flatten(v.logits), flatten(ref.logits))
		switch {
		case v.SameTokens >= r.CheckTokens:
			v.OK, v.Check = true, fmt.Sprintf("same first %d tokens", r.CheckTokens)
		case slices.EqualFunc(v.tokens, ref.tokens, slices.Equal):
			v.OK, v.Check = true, "same tokens" // rows that ended before CheckTokens
		case v.LogitsRelErr <= r.Tolerance:
			v.OK, v.Check = true, fmt.Sprintf("logits within %.3g (%.3g)", r.Tolerance, v.LogitsRelErr)
		default:
			v.Check = fmt.Sprintf("WRONG: %d same tokens, logits off by %.3g", v.SameTokens, v.LogitsRelErr)
		}
	}
}

// sameLeading is the fewest leading tokens a row of got shares with the
// same row of want.
func sameLeading(got, want [][]int) int {
	least := math.MaxInt
	for b := range min(len(got), len(want)) {
		n := 0
		for n < len(got[b]) && n < len(want[b]) && got[b][n] == want[b][n] {
			n++
		}
		least = min(least, n)
	}
	if least == math.MaxInt {
		return 0
	}
	return least
}

func flatten(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// compareOps fills the per-op table from the baseline's and candidate's
// profiles and the ablations' tokens/s.
func (r *compareReport) compareOps(base, cand kernels.Spec, units []string) {
	b, c := r.Variants[0], r.Variants[1]
	r.GainMs = 1000 * (b.WallS - c.WallS)
	byOp := func(v variantReport) map[kernels.Op]profile.OpStat {
		m := map[kernels.Op]profile.OpStat{}
		for _, o := range v.Ops {
			m[o.Op] = o
		}
		return m
	}
	bo, co := byOp(b), byOp(c)
	unitOf := func(op kernels.Op) string {
		for _, u := range units {
			if u == string(op) || slices.Contains(kernels.OpGroups[u], op) {
				return u
			}
		}
		return ""
	}
	ablation := map[string]*variantReport{}
	for i := range r.Variants {
		v := &r.Variants[i]
		if v.Ablated != nil {
			ablation[v.Role] = v
		}
	}
	r.Unattributed = gainPart{BaselineMs: b.UnattributedMs, CandidateMs: c.UnattributedMs}
	r.Unattributed.GainShare = r.share(b.UnattributedMs, c.UnattributedMs)
	r.Outside = gainPart{BaselineMs: 1000*b.WallS - b.ComputeMs, CandidateMs: 1000*c.WallS - c.ComputeMs}
	r.Outside.GainShare = r.share(r.Outside.BaselineMs, r.Outside.CandidateMs)
	seen := map[kernels.Op]bool{}
	for _, ops := range [][]profile.OpStat{b.Ops, c.Ops} {
		for _, o := range ops {
			if seen[o.Op] {
				continue
			}
			seen[o.Op] = true
			unit := unitOf(o.Op)
			row := opComparison{Op: o.Op, BaselineSet: base.Runner(o.Op), CandidateSet: cand.Runner(o.Op),
				BaselineMs: bo[o.Op].Ms, CandidateMs: co[o.Op].Ms, Unit: report.NullString(unit)}
			if row.CandidateMs > 0 {
				row.Speedup = report.NullNum(row.BaselineMs / row.CandidateMs)
			}
			row.GainShare = r.share(row.BaselineMs, row.CandidateMs)
			if v := ablation["baseline, "+unit+" on candidate"]; v != nil && unit != "" {
				row.AloneTokensPerSec = report.NullNum(v.TokensPerSec)
			}
			if v := ablation["candidate, "+unit+" on baseline"]; v != nil && unit != "" {
				row.WithoutTokensPerSec = report.NullNum(v.TokensPerSec)
			}
			r.Ops = append(r.Ops, row)
		}
	}
	slices.SortStableFunc(r.Ops, func(x, y opComparison) int {
		return -cmp.Compare(x.BaselineMs+x.CandidateMs, y.BaselineMs+y.CandidateMs)
	})
}

// share is the part of the end-to-end gain that going from baseMs to
// candMs makes; null without a gain.
func (r *compareReport) share(baseMs, candMs float64) *float64 {
	if r.GainMs == 0 {
		return nil
	}
	v := (baseMs - candMs) / r.GainMs
	return &v
}

func (r *compareReport) writeText(w io.Writer) {
	for _, v := range r.Variants {
		fmt.Fprintf(w, "%s   [%s: %s]\n", v.Summary, v.Role, v.Check)
	}
	fmt.Fprintln(w)
	b, c := r.Variants[0], r.Variants[1]
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "op\t%s ms\t%s ms\tspeedup\tshare of gain\tbaseline+op tok/s\tcandidate−op tok/s\t\n", r.Baseline, r.Candidate)
	for _, o := range r.Ops {
		speed := "-"
		if o.Speedup != nil {
			speed = fmt.Sprintf("%.2f×", *o.Speedup)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t\n", o.Op, o.BaselineMs, o.CandidateMs, speed, shareCell(o.GainShare),
			tokensOrDash(o.AloneTokensPerSec), tokensOrDash(o.WithoutTokensPerSec))
	}
	for _, p := range []struct {
		name string
		part gainPart
	}{{unattributedName, r.Unattributed}, {outsideName, r.Outside}} {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t\t%s\t\t\t\n", p.name, p.part.BaselineMs, p.part.CandidateMs, shareCell(p.part.GainShare))
	}
	tw.Flush()
	fmt.Fprintf(w, "end to end: %s %.3f s, %s %.3f s (%.2f×); gain %.1f ms. baseline+op: %s with the op (or its group) on %s's set; candidate−op: %s with it on %s's\n",
		r.Baseline, b.WallS, r.Candidate, c.WallS, b.WallS/c.WallS, r.GainMs, r.Baseline, r.Candidate, r.Candidate, r.Baseline)
	fmt.Fprintf(w, "%s: device time charged to no op (%s); %s: wall time less device time (host, launch gaps; negative where kernels overlapped)\n",
		unattributedName, r.unattributedWhy(), outsideName)
	for _, v := range r.Variants[:2] {
		if v.ProfileNote != nil {
			fmt.Fprintf(w, "%s's op times: %s\n", v.Spec, *v.ProfileNote)
		}
	}
	for _, v := range r.Variants[:2] {
		fmt.Fprintf(w, "%s: %s\n", v.Spec, v.Phases.Line(r.Batch))
		if l := report.SpreadLine(v.WallSpread); l != "" {
			fmt.Fprintf(w, "%s: %s\n", v.Spec, l)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\ttokens/s\twall s\t±\tdevice ms\tpeak memory\tworking sets\tcheck\t")
	for _, v := range r.Variants {
		peak, ws := "-", "-"
		if v.Memory != nil {
			peak = report.BytesOrDash(v.Memory.PeakBytes)
			var sum int64
			for _, n := range v.Memory.WorkingSets {
				sum += n
			}
			ws = report.BytesOrDash(sum)
		}
		dev := "-"
		if v.WallSpread.N > 1 {
			dev = fmt.Sprintf("%.1f%%", 100*v.WallSpread.Rel())
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%s\t%.1f\t%s\t%s\t%s\t\n", v.Spec, v.TokensPerSec, v.WallS, dev, v.ComputeMs, peak, ws, v.Check)
	}
	tw.Flush()
	fmt.Fprintf(w, "wall s: the median of --repeat %d runs; ±: their standard deviation over their mean\n", r.Repeat)
}

// The names of the op table's two closing rows.
const (
	unattributedName = "(no op)"
	outsideName      = "(not device)"
)

// unattributedWhy says what the device time charged to no op is, by
// where the op times come from.
func (r *compareReport) unattributedWhy() string {
	if r.Variants[0].ProfileSource == "cupti" && r.Variants[1].ProfileSource == "cupti" {
		return "kernels CUPTI could not tie to an op call"
	}
	if r.Unattributed.BaselineMs == 0 && r.Unattributed.CandidateMs == 0 {
		return "none: events timed every op call"
	}
	return "the CUDA graph replays of decode steps, timed whole by events; --cupti where CUPTI loads charges their kernels to ops"
}

func shareCell(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**v)
}

func tokensOrDash(v *float64) string {
	if v == nil || *v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

// rowLengths is the length of each row.
func rowLengths(rows [][]int) []int {
	n := make([]int, len(rows))
	for i, r := range rows {
		n[i] = len(r)
	}
	return n
}
