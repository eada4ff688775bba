package main

import (
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/chrometrace"
	"github.com/fuselm/fuselm/kernels"
	_ "github.com/fuselm/fuselm/kernels/cpu"
	_ "github.com/fuselm/fuselm/kernels/fused"
	_ "github.com/fuselm/fuselm/kernels/naive"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/measure"
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/outfile"
	"github.com/fuselm/fuselm/report"
	"github.com/fuselm/fuselm/spread"
)

// genFlags are the flags of the generate command (the root command).
type genFlags struct {
	model, prompt, promptFile string
	promptsFile               string
	batch, maxNew, minNew     int
	warmup, repeat            int
	kernels, device, profile  string
	seed                      uint64
	temperature, topP         float64
	topK                      int
	quiet, jsonOut, noGraphs  bool
	trace                     string
	cupti                     bool
}

func newRootCmd() *cobra.Command {
	var f genFlags
	cmd := &cobra.Command{
		Use:   "infer --model M [--prompt S | --prompt-file F | --prompts F.jsonl] [flags]",
		Short: "Generate text with Qwen2 / DeepSeek-V2 checkpoints and time every op",
		Long: `infer generates text from a Hugging Face checkpoint of the Qwen2 or DeepSeek-V2
family and reports tokens/s and the time of every op, for the kernel set chosen
with --kernels: "fused" (CUDA, the default where a GPU is found), "naive" (CUDA,
the eager baseline) or "cpu" (pure Go, the no-GPU path), and per op another set
of the same device, as SET[,OP=SET...], e.g. "fused,attn=naive,rope=naive".

` + promptsRule + `

Logs go to stderr, progress bars too when it is a terminal; --quiet silences
both.

` + opList() + `

` + exitRule,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGenerate(cmd, &f)
		},
	}
	fl := cmd.Flags()
	f.workloadFlags(cmd)
	fl.StringVar(&f.kernels, "kernels", "", `kernel spec: SET[,OP=SET...] (default: the device's best set; ops and sets above)`)
	fl.StringVar(&f.device, "device", "", "cpu or cuda (default: cuda when a GPU is found)")
	fl.StringVar(&f.profile, "profile", "", "write the per-op profile and timings as JSON to this file")
	fl.StringVar(&f.trace, "trace", "", "write a Chrome trace (Perfetto, chrome://tracing) of the reported generation to this file")
	fl.BoolVar(&f.cupti, "cupti", false, "time every kernel through CUPTI, graph replays and cuBLAS's included "+
		"(tracing slows the run a little, so events time the ops by default; ignored on the cpu device)")
	fl.Uint64Var(&f.seed, "seed", 0, "sampling seed")
	fl.Float64Var(&f.temperature, "temperature", 0, "sampling temperature; 0 is greedy")
	fl.IntVar(&f.topK, "top-k", 0, "sample among the k most likely tokens (0: all)")
	fl.Float64Var(&f.topP, "top-p", 0, "sample among the most likely tokens whose probability reaches p (0 or 1: all)")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bars or logs on stderr")
	fl.BoolVar(&f.jsonOut, "json", false, "stdout is one JSON document: ids, text and timings of every row, and the profile")
	fl.BoolVar(&f.noGraphs, "no-graphs", false, "run decode steps eagerly instead of replaying a CUDA graph (ignored on the cpu device, which records none)")
	fl.IntVar(&f.warmup, "warmup", 0, "untimed generations first (kernel loading, cuBLAS set-up)")
	fl.IntVar(&f.repeat, "repeat", 1, "timed generations; the one of median wall time is reported")
	return silence(cmd)
}

// workloadFlags registers on cmd the flags that say what to generate:
// the checkpoint, the prompt, the batch and the new tokens.
func (f *genFlags) workloadFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "checkpoint directory, or HF hub id Org/Name found in the local HF cache")
	fl.StringVar(&f.prompt, "prompt", "", "prompt text")
	fl.StringVar(&f.promptFile, "prompt-file", "", "prompt file (lines stripped and joined with newlines, as TileGym reads it)")
	fl.StringVar(&f.promptsFile, "prompts", "", `JSONL file of distinct prompts, one row each: {"text": "..."} a line ("prompt" also read)`)
	fl.IntVar(&f.batch, "batch", 1, "rows: the prompt is repeated on every row (with --prompts: the file's count, if given)")
	fl.IntVar(&f.maxNew, "max-new-tokens", 50, "most new tokens per row")
	fl.IntVar(&f.minNew, "min-new-tokens", 0, "fewest new tokens per row: end-of-sequence is ignored until then")
}

