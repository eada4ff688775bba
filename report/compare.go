package report

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/spread"
)

// Compare is what infer compare reports; --json writes it.
type Compare struct {
	Provenance
	Model        string `json:"model"`
	DType        string `json:"dtype"`
	Batch        int    `json:"batch"`
	PromptTokens int    `json:"prompt_tokens"` // the longest row's
	// RowPromptTokens are each row's prompt tokens (rows differ with --prompts).
	RowPromptTokens []int          `json:"row_prompt_tokens"`
	MaxNew          int            `json:"max_new_tokens"`
	Baseline        string         `json:"baseline"`
	Candidate       string         `json:"candidate"`
	Warmup          int            `json:"warmup_runs"`
	Repeat          int            `json:"timed_runs"`
	CheckTokens     int            `json:"check_tokens"`
	Tolerance       float64        `json:"tolerance"`
	GainMs          float64        `json:"gain_ms"` // the baseline's wall time less the candidate's
	Variants        []Variant      `json:"variants"`
	Ops             []OpComparison `json:"ops"`
	// The rest of the gain, beside Ops': device time charged to no op
	// (Unattributed: under events, the graph replays, timed whole), and
	// wall time outside the device's timed work (Outside: the host,
	// launch gaps, what ran concurrently). The op rows' shares and these
	// two add up to the whole gain.
	Unattributed GainPart `json:"unattributed_device"`
	Outside      GainPart `json:"outside_device"`
}

// GainPart is a part of the baseline's and the candidate's time and its
// share of the end-to-end gain (null when there is no gain).
type GainPart struct {
	BaselineMs  float64  `json:"baseline_ms"`
	CandidateMs float64  `json:"candidate_ms"`
	GainShare   *float64 `json:"gain_share"`
}

// Variant is one kernel spec's run.
type Variant struct {
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
	Phases
	// ComputeMs is the summed device time of the run Ops come from (the
	// traced one where kernels were traced), UnattributedMs the part of it
	// charged to no op.
	ComputeMs      float64          `json:"compute_ms"`
	UnattributedMs float64          `json:"unattributed_ms"`
	ProfileSource  string           `json:"profile_source"`
	ProfileNote    *string          `json:"profile_note"`
	Memory         *Memory          `json:"memory"`
	SameTokens     int              `json:"same_leading_tokens"` // the fewest leading tokens any row shares with the baseline's
	LogitsRelErr   float64          `json:"prefill_logits_rel_err"`
	OK             bool             `json:"ok"`
	Check          string           `json:"check"` // why it passed or failed
	Ops            []profile.OpStat `json:"ops"`
	// Tokens and Logits are the checked generation's tokens and prefill
	// logits, held against the baseline's.
	Tokens [][]int     `json:"-"`
	Logits [][]float32 `json:"-"`
}

