package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/spread"
)

// Run is what one generation run reports: the --json document, and the
// content of the --profile file.
type Run struct {
	Provenance
	Model   string           `json:"model"`
	Kernels string           `json:"kernels"`
	DType   string           `json:"dtype"`
	Batch   int              `json:"batch"`
	Rows    []Row            `json:"rows"` // null in the --profile file
	Timings Timings          `json:"timings"`
	Profile []profile.OpStat `json:"profile"`
	// ProfileNote says what the profile's times miss (null when nothing).
	ProfileNote *string         `json:"profile_note"`
	Tuning      []kernels.Tuned `json:"tuning"` // the tuning cache's choices this run applied
	ProfileDetail
}

// ProfileDetail is what the profile adds to the per-op table.
type ProfileDetail struct {
	// ProfileSource is where the profile's times come from: "cupti" (every
	// kernel) or "events" (marks around each op call and graph replay).
	ProfileSource string  `json:"profile_source"`
	GPU           *GPU    `json:"gpu"` // null where kernels were not traced
	Memory        *Memory `json:"memory"`
}

// Row is one row of the batch: its prompt, the ids it generated and their text.
type Row struct {
	PromptIDs    []int  `json:"prompt_ids"`
	GeneratedIDs []int  `json:"generated_ids"`
	Text         string `json:"text"`
}

// Timings are the reported (median) generation's times, its phases apart,
// and the spread of every timed run's wall time.
type Timings struct {
	NewTokens    int     `json:"new_tokens"`
	TokensPerSec float64 `json:"tokens_per_s"`
	WallS        float64 `json:"wall_s"`
	Phases
	ComputeMs  float64 `json:"compute_ms"`
	LoadS      float64 `json:"load_s"`
	GraphSteps int     `json:"graph_replays"`
	// GraphKept says the replays were of the decode graph an earlier
	// generation of the run recorded: this one recorded none.
	GraphKept  bool           `json:"graph_kept"`
	Warmup     int            `json:"warmup_runs"`
	RunsWallS  []float64      `json:"runs_wall_s"` // in the order they ran
	WallSpread spread.Summary `json:"wall_s_spread"`
}

// Phases are a generation's prefill and decode apart, as llama-bench's pp
// and tg and vLLM's TTFT and TPOT split them.
type Phases struct {
	PromptTokens int     `json:"prompt_tokens"` // every row's
	PrefillMs    float64 `json:"prefill_ms"`
	DecodeMs     float64 `json:"decode_ms"`
	// TTFTMs is the time to the first new token of every row: the prefill,
	// the first token's choice included (prefill_ms, under vLLM's name).
	TTFTMs              float64 `json:"ttft_ms"`
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_s"` // prompt tokens over the prefill
	DecodeSteps         int     `json:"decode_steps"`
	// DecodeTokensPerSec is the tokens the decode steps made (all but
	// each row's first) over the decode time; TPOTMs the time of one
	// decode step, each row's time per output token after its first. Both
	// are null when no decode step ran.
	DecodeTokensPerSec *float64 `json:"decode_tokens_per_s"`
	TPOTMs             *float64 `json:"tpot_ms"`
}

// PhasesOf is gen's phases; rows is the batch.
func PhasesOf(gen *model.Generation, rows int) Phases {
	p := Phases{PromptTokens: gen.PromptTokens, PrefillMs: gen.PrefillMs, DecodeMs: gen.DecodeMs, TTFTMs: gen.PrefillMs,
		DecodeSteps: gen.DecodeSteps}
	if gen.PrefillMs > 0 {
		p.PrefillTokensPerSec = float64(gen.PromptTokens) / (gen.PrefillMs / 1000)
	}
	if gen.DecodeSteps > 0 && gen.DecodeMs > 0 {
		p.DecodeTokensPerSec = profile.NonZero(float64(gen.NewTokens-rows) / (gen.DecodeMs / 1000))
		p.TPOTMs = profile.NonZero(gen.DecodeMs / float64(gen.DecodeSteps))
	}
	return p
}

