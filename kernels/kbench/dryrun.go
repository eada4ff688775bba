package kbench

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
)

// Offer is what one set offers for one shape of one op on a target: its
// variants, valid or not (and why), or the set it falls back to.
type Offer struct {
	Op       kernels.Op        `json:"op"`
	Shape    string            `json:"shape"`
	Set      string            `json:"set"`
	Fallback string            `json:"runs,omitempty"` // the set whose kernel runs when Set has none of its own
	Variants []kernels.Variant `json:"variants,omitempty"`
}

// DryRun lists, without running anything, what each of sets offers for the
// cases and shapes of opt on target.
func DryRun(target kernels.Target, sets []string, opt Options) ([]Offer, error) {
	cs, err := selectCases(opt.Ops, opt.Shapes)
	if err != nil {
		return nil, err
	}
	var out []Offer
	for _, c := range cs {
		shapes := opt.Shapes
		if len(shapes) == 0 {
			shapes = c.Shapes
		}
		for _, s := range shapes {
			for _, set := range sets {
				info, ok := kernels.Set(set)
				if !ok {
					return nil, fmt.Errorf("kernel set %q is not built into this binary", set)
				}
				o := Offer{Op: c.Op, Shape: s.String(), Set: set}
				if info.Owns(c.Op) {
					o.Variants = info.VariantsOf(c.Op, s, target)
				} else {
					o.Fallback = kernels.Spec{Base: set}.Runner(c.Op)
				}
				out = append(out, o)
			}
		}
	}
	return out, nil
}
