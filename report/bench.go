package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kbench"
	"github.com/fuselm/fuselm/kernels/profile"
)

// Format is how a document is written: as text tables, JSON or CSV.
type Format int

// The formats of bench's documents.
const (
	AsTables Format = iota
	AsJSON
	AsCSV
)

// Bench is bench's --json document: the report, opened as every JSON
// document of infer is, with null for the rates not measured.
type Bench struct {
	Provenance
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
	b, err := JSON(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteBench writes the rows of rep as tables (one per op), CSV or JSON, the
// JSON document opened with prov.
func WriteBench(w io.Writer, rep *kbench.Report, prov Provenance, as Format) error {
	switch as {
	case AsJSON:
		return writeJSON(w, Bench{Provenance: prov, Target: rep.Target, CopyRate: profile.NonZero(rep.CopyRate),
			MatrixRate: profile.NonZero(rep.MatrixRate), Groups: rep.Groups, Rows: rep.Rows, Tuned: rep.Tuned, Note: profile.NonZero(rep.Note)})
	case AsCSV:
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

// DryRun is a dry run's --json document.
type DryRun struct {
	Provenance
	Target kernels.Target `json:"target"`
	Offers []DryOffer     `json:"offers"`
}

// DryOffer is what one set offers for one shape of one op.
type DryOffer struct {
	Op    kernels.Op `json:"op"`
	Shape string     `json:"shape"`
	Set   string     `json:"set"`
	// Runs is the set whose kernel runs where Set has none of its own
	// (Variants is then null); null where Set has its own.
	Runs     *string      `json:"runs"`
	Variants []DryVariant `json:"variants"`
}

// DryVariant is one variant of a set for a shape, and whether it runs it.
type DryVariant struct {
	Name   string  `json:"name"`
	Params string  `json:"params"`
	Valid  bool    `json:"valid"`
	Reason *string `json:"reason"` // why it cannot run this shape here; null when it can
}

// NewDryRun is the document of a dry run for target: every set's variants
// per op and shape.
func NewDryRun(prov Provenance, target kernels.Target, offers []kbench.Offer) *DryRun {
	doc := &DryRun{Provenance: prov, Target: target, Offers: []DryOffer{}}
	for _, o := range offers {
		d := DryOffer{Op: o.Op, Shape: o.Shape, Set: o.Set, Runs: profile.NonZero(o.Fallback)}
		for _, v := range o.Variants {
			d.Variants = append(d.Variants, DryVariant{Name: v.Name, Params: v.Params, Valid: v.Valid(), Reason: profile.NonZero(v.Why)})
		}
		doc.Offers = append(doc.Offers, d)
	}
	return doc
}

// Write writes the dry run as a table per op within width columns, JSON or
// CSV.
func (doc *DryRun) Write(w io.Writer, as Format, width int) error {
	switch as {
	case AsJSON:
		return writeJSON(w, doc)
	case AsCSV:
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
		doc.Target.Arch, doc.Target.SMs, doc.Target.SharedPerBlock>>10, doc.Target.L2Bytes>>20)
	for from := 0; from < len(doc.Offers); {
		to := from + 1
		for to < len(doc.Offers) && doc.Offers[to].Op == doc.Offers[from].Op {
			to++
		}
		writeOfferTable(w, doc.Offers[from:to], width)
		from = to
	}
	return nil
}

// writeOfferTable writes one op's offers within width columns: the shape
// and the set once where they repeat, the last column (the parameters, or
// why a variant is not valid) wrapped beneath its row.
func writeOfferTable(w io.Writer, offers []DryOffer, width int) {
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
