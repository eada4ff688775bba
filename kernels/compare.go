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

// RelErr is Rel, or NaN where want held poison or got left an element
// unwritten: the verdict of the function RelErr.
func (d Diff) RelErr() float64 {
	if d.Poison > 0 || d.Unwritten > 0 {
		return math.NaN()
	}
	return d.Rel
}

// DiffAcc is Compare over got and want given piece after piece: its Diff
// is Compare's over the pieces concatenated, indices counted from the first
// piece's start. It holds a comparison of outputs too large to read at
// once. The zero DiffAcc has seen no elements.
type DiffAcc struct {
	d           Diff    // Max, and the counts and their first indices
	n           int     // the elements added so far
	numbers     int     // of them, those holding a number on both sides
	diff2, ref2 float64 // Σ (got − want)², Σ want² over those
}

// Add holds got against want, which must be as long, as the elements
// after those added so far.
func (a *DiffAcc) Add(got, want []float32) {
	got = got[:len(want)]
	d, numbers, diff2, ref2 := a.d, a.numbers, a.diff2, a.ref2
	for j, w := range want {
		i := a.n + j
		g := got[j]
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
			if x > d.Max || numbers == 0 {
				d.Max, d.MaxAt = x, i
			}
			numbers++
		}
	}
	a.d, a.numbers, a.diff2, a.ref2 = d, numbers, diff2, ref2
	a.n += len(want)
}

// Len is the number of elements added so far.
func (a *DiffAcc) Len() int { return a.n }

// Diff is the comparison of every element added so far.
func (a *DiffAcc) Diff() Diff {
	d := a.d
	if a.numbers == 0 {
		d.Max, d.MaxAt = 0, -1
	}
	d.Rel = math.Sqrt(a.diff2) / math.Max(math.Sqrt(a.ref2), 1e-30)
	return d
}

// Compare holds got against want, which must be as long.
func Compare(got, want []float32) Diff {
	var a DiffAcc
	a.Add(got, want)
	return a.Diff()
}

// RelErr is ‖got − want‖ / ‖want‖ (Compare's Rel), NaN when either side
// holds a NaN or the two differ in length.
func RelErr(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.NaN()
	}
	return Compare(got, want).RelErr()
}
