package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestCompare: NaN in the reference is poison the op must leave alone, NaN
// in the output where the reference has a number was never written, and
// the relative error is over the elements holding numbers on both sides.
func TestCompare(t *testing.T) {
	nan := float32(math.NaN())
	want := []float32{3, nan, 4, 0, nan}
	got := []float32{3, 1, 4.5, nan, nan}
	d := Compare(got, want)
	if d.Poison != 2 || d.Overwritten != 1 || d.FirstOverwritten != 1 || d.Unwritten != 1 || d.FirstUnwritten != 3 ||
		d.MaxAt != 2 || d.Max != 0.5 || math.Abs(d.Rel-0.1) > 1e-12 {
		t.Errorf("Compare = %+v", d)
	}
	if e := RelErr([]float32{3, 4.5}, []float32{3, 4}); math.Abs(e-0.1) > 1e-12 {
		t.Errorf("RelErr = %g, want 0.1", e)
	}
	for _, c := range [][2][]float32{{got, want}, {{1, nan}, {1, 2}}, {{1}, {1, 2}}} {
		if e := RelErr(c[0], c[1]); !math.IsNaN(e) {
			t.Errorf("RelErr(%v, %v) = %g, want NaN", c[0], c[1], e)
		}
	}
}

// TestDiffAccPieces: DiffAcc over got and want cut into pieces at any
// boundaries gives Compare's Diff of the whole, indices counted from the
// start of the whole, on data holding poison (NaN in want), unwritten
// elements (NaN in got), overwritten poison and infinities; and Compare
// gives what an element-by-element reading of Diff's definition does.
func TestDiffAccPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	special := func(x float32) float32 {
		switch rng.IntN(40) {
		case 0:
			return nan
		case 1:
			return inf
		case 2:
			return -inf
		case 3:
			return 0
		}
		return x
	}
	for trial := range 200 {
		n := rng.IntN(300)
		want, got := make([]float32, n), make([]float32, n)
		for i := range want {
			want[i] = float32(rng.NormFloat64())
			got[i] = want[i] + float32(rng.NormFloat64()*1e-2)
			if trial%2 == 1 { // half the trials hold special values
				want[i], got[i] = special(want[i]), special(got[i])
			}
		}
		whole := Compare(got, want)
		if o := compareByDefinition(got, want); !sameDiff(whole, o) {
			t.Fatalf("trial %d: Compare = %+v, by definition %+v", trial, whole, o)
		}
		var a DiffAcc
		for i := 0; i < n; {
			j := min(n, i+rng.IntN(40)) // pieces of 0 to 39 elements
			a.Add(got[i:j], want[i:j])
			i = j
		}
		if a.Len() != n {
			t.Fatalf("trial %d: Len %d, want %d", trial, a.Len(), n)
		}
		if d := a.Diff(); !sameDiff(d, whole) {
			t.Fatalf("trial %d: in pieces %+v, whole %+v", trial, d, whole)
		}
	}
}

// TestDiffAccIndices: the first unwritten and overwritten elements, and the
// largest difference, are found in later pieces at their indices in the
// whole; a first piece without numbers leaves MaxAt to a later one.
func TestDiffAccIndices(t *testing.T) {
	nan := float32(math.NaN())
	var a DiffAcc
	a.Add([]float32{nan, nan}, []float32{nan, nan}) // poison left alone
	if d := a.Diff(); d.MaxAt != -1 || d.Poison != 2 || !math.IsNaN(d.RelErr()) {
		t.Errorf("after poison alone: %+v", d)
	}
	a.Add([]float32{1, 2, nan}, []float32{1, 2.5, 3}) // 2, 3, 4
	a.Add(nil, nil)
	a.Add([]float32{4, 7, 0}, []float32{nan, 6, 0}) // 5, 6, 7
	a.Add([]float32{nan}, []float32{9})             // 8
	d := a.Diff()
	want := Diff{Max: 1, MaxAt: 6, Unwritten: 2, FirstUnwritten: 4, Overwritten: 1, FirstOverwritten: 5, Poison: 3,
		Rel: math.Sqrt(0.25+1) / math.Sqrt(1+6.25+36)}
	if !sameDiff(d, want) || a.Len() != 9 {
		t.Errorf("Diff = %+v (Len %d), want %+v (Len 9)", d, a.Len(), want)
	}
	if e := d.RelErr(); !math.IsNaN(e) {
		t.Errorf("RelErr with unwritten elements = %g, want NaN", e)
	}
	// Equal numbers: the largest difference is 0, at the first of them.
	var eq DiffAcc
	eq.Add([]float32{nan}, []float32{nan})
	eq.Add([]float32{5, 6}, []float32{5, 6})
	if d := eq.Diff(); d.Max != 0 || d.MaxAt != 1 || d.Rel != 0 {
		t.Errorf("equal after poison: %+v, want Max 0 at 1", d)
	}
}

