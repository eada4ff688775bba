package kerneltest

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/fuselm/fuselm/kernels"
)

// groupGemmChecks are groups empty, uneven and of one, pitched, and
// over fused's prefill tiling.
func groupGemmChecks(l *caseList) {
	for _, s := range []groupGemmCase{
		{name: "odd", sizes: []int{3, 0, 17, 1, 40}, lead: 2, trail: 5, n: 72, k: 200},
		{name: "empty groups", sizes: []int{0, 0, 5, 0, 0, 0, 129, 0}, n: 136, k: 64},
		{name: "one group holds all rows", sizes: []int{0, 0, 300, 0}, n: 96, k: 128},
		{name: "no rows", sizes: []int{0, 0, 0}, lead: 4, n: 64, k: 64},
		{name: "uneven", sizes: []int{130, 7, 0, 257, 1, 64, 128, 33, 0, 90, 2, 66, 19, 0, 200, 5}, trail: 3, n: 264, k: 520, pitched: true},
		{name: "medium groups", sizes: []int{40, 17, 64, 65, 3, 33}, lead: 1, n: 200, k: 136},
		{name: "v2-lite down, decode", sizes: []int{1, 0, 2, 0, 0, 1, 3, 1}, n: 2048, k: 1408},
		// Over 64 rows per group: fused's prefill tiling (and its Hopper
		// variant), with a partial n-tile, a k tail and empty groups.
		{name: "prefill tiling, odd", sizes: []int{0, 130, 1, 0, 257, 383, 0, 77}, lead: 3, trail: 2, n: 264, k: 200, pitched: true},
	} {
		l.addW(s.String(), func(e *env) { groupGemm(e, s) })
	}
}

// moeRoutedChecks are DeepSeek-V2-Lite's routing (greedy top-6 of 64
// experts, one group) at decode's token counts, which fused runs as one
// kernel chain up to 8 tokens, and past them (16, 40), where it declines
// and the Dispatch runs the parts; group-limited routes, and routes
// decided by ties; the experts' dims of no tile, then V2-Lite's own (1.1
// GB of expert weights: GPUs only). A set that declines a case (fused
// beyond its fold) is skipped on it: moe_route's and moe_experts' own
// cases hold the parts.
func moeRoutedChecks(l *caseList) {
	lite := kernels.Routing{Method: kernels.RouteGreedy, TopK: 6, Groups: 1, TopKGroups: 1, Scale: 1}
	limited := kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, NormTopK: true, Scale: 2.5}
	add := func(c routedCase, long bool) {
		for _, w := range l.wdts {
			l.addCase(opCase{name: c.String() + ",w=" + w.String(), wdt: w, long: long, declinable: true,
				run: func(e *env) { moeRouted(e, c) }})
		}
	}
	const h, inter = 264, 176 // of no n-tile (64 columns) and no gate/up tile (32)
	for _, n := range []int{1, 3, 8, 16, 40} {
		add(routedCase{routeCase: routeCase{name: "v2-lite routing", n: n, e: 64, r: lite}, h: h, inter: inter}, false)
	}
	for _, n := range []int{3, 8} {
		add(routedCase{routeCase: routeCase{name: "group-limited 8 groups top 3", n: n, e: 64, r: limited}, h: h, inter: inter}, false)
		add(routedCase{routeCase: routeCase{name: "ties, v2-lite routing", n: n, e: 64, r: lite, ties: true}, h: h, inter: inter}, false)
		add(routedCase{routeCase: routeCase{name: "ties, group-limited 8 groups top 3", n: n, e: 64, r: limited, ties: true}, h: h, inter: inter}, false)
	}
	for _, n := range []int{1, 8, 16} {
		add(routedCase{routeCase: routeCase{name: "v2-lite", n: n, e: 64, r: lite}, h: 2048, inter: 1408}, true)
	}
}

// routedCase is moe_routed over routeCase's tokens and routing, with
// experts of h inputs and inter intermediate columns.
type routedCase struct {
	routeCase
	h, inter int
}

func (c routedCase) String() string {
	return fmt.Sprintf("%s,N=%d,H=%d,I=%d,E=%d,K=%d", c.name, c.n, c.h, c.inter, c.e, c.r.TopK)
}