// OpComparison is one op's row: its time under the baseline and the
// candidate, and the tokens/s of its two ablations (null when not run).
type OpComparison struct {
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

// Check holds every variant's tokens and prefill logits against the
// baseline's (the first variant).
func (r *Compare) Check() {
	ref := r.Variants[0]
	for i := range r.Variants {
		v := &r.Variants[i]
		v.SameTokens = sameLeading(v.Tokens, ref.Tokens)
		v.LogitsRelErr = kernels.RelErr(flatten(v.Logits), flatten(ref.Logits))
		switch {
		case v.SameTokens >= r.CheckTokens:
			v.OK, v.Check = true, fmt.Sprintf("same first %d tokens", r.CheckTokens)
		case slices.EqualFunc(v.Tokens, ref.Tokens, slices.Equal):
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

// CompareOps fills the per-op table from the baseline's and candidate's
// profiles and the ablations' tokens/s.
func (r *Compare) CompareOps(base, cand kernels.Spec, units []string) {
	b, c := r.Variants[0], r.Variants[1]
	r.GainMs = 1000 * (b.WallS - c.WallS)
	byOp := func(v Variant) map[kernels.Op]profile.OpStat {
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
	ablation := map[string]*Variant{}
	for i := range r.Variants {
		v := &r.Variants[i]
		if v.Ablated != nil {
			ablation[v.Role] = v
		}
	}
	r.Unattributed = GainPart{BaselineMs: b.UnattributedMs, CandidateMs: c.UnattributedMs}
	r.Unattributed.GainShare = r.share(b.UnattributedMs, c.UnattributedMs)
	r.Outside = GainPart{BaselineMs: 1000*b.WallS - b.ComputeMs, CandidateMs: 1000*c.WallS - c.ComputeMs}
	r.Outside.GainShare = r.share(r.Outside.BaselineMs, r.Outside.CandidateMs)
	seen := map[kernels.Op]bool{}
	for _, ops := range [][]profile.OpStat{b.Ops, c.Ops} {
		for _, o := range ops {
			if seen[o.Op] {
				continue
			}
			seen[o.Op] = true
			unit := unitOf(o.Op)
			row := OpComparison{Op: o.Op, BaselineSet: base.Runner(o.Op), CandidateSet: cand.Runner(o.Op),
				BaselineMs: bo[o.Op].Ms, CandidateMs: co[o.Op].Ms, Unit: profile.NonZero(unit)}
			if row.CandidateMs > 0 {
				row.Speedup = profile.NonZero(row.BaselineMs / row.CandidateMs)
			}
			row.GainShare = r.share(row.BaselineMs, row.CandidateMs)
			if v := ablation["baseline, "+unit+" on candidate"]; v != nil && unit != "" {
				row.AloneTokensPerSec = profile.NonZero(v.TokensPerSec)
			}
			if v := ablation["candidate, "+unit+" on baseline"]; v != nil && unit != "" {
				row.WithoutTokensPerSec = profile.NonZero(v.TokensPerSec)
			}
			r.Ops = append(r.Ops, row)
		}
	}
	slices.SortStableFunc(r.Ops, func(x, y OpComparison) int {
		return -cmp.Compare(x.BaselineMs+x.CandidateMs, y.BaselineMs+y.CandidateMs)
	})
}

// share is the part of the end-to-end gain that going from baseMs to
// candMs makes; null without a gain.
func (r *Compare) share(baseMs, candMs float64) *float64 {
	if r.GainMs == 0 {
		return nil
	}
	v := (baseMs - candMs) / r.GainMs
	return &v
}

// WriteText prints each variant's summary line, the per-op table closed by
// the rest of the gain, and each variant's rate and memory.
func (r *Compare) WriteText(w io.Writer) {
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
		part GainPart
	}{{UnattributedName, r.Unattributed}, {OutsideName, r.Outside}} {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t\t%s\t\t\t\n", p.name, p.part.BaselineMs, p.part.CandidateMs, shareCell(p.part.GainShare))
	}
	tw.Flush()
	fmt.Fprintf(w, "end to end: %s %.3f s, %s %.3f s (%.2f×); gain %.1f ms. baseline+op: %s with the op (or its group) on %s's set; candidate−op: %s with it on %s's\n",
		r.Baseline, b.WallS, r.Candidate, c.WallS, b.WallS/c.WallS, r.GainMs, r.Baseline, r.Candidate, r.Candidate, r.Baseline)
	fmt.Fprintf(w, "%s: device time charged to no op (%s); %s: wall time less device time (host, launch gaps; negative where kernels overlapped)\n",
		UnattributedName, r.unattributedWhy(), OutsideName)
	for _, v := range r.Variants[:2] {
		if v.ProfileNote != nil {
			fmt.Fprintf(w, "%s's op times: %s\n", v.Spec, *v.ProfileNote)
		}
	}
	for _, v := range r.Variants[:2] {
		fmt.Fprintf(w, "%s: %s\n", v.Spec, v.Phases.Line(r.Batch))
		if l := SpreadLine(v.WallSpread); l != "" {
			fmt.Fprintf(w, "%s: %s\n", v.Spec, l)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\ttokens/s\twall s\t±\tdevice ms\tpeak memory\tworking sets\tcheck\t")
	for _, v := range r.Variants {
		peak, ws := "-", "-"
		if v.Memory != nil {
			peak = BytesOrDash(v.Memory.PeakBytes)
			var sum int64
			for _, n := range v.Memory.WorkingSets {
				sum += n
			}
			ws = BytesOrDash(sum)
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
	UnattributedName = "(no op)"
	OutsideName      = "(not device)"
)

// unattributedWhy says what the device time charged to no op is, by
// where the op times come from.
func (r *Compare) unattributedWhy() string {
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
