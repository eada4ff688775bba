package kbench

import (
	"fmt"
	"slices"
	"strings"

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
					o.Variants = opt.pick(info.VariantsOf(c.Op, s, target))
				} else {
					o.Fallback = kernels.Spec{Base: set}.Runner(c.Op)
				}
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// pick is vs less the variants opt.Variants leaves out: none when it is
// empty or vs has one variant only.
func (opt Options) pick(vs []kernels.Variant) []kernels.Variant {
	if len(opt.Variants) == 0 || len(vs) < 2 {
		return vs
	}
	return slices.DeleteFunc(slices.Clone(vs), func(v kernels.Variant) bool { return !slices.Contains(opt.Variants, v.Name) })
}

// CheckVariants says which name of opt.Variants, if any, no set of sets
// offers among several variants of one of opt's cases, on its shapes, on
// target: a name that would leave every row out.
func CheckVariants(target kernels.Target, sets []string, opt Options) error {
	if len(opt.Variants) == 0 {
		return nil
	}
	all := opt
	all.Variants = nil
	offers, err := DryRun(target, sets, all)
	if err != nil {
		return err
	}
	var names []string
	for _, o := range offers {
		if len(o.Variants) < 2 {
			continue
		}
		for _, v := range o.Variants {
			if !slices.Contains(names, v.Name) {
				names = append(names, v.Name)
			}
		}
	}
	slices.Sort(names)
	for _, v := range opt.Variants {
		if !slices.Contains(names, v) {
			if len(names) == 0 {
				return fmt.Errorf("no set offers a choice of variants for these ops and shapes on %s, so %q cannot be picked", target.Arch, v)
			}
			return fmt.Errorf("no set offers a variant %q of these ops and shapes on %s (offered: %s)", v, target.Arch, strings.Join(names, ", "))
		}
	}
	return nil
}
