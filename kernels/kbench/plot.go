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
// rate (the measured GEMM or copy rate) dashed; the device in each title.
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
	const panelW, panelH = 7 * vg.Inch, 5.5 * vg.Inch
	img := vgimg.New(panelW*vg.Length(cols), panelH*vg.Length(rowsN))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rowsN, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	for i, op := range ops {
		p, err := panel(rep, op)
		if err != nil {
			return nil, err
		}
		p.Draw(tiles.At(dc, i%cols, i/cols))
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

// shortLabels names each shape by the dimensions that differ between them.
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
	out := make([]string, len(shapes))
	for i, p := range parsed {
		if len(differ) == 0 {
			out[i] = shapes[i]
			continue
		}
		sub := kernels.Shape{}
		for _, d := range differ {
			if v, ok := p[d]; ok {
				sub[d] = v
			}
		}
		out[i] = strings.ReplaceAll(sub.String(), ",", " ")
	}
	return out
}

func panel(rep *Report, op kernels.Op) (*plot.Plot, error) {
	labels, lines, unit, floor := panelData(rep, op)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s", op, rep.Device)
	p.X.Label.Text = "shape"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top = true
	p.X.Tick.Marker = labelTicks(labels)
	// Shape labels are long: slanted, they do not run into each other.
	p.X.Tick.Label.Rotation = math.Pi / 5
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range lines {
		pts := plotter.XYs{}
		for j, v := range s.Values {
			if v == v {
				pts = append(pts, plotter.XY{X: float64(j), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := palette[i%len(palette)]
		l.Color, sc.Color = c, c
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	if floor > 0 && len(labels) > 0 {
		f := plotter.XYs{{X: 0, Y: floor}, {X: float64(len(labels) - 1), Y: floor}}
		if len(labels) == 1 {
			f[1].X = 1
		}
		l, err := plotter.NewLine(f)
		if err != nil {
			return nil, err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 90}
		p.Add(l)
		what := "copy rate"
		if unit == "TFLOP/s" {
			what = "bf16 GEMM rate"
		}
		p.Legend.Add(fmt.Sprintf("floor: measured %s (%.0f %s)", what, floor, unit), l)
	}
	return p, nil
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
