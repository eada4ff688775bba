package kbench

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/fuselm/fuselm/kernels"
)

// Plot draws the report as a PNG: one panel per op, its metric (TFLOP/s or
// GB/s) against its shapes, one line per set and variant, and the floor's
// rate (the measured GEMM or copy rate) dashed; the device in each title,
// the legend under the shapes' labels, off the data.
func Plot(rep *Report) ([]byte, error) {
	var ops []kernels.Op
	for _, r := range rep.Rows {
		if len(ops) == 0 || ops[len(ops)-1] != r.Op {
			ops = append(ops, r.Op)
		}
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("plot: no rows")
	}
	cols := min(2, len(ops))
	rowsN := (len(ops) + cols - 1) / cols
	const plotH, pad = 5.5 * vg.Inch, 2 * vg.Millimeter
	// Panels widen with their shapes, so that slanted labels do not touch.
	panelW := 7 * vg.Inch
	for _, op := range ops {
		labels, _, _, _ := panelData(rep, op)
		panelW = max(panelW, 1.5*vg.Inch+vg.Length(len(labels))*labelPitch)
	}
	panels := make([]*plot.Plot, len(ops))
	legends := make([][]plot.Legend, len(ops))
	legendH := vg.Length(0) // one height for every panel's legend, so that panels of a row align
	for i, op := range ops {
		p, entries, err := panel(rep, op)
		if err != nil {
			return nil, err
		}
		panels[i] = p
		legends[i] = legendColumns(entries, panelW-4*pad)
		legendH = max(legendH, legendHeight(legends[i][0]))
	}
	panelH := plotH + legendH
	img := vgimg.New(panelW*vg.Length(cols), panelH*vg.Length(rowsN))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rowsN, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	for i, p := range panels {
		tile := tiles.At(dc, i%cols, i/cols)
		p.Draw(draw.Crop(tile, 0, 0, legendH, 0))
		strip := draw.Crop(tile, 0, 0, 0, -(tile.Max.Y - tile.Min.Y - legendH))
		for _, l := range legends[i] {
			l.Draw(strip)
			strip = draw.Crop(strip, legendWidth(l)+legendGap, 0, 0, 0)
		}
	}
	var buf bytes.Buffer
	png := vgimg.PngCanvas{Canvas: img}
	if _, err := png.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Series is one line of a panel: a set (and variant) and its metric per
// shape (NaN where it did not run).
type Series struct {
	Name   string
	Values []float64
}

// panelData is what one op's panel draws: the shapes' labels, the lines,
// the metric's unit and the floor's rate in it (0 when not measured).
func panelData(rep *Report, op kernels.Op) (labels []string, lines []Series, unit string, floor float64) {
	var shapes []string
	byName := map[string]map[string]float64{}
	var names []string
	bound := ""
	for _, r := range rep.Rows {
		if r.Op != op {
			continue
		}
		bound = CaseFor(op).Bound
		if !contains(shapes, r.Shape) {
			shapes = append(shapes, r.Shape)
		}
		if r.Err != "" || r.Ms == 0 { // a failed row, or one of a set that runs another's kernel
			continue
		}
		name := r.Set
		if r.Variant != "" && r.Variant != "default" {
			name += " " + r.Variant
		}
		if byName[name] == nil {
			byName[name] = map[string]float64{}
			names = append(names, name)
		}
		v := r.GBs
		if bound == "compute" {
			v = r.TFLOPS
		}
		byName[name][r.Shape] = v
	}
	unit, floor = "GB/s", rep.CopyRate/1e9
	if bound == "compute" {
		unit, floor = "TFLOP/s", rep.MatrixRate/1e12
	}
	for _, n := range names {
		s := Series{Name: n}
		for _, sh := range shapes {
			v, ok := byName[n][sh]
			if !ok {
				v = nan
			}
			s.Values = append(s.Values, v)
		}
		lines = append(lines, s)
	}
	return shortLabels(shapes), lines, unit, floor
}

var nan = func() float64 { var z float64; return z / z }()

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// shortLabels names each shape by the dimensions that differ between them;
// a dimension that nearly every shape shares (three in four or more) is
// named only where a shape departs from it (the model layer among
// TileGym's shapes).
func shortLabels(shapes []string) []string {
	parsed := make([]kernels.Shape, len(shapes))
	for i, s := range shapes {
		parsed[i], _ = kernels.ParseShape(s)
	}
	names := map[string]bool{}
	for _, p := range parsed {
		for name := range p {
			names[name] = true
		}
	}
	var differ []string
	for name := range names {
		v0, ok0 := parsed[0][name]
		for _, p := range parsed[1:] {
			if v, ok := p[name]; ok != ok0 || v != v0 { // a dimension some shapes lack (dt) differs too
				differ = append(differ, name)
				break
			}
		}
	}
	// common[d] is the value of d that three in four shapes or more have.
	common := map[string]string{}
	for _, d := range differ {
		count := map[string]int{}
		for _, p := range parsed {
			v, ok := p[d]
			key := "absent"
			if ok {
				key = fmt.Sprint(v)
			}
			count[key]++
		}
		for v, n := range count {
			if 4*n >= 3*len(parsed) {
				common[d] = v
			}
		}
	}
	out := make([]string, len(shapes))
	for i, p := range parsed {
		if len(differ) == 0 {
			out[i] = shapes[i]
			continue
		}
		sub := kernels.Shape{}
		for _, d := range differ {
			if v, ok := p[d]; ok && common[d] != fmt.Sprint(v) {
				sub[d] = v
			}
		}
		out[i] = strings.ReplaceAll(sub.String(), ",", " ")
	}
	return out
}

// legendEntry is one line of a panel's legend.
type legendEntry struct {
	name   string
	thumbs []plot.Thumbnailer
}

// labelPitch is the least room a shape's slanted label needs along the axis.
const labelPitch = vg.Inch / 4

// legendGap is the space before a legend column.
const legendGap = 8 * vg.Millimeter

// legendColumns lays a panel's legend entries out in two columns, the
// first holding the extra one, where both fit in width; else in one.
func legendColumns(entries []legendEntry, width vg.Length) []plot.Legend {
	split := (len(entries) + 1) / 2
	two := []plot.Legend{newLegend(entries[:split]), newLegend(entries[split:])}
	if len(entries) > 1 && 2*legendGap+legendWidth(two[0])+legendWidth(two[1]) <= width {
		return two
	}
	return []plot.Legend{newLegend(entries)}
}

func newLegend(entries []legendEntry) plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.XOffs = legendGap
	for _, e := range entries {
		l.Add(e.name, e.thumbs...)
	}
	return l
}