// moeRouted routes c's logits (routeLogits) and runs the experts over the
// routes: idx and weight held to the reference as moe_route's, and out.
func moeRouted(e *env, c routedCase) {
	logits := routeLogits(e, c.routeCase)
	lg := e.tensor(f32K, logits, c.n, c.e)
	x := e.random(actK, 1, c.n, c.h)
	gateUp := e.patterned(weightK, 1/math.Sqrt(float64(c.h)), c.e, 2*c.inter, c.h)
	down := e.patterned(weightK, 1/math.Sqrt(float64(c.inter)), c.e, c.h, c.inter)
	k := c.r.TopK
	idx := e.ints(filled(c.n*k, -1), c.n, k)
	w := e.poisoned(f32K, c.n, k)
	out := e.poisoned(actK, c.n, c.h)
	e.run(func(o kernels.Ops, s int) { o.MoERouted(out[s], idx[s], w[s], x[s], lg[s], gateUp[s], down[s], &c.r) })
	checkRoutes(e, c.routeCase, logits, idx, w)
	e.check("out", out, all)
}

func routeName(r kernels.Routing) string {
	s := "greedy"
	if r.Method == kernels.RouteGroupLimited {
		s = fmt.Sprintf("group-limited %d groups top %d", r.Groups, r.TopKGroups)
	}
	if r.NormTopK {
		s += " norm"
	}
	return s
}

// tiedLogits are router logits drawn from four values half a unit apart:
// a token's best value is shared by about a quarter of the experts, so its
// choice is decided by the tie order alone (and, group-limited, so is the
// choice of groups); values that differ are far apart for any rounding.
func tiedLogits(e *env, n, experts int) []float32 {
	v := make([]float32, n*experts)
	for i := range v {
		v[i] = float32(e.rng.Intn(4)) * 0.5
	}
	return v
}

// wantRoute is the choice every set must make for logits with exact ties,
// worked out on the logits themselves (softmax keeps their order and their
// ties): experts ordered by score, ties to the lower index; group-limited,
// the groups ordered by their best score, ties to the lower group, and the
// experts of the groups left out scoring below every other (0 after the
// softmax). The result is sorted by expert.
func wantRoute(logits []float32, r kernels.Routing) []int32 {
	experts := len(logits)
	score := slices.Clone(logits)
	if r.Method == kernels.RouteGroupLimited {
		size := experts / r.Groups
		best := make([]float32, r.Groups)
		for g := range best {
			best[g] = slices.Max(logits[g*size : (g+1)*size])
		}
		order := make([]int, r.Groups)
		for g := range order {
			order[g] = g
		}
		slices.SortStableFunc(order, func(a, b int) int { return -cmp.Compare(best[a], best[b]) })
		for _, g := range order[r.TopKGroups:] {
			for j := g * size; j < (g+1)*size; j++ {
				score[j] = float32(math.Inf(-1))
			}
		}
	}
	order := make([]int, experts)
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, b int) int { return -cmp.Compare(score[a], score[b]) })
	out := make([]int32, r.TopK)
	for k := range out {
		out[k] = int32(order[k])
	}
	slices.Sort(out)
	return out
}

type groupGemmCase struct {
	name        string
	sizes       []int // rows of each group, in order
	lead, trail int   // rows of x before the first group and after the last, in no group
	n, k        int
	pitched     bool // x and out are column slices of wider matrices
}

func (c groupGemmCase) String() string {
	s := fmt.Sprintf("%s,E=%d,M=%d,N=%d,K=%d", c.name, len(c.sizes), c.lead+sum(c.sizes)+c.trail, c.n, c.k)
	if c.pitched {
		s += ",pitched"
	}
	return s
}

// groupGemm checks every group's rows against its own weights, and that
// the rows no group takes keep their poison.
func groupGemm(e *env, c groupGemmCase) {
	m, groups := c.lead+sum(c.sizes)+c.trail, len(c.sizes)
	first := make([]int32, groups+1)
	first[0] = int32(c.lead)
	for g, n := range c.sizes {
		first[g+1] = first[g] + int32(n)
	}
	x := e.random(actK, 1, m, c.k)
	whole := e.poisoned(actK, m, c.n)
	out := whole
	if c.pitched {
		x = e.random(actK, 1, m, c.k+24).cols(xCol, xCol+c.k)
		whole = e.poisoned(actK, m, c.n+32)
		out = whole.cols(outCol, outCol+c.n)
	}
	w := e.random(weightK, 1/math.Sqrt(float64(c.k)), groups, c.n, c.k)
	fs := e.ints(first, groups+1)
	e.run(func(o kernels.Ops, s int) { o.GroupGemm(out[s], x[s], w[s], fs[s]) })
	e.check("out", whole, func(r, col int) bool {
		return r >= c.lead && r < int(first[groups]) && (!c.pitched || col >= outCol && col < outCol+c.n)
	})
}
