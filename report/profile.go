package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/model"
)

// GPU is what the kernel trace says beyond the per-op table: the
// device's busy time against the wall time, every kernel, and where the
// kernels come from (cupti only).
type GPU struct {
	KernelMs float64 `json:"kernel_ms"` // the sum of every kernel's time
	BusyMs   float64 `json:"busy_ms"`   // the union of the kernels' intervals
	SpanMs   float64 `json:"span_ms"`   // first kernel start to last kernel end
	WallMs   float64 `json:"wall_ms"`   // the generation's wall time
	Launches int     `json:"launches"`
	// PrefillLaunches and DecodeLaunches are the kernels of each phase;
	// DecodeLaunchesPerStep is the decode's over its steps, what a decode
	// step's chain of launches is (0 without decode steps).
	PrefillLaunches       int     `json:"prefill_launches,omitempty"`
	DecodeLaunches        int     `json:"decode_launches,omitempty"`
	DecodeLaunchesPerStep float64 `json:"decode_launches_per_step,omitempty"`
	// SumOverBusy is (KernelMs − BusyMs) / BusyMs: above 5%, kernels ran
	// concurrently, and their sum overstates the time the device was busy.
	SumOverBusy float64               `json:"sum_over_busy"`
	Kernels     []profile.KernelStat  `json:"kernels"`
	Coverage    []profile.CoverageRow `json:"coverage"`
}

// SumBusyTolerance is how far the kernel sum may exceed the busy time
// before the report says the two disagree.
const SumBusyTolerance = 0.05

// NewGPU is the GPU report of a profile p whose kernels were traced, of a
// generation of wallMs and decodeSteps decode steps; nil where they were
// not.
func NewGPU(p *profile.Report, wallMs float64, decodeSteps int) *GPU {
	if p.Source != "cupti" {
		return nil
	}
	g := &GPU{KernelMs: p.ComputeMs, BusyMs: p.BusyMs, SpanMs: p.SpanMs, WallMs: wallMs,
		Launches: p.Launches, Kernels: p.Kernels, Coverage: p.Coverage,
		PrefillLaunches: p.PhaseLaunches["prefill"], DecodeLaunches: p.PhaseLaunches["decode"]}
	if decodeSteps > 0 {
		g.DecodeLaunchesPerStep = float64(g.DecodeLaunches) / float64(decodeSteps)
	}
	if p.BusyMs > 0 {
		g.SumOverBusy = (p.ComputeMs - p.BusyMs) / p.BusyMs
	}
	return g
}

// Memory is the device memory of a run: the allocator's high-water
// mark split into what holds it, and each op's working set (the scratch a
// call asked for beyond its inputs and outputs: attention's scores in the
// naive set grow as N², flash attention's as N).
type Memory struct {
	// PeakBytes is the allocator's high-water mark plus the memory held
	// outside it (cuBLAS's workspace); 0 where the device keeps no count
	// (the cpu).
	PeakBytes   int64                `json:"peak_bytes"`
	Weights     int64                `json:"weights_bytes"`
	KVCache     int64                `json:"kv_cache_bytes"`
	Work        int64                `json:"work_bytes"`
	Scratch     int64                `json:"scratch_bytes"`
	Libraries   int64                `json:"library_bytes"`
	Other       int64                `json:"other_bytes"` // the allocator's rounding and cached blocks
	WorkingSets map[kernels.Op]int64 `json:"working_sets"`
}

// MarshalJSON writes null for what the device keeps no count of: the
// peak, scratch, library and other bytes on the cpu, and no working sets.
func (m Memory) MarshalJSON() ([]byte, error) {
	type fields Memory // its fields and tags, without this method
	counted := m.PeakBytes > 0
	orNull := func(n int64) *int64 {
		if !counted {
			return nil
		}
		return &n
	}
	return json.Marshal(struct {
		fields
		PeakBytes *int64 `json:"peak_bytes"`
		Scratch   *int64 `json:"scratch_bytes"`
		Libraries *int64 `json:"library_bytes"`
		Other     *int64 `json:"other_bytes"`
	}{fields(m), orNull(m.PeakBytes), orNull(m.Scratch), orNull(m.Libraries), orNull(m.Other)})
}