// check rejects flag values that cannot run, before anything is loaded.
func (f *genFlags) check(cmd *cobra.Command) error {
	bad := func(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }
	switch {
	case f.model == "":
		return bad("--model is required")
	case f.promptSources(cmd) != 1:
		return bad("give exactly one of --prompt, --prompt-file or --prompts")
	case f.batch < 1:
		return bad("--batch must be at least 1, not %d", f.batch)
	case f.maxNew < 1:
		return bad("--max-new-tokens must be at least 1, not %d", f.maxNew)
	case f.minNew < 0:
		return bad("--min-new-tokens must not be negative (%d)", f.minNew)
	case f.minNew > f.maxNew:
		return bad("--min-new-tokens (%d) is more than --max-new-tokens (%d)", f.minNew, f.maxNew)
	case !(f.temperature >= 0 && f.temperature <= math.MaxFloat64):
		return bad("--temperature must be a finite number ≥ 0, not %g", f.temperature)
	case f.topK < 0:
		return bad("--top-k must not be negative (%d)", f.topK)
	case !(f.topP >= 0 && f.topP <= 1):
		return bad("--top-p must be in [0, 1], not %g", f.topP)
	case f.warmup < 0:
		return bad("--warmup must not be negative (%d)", f.warmup)
	case f.repeat < 1:
		return bad("--repeat must be at least 1, not %d", f.repeat)
	case f.device != "" && f.device != "cpu" && f.device != "cuda":
		return bad("--device must be cpu or cuda, not %q", f.device)
	}
	return nil
}

// checkOutputs makes sure, before anything is loaded, that every file the
// run writes at its end can be written and destroys no input.
func (f *genFlags) checkOutputs() error {
	return checkOutputs([]namedPath{{"--profile", f.profile}, {"--trace", f.trace}}, f.model, f.inputs()...)
}

// inputs are the files of the command line the run reads, which no
// output may overwrite.
func (f *genFlags) inputs() []namedPath {
	var ins []namedPath
	if f.promptFile != "" {
		ins = append(ins, namedPath{"--prompt-file", f.promptFile})
	}
	if f.promptsFile != "" {
		ins = append(ins, namedPath{"--prompts", f.promptsFile})
	}
	return ins
}

// promptSources is how many of --prompt, --prompt-file and --prompts the
// command line gave.
func (f *genFlags) promptSources(cmd *cobra.Command) int {
	n := 0
	for _, given := range []bool{f.prompt != "" || cmd.Flags().Changed("prompt"), f.promptFile != "", f.promptsFile != ""} {
		if given {
			n++
		}
	}
	return n
}

