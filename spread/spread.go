// Package spread summarizes repeated measurements: the median a report
// quotes, and the minimum, maximum and standard deviation that say whether
// a difference between two medians is larger than the noise.
package spread

import (
	"math"
	"slices"
)

// Summary is the spread of n measurements of one quantity.
type Summary struct {
	N int `json:"n"`
	// Median is the middle measurement, the upper one of the two middle
	// ones when n is even: the one a report quotes, a measurement itself.
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
	// StdDev is the sample standard deviation (n−1 in the denominator);
	// RelStdDev is StdDev over Mean. Both are null with one measurement,
	// which has no spread to measure.
	StdDev    *float64 `json:"stddev"`
	RelStdDev *float64 `json:"rel_stddev"`
}

// Of is the spread of xs; the zero Summary when xs is empty.
func Of(xs []float64) Summary {
	n := len(xs)
	if n == 0 {
		return Summary{}
	}
	s := slices.Sorted(slices.Values(xs))
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	out := Summary{N: n, Median: s[n/2], Min: s[0], Max: s[n-1], Mean: sum / float64(n)}
	if n > 1 {
		ss := 0.0
		for _, x := range s {
			ss += (x - out.Mean) * (x - out.Mean)
		}
		sd := math.Sqrt(ss / float64(n-1))
		out.StdDev = &sd
		if out.Mean != 0 {
			rel := sd / out.Mean
			out.RelStdDev = &rel
		}
	}
	return out
}

// Rel is RelStdDev, 0 when there is none.
func (s Summary) Rel() float64 {
	if s.RelStdDev == nil {
		return 0
	}
	return *s.RelStdDev
}
