package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kbench"
	"github.com/fuselm/fuselm/outfile"
	"github.com/fuselm/fuselm/report"
)

// benchFlags are the flags of infer bench.
type benchFlags struct {
	sets, variants, arch, device, plot string
	shapes                             []string
	dryRun, optimize, cupti            bool
	jsonOut, csvOut, quiet             bool
	seed                               uint64
	groups                             int
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [OP...] [flags]",
		Short: "Time every kernel set's kernels op by op (TileGym's kernel benchmarks)",
		Long: `bench times the kernels of every set side by side, op by op, on TileGym's
shapes and the models' real layers (or --shape): for each set, and each
variant of a set that has several, the time of one call, the metric the op is
bound by (TFLOP/s or GB/s), its floor (bytes over the measured copy rate, or
FLOPs over the measured GEMM rate) and the share of it reached. Every result is
first checked against the cpu set (or naive, where the cpu would take too long)
on the same inputs; a result that differs is reported and not timed.

--dry-run lists what each set offers for every shape, valid or not and why,
without running anything (with --arch, on a machine with no GPU). --optimize
times every variant, keeps the fastest per tuning key in the device's tuning
cache, and infer applies it.

--variants times, of a set that offers several variants of an op, only those
named (comma-separated, e.g. --variants wgmma): the kernel under work, without
timing every tiling beside it. With --optimize, the fastest of those is kept.

Each row's time is the median over --groups groups of calls (a group is as
many calls as fill about 5 ms, at most 200); the tables give the spread of
one call's time over the groups as its standard deviation relative to the
mean (±), the JSON and CSV its min, max and standard deviation. More groups
narrow it.

--cupti runs every timed row's calls again after the timing, under CUPTI, and
gives each row the kernels of one call: launches and device time per call and
their share of the row's time (graph replays and cuBLAS's kernels included).
The tables add each row's longest kernel; attention's add the op's rate without
its kv_append (on fused's attn_prefill, flash_hopper's own), the figure that
cuDNN's and FlashAttention's attention, which append to no cache, are read
against; --json holds every kernel.

Ops: ` + strings.Join(benchOps(), " ") + `

` + exitRule,
		RunE: func(cmd *cobra.Command, args []string) error { return runBench(cmd, &f, args) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.sets, "sets", "", "kernel sets side by side, comma-separated (default: every set of the device)")
	fl.StringVar(&f.variants, "variants", "", "of a set with several variants of an op, time only these, comma-separated (default: all)")
	fl.StringArrayVar(&f.shapes, "shape", nil, `a shape instead of the defaults, as "B=4,H=32,KVH=32,D=128,N=4096,causal=1" (repeatable; attn_prefill also takes dt=f16)`)
	fl.BoolVar(&f.dryRun, "dry-run", false, "list each set's variants for every shape, valid or not, and run nothing")
	fl.StringVar(&f.arch, "arch", "", "the target of --dry-run where no GPU is found: "+strings.Join(targetNames(), ", "))
	fl.BoolVar(&f.optimize, "optimize", false, "keep the fastest variant per tuning key in the device's tuning cache")
	fl.BoolVar(&f.cupti, "cupti", false, "time each row's kernels through CUPTI, graph replays and cuBLAS's included "+
		"(in a pass of their own after the timing, which tracing could slow, so that the rows' times stay the events')")
	fl.StringVar(&f.device, "device", "", "cpu or cuda (default: cuda when a GPU is found)")
	fl.BoolVar(&f.jsonOut, "json", false, "stdout is one JSON document instead of tables")
	fl.BoolVar(&f.csvOut, "csv", false, "stdout is CSV, one line per row, instead of tables")
	fl.StringVar(&f.plot, "plot", "", "draw each op's metric against its shapes, one line per set and variant, the floor dashed, to this PNG")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the random inputs")
	fl.IntVar(&f.groups, "groups", kbench.DefaultGroups, "groups of calls each row's time is the median of")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar or logs on stderr")
	c := silence(cmd)
	c.Args = benchArgs
	return c
}

func benchOps() []string {
	var ops []string
	for _, c := range kbench.Cases() {
		ops = append(ops, string(c.Op))
	}
	return ops
}

