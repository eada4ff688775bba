package fused

import (
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestWgmmaProbe times group_wgmma's two GEMMs of moe_experts at the
// prefill's tiling alone (median µs, back to back) at DeepSeek-V2-Lite's
// dims and the token counts of W5's and W4's prefills (2,048) and W3's
// (11,041), distinct random routing over 64 experts, top-6; it logs each
// GEMM's rate over the real rows' FLOPs and over the padded rows', and the
// packed path's parts beside them (x's rows copied into expert order by
// copy_rows, gate/up over them by tensor copies) and moe_experts whole
// both ways. The
// module is built with FUSELM_GW_PROBE_OPTS (space-separated NVRTC
// options: diagnostic builds such as -DGW_NO_STORE=1, whose results are
// wrong, so nothing is checked here). Skipped unless FUSELM_GW_PROBE=1.
func TestWgmmaProbe(t *testing.T) {
	if os.Getenv("FUSELM_GW_PROBE") != "1" {
		t.Skip("FUSELM_GW_PROBE is not 1: the probe is a measurement, run on demand")
	}
	saved := gwOpts
	defer func() { gwOpts = saved }()
	gwOpts = strings.Fields(os.Getenv("FUSELM_GW_PROBE_OPTS"))
	dev, o := openHopperSet(t, "group_wgmma", func(o *ops) error { return o.gw.ready() })
	defer func(on bool) { prefillWgmma = on }(prefillWgmma)
	prefillWgmma = true
	rng := rand.New(rand.NewSource(11))
	random := normalOn(t, dev, rng)
	const hidden, inter, experts, k = 2048, 1408, 64, 6
	gateUp := random(kernels.BF16, 1/math.Sqrt(hidden), experts, 2*inter, hidden)
	down := random(kernels.BF16, 1/math.Sqrt(inter), experts, hidden, inter)
	op := kernels.OpMoEExperts
	for _, n := range []int{2048, 11041} {
		x := random(kernels.BF16, 1, n, hidden)
		out := dev.Alloc(kernels.BF16, n, hidden)
		idx, weight := routesOn(t, dev, rng, "distinct", n, k, experts)
		o.MoEExperts(out, x, idx, weight, gateUp, down) // align: first, sorted and the buffers
		c := configFor(n*k, experts)
		if c.Name != prefillTiling {
			t.Fatalf("%d tokens run tiling %s, not %s", n, c.Name, prefillTiling)
		}
		_, rows, first, sorted, slot, act, y := o.moeScratch(c, n*k, experts, inter, hidden)
		starts, err := dev.ReadI32(o.moeFirst)
		if err != nil {
			t.Fatal(err)
		}
		padded := int(starts[experts])
		gu := func() {
			o.wgmmaGemm(op, true, false, act, o.Mat(x), n, sorted.P, k, dev.Ptr(gateUp), first.P, experts, rows, 2*inter, hidden)
		}
		dn := func() {
			o.wgmmaGemm(op, false, false, y, act, rows, 0, 1, dev.Ptr(down), first.P, experts, rows, hidden, inter)
		}
		dnTMA := func() {
			o.wgmmaGemm(op, false, true, y, act, rows, 0, 1, dev.Ptr(down), first.P, experts, rows, hidden, inter)
		}
		pack := func() { o.CopyRows(y, slot.P, o.Mat(x), 0, k, n, n*k, hidden) } // moe_experts' packed path, into y
		guPacked := func() {
			o.wgmmaGemm(op, true, false, act, y, rows, 0, 1, dev.Ptr(gateUp), first.P, experts, rows, 2*inter, hidden)
		}
		whole := func() { o.MoEExperts(out, x, idx, weight, gateUp, down) }
		wholePacked := func() {
			defer func(g bool) { wgmmaGather = g }(wgmmaGather)
			wgmmaGather = false
			o.MoEExperts(out, x, idx, weight, gateUp, down)
		}
		for _, g := range []struct {
			name string
			call func()
			n, k int
		}{{"gate/up", gu, 2 * inter, hidden}, {"x's rows packed (copy_rows)", pack, 0, 0}, {"gate/up over the packed rows", guPacked, 2 * inter, hidden},
			{"down", dn, hidden, inter}, {"down (tensor stores)", dnTMA, hidden, inter},
			{"moe_experts", whole, 3 * inter, hidden}, {"moe_experts (x packed first)", wholePacked, 3 * inter, hidden}} {
			us := medianUs(t, dev, g.call)
			if g.n == 0 { // a copy: its rate in bytes, each choice's row read and written
				t.Logf("N=%d (%d choices, %d padded rows) %s: %.1f µs, %.0f GB/s (opts %q)", n, n*k, padded, g.name, us,
					2*float64(n*k)*float64(hidden)*2/us/1e3, gwOpts)
				continue
			}
			real, pad := 2*float64(n*k)*float64(g.n)*float64(g.k), 2*float64(padded)*float64(g.n)*float64(g.k)
			t.Logf("N=%d (%d choices, %d padded rows) %s: %.1f µs, %.0f TFLOP/s of the real rows, %.0f of the padded (opts %q)",
				n, n*k, padded, g.name, us, real/us/1e6, pad/us/1e6, gwOpts)
		}
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
	}
}