// NewMemory is the memory report of a run on dev of a model that holds m,
// with the working sets of ops.
func NewMemory(dev kernels.Device, m model.Memory, ops []profile.OpStat) *Memory {
	r := &Memory{Weights: int64(m.Weights), KVCache: int64(m.Cache), Work: int64(m.Work)}
	for _, o := range ops {
		if o.Scratch > 0 {
			if r.WorkingSets == nil {
				r.WorkingSets = map[kernels.Op]int64{}
			}
			r.WorkingSets[o.Op] = o.Scratch
		}
	}
	if d, ok := dev.(*cuda.Device); ok {
		r.Scratch, r.Libraries = d.ScratchBytes(), d.LibraryBytes()
		r.PeakBytes = d.MemStats().Peak + r.Libraries
		r.Other = max(0, r.PeakBytes-r.Weights-r.KVCache-r.Work-r.Scratch-r.Libraries)
	}
	return r
}

// writeOpTable prints the per-op table: time, calls, phases, share, the
// rates the ops' FLOPs and bytes give, and their working sets.
func writeOpTable(w io.Writer, rows []profile.OpStat) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tset\tcalls\ttotal ms\tavg ms\tprefill ms\tdecode ms\tshare\tTFLOP/s\tGB/s\tscratch\t")
	var calls int
	var total, pre, dec float64
	for _, r := range rows {
		avg := 0.0
		if r.Calls > 0 {
			avg = r.Ms / float64(r.Calls)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.4f\t%.3f\t%.3f\t%.1f%%\t%s\t%s\t%s\t\n", r.Op, r.Set, r.Calls, r.Ms, avg,
			r.PhaseMs["prefill"], r.PhaseMs["decode"], 100*r.Share, rateCell(r.TFLOPs), rateCell(r.GBs), BytesOrDash(r.Scratch))
		calls += r.Calls
		total += r.Ms
		pre += r.PhaseMs["prefill"]
		dec += r.PhaseMs["decode"]
	}
	fmt.Fprintf(tw, "total\t\t%d\t%.3f\t\t%.3f\t%.3f\t100.0%%\t\t\t\t\n", calls, total, pre, dec)
	tw.Flush()
	var groups []string
	for _, r := range rows {
		if len(r.Parts) > 0 {
			parts := make([]string, len(r.Parts))
			for i, p := range r.Parts {
				parts[i] = string(p)
			}
			groups = append(groups, fmt.Sprintf("%s = %s", r.Op, strings.Join(parts, " + ")))
		}
	}
	if len(groups) > 0 {
		fmt.Fprintf(w, "composite ops, each a group's time as its kernels ran it, not split among its parts: %s\n", strings.Join(groups, "; "))
	}
	var beside []string
	for _, r := range rows {
		if r.BesideMs > 0 {
			beside = append(beside, fmt.Sprintf("%s %.3f", r.Op, r.BesideMs))
		}
	}
	if len(beside) > 0 {
		fmt.Fprintf(w, "ms that ran beside the second stream's work, each op's events time with what ran beside it (so the rows overlap): %s\n", strings.Join(beside, ", "))
	}
}

// rateCell prints a TFLOP/s or GB/s figure with three significant digits or
// so; "-" when the op counts none.
func rateCell(v float64) string {
	switch {
	case v <= 0 || math.IsInf(v, 0) || math.IsNaN(v):
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 0.01:
		return fmt.Sprintf("%.2f", v)
	}
	return "<0.01"
}

// BytesOrDash is n bytes in binary units, "-" for none.
func BytesOrDash(n int64) string {
	if n <= 0 {
		return "-"
	}
	return model.Bytes(n).String()
}