func targetNames() []string {
	names := make([]string, 0, len(kernels.Targets))
	for n := range kernels.Targets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// benchArgs accepts op names only.
func benchArgs(_ *cobra.Command, args []string) error {
	for _, a := range args {
		if kbench.CaseFor(kernels.Op(a)) == nil {
			return usageError{fmt.Errorf("bench: no benchmark for op %q (ops: %s)", a, strings.Join(benchOps(), ", "))}
		}
	}
	return nil
}

// check rejects flag combinations that cannot run, before any device work.
func (f *benchFlags) check(ops []kernels.Op) (kbench.Options, error) {
	bad := func(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }
	opt := kbench.Options{Seed: f.seed, Optimize: f.optimize, CUPTI: f.cupti, Groups: f.groups}
	for _, op := range ops {
		opt.Ops = append(opt.Ops, op)
	}
	switch {
	case f.jsonOut && f.csvOut:
		return opt, bad("give at most one of --json and --csv")
	case f.dryRun && f.optimize:
		return opt, bad("--dry-run runs nothing, so it cannot --optimize")
	case f.dryRun && f.plot != "":
		return opt, bad("--dry-run runs nothing, so there is nothing to --plot")
	case f.dryRun && f.cupti:
		return opt, bad("--dry-run runs nothing, so there are no kernels for --cupti to time")
	case f.arch != "" && !f.dryRun:
		return opt, bad("--arch names the target of a --dry-run; a run measures the device it runs on")
	case f.device != "" && f.device != "cpu" && f.device != "cuda":
		return opt, bad("--device must be cpu or cuda, not %q", f.device)
	case f.groups < 1:
		return opt, bad("--groups must be at least 1, not %d", f.groups)
	case f.dryRun && f.groups != kbench.DefaultGroups:
		return opt, bad("--dry-run runs nothing, so there are no --groups to time")
	}
	if f.arch != "" {
		if _, ok := kernels.Targets[f.arch]; !ok {
			return opt, bad("--arch %q: known targets are %s", f.arch, strings.Join(targetNames(), ", "))
		}
	}
	for _, s := range f.shapes {
		sh, err := kernels.ParseShape(s)
		if err != nil {
			return opt, usageError{fmt.Errorf("--shape: %w", err)}
		}
		opt.Shapes = append(opt.Shapes, sh)
	}
	if len(opt.Shapes) > 0 && len(opt.Ops) == 0 {
		return opt, bad("--shape needs the op(s) it is a shape of, e.g. infer bench attn_prefill --shape ...")
	}
	for _, op := range opt.Ops {
		for _, s := range opt.Shapes {
			if err := kbench.CaseFor(op).Check(s); err != nil {
				return opt, usageError{fmt.Errorf("--shape: %w", err)}
			}
		}
	}
	opt.Sets = names(f.sets)
	for _, s := range opt.Sets {
		if _, ok := kernels.Set(s); !ok {
			return opt, bad("--sets: kernel set %q is not built into this binary", s)
		}
	}
	opt.Variants = names(f.variants)
	if slices.Contains(opt.Variants, "") {
		return opt, bad("--variants: an empty name in %q", f.variants)
	}
	if err := checkOutputs([]namedPath{{"--plot", f.plot}}, ""); err != nil {
		return opt, err
	}
	return opt, nil
}

// format is the form of bench's stdout the flags ask for.
func (f *benchFlags) format() report.Format {
	switch {
	case f.jsonOut:
		return report.AsJSON
	case f.csvOut:
		return report.AsCSV
	}
	return report.AsTables
}

// names are the comma-separated names of a flag's value, trimmed, each
// once, in order; none for an empty value.
func names(value string) []string {
	var out []string
	if value == "" {
		return out
	}
	for _, n := range strings.Split(value, ",") {
		if n = strings.TrimSpace(n); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// checkVariants is kbench.CheckVariants's verdict on --variants for the
// sets of opt on target, as a usage error.
func checkVariants(target kernels.Target, opt kbench.Options) error {
	if err := kbench.CheckVariants(target, opt.Sets, opt); err != nil {
		return usageError{fmt.Errorf("--variants: %w", err)}
	}
	return nil
}

// runBench is infer bench's path: a dry run's offers, or every set's
// kernels timed on the device, --optimize's choices kept in the tuning
// cache, and the report written.
func runBench(cmd *cobra.Command, f *benchFlags, args []string) error {
	var ops []kernels.Op
	for _, a := range args {
		ops = append(ops, kernels.Op(a))
	}
	opt, err := f.check(ops)
	if err != nil {
		return err
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	logw := stderr
	if f.quiet {
		logw = io.Discard
	}
	if f.dryRun {
		target, kind, device, err := f.dryTarget()
		if err != nil {
			return err
		}
		if len(opt.Sets) == 0 {
			opt.Sets = setsOf(kind)
		}
		if err := checkVariants(target, opt); err != nil {
			return err
		}
		offers, err := kbench.DryRun(target, opt.Sets, opt)
		if err != nil {
			return usageError{err}
		}
		return report.NewDryRun(newProvenance(device), target, offers).Write(stdout, f.format(), tableWidth(stdout))
	}

	kind := f.device
	if kind == "" {
		if err := cuda.Probe(); err != nil {
			return fmt.Errorf("bench times the CUDA sets and finds no GPU (%v): --dry-run --arch lists what "+
				"they offer, --device cpu --shape times the cpu set", err)
		}
		kind = "cuda"
	}
	if kind == "cpu" && len(opt.Shapes) == 0 {
		return usageError{errors.New("bench --device cpu needs --shape: the default shapes are a GPU's (minutes each on a CPU)")}
	}
	if len(opt.Sets) == 0 {
		opt.Sets = setsOf(kind)
	}
	for _, s := range opt.Sets {
		if info, _ := kernels.Set(s); info.Device != kind {
			return usageError{fmt.Errorf("--sets: %s runs on %s, not on the %s device", s, info.Device, kind)}
		}
	}
	dev, err := openBenchDevice(kind)
	if err != nil {
		return err
	}
	defer dev.Close()
	target := deviceTarget(dev)
	if err := checkVariants(target, opt); err != nil {
		return err
	}
	fmt.Fprintf(logw, "bench: %s, sets %s\n", dev.Name(), strings.Join(opt.Sets, ", "))
	bar := newProgress(stderr, f.quiet, 1, "bench", false)
	opt.Progress = func(done, total int) {
		if bar.bar != nil {
			bar.bar.ChangeMax(total)
		}
		bar.Set(int64(done))
	}
	rep, err := kbench.Run(dev, target, opt)
	bar.Done()
	if err != nil {
		return err
	}
	if rep.Note != "" && f.csvOut { // the tables and the JSON say it; CSV has no place for it
		fmt.Fprintf(logw, "bench: %s\n", rep.Note)
	}
	if f.optimize {
		if err := keepTuning(dev, rep, opt, logw); err != nil {
			return err
		}
	}
	if f.plot != "" {
		png, err := kbench.Plot(rep)
		if err != nil {
			return err
		}
		if err := outfile.Write(f.plot, png); err != nil {
			return err
		}
	}
	return report.WriteBench(stdout, rep, newProvenance(rep.Device), f.format())
}

// setsOf is every registered set of a device kind, the default first.
func setsOf(kind string) []string {
	def := kernels.DefaultSet(kind)
	out := []string{}
	if def != "" {
		out = append(out, def)
	}
	for _, s := range kernels.Sets() {
		if s.Device == kind && s.Name != def {
			out = append(out, s.Name)
		}
	}
	return out
}

// dryTarget is --arch's target, else the device's own, with the device
// kind and the device's name ("" for --arch, which names no device).
func (f *benchFlags) dryTarget() (kernels.Target, string, string, error) {
	if f.arch != "" {
		return kernels.Targets[f.arch], "cuda", "", nil
	}
	if f.device == "cpu" {
		return kernels.Target{Arch: "cpu"}, "cpu", cpuDevice().Name(), nil
	}
	if err := cuda.Probe(); err != nil {
		return kernels.Target{}, "", "", usageError{fmt.Errorf("--dry-run needs --arch (%s) where no GPU is found: %v",
			strings.Join(targetNames(), ", "), err)}
	}
	dev, err := cuda.Open(0)
	if err != nil {
		return kernels.Target{}, "", "", err
	}
	defer dev.Close()
	return deviceTarget(dev), "cuda", dev.Name(), nil
}

func openBenchDevice(kind string) (kernels.Device, error) {
	if kind == "cpu" {
		return cpuDevice(), nil
	}
	if err := cuda.Probe(); err != nil {
		return nil, fmt.Errorf("bench --device cuda needs a CUDA device: %w", err)
	}
	return cuda.Open(0)
}

// deviceTarget is what the kernels' variants depend on, read off dev.
func deviceTarget(dev kernels.Device) kernels.Target {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return kernels.Target{Arch: "cpu"}
	}
	p := d.Props()
	return kernels.Target{Arch: p.Arch, SMs: p.SMs, SharedPerBlock: p.MaxSharedOptin, SharedPerSM: p.MaxSharedPerSM, L2Bytes: p.L2Bytes}
}

// dryRunWidth is the most columns a dry run's table takes, fewer on a
// narrower terminal (down to minTableWidth): the parameters wrap beneath
// their row; --json and --csv hold them on one line.
const (
	dryRunWidth   = 160
	minTableWidth = 80
)

// tableWidth is the width a table written to w may take: dryRunWidth, or
// the terminal's width where w is a narrower terminal.
func tableWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !isTerminal(w) {
		return dryRunWidth
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil || cols <= 0 {
		return dryRunWidth
	}
	return max(minTableWidth, min(dryRunWidth, cols))
}