// Line is the phases' line under the summary line.
func (p Phases) Line(rows int) string {
	s := fmt.Sprintf("prefill %d tokens: TTFT %.2f ms, %.1f tokens/s", p.PromptTokens, p.TTFTMs, p.PrefillTokensPerSec)
	if p.DecodeTokensPerSec == nil {
		return s + " | decode: no step (one new token)"
	}
	return s + fmt.Sprintf(" | decode %s × %s: TPOT %.3f ms, %.2f tokens/s", plural(p.DecodeSteps, "step"), plural(rows, "row"),
		*p.TPOTMs, *p.DecodeTokensPerSec)
}

// plural is "1 row", "2 rows".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// SpreadLine says how the timed runs' wall times spread; "" for one run.
func SpreadLine(s spread.Summary) string {
	if s.N < 2 {
		return ""
	}
	return fmt.Sprintf("%d runs: wall median %.4f s, min %.4f, max %.4f, stddev %.2f%% of the mean", s.N, s.Median, s.Min, s.Max, 100*s.Rel())
}

// SummaryLine is TileGym's one-line result:
// <model>_<kernels>_<dtype> | X tokens/s | Y s | Z ms CUDA, with the dtype
// named as torch names it and Z the sum of every kernel's time over the
// generation. Where kernels were not traced, Z is the events' sum and the
// line says "ms compute".
func (r *Run) SummaryLine() string {
	unit := "ms compute"
	if r.ProfileSource == "cupti" {
		unit = "ms CUDA"
	}
	return fmt.Sprintf("%s_%s_%s | %.2f tokens/s | %.3f s | %.1f %s",
		r.Model, r.Kernels, torchDType(r.DType), r.Timings.TokensPerSec, r.Timings.WallS, r.Timings.ComputeMs, unit)
}

// torchDType is the name torch gives a dtype ("bfloat16" for bf16).
func torchDType(dt string) string {
	switch dt {
	case "bf16":
		return "bfloat16"
	case "f16":
		return "float16"
	case "f32":
		return "float32"
	}
	return dt
}

// WriteText prints the generated text of each distinct row once (rows of
// one prompt that generated one text are one), the summary line and the
// per-op table.
func (r *Run) WriteText(w io.Writer) {
	type rowKey struct{ prompt, text string }
	seen := map[rowKey][]int{}
	var order []rowKey
	for i, row := range r.Rows {
		k := rowKey{fmt.Sprint(row.PromptIDs), row.Text}
		if _, ok := seen[k]; !ok {
			order = append(order, k)
		}
		seen[k] = append(seen[k], i)
	}
	for _, k := range order {
		rows := seen[k]
		if len(r.Rows) > 1 {
			fmt.Fprintf(w, "--- %s\n", rowsLabel(rows, len(r.Rows)))
		}
		fmt.Fprintln(w, k.text)
	}
	fmt.Fprintln(w)
	r.WriteProfile(w)
}

// WriteProfile prints the summary line, the per-op table, and what the
// kernel trace and the allocator say.
func (r *Run) WriteProfile(w io.Writer) {
	fmt.Fprintln(w, r.SummaryLine())
	fmt.Fprintln(w, r.Timings.Phases.Line(r.Batch))
	if l := SpreadLine(r.Timings.WallSpread); l != "" {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w)
	writeOpTable(w, r.Profile)
	if r.ProfileNote != nil {
		fmt.Fprintln(w, *r.ProfileNote)
	}
	if r.GPU != nil {
		fmt.Fprintln(w)
		r.GPU.write(w)
	}
	if r.Memory != nil {
		fmt.Fprintln(w)
		r.Memory.write(w)
	}
}

func rowsLabel(rows []int, n int) string {
	if len(rows) == n {
		return fmt.Sprintf("all %d rows", n)
	}
	parts := make([]string, len(rows))
	for i, r := range rows {
		parts[i] = fmt.Sprint(r)
	}
	if len(rows) == 1 {
		return "row " + parts[0]
	}
	return "rows " + strings.Join(parts, ",")
}
