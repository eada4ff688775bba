package kernels

import (
	"math"
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
