package kernels

import "math"

// Diff is how far a set's output is from a reference's, element by element
// (both read as float32): the one comparison every check of a set against
// a reference makes (kerneltest, the kernel benchmarks, infer compare).
// NaN in want is poison: an element the op must not write, so got must be
// NaN there too.
type Diff struct {
	// Rel is ‖got − want‖ / ‖want‖ over the elements where both hold a
	// number; a difference that is not finite counts as +Inf.
	Rel float64
	// Max is the largest difference |got − want|, at element MaxAt; MaxAt
	// is -1 when no element held a number on both sides.
	Max   float64
	MaxAt int
	// Unwritten counts the elements where want holds a number and got NaN,
	// the first at FirstUnwritten; Overwritten those where want holds NaN
	// and got a number, the first at FirstOverwritten; Poison those where
	// want holds NaN.
	Unwritten, FirstUnwritten     int
	Overwritten, FirstOverwritten int
	Poison                        int
}

// Compare holds got against want, which must be as long.
func Compare(got, want []float32) Diff {
	d := Diff{MaxAt: -1}
	var diff2, ref2 float64
	for i, w := range want {
		g := got[i]
		wn, gn := w != w, g != g
		switch {
		case wn:
			d.Poison++
			if !gn {
				if d.Overwritten == 0 {
					d.FirstOverwritten = i
				}
				d.Overwritten++
			}
		case gn:
			if d.Unwritten == 0 {
				d.FirstUnwritten = i
			}
			d.Unwritten++
		default:
			x := math.Abs(float64(g) - float64(w))
			if math.IsInf(x, 0) || math.IsNaN(x) {
				x = math.Inf(1)
			}
			diff2 += x * x
			ref2 += float64(w) * float64(w)
			if x > d.Max || d.MaxAt < 0 {
				d.Max, d.MaxAt = x, i
			}
		}
	}
	d.Rel = math.Sqrt(diff2) / math.Max(math.Sqrt(ref2), 1e-30)
	return d
}

// RelErr is ‖got − want‖ / ‖want‖ (Compare's Rel), NaN when either side
// holds a NaN or the two differ in length.
func RelErr(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.NaN()
	}
	d := Compare(got, want)
	if d.Poison > 0 || d.Unwritten > 0 {
		return math.NaN()
	}
	return d.Rel
}
