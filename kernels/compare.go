package kernels

import (
	"math"
	"runtime"
	"sync"
)

// Diff is how far a set's output is from a reference's, element by element
// (both read as float32): the one comparison every check of a set against
// a reference makes (kerneltest, the kernel benchmarks, infer compare).
// NaN in want is poison: an element the op must not write, so got must be
// NaN there too.
type Diff struct {
	// Rel is ‖got − want‖ / ‖want‖ over the elements where both hold a
	// number; a difference that is not finite counts as +Inf.
	Rel float64
	// Max is the largest difference |got − want|, at element MaxAt (the
	// first, where several are as large); MaxAt is -1 when no element held
	// a number on both sides.
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

// diffBlock is how many elements Rel's sums of squares add one by one
// before adding their sum to the total, blocks counted from the start of
// the whole comparison: the same additions in the same order however the
// elements come in pieces or are split among goroutines (at block
// boundaries), so that Rel is the same to the bit.
const diffBlock = 1 << 16

// sums are Σ (got − want)² and Σ want² over the elements holding a number
// on both sides of a run of elements.
type sums struct{ diff2, ref2 float64 }

// tally is what a comparison counts over a run of elements, indices
// counted from the start of the whole comparison: Max and MaxAt (valid
// where numbers > 0), the counts and their first indices.
type tally struct {
	d       Diff
	numbers int // the elements holding a number on both sides
}

// then folds u, the tally of the elements after t's, into t: the first
// largest difference and the first of each count stay the first.
func (t *tally) then(u tally) {
	if u.numbers > 0 && (t.numbers == 0 || u.d.Max > t.d.Max) {
		t.d.Max, t.d.MaxAt = u.d.Max, u.d.MaxAt
	}
	t.numbers += u.numbers
	if t.d.Unwritten == 0 {
		t.d.FirstUnwritten = u.d.FirstUnwritten
	}
	t.d.Unwritten += u.d.Unwritten
	if t.d.Overwritten == 0 {
		t.d.FirstOverwritten = u.d.FirstOverwritten
	}
	t.d.Overwritten += u.d.Overwritten
	t.d.Poison += u.d.Poison
}

// scan compares got and want, elements [at, at+len(want)) of the whole,
// into t, adding their squares to open, the sums of the block under way
// at at, and appending to closed the sums of each block the run completes;
// it returns closed.
func scan(t *tally, open *sums, closed []sums, got, want []float32, at int) []sums {
	got = got[:len(want)]
	d, numbers, diff2, ref2 := t.d, t.numbers, open.diff2, open.ref2
	for lo := 0; lo < len(want); {
		hi := min(len(want), lo+diffBlock-(at+lo)%diffBlock) // the end of lo's block, or of the run
		ws, base := want[lo:hi], at+lo
		gs := got[lo:hi][:len(ws)] // as long as ws, so that gs[j] needs no bounds check
		for j, w := range ws {
			g := gs[j]
			wn, gn := w != w, g != g
			switch {
			case wn:
				d.Poison++
				if !gn {
					if d.Overwritten == 0 {
						d.FirstOverwritten = base + j
					}
					d.Overwritten++
				}
			case gn:
				if d.Unwritten == 0 {
					d.FirstUnwritten = base + j
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
					d.Max, d.MaxAt = x, base+j
				}
				numbers++
			}
		}
		if (at+hi)%diffBlock == 0 {
			closed = append(closed, sums{diff2, ref2})
			diff2, ref2 = 0, 0
		}
		lo = hi
	}
	t.d, t.numbers, *open = d, numbers, sums{diff2, ref2}
	return closed
}

// DiffAcc is Compare over got and want given piece after piece: its Diff
// is Compare's over the pieces concatenated, indices counted from the first
// piece's start, to the bit whatever the pieces' boundaries. It holds a
// comparison of outputs too large to read at once. The zero DiffAcc has
// seen no elements.
type DiffAcc struct {
	t     tally
	n     int  // the elements added so far
	total sums // over the blocks completed so far, added block after block
	open  sums // over the elements of the block under way
}

// Add holds got against want, which must be as long, as the elements
// after those added so far.
func (a *DiffAcc) Add(got, want []float32) { a.add(got, want, 1) }

// parallelGrain is the fewest elements AddParallel gives a goroutine.
const parallelGrain = 4 * diffBlock

// AddParallel is Add split among up to GOMAXPROCS goroutines where the
// piece is large, with the same result to the bit as Add for any number
// of them.
func (a *DiffAcc) AddParallel(got, want []float32) {
	a.add(got, want, min(runtime.GOMAXPROCS(0), len(want)/parallelGrain))
}

// add is Add split among up to workers goroutines, each given whole blocks
// (the first and last may be the ends of blocks begun or left by other
// pieces), their tallies and block sums folded in in order.
func (a *DiffAcc) add(got, want []float32, workers int) {
	n := len(want)
	got = got[:n]
	if n == 0 {
		return
	}
	first, last := a.n/diffBlock, (a.n+n-1)/diffBlock // the blocks the piece touches
	blocks := last - first + 1
	workers = max(1, min(workers, blocks))
	per := (blocks + workers - 1) / workers
	workers = (blocks + per - 1) / per // none left without a block
	type part struct {
		t      tally
		open   sums
		closed []sums
	}
	parts := make([]part, workers)
	parts[0].open = a.open // the block under way goes on in the first part
	run := func(w int) {
		lo := max(a.n, (first+w*per)*diffBlock) - a.n
		hi := min(a.n+n, (first+(w+1)*per)*diffBlock) - a.n
		p := &parts[w]
		p.closed = scan(&p.t, &p.open, make([]sums, 0, per), got[lo:hi], want[lo:hi], a.n+lo)
	}
	if workers == 1 {
		run(0)
	} else {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { run(w) })
		}
		wg.Wait()
	}
	for _, p := range parts {
		a.t.then(p.t)
		for _, s := range p.closed {
			a.total.diff2 += s.diff2
			a.total.ref2 += s.ref2
		}
	}
	a.open = parts[workers-1].open // every part but the last ends a block
	a.n += n
}

// Len is the number of elements added so far.
func (a *DiffAcc) Len() int { return a.n }

// Diff is the comparison of every element added so far.
func (a *DiffAcc) Diff() Diff {
	d := a.t.d
	if a.t.numbers == 0 {
		d.Max, d.MaxAt = 0, -1
	}
	diff2, ref2 := a.total.diff2+a.open.diff2, a.total.ref2+a.open.ref2
	d.Rel = math.Sqrt(diff2) / math.Max(math.Sqrt(ref2), 1e-30)
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