// legendCanvas is a canvas to measure legends on.
var legendCanvas = draw.New(vgimg.New(vg.Inch, vg.Inch))

// legendWidth is the width a legend column's entries take.
func legendWidth(l plot.Legend) vg.Length {
	r := l.Rectangle(legendCanvas)
	return r.Max.X - r.Min.X
}

// legendHeight is the height a legend column takes, with a margin above.
func legendHeight(l plot.Legend) vg.Length {
	r := l.Rectangle(legendCanvas)
	return r.Max.Y - r.Min.Y + vg.Millimeter*3
}

// labelRoom is an invisible plotter whose glyph boxes are the x axis's
// slanted tick labels: gonum makes room for the glyphs of plotters on both
// sides but for the tick labels' only on the right, so that the first
// labels would run off the left edge.
type labelRoom struct{}

func (labelRoom) Plot(draw.Canvas, *plot.Plot) {}

func (l labelRoom) GlyphBoxes(p *plot.Plot) []plot.GlyphBox {
	var boxes []plot.GlyphBox
	for _, t := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
		r := p.X.Tick.Label.Rectangle(t.Label)
		r.Min.Y, r.Max.Y = 0, 0 // room across, none up or down
		boxes = append(boxes, plot.GlyphBox{X: p.X.Norm(t.Value), Y: 0.5, Rectangle: r})
	}
	return boxes
}

// panel is one op's plot and its legend's entries.
func panel(rep *Report, op kernels.Op) (*plot.Plot, []legendEntry, error) {
	labels, lines, unit, floor := panelData(rep, op)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s", op, rep.Device)
	p.X.Label.Text = "shape"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.X.Tick.Marker = labelTicks(labels)
	// Shape labels are long: slanted, they do not run into each other.
	p.X.Tick.Label.Rotation = math.Pi / 5
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	if len(labels) > 12 {
		p.X.Tick.Label.Font.Size = vg.Points(8)
	}
	p.X.Min, p.X.Max = -0.5, math.Max(0.5, float64(len(labels))-0.5)
	p.Add(plotter.NewGrid(), labelRoom{})
	var legend []legendEntry
	for i, s := range lines {
		segs := segments(s.Values)
		if len(segs) == 0 {
			continue
		}
		c := palette[i%len(palette)]
		var thumbs []plot.Thumbnailer
		for _, seg := range segs {
			l, sc, err := plotter.NewLinePoints(seg)
			if err != nil {
				return nil, nil, err
			}
			l.Color, sc.Color = c, c
			p.Add(l, sc)
			if thumbs == nil {
				thumbs = []plot.Thumbnailer{l, sc}
			}
		}
		legend = append(legend, legendEntry{s.Name, thumbs})
	}
	if floor > 0 && len(labels) > 0 {
		f := plotter.XYs{{X: 0, Y: floor}, {X: float64(len(labels) - 1), Y: floor}}
		if len(labels) == 1 {
			f[1].X = 1
		}
		f[0].X, f[len(f)-1].X = p.X.Min, p.X.Max
		l, err := plotter.NewLine(f)
		if err != nil {
			return nil, nil, err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 90}
		p.Add(l)
		what := "copy rate"
		if unit == "TFLOP/s" {
			what = "bf16 GEMM rate"
		}
		legend = append(legend, legendEntry{fmt.Sprintf("floor: measured %s (%.0f %s)", what, floor, unit), []plot.Thumbnailer{l}})
	}
	return p, legend, nil
}

// segments are the runs of values a line joins: the shapes a series ran
// in a row, at x 0, 1, 2, ...; a shape it did not run (NaN) breaks it.
func segments(values []float64) []plotter.XYs {
	var segs []plotter.XYs
	cur := plotter.XYs{}
	for j, v := range values {
		if v != v {
			if len(cur) > 0 {
				segs, cur = append(segs, cur), plotter.XYs{}
			}
			continue
		}
		cur = append(cur, plotter.XY{X: float64(j), Y: v})
	}
	if len(cur) > 0 {
		segs = append(segs, cur)
	}
	return segs
}

// labelTicks puts the shapes' labels at 0, 1, 2, ...
type labelTicks []string

func (t labelTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for i, l := range t {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: l})
	}
	return ticks
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
}