// runGenerate is infer's path: the flags checked, the session opened
// (session.go), the tuning cache applied, the generations measured, and the
// report written to stdout and to the files the flags name.
func runGenerate(cmd *cobra.Command, f *genFlags) (err error) {
	if err := f.check(cmd); err != nil {
		return err
	}
	if err := f.checkOutputs(); err != nil {
		return err
	}
	logf := f.logger(cmd)

	in, err := f.readInputs(cmd)
	if err != nil {
		return err
	}
	defer in.weights.Close()
	spec, dir, cfg, tok := in.spec, in.dir, in.cfg, in.tok

	dev, prof, ops, closeRun, err := openRun(f, in, spec)
	if err != nil {
		return err
	}
	defer closeRun()
	logf("infer: %s (%s) on %s, kernels %s", filepath.Base(dir), cfg.Arch, dev.Name(), spec)
	if in.compiled != "" {
		logf("%s", in.compiled)
	}
	ignoredOnCPU(cmd, dev, logf)
	tuned := applyTuning(dev, ops, logf)

	tLoad := time.Now()
	m, loadSpan, err := loadModel(cmd, f, in, dev, ops, tLoad)
	if err != nil {
		return err
	}
	defer m.Close()
	loadS := time.Since(tLoad).Seconds()
	logf("infer: weights loaded in %.1f s; device memory: %s", loadS, m.Memory())

	prompts := in.rows(f.batch)
	opts := model.GenerateOptions{
		MaxNewTokens: f.maxNew,
		MinNewTokens: f.minNew,
		Sampling:     model.Sampling{Temperature: f.temperature, TopK: f.topK, TopP: f.topP, Seed: f.seed},
		EOS:          tok.EOS(),
		NoGraphs:     f.noGraphs,
		Profile:      prof,
		Logf:         logf,
	}
	runs, walls, err := measure.Generations(m, prompts, opts, prof, f.warmup, f.repeat, f.trace != "",
		func(i int, timed bool) (func(model.StepEvent), func()) {
			desc := fmt.Sprintf("generating %d/%d", i-f.warmup+1, f.repeat)
			if !timed {
				desc = fmt.Sprintf("warm-up %d/%d", i+1, f.warmup)
			}
			steps := newProgress(cmd.ErrOrStderr(), f.quiet, int64(f.maxNew), desc, false)
			return func(e model.StepEvent) { steps.Set(int64(e.Step)) }, steps.Done
		})
	if err != nil {
		return err
	}
	med := runs[len(runs)/2]
	gen := med.Gen

	rep := &report.Run{
		Provenance: newProvenance(dev.Name()),
		Model:      modelName(f.model, dir),
		Kernels:    spec.String(),
		DType:      dev.ActDType().String(),
		Batch:      f.batch,
		Profile:    med.Report.Ops,
		Tuning:     tuned,
	}
	rep.ProfileNote = profile.NonZero(med.Report.Note)
	rep.ProfileSource = med.Report.Source
	rep.GPU = report.NewGPU(med.Report, gen.WallMs, gen.DecodeSteps)
	rep.Memory = report.NewMemory(dev, m.Memory(), med.Report.Ops)
	for b := range prompts {
		rep.Rows = append(rep.Rows, report.Row{PromptIDs: prompts[b], GeneratedIDs: gen.Tokens[b], Text: tok.Decode(gen.Tokens[b], true)})
	}
	rep.Timings = report.Timings{
		NewTokens:    gen.NewTokens,
		TokensPerSec: float64(gen.NewTokens) / (gen.WallMs / 1000),
		WallS:        gen.WallMs / 1000,
		Phases:       report.PhasesOf(gen, f.batch),
		ComputeMs:    med.Report.ComputeMs,
		LoadS:        loadS,
		GraphSteps:   gen.GraphReplays,
		GraphKept:    gen.GraphKept,
		Warmup:       f.warmup,
		RunsWallS:    walls,
		WallSpread:   spread.Of(walls),
	}
	if gen.GraphReplays == 0 && gen.Graph != "" && dev.ActDType() != kernels.F32 {
		logf("infer: CUDA graphs %s", gen.Graph)
	}

	if f.profile != "" {
		profOnly := *rep
		profOnly.Rows = nil
		b, err := report.JSON(&profOnly)
		if err != nil {
			return err
		}
		if err := outfile.Write(f.profile, b); err != nil {
			return fmt.Errorf("--profile %w", err)
		}
	}
	if f.trace != "" {
		med.Trace.Host = append([]profile.HostSpan{loadSpan}, med.Trace.Host...)
		// Chrome's trace format names its own keys (traceEvents, otherData):
		// the provenance goes in otherData.
		b, err := chrometrace.Build(med.Trace, dev.Name(), map[string]any{"model": rep.Model, "kernels": rep.Kernels,
			"summary": rep.SummaryLine(), "profile_source": rep.ProfileSource,
			"version": rep.Version, "commit": rep.Commit, "date": rep.Date, "device": rep.Device})
		if err != nil {
			return err
		}
		if err := outfile.Write(f.trace, b); err != nil {
			return fmt.Errorf("--trace %w", err)
		}
	}
	out := cmd.OutOrStdout()
	if f.jsonOut {
		b, err := report.JSON(rep)
		if err != nil {
			return err
		}
		if !f.quiet {
			rep.WriteProfile(cmd.ErrOrStderr())
		}
		_, err = out.Write(b)
		return err
	}
	rep.WriteText(out)
	return nil
}
