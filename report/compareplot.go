package report

import (
	"bytes"
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The colours of compare's plot: the baseline, the candidate, the
// ablations, and a variant that failed the check.
var (
	baselineColor  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	candidateColor = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	ablationColor  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	wrongColor     = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// opTimes is the left panel's data: the ops, largest first, then the
// device time charged to no op where there is some, in ms under the
// baseline and the candidate.
func (r *Compare) opTimes() (names []string, baseline, candidate []float64) {
	for _, o := range r.Ops {
		if o.BaselineMs <= 0 && o.CandidateMs <= 0 {
			continue
		}
		names = append(names, string(o.Op))
		baseline = append(baseline, o.BaselineMs)
		candidate = append(candidate, o.CandidateMs)
	}
	if u := r.Unattributed; u.BaselineMs > 0 || u.CandidateMs > 0 {
		names = append(names, UnattributedName)
		baseline = append(baseline, max(0, u.BaselineMs))
		candidate = append(candidate, max(0, u.CandidateMs))
	}
	return names, baseline, candidate
}

// deviceName is the device of the report, "" where none is named.
func (r *Compare) deviceName() string {
	if r.Device == nil {
		return ""
	}
	return *r.Device
}

// timeAxis is the left panel's axis label: what the op times hold.
func (r *Compare) timeAxis() string {
	traced := len(r.Variants) >= 2 && r.Variants[0].ProfileSource == "cupti" && r.Variants[1].ProfileSource == "cupti"
	if traced {
		return "device time per generation (ms), every kernel (CUPTI)"
	}
	if r.Unattributed.BaselineMs > 0 || r.Unattributed.CandidateMs > 0 {
		return "device time per generation (ms), events: graph replays timed whole in " + UnattributedName
	}
	return "time per generation (ms), events around each op"
}

// barRows lays out horizontal bars top to bottom in the order given: gonum
// draws category 0 at the bottom.
func barRows(names []string, vals ...[]float64) ([]string, [][]float64) {
	n := len(names)
	rn := make([]string, n)
	rv := make([][]float64, len(vals))
	for j := range vals {
		rv[j] = make([]float64, n)
	}
	for i := range n {
		rn[n-1-i] = names[i]
		for j := range vals {
			rv[j][n-1-i] = vals[j][i]
		}
	}
	return rn, rv
}

// opTimePlot draws per-op device time, baseline against candidate.
func (r *Compare) opTimePlot() (*plot.Plot, error) {
	names, b, c := r.opTimes()
	names, vals := barRows(names, b, c)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s\nper-op device time", r.Model, r.deviceName())
	if s := r.Unattributed.GainShare; s != nil && *s != 0 {
		p.Title.Text += fmt.Sprintf("; %.0f%% of the gain in %s", 100**s, UnattributedName)
	}
	p.X.Label.Text = r.timeAxis()
	p.Y.Label.Text = "op"
	p.Legend.Top = true
	w := vg.Points(9)
	for i, s := range []struct {
		name string
		c    color.Color
	}{{r.Baseline, baselineColor}, {r.Candidate, candidateColor}} {
		bars, err := plotter.NewBarChart(plotter.Values(vals[i]), w)
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.Color = s.c
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(1-2*i) / 2
		labels, err := barLabels(vals[i], "%.1f", bars.Offset)
		if err != nil {
			return nil, err
		}
		p.Add(bars, labels)
		p.Legend.Add(s.name, bars)
	}
	p.NominalY(names...)
	p.X.Min = 0
	p.X.Max = 1.25 * maxOf(b, c) // room for the labels and the legend
	return p, nil
}

// barLabels prints each horizontal bar's value at its end; offset is the
// bars' offset across the axis.
func barLabels(vals []float64, format string, offset vg.Length) (*plotter.Labels, error) {
	xy := plotter.XYLabels{}
	for i, v := range vals {
		xy.XYs = append(xy.XYs, plotter.XY{X: v, Y: float64(i)})
		xy.Labels = append(xy.Labels, fmt.Sprintf(format, v))
	}
	l, err := plotter.NewLabels(xy)
	if err != nil {
		return nil, err
	}
	l.Offset = vg.Point{X: vg.Points(3), Y: offset - vg.Points(3)}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(8)
	}
	return l, nil
}

func maxOf(vals ...[]float64) float64 {
	m := 0.0
	for _, v := range vals {
		for _, x := range v {
			m = max(m, x)
		}
	}
	if m == 0 {
		return 1
	}
	return m
}

// variantRates is the right panel's data: each variant's name, tokens/s
// and colour.
func (r *Compare) variantRates() (names []string, rates []float64, colors []color.Color) {
	for _, v := range r.Variants {
		c := ablationColor
		switch {
		case !v.OK:
			c = wrongColor
		case v.Role == "baseline":
			c = baselineColor
		case v.Role == "candidate":
			c = candidateColor
		}
		names = append(names, v.Spec)
		rates = append(rates, v.TokensPerSec)
		colors = append(colors, c)
	}
	return names, rates, colors
}

// ratePlot draws tokens/s per variant.
func (r *Compare) ratePlot() (*plot.Plot, error) {
	names, rates, colors := r.variantRates()
	names, vals := barRows(names, rates)
	n := len(colors)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("tokens/s per variant (batch %d, %d new tokens, %s)", r.Batch, r.MaxNew, r.DType)
	if slices.Contains(colors, color.Color(wrongColor)) {
		p.Title.Text += "; red: failed the check"
	}
	p.X.Label.Text = "tokens/s (batch × new tokens / wall time)"
	p.Y.Label.Text = "kernel spec"
	w := vg.Points(12)
	// One bar chart per variant, so that each has its colour.
	for i := range n {
		v := make(plotter.Values, n)
		v[n-1-i] = vals[0][n-1-i]
		bars, err := plotter.NewBarChart(v, w)
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.Color = colors[i]
		bars.LineStyle.Width = 0
		p.Add(bars)
	}
	labels, err := barLabels(vals[0], "%.2f", 0)
	if err != nil {
		return nil, err
	}
	p.Add(labels)
	p.NominalY(names...)
	p.X.Min = 0
	p.X.Max = 1.15 * maxOf(rates)
	return p, nil
}

// ComparePlot is the PNG of the two panels side by side.
func ComparePlot(r *Compare) ([]byte, error) {
	left, err := r.opTimePlot()
	if err != nil {
		return nil, err
	}
	right, err := r.ratePlot()
	if err != nil {
		return nil, err
	}
	rows := max(len(r.Ops), len(r.Variants))
	h := max(4*vg.Inch, vg.Length(rows)*0.35*vg.Inch+1.5*vg.Inch)
	return renderPNG(h, left, right)
}

// renderPNG draws the plots side by side, each 8 inches wide and h high.
func renderPNG(h vg.Length, plots ...*plot.Plot) ([]byte, error) {
	const w = 8 * vg.Inch
	img := vgimg.New(w*vg.Length(len(plots)), h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	for i, p := range plots {
		p.Draw(tiles.At(dc, i, 0))
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
