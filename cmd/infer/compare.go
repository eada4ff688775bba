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
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/outfile"
)

// compareFlags are infer compare's flags: those it shares with generation,
// and its own.
type compareFlags struct {
	gen                 genFlags
	baseline, candidate string
	ops                 string
	jsonPath, plotPath  string
	checkTokens         int
	tolerance           float64
}

func newCompareCmd() *cobra.Command {
	var cf compareFlags
	cmd := &cobra.Command{
		Use:   "compare --model M [--prompt S | --prompt-file F] [flags]",
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

It prints each variant's summary line, a table of every op (baseline ms,
candidate ms, speedup, the op's share of the end-to-end gain, and the
tokens/s of its two ablations), and each variant's peak memory. --json
writes all of it, --plot a PNG of per-op time and tokens/s per variant.
When a variant fails the check, compare says which and exits 1 after
writing its files.

` + exitRule,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCompare(cmd, &cf) },
	}
	f := &cf.gen
	fl := cmd.Flags()
	f.workloadFlags(cmd)
	fl.StringVar(&f.device, "device", "", "cpu or cuda (default: the device of the kernel sets)")
	fl.BoolVar(&f.noGraphs, "no-graphs", false, "run decode steps eagerly instead of replaying a CUDA graph")
	fl.BoolVar(&f.cupti, "cupti", false, "time every kernel through CUPTI, graph replays and cuBLAS's included "+
		"(tracing slows the run a little: W1 148.0 tokens/s with it, 153.5 without, so events time the ops by default)")
	fl.IntVar(&f.warmup, "warmup", 0, "untimed generations per variant after the checked one")
	fl.IntVar(&f.repeat, "repeat", 1, "timed generations per variant; the one of median wall time is reported")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar or logs on stderr")
	fl.StringVar(&cf.baseline, "baseline", "naive", "the baseline kernel spec")
	fl.StringVar(&cf.candidate, "candidate", "fused", "the candidate kernel spec")
	fl.StringVar(&cf.ops, "ops", "", "comma-separated ops or groups to ablate (default: every one that differs)")
	fl.StringVar(&cf.jsonPath, "json", "", "write every variant's results as JSON to this file")
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
	Model        string          `json:"model"`
	Device       string          `json:"device"`
	DType        string          `json:"dtype"`
	Batch        int             `json:"batch"`
	PromptTokens int             `json:"prompt_tokens"`
	MaxNew       int             `json:"max_new_tokens"`
	Baseline     string          `json:"baseline"`
	Candidate    string          `json:"candidate"`
	Warmup       int             `json:"warmup_runs"`
	Repeat       int             `json:"timed_runs"`
	CheckTokens  int             `json:"check_tokens"`
	Tolerance    float64         `json:"tolerance"`
	GainMs       float64         `json:"gain_ms"` // the baseline's wall time less the candidate's
	Variants     []variantReport `json:"variants"`
	Ops          []opComparison  `json:"ops"`
}

// variantReport is one kernel spec's run.
type variantReport struct {
	Spec string `json:"spec"`
	// Role is "baseline", "candidate", or the ablation: "candidate, OP on
	// baseline" or "baseline, OP on candidate".
	Role          string           `json:"role"`
	Ablated       string           `json:"ablated,omitempty"`
	Summary       string           `json:"summary"`
	TokensPerSec  float64          `json:"tokens_per_s"`
	WallS         float64          `json:"wall_s"`
	RunsWallS     []float64        `json:"runs_wall_s"`
	ComputeMs     float64          `json:"compute_ms"`
	ProfileSource string           `json:"profile_source"`
	ProfileNote   string           `json:"profile_note,omitempty"`
	Memory        *memoryReport    `json:"memory"`
	SameTokens    int              `json:"same_leading_tokens"` // the fewest leading tokens any row shares with the baseline's
	LogitsRelErr  float64          `json:"prefill_logits_rel_err"`
	OK            bool             `json:"ok"`
	Check         string           `json:"check"` // why it passed or failed
	Ops           []profile.OpStat `json:"ops"`
	tokens        [][]int
	logits        [][]float32
}

// opComparison is one op's row: its time under the baseline and the
// candidate, and the tokens/s of its two ablations (0 when not run).
type opComparison struct {
	Op           kernels.Op `json:"op"`
	BaselineSet  string     `json:"baseline_set"`
	CandidateSet string     `json:"candidate_set"`
	BaselineMs   float64    `json:"baseline_ms"`
	CandidateMs  float64    `json:"candidate_ms"`
	Speedup      float64    `json:"speedup"`
	// GainShare is the op's time saved over the end-to-end gain (the
	// baseline's wall time less the candidate's).
	GainShare float64 `json:"gain_share"`
	// AloneTokensPerSec is the baseline with this op (or its group) on
	// the candidate's set; WithoutTokensPerSec the candidate with it on the
	// baseline's.
	Unit                string  `json:"ablation,omitempty"`
	AloneTokensPerSec   float64 `json:"baseline_with_op_tokens_per_s,omitempty"`
	WithoutTokensPerSec float64 `json:"candidate_without_op_tokens_per_s,omitempty"`
}

func runCompare(cmd *cobra.Command, cf *compareFlags) error {
	base, cand, only, err := cf.check(cmd)
	if err != nil {
		return err
	}
	for _, o := range []struct{ flag, path string }{{"--json", cf.jsonPath}, {"--plot", cf.plotPath}} {
		if o.path != "" {
			if err := outfile.Check(o.path); err != nil {
				return fmt.Errorf("%s %w", o.flag, err)
			}
		}
	}
	f := &cf.gen
	logf := f.logger(cmd)
	in, err := f.readInputs()
	if err != nil {
		return err
	}
	defer in.weights.Close()
	dev, prof, ops, closeRun, err := openRun(f, in, base)
	if err != nil {
		return err
	}
	defer closeRun()
	logf("infer compare: %s (%s) on %s, %s against %s", filepath.Base(in.dir), in.cfg.Arch, dev.Name(), cand, base)
	m, _, err := loadModel(cmd, f, in, dev, ops, time.Now())
	if err != nil {
		return err
	}
	defer m.Close()

	rep := &compareReport{
		Model: modelName(f.model, in.dir), Device: dev.Name(), DType: dev.ActDType().String(), Batch: f.batch,
		PromptTokens: len(in.ids), MaxNew: f.maxNew, Baseline: base.String(), Candidate: cand.String(),
		Warmup: f.warmup, Repeat: f.repeat, CheckTokens: min(cf.checkTokens, f.maxNew), Tolerance: cf.tolerance,
	}
	if rep.Tolerance == 0 {
		rep.Tolerance = 1e-4
		if dev.ActDType() != kernels.F32 {
			rep.Tolerance = 0.1
		}
	}
	prompts := make([][]int, f.batch)
	for i := range prompts {
		prompts[i] = in.ids
	}
	opts := model.GenerateOptions{MaxNewTokens: f.maxNew, MinNewTokens: f.minNew, EOS: in.tok.EOS(), NoGraphs: f.noGraphs, Profile: prof, Logf: logf}
	perVariant := int64(1 + f.warmup + f.repeat)
	bar := newProgress(cmd.ErrOrStderr(), f.quiet, 2*perVariant, "comparing", false)
	var done int64
	progress := func(int, bool) (func(model.StepEvent), func()) {
		return func(model.StepEvent) {}, func() { done++; bar.Set(done) }
	}
	run := func(spec kernels.Spec, role, unit string) error {
		v, err := runVariant(m, dev, ops, prof, prompts, opts, spec, f, progress)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", spec, role, err)
		}
		v.Role, v.Ablated = role, unit
		r := runReport{Model: rep.Model, Kernels: v.Spec, DType: rep.DType,
			Timings: timings{TokensPerSec: v.TokensPerSec, WallS: v.WallS, ComputeMs: v.ComputeMs}}
		r.ProfileSource = v.ProfileSource
		v.Summary = r.summaryLine()
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
	bar.SetMax(int64(2+2*len(units)) * perVariant)
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

	if cf.jsonPath != "" {
		b, err := marshalJSON(rep)
		if err != nil {
			return err
		}
		if err := outfile.Write(cf.jsonPath, b); err != nil {
			return fmt.Errorf("--json %w", err)
		}
	}
	if cf.plotPath != "" {
		png, err := comparePlot(rep)
		if err != nil {
			return err
		}
		if err := outfile.Write(cf.plotPath, png); err != nil {
			return fmt.Errorf("--plot %w", err)
		}
	}
	rep.writeText(cmd.OutOrStdout())
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
// tokens and prefill logits kept), then the warm-up and timed ones. On a
// CUDA device the scratch memory of earlier variants is freed first, so
// that the peak is the variant's own.
func runVariant(m model.Model, dev kernels.Device, ops *kernels.Dispatch, prof *profile.Profile, prompts [][]int, opts model.GenerateOptions,
	spec kernels.Spec, f *genFlags, progress func(int, bool) (func(model.StepEvent), func())) (*variantReport, error) {
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
	runs, walls, err := generateRuns(m, prompts, opts, prof, f.warmup, f.repeat, false, progress)
	if err != nil {
		return nil, err
	}
	med := runs[len(runs)/2]
	return &variantReport{
		Spec:          spec.String(),
		TokensPerSec:  float64(med.gen.NewTokens) / (med.gen.WallMs / 1000),
		WallS:         med.gen.WallMs / 1000,
		RunsWallS:     walls,
		ComputeMs:     med.report.ComputeMs,
		ProfileSource: med.report.Source,
		ProfileNote:   med.report.Note,
		Memory:        newMemoryReport(dev, m.Memory(), med.profile),
		Ops:           med.profile,
		tokens:        first.Tokens,
		logits:        first.PrefillLogits,
	}, nil
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
		if v.Ablated != "" {
			ablation[v.Role] = v
		}
	}
	seen := map[kernels.Op]bool{}
	for _, ops := range [][]profile.OpStat{b.Ops, c.Ops} {
		for _, o := range ops {
			if seen[o.Op] {
				continue
			}
			seen[o.Op] = true
			row := opComparison{Op: o.Op, BaselineSet: base.Runner(o.Op), CandidateSet: cand.Runner(o.Op),
				BaselineMs: bo[o.Op].Ms, CandidateMs: co[o.Op].Ms, Unit: unitOf(o.Op)}
			if row.CandidateMs > 0 {
				row.Speedup = row.BaselineMs / row.CandidateMs
			}
			if r.GainMs != 0 {
				row.GainShare = (row.BaselineMs - row.CandidateMs) / r.GainMs
			}
			if v := ablation["baseline, "+row.Unit+" on candidate"]; v != nil {
				row.AloneTokensPerSec = v.TokensPerSec
			}
			if v := ablation["candidate, "+row.Unit+" on baseline"]; v != nil {
				row.WithoutTokensPerSec = v.TokensPerSec
			}
			r.Ops = append(r.Ops, row)
		}
	}
	slices.SortStableFunc(r.Ops, func(x, y opComparison) int {
		return -cmp.Compare(x.BaselineMs+x.CandidateMs, y.BaselineMs+y.CandidateMs)
	})
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
		if o.Speedup > 0 {
			speed = fmt.Sprintf("%.2f×", o.Speedup)
		}
		share := "-"
		if r.GainMs != 0 {
			share = fmt.Sprintf("%.1f%%", 100*o.GainShare)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t\n", o.Op, o.BaselineMs, o.CandidateMs, speed, share,
			tokensOrDash(o.AloneTokensPerSec), tokensOrDash(o.WithoutTokensPerSec))
	}
	tw.Flush()
	fmt.Fprintf(w, "end to end: %s %.3f s, %s %.3f s (%.2f×); gain %.1f ms. baseline+op: %s with the op (or its group) on %s's set; candidate−op: %s with it on %s's\n\n",
		r.Baseline, b.WallS, r.Candidate, c.WallS, b.WallS/c.WallS, r.GainMs, r.Baseline, r.Candidate, r.Candidate, r.Baseline)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\ttokens/s\twall s\tdevice ms\tpeak memory\tworking sets\tcheck\t")
	for _, v := range r.Variants {
		peak, ws := "-", "-"
		if v.Memory != nil {
			peak = bytesOrDash(v.Memory.PeakBytes)
			var sum int64
			for _, n := range v.Memory.WorkingSets {
				sum += n
			}
			ws = bytesOrDash(sum)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%.1f\t%s\t%s\t%s\t\n", v.Spec, v.TokensPerSec, v.WallS, v.ComputeMs, peak, ws, v.Check)
	}
	tw.Flush()
}

func tokensOrDash(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}
