package kernels_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// TestMoERoutedParts checks where the Dispatch runs moe_routed as one call:
// where the set that runs it fuses it (fused) and runs moe_route and
// moe_experts too, or where the spec names it; else as moe_route then
// moe_experts, each on its own set and in its own profile row, with the
// same routes and output.
func TestMoERoutedParts(t *testing.T) {
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true}, {"naive", false}, {"cpu", false}, {"fused,moe_route=naive", false},
		{"fused,moe_experts=naive", false}, {"fused,moe=naive", false}, {"naive,moe_routed=naive", true},
		{"fused,moe_route=naive,moe_routed=fused", true},
	} {
		s, err := kernels.ParseSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Whole(kernels.OpMoERouted); got != c.whole {
			t.Errorf("%s: Whole(moe_routed) = %v, want %v", c.spec, got, c.whole)
		}
	}

	dev := cpu.NewDevice()
	const n, hidden, inter, experts, topK = 3, 16, 8, 8, 2
	x, logits := dev.Alloc(kernels.F32, n, hidden), dev.Alloc(kernels.F32, n, experts)
	gateUp, down := dev.Alloc(kernels.F32, experts, 2*inter, hidden), dev.Alloc(kernels.F32, experts, hidden, inter)
	for i, t := range []*kernels.Tensor{x, logits, gateUp, down} {
		patterned(t, i)
	}
	r := &kernels.Routing{Method: kernels.RouteGreedy, TopK: topK, NormTopK: true, Scale: 1}
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"cpu,moe_routed=cpu", map[kernels.Op]string{kernels.OpMoERouted: "cpu"}},
		{"cpu", map[kernels.Op]string{kernels.OpMoERoute: "cpu", kernels.OpMoEExperts: "cpu"}},
	} {
		out, idx, weight := dev.Alloc(kernels.F32, n, hidden), dev.Alloc(kernels.I32, n, topK), dev.Alloc(kernels.F32, n, topK)
		got, _ := profiledRun(t, dev, c.spec, func(ops kernels.Ops) { ops.MoERouted(out, idx, weight, x, logits, gateUp, down, r) })
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		ids := cpu.I32(idx)
		routes := make([]float32, len(ids))
		for i, e := range ids {
			routes[i] = float32(e)
		}
		outs = append(outs, slices.Concat(cpu.F32(out), routes, cpu.F32(weight)))
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Errorf("moe_routed whole: %v, as its parts: %v", outs[0], outs[1])
	}
}
