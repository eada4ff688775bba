package main

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
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

// runCompare is infer compare's path: one session, the model loaded once,
// each variant run and checked against the baseline, then the report and its
// plot written.
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
	if in.compiled != "" {
		logf("%s", in.compiled)
	}
	ignoredOnCPU(cmd, dev, logf)
	tracer := newVariantTracer(dev, prof, f.cupti)
	m, _, err := loadModel(cmd, f, in, dev, ops, time.Now())
	if err != nil {
		return err
	}
	defer m.Close()

	rep := &report.Compare{
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
	// Under events (no tracer) the table's decode rows are the first decode
	// step's, run eagerly even where the graph kept from the generation
	// before could replay it; a traced run records its own graph.
	opts := model.GenerateOptions{MaxNewTokens: f.maxNew, MinNewTokens: f.minNew, EOS: in.tok.EOS(), NoGraphs: f.noGraphs,
		EagerFirstStep: tracer == nil, Profile: prof, Logf: logf}
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
		v.Role, v.Ablated = role, profile.NonZero(unit)
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
	rep.Check()
	rep.CompareOps(base, cand, units)

	if cf.plotPath != "" {
		png, err := report.ComparePlot(rep)
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
			rep.WriteText(cmd.ErrOrStderr())
		}
		if _, err := cmd.OutOrStdout().Write(b); err != nil {
			return err
		}
	} else {
		rep.WriteText(cmd.OutOrStdout())
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
	spec kernels.Spec, f *genFlags, progress func(int, bool) (func(model.StepEvent), func()), tracer *variantTracer) (*report.Variant, error) {
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
	v := &report.Variant{
		Spec:          spec.String(),
		TokensPerSec:  float64(med.Gen.NewTokens) / (med.Gen.WallMs / 1000),
		WallS:         med.Gen.WallMs / 1000,
		RunsWallS:     walls,
		WallSpread:    spread.Of(walls),
		Phases:        report.PhasesOf(med.Gen, len(prompts)),
		ComputeMs:     profiled.Report.ComputeMs,
		ProfileSource: profiled.Report.Source,
		ProfileNote:   profile.NonZero(profiled.Report.Note),
		Memory:        report.NewMemory(dev, m.Memory(), profiled.Report.Ops),
		Ops:           profiled.Report.Ops,
		Tokens:        first.Tokens,
		Logits:        first.PrefillLogits,
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

// rowLengths is the length of each row.
func rowLengths(rows [][]int) []int {
	n := make([]int, len(rows))
	for i, r := range rows {
		n[i] = len(r)
	}
	return n
}
