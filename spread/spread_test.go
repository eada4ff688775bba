package spread

import (
	"encoding/json"
	"math"
	"testing"
)

func TestOf(t *testing.T) {
	s := Of([]float64{3, 1, 2, 6})
	if s.N != 4 || s.Median != 3 || s.Min != 1 || s.Max != 6 || s.Mean != 3 {
		t.Errorf("%+v", s)
	}
	// Sample standard deviation: squares 0, 4, 1, 9 over 3.
	if s.StdDev == nil || math.Abs(*s.StdDev-math.Sqrt(14.0/3)) > 1e-12 || math.Abs(s.Rel()-math.Sqrt(14.0/3)/3) > 1e-12 {
		t.Errorf("stddev %v, rel %v", s.StdDev, s.Rel())
	}
	if s := Of([]float64{5, 4, 6}); s.Median != 5 {
		t.Errorf("odd median %v", s.Median)
	}
	one := Of([]float64{2.5})
	if one.Median != 2.5 || one.Min != 2.5 || one.Max != 2.5 || one.StdDev != nil || one.Rel() != 0 {
		t.Errorf("one measurement: %+v", one)
	}
	b, _ := json.Marshal(one)
	if string(b) != `{"n":1,"median":2.5,"min":2.5,"max":2.5,"mean":2.5,"stddev":null,"rel_stddev":null}` {
		t.Errorf("JSON %s", b)
	}
	if (Of(nil) != Summary{}) {
		t.Errorf("empty: %+v", Of(nil))
	}
}