// compareByDefinition is Diff's definition read element by element, the
// whole at once, Rel's sums of squares added one by one within each block
// of diffBlock elements and the blocks' sums added in order: what Compare
// must give.
func compareByDefinition(got, want []float32) Diff {
	d := Diff{MaxAt: -1}
	var diff2, ref2, blockDiff2, blockRef2 float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		switch {
		case math.IsNaN(w):
			d.Poison++
			if !math.IsNaN(g) {
				if d.Overwritten == 0 {
					d.FirstOverwritten = i
				}
				d.Overwritten++
			}
		case math.IsNaN(g):
			if d.Unwritten == 0 {
				d.FirstUnwritten = i
			}
			d.Unwritten++
		default:
			x := math.Abs(g - w)
			if math.IsNaN(x) { // inf − inf
				x = math.Inf(1)
			}
			blockDiff2 += x * x
			blockRef2 += w * w
			if d.MaxAt < 0 || x > d.Max {
				d.Max, d.MaxAt = x, i
			}
		}
		if (i+1)%diffBlock == 0 || i == len(want)-1 {
			diff2, ref2 = diff2+blockDiff2, ref2+blockRef2
			blockDiff2, blockRef2 = 0, 0
		}
	}
	d.Rel = math.Sqrt(diff2) / math.Max(math.Sqrt(ref2), 1e-30)
	return d
}

// sameDiff is a == b, a NaN Rel equal to a NaN Rel.
func sameDiff(a, b Diff) bool {
	if math.IsNaN(a.Rel) && math.IsNaN(b.Rel) {
		a.Rel, b.Rel = 0, 0
	}
	return a == b
}

// TestDiffAccParallel: over several blocks, a DiffAcc fed pieces at any
// boundaries, each split among any number of goroutines, gives Compare's
// Diff of the whole to the bit (Rel, the first largest difference, the
// counts and their first indices) from the same sums of squares, and
// Compare gives the definition's: on data of ordinary numbers, of numbers
// with ties for the largest difference in several blocks, and of numbers
// with poison, unwritten elements, overwritten poison and infinities.
func TestDiffAccParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	n := 8*diffBlock + 1234
	// cuts are ways to cut the n elements into pieces, as their lengths.
	cuts := map[string][]int{"whole": {n}}
	for range 4 {
		var any, small []int
		for left := n; left > 0; {
			any = append(any, min(left, rng.IntN(4*diffBlock)))
			left -= any[len(any)-1]
		}
		for left := n; left > 0; {
			small = append(small, min(left, rng.IntN(diffBlock/4)))
			left -= small[len(small)-1]
		}
		cuts[fmt.Sprint("any ", len(cuts))], cuts[fmt.Sprint("small ", len(cuts))] = any, small
	}
	for span := 1; span <= 8; span++ { // a piece after a third of a block touching span blocks
		first, mid := diffBlock/3, (span-1)*diffBlock+diffBlock/2
		cuts[fmt.Sprint("spanning ", span)] = []int{first, mid, n - first - mid}
	}
	for _, data := range []string{"numbers", "ties", "special"} {
		want, got := make([]float32, n), make([]float32, n)
		for i := range want {
			want[i] = float32(rng.NormFloat64())
			got[i] = want[i] + float32(rng.NormFloat64()*1e-2)
			switch data {
			case "ties":
				if rng.IntN(diffBlock/2) == 0 {
					want[i], got[i] = 0, 1 // the largest difference, in several blocks
				}
			case "special":
				for _, x := range []*float32{&want[i], &got[i]} {
					switch rng.IntN(2000) {
					case 0:
						*x = nan
					case 1:
						*x = inf
					case 2:
						*x = -inf
					}
				}
			}
		}
		var whole DiffAcc
		whole.Add(got, want)
		if d, o := whole.Diff(), compareByDefinition(got, want); !sameDiff(d, o) {
			t.Fatalf("%s: Compare = %+v, by definition %+v", data, d, o)
		}
		if data == "ties" && whole.Diff().Max != 1 {
			t.Fatalf("ties: Max %g, want 1", whole.Diff().Max)
		}
		for name, pieces := range cuts {
			for _, workers := range []int{1, 2, 3, 7, 16} {
				var a DiffAcc
				at := 0
				for _, m := range pieces {
					a.add(got[at:at+m], want[at:at+m], workers)
					at += m
				}
				if d := a.Diff(); a.Len() != n || !sameDiff(d, whole.Diff()) || sumBits(&a) != sumBits(&whole) {
					t.Fatalf("%s, pieces %s, %d workers: %+v (Len %d, sums %v), whole %+v (Len %d, sums %v)",
						data, name, workers, d, a.Len(), sumBits(&a), whole.Diff(), n, sumBits(&whole))
				}
			}
		}
		var a DiffAcc
		a.AddParallel(got[:n/3], want[:n/3])
		a.AddParallel(got[n/3:], want[n/3:])
		if d := a.Diff(); !sameDiff(d, whole.Diff()) || sumBits(&a) != sumBits(&whole) {
			t.Fatalf("%s: AddParallel %+v, whole %+v", data, d, whole.Diff())
		}
	}
}

// sumBits is the sums of squares Diff's Rel is made of, as their bits.
func sumBits(a *DiffAcc) [2]uint64 {
	return [2]uint64{math.Float64bits(a.total.diff2 + a.open.diff2), math.Float64bits(a.total.ref2 + a.open.ref2)}
}
