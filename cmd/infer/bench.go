package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

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
		return writeOffers(stdout, target, device, offers, f)
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
	return writeReport(stdout, rep, f)
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

// benchDoc is bench's --json document: the report, opened as every JSON
// document of infer is, with null for the rates not measured.
type benchDoc struct {
	report.Provenance
	Target     kernels.Target  `json:"target"`
	CopyRate   *float64        `json:"copy_bytes_per_s"`  // device-to-device, bytes read + written
	MatrixRate *float64        `json:"matrix_flop_per_s"` // bf16 GEMM through the naive set's cuBLAS
	Groups     int             `json:"groups"`
	Rows       []kbench.Row    `json:"rows"`
	Tuned      []kernels.Tuned `json:"tuned"`
	Note       *string         `json:"note"`
}

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	b, err := report.JSON(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// writeReport writes the rows as tables (one per op), JSON or CSV.
func writeReport(w io.Writer, rep *kbench.Report, f *benchFlags) error {
	switch {
	case f.jsonOut:
		return writeJSON(w, benchDoc{Provenance: newProvenance(rep.Device), Target: rep.Target, CopyRate: report.NullNum(rep.CopyRate),
			MatrixRate: report.NullNum(rep.MatrixRate), Groups: rep.Groups, Rows: rep.Rows, Tuned: rep.Tuned, Note: report.NullString(rep.Note)})
	case f.csvOut:
		cw := csv.NewWriter(w)
		cw.Write([]string{"op", "shape", "set", "variant", "ms", "ms_min", "ms_max", "ms_rel_stddev", "tflop_s", "gb_s", "floor_ms",
			"share_of_floor", "checked", "note", "error", "top_kernel", "top_kernel_ms", "top_kernel_share",
			"ms_without_kv_append", "tflop_s_without_kv_append", "gb_s_without_kv_append"})
		for _, r := range rep.Rows {
			var top kbench.KernelTime
			if len(r.Kernels) > 0 {
				top = r.Kernels[0]
			}
			var lo, hi, rel string
			if r.Ms > 0 {
				lo, hi, rel = num(r.Spread.Min), num(r.Spread.Max), num(r.Spread.Rel())
			}
			cw.Write([]string{string(r.Op), r.Shape, r.Set, r.Variant, num(r.Ms), lo, hi, rel, num(r.TFLOPS), num(r.GBs), num(r.FloorMs),
				num(r.OfFloor), r.Checked, r.Note, r.Err, top.Name, num(top.Ms), num(top.Share),
				num(r.NoAppendMs), num(r.NoAppendTFLOPS), num(r.NoAppendGBs)})
		}
		cw.Flush()
		return cw.Error()
	}
	fmt.Fprintf(w, "%s; copy %s, bf16 GEMM %s; each time the median of %d groups of calls, ± their relative standard deviation\n",
		rep.Device, rate(rep.CopyRate/1e9, "GB/s"), rate(rep.MatrixRate/1e12, "TFLOP/s"), rep.Groups)
	if rep.Note != "" {
		fmt.Fprintln(w, rep.Note)
	}
	for from := 0; from < len(rep.Rows); {
		to := from + 1
		for to < len(rep.Rows) && rep.Rows[to].Op == rep.Rows[from].Op {
			to++
		}
		writeBenchTable(w, rep.Rows[from:to])
		from = to
	}
	if len(rep.Tuned) > 0 {
		fmt.Fprintln(w, "\nfastest variants (kept by --optimize):")
		for _, t := range rep.Tuned {
			fmt.Fprintf(w, "  %s %s %s: %s\n", t.Set, t.Op, t.Key, t.Variant)
		}
	}
	return nil
}

// writeBenchTable writes one op's rows. Where the kernels were traced
// (--cupti) each row adds its longest kernel, with its ms a call and their
// share of the row's; where a call appended to the KV cache, the op's
// metric without the append.
func writeBenchTable(w io.Writer, rows []kbench.Row) {
	op := rows[0].Op
	traced, appended := false, false
	for _, r := range rows {
		traced = traced || len(r.Kernels) > 0
		appended = appended || r.NoAppendMs > 0
	}
	compute := kbench.CaseFor(op) != nil && kbench.CaseFor(op).Bound == "compute"
	fmt.Fprintf(w, "\n%s\n", op)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	head := "shape\tset\tvariant\tms\t±\tTFLOP/s\tGB/s\tbound\tfloor ms\tof floor\tchecked against\t"
	if traced {
		head += "top kernel\tits ms\t"
	}
	if appended && compute {
		head += "TFLOP/s w/o kv_append\t"
	} else if appended {
		head += "GB/s w/o kv_append\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		if r.Err != "" || r.Ms == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t\t%s\t\n", r.Shape, r.Set, r.Variant, strings.TrimSpace(r.Note+" "+r.Err))
			continue
		}
		floor, share := "-", "-"
		if r.FloorMs > 0 {
			floor, share = fmt.Sprintf("%.4f", r.FloorMs), fmt.Sprintf("%.0f%%", 100*r.OfFloor)
		}
		dev := "-"
		if r.Spread.N > 1 {
			dev = fmt.Sprintf("%.1f%%", 100*r.Spread.Rel())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t", r.Shape, r.Set, r.Variant, r.Ms, dev, r.TFLOPS, r.GBs,
			r.Bound, floor, share, r.Checked)
		if traced {
			name, ms := "-", "-"
			if len(r.Kernels) > 0 {
				k := r.Kernels[0]
				name, ms = kernelCell(k.Name), fmt.Sprintf("%.4f (%.0f%%)", k.Ms, 100*k.Share)
			}
			fmt.Fprintf(tw, "%s\t%s\t", name, ms)
		}
		if appended {
			v := r.NoAppendGBs
			if compute {
				v = r.NoAppendTFLOPS
			}
			cell := "-"
			if v > 0 {
				cell = fmt.Sprintf("%.1f", v)
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		if r.Note != "" { // after the last column, not in one, so that a long note widens none
			fmt.Fprintf(tw, "  %s", r.Note)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// kernelCell cuts a long kernel name (cuBLAS's run to a hundred
// characters) for a table cell; --json holds it whole.
func kernelCell(name string) string {
	const most = 40
	if len(name) <= most {
		return name
	}
	return name[:most-3] + "..."
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

// dryDoc is a dry run's --json document.
type dryDoc struct {
	report.Provenance
	Target kernels.Target `json:"target"`
	Offers []dryOffer     `json:"offers"`
}

// dryOffer is what one set offers for one shape of one op.
type dryOffer struct {
	Op    kernels.Op `json:"op"`
	Shape string     `json:"shape"`
	Set   string     `json:"set"`
	// Runs is the set whose kernel runs where Set has none of its own
	// (Variants is then null); null where Set has its own.
	Runs     *string      `json:"runs"`
	Variants []dryVariant `json:"variants"`
}

type dryVariant struct {
	Name   string  `json:"name"`
	Params string  `json:"params"`
	Valid  bool    `json:"valid"`
	Reason *string `json:"reason"` // why it cannot run this shape here; null when it can
}

// writeOffers writes a dry run: every set's variants per op and shape, as
// a table per op, JSON or CSV.
func writeOffers(w io.Writer, target kernels.Target, device string, offers []kbench.Offer, f *benchFlags) error {
	doc := dryDoc{Provenance: newProvenance(device), Target: target, Offers: []dryOffer{}}
	for _, o := range offers {
		d := dryOffer{Op: o.Op, Shape: o.Shape, Set: o.Set, Runs: report.NullString(o.Fallback)}
		for _, v := range o.Variants {
			d.Variants = append(d.Variants, dryVariant{Name: v.Name, Params: v.Params, Valid: v.Valid(), Reason: report.NullString(v.Why)})
		}
		doc.Offers = append(doc.Offers, d)
	}
	switch {
	case f.jsonOut:
		return writeJSON(w, doc)
	case f.csvOut:
		cw := csv.NewWriter(w)
		cw.Write([]string{"op", "shape", "set", "variant", "params", "valid", "reason"})
		for _, o := range doc.Offers {
			if o.Runs != nil {
				cw.Write([]string{string(o.Op), o.Shape, o.Set, "", "", "", "no kernel of its own: runs " + *o.Runs + "'s"})
				continue
			}
			for _, v := range o.Variants {
				reason := ""
				if v.Reason != nil {
					reason = *v.Reason
				}
				cw.Write([]string{string(o.Op), o.Shape, o.Set, v.Name, v.Params, strconv.FormatBool(v.Valid), reason})
			}
		}
		cw.Flush()
		return cw.Error()
	}
	fmt.Fprintf(w, "dry run for %s (%d SMs, %d KiB of shared memory a block, L2 %d MiB)\n"+
		"each set's variants per shape; parameters wrap beneath their row, --json and --csv hold them whole\n",
		target.Arch, target.SMs, target.SharedPerBlock>>10, target.L2Bytes>>20)
	for from := 0; from < len(doc.Offers); {
		to := from + 1
		for to < len(doc.Offers) && doc.Offers[to].Op == doc.Offers[from].Op {
			to++
		}
		writeOfferTable(w, doc.Offers[from:to], tableWidth(w))
		from = to
	}
	return nil
}

// writeOfferTable writes one op's offers within width columns: the shape
// and the set once where they repeat, the last column (the parameters, or
// why a variant is not valid) wrapped beneath its row.
func writeOfferTable(w io.Writer, offers []dryOffer, width int) {
	head := []string{"shape", "set", "variant", "valid", "parameters, or why not valid"}
	var rows [][]string
	lastShape, lastSet := "", ""
	for _, o := range offers {
		shape, set := o.Shape, o.Set
		if shape == lastShape {
			shape = ""
			if set == lastSet {
				set = ""
			}
		}
		lastShape, lastSet = o.Shape, o.Set
		if o.Runs != nil {
			rows = append(rows, []string{shape, set, "-", "-", "no kernel of its own: runs " + *o.Runs + "'s"})
			continue
		}
		for i, v := range o.Variants {
			valid, last := "yes", v.Params
			if !v.Valid {
				valid, last = "no", *v.Reason
			}
			if i > 0 {
				shape, set = "", ""
			}
			rows = append(rows, []string{shape, set, v.Name, valid, last})
		}
	}
	const indent, gap = 2, 2
	widths := make([]int, len(head)-1)
	for _, r := range append([][]string{head}, rows...) {
		for c := range widths {
			widths[c] = max(widths[c], utf8.RuneCountInString(r[c]))
		}
	}
	lead := indent
	for _, wd := range widths {
		lead += wd + gap
	}
	lastWidth := max(30, width-lead)
	line := func(r []string) {
		var b strings.Builder
		b.WriteString(strings.Repeat(" ", indent))
		for c, wd := range widths {
			b.WriteString(r[c] + strings.Repeat(" ", wd+gap-utf8.RuneCountInString(r[c])))
		}
		for i, part := range wrap(r[len(r)-1], lastWidth) {
			if i > 0 {
				b.WriteString("\n" + strings.Repeat(" ", lead))
			}
			b.WriteString(part)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintf(w, "\n%s\n", offers[0].Op)
	line(head)
	for _, r := range rows {
		line(r)
	}
}

// wrap breaks s into lines of at most width runes, between words where it
// can, and inside a word longer than a line.
func wrap(s string, width int) []string {
	var lines []string
	cur := ""
	for _, word := range strings.Fields(s) {
		for utf8.RuneCountInString(word) > width {
			if cur != "" {
				lines, cur = append(lines, cur), ""
			}
			r := []rune(word)
			lines, word = append(lines, string(r[:width])), string(r[width:])
		}
		switch {
		case cur == "":
			cur = word
		case utf8.RuneCountInString(cur)+1+utf8.RuneCountInString(word) <= width:
			cur += " " + word
		default:
			lines, cur = append(lines, cur), word
		}
	}
	if cur != "" || len(lines) == 0 {
		lines = append(lines, cur)
	}
	return lines
}

func num(v float64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

func rate(v float64, unit string) string {
	if v == 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.0f %s", v, unit)
}