// kernelsShown is how many kernels the text report lists; --profile and
// --json hold them all.
const kernelsShown = 20

// writeGPU prints the busy time against the wall time, the coverage and
// the largest kernels.
func (g *GPU) write(w io.Writer) {
	busy := 0.0
	if g.WallMs > 0 {
		busy = 100 * g.BusyMs / g.WallMs
	}
	fmt.Fprintf(w, "GPU: %d kernels%s, %.1f ms; busy %.1f ms of %.1f ms wall (%.1f%%), first kernel to last %.1f ms; ",
		g.Launches, g.byPhase(), g.KernelMs, g.BusyMs, g.WallMs, busy, g.SpanMs)
	if math.Abs(g.SumOverBusy) <= SumBusyTolerance {
		fmt.Fprintf(w, "the kernel sum is within %.0f%% of the busy time\n", 100*SumBusyTolerance)
	} else {
		fmt.Fprintf(w, "the kernel sum is %.1f%% above the busy time: kernels ran concurrently\n", 100*g.SumOverBusy)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "coverage\tlaunches\tlaunch share\tms\ttime share\t")
	for _, c := range g.Coverage {
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.3f\t%.1f%%\t\n", coverageName(c), c.Launches, 100*c.LaunchShare, c.Ms, 100*c.TimeShare)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kernel\top\tcalls\ttotal µs\tavg µs\tmax µs\tshare\t")
	for i, k := range g.Kernels {
		if i == kernelsShown {
			break
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.2f\t%.2f\t%.1f%%\t\n", shortName(k.Name), k.Op, k.Calls, k.Us, k.AvgUs, k.MaxUs, 100*k.Share)
	}
	tw.Flush()
	if n := len(g.Kernels) - kernelsShown; n > 0 {
		fmt.Fprintf(w, "(%d more kernels in --profile and --json)\n", n)
	}
}

// byPhase is " (P in the prefill, D a decode step)" as far as the kernels
// were tied to a phase, else "".
func (g *GPU) byPhase() string {
	var parts []string
	if g.PrefillLaunches > 0 {
		parts = append(parts, fmt.Sprintf("%d in the prefill", g.PrefillLaunches))
	}
	if g.DecodeLaunchesPerStep > 0 {
		parts = append(parts, fmt.Sprintf("%.1f a decode step", g.DecodeLaunchesPerStep))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// coverageName is "fuselm fused", "cuBLAS" or "other".
func coverageName(c profile.CoverageRow) string {
	switch c.Source {
	case profile.SourceOwn:
		return "fuselm " + c.Set
	case profile.SourceCUBLAS:
		return "cuBLAS"
	}
	return c.Source
}

// shortName cuts a long (C++) kernel name for the table.
func shortName(name string) string {
	const most = 60
	if len(name) <= most {
		return name
	}
	return name[:most-3] + "..."
}

func (m *Memory) write(w io.Writer) {
	parts := fmt.Sprintf("weights %s, KV cache %s, work %s", model.Bytes(m.Weights), model.Bytes(m.KVCache), model.Bytes(m.Work))
	if m.PeakBytes > 0 {
		fmt.Fprintf(w, "memory: peak %s = %s, scratch %s, cuBLAS workspace %s, allocator rounding and cache %s\n",
			model.Bytes(m.PeakBytes), parts, model.Bytes(m.Scratch), model.Bytes(m.Libraries), model.Bytes(m.Other))
	} else {
		fmt.Fprintf(w, "memory: %s (the device keeps no high-water mark)\n", parts)
	}
	if len(m.WorkingSets) == 0 {
		return
	}
	var ws []string
	for _, op := range kernels.AllOps {
		if n, ok := m.WorkingSets[op]; ok {
			ws = append(ws, fmt.Sprintf("%s %s", op, model.Bytes(n)))
		}
	}
	fmt.Fprintf(w, "working sets (scratch per call): %s\n", strings.Join(ws, ", "))
}
