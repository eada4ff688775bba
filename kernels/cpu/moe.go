package cpu

import (
	"math"

	"github.com/fuselm/fuselm/kernels"
)

// MoERoute picks each token's TopK experts: scores = softmax(logits) in f32;
// RouteGreedy takes the top-K scores; RouteGroupLimited splits the E experts
// into Groups equal groups, keeps the TopKGroups groups with the highest
// best score, zeroes the other experts' scores and takes the top-K of all.
// weight = the chosen (masked) scores, divided by their sum + 1e-20 when
// NormTopK and TopK > 1, times Scale. idx [N,K] i32; weight [N,K] f32;
// logits [N,E] f32.
//
// A token's K entries are in descending score order, ties to the lower
// expert index (as every choice here); consumers must not rely on the order.
func (o *ops) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	const op = kernels.OpMoERoute
	kernels.CheckMoERoute(idx, weight, logits, r)
	ix, wm, lm := ints(op, "idx", idx), floats(op, "weight", weight), floats(op, "logits", logits)
	e, k := lm.cols, r.TopK
	kernels.Parallel(lm.rows, grainFor(e*k), func(lo, hi int) {
		scores := make([]float32, e)
		var groupBest []float32
		var taken []bool
		if r.Method == kernels.RouteGroupLimited {
			groupBest, taken = make([]float32, r.Groups), make([]bool, r.Groups)
		}
		for t := lo; t < hi; t++ {
			copy(scores, lm.row(t))
			softmax(scores)
			if r.Method == kernels.RouteGroupLimited {
				size := e / r.Groups
				for g := range groupBest {
					groupBest[g] = float32(math.Inf(-1))
					for _, s := range scores[g*size : (g+1)*size] {
						groupBest[g] = max(groupBest[g], s)
					}
				}
				clear(taken)
				for range r.TopKGroups {
					g := argmax(groupBest)
					taken[g], groupBest[g] = true, float32(math.Inf(-1))
				}
				for g, keep := range taken {
					if !keep {
						clear(scores[g*size : (g+1)*size])
					}
				}
			}
			ti, tw := ix[t*k:(t+1)*k], wm.row(t)
			var sum float32
			for j := range k {
				c := argmax(scores)
				ti[j], tw[j] = int32(c), scores[c]
				sum += scores[c]
				scores[c] = float32(math.Inf(-1))
			}
			for j := range tw {
				if r.NormTopK && k > 1 {
					tw[j] /= sum + 1e-20
				}
				tw[j] *= r.Scale
			}
		}
	})
}

// MoEExperts is out[t] = Σ_k weight[t,k] · down_e(silu(gate_e·x[t]) · up_e·x[t])
// with e = idx[t,k]: out, x [N,H] act; idx [N,K] i32; weight [N,K] f32;
// gateUp [E,2I,H] (gate rows first); down [E,H,I], any float type. Tokens are
// grouped by expert so that each expert's weights are read once; an index
// outside [0,E) contributes nothing and is reported at Sync.
//
// With bf16 activations each expert's projections and SwiGLU round as
// Linear and SwiGLU do, and the weighted sum over a token's experts is f32,
// rounded once: transformers' grouped_mm experts, which multiply the bf16
// expert outputs by the f32 weights (an f32 product), sum them over top_k
// in f32 and cast the sum to bf16.
func (o *ops) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	const op = kernels.OpMoEExperts
	kernels.CheckMoEExperts(o.dev.ActDType(), out, x, idx, weight, gateUp, down)
	xm, ix, wm := o.in(op, "x", x), ints(op, "idx", idx), floats(op, "weight", weight)
	om, commit := o.out(op, "out", out)
	gu, dw := weightArg(op, "gateUp", gateUp), weightArg(op, "down", down)
	n, h, k, inter := xm.rows, xm.cols, wm.cols, dw.cols
	e := gu.rows / (2 * inter)

	// slots[e] lists the (token, k) pairs routed to expert e as t·K+k.
	slots := make([][]int, e)
	for s, v := range ix {
		if v < 0 || int(v) >= e {
			o.dev.fail("%s: token %d routed to expert %d of %d", op, s/k, v, e)
			continue
		}
		slots[v] = append(slots[v], s)
	}
	y := newMat(n*k, h) // y[t·K+k] = expert idx[t,k]'s output for token t
	for ex, ss := range slots {
		if len(ss) == 0 {
			continue
		}
		xe := newMat(len(ss), h)
		for i, s := range ss {
			copy(xe.row(i), xm.row(s/k))
		}
		g := newMat(len(ss), 2*inter)
		gemm(g, xe, gu.sub(ex*2*inter, (ex+1)*2*inter), nil)
		o.round(g.d)
		a := newMat(len(ss), inter)
		for i := range ss {
			swiglu(a.row(i), g.row(i), o.bf16)
		}
		o.round(a.d)
		ye := newMat(len(ss), h)
		gemm(ye, a, dw.sub(ex*h, (ex+1)*h), nil)
		o.round(ye.d)
		for i, s := range ss {
			copy(y.row(s), ye.row(i))
		}
	}
	kernels.Parallel(n, grainFor(k*h), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			dst := om.row(t)
			clear(dst)
			for j, w := range wm.row(t) {
				axpy(w, y.row(t*k+j), dst)
			}
		}
	})
	commit()
}

// MoERouted is MoERoute then MoEExperts over its routes, as the Dispatch
// runs the op's parts: idx, weight and out as the two calls write them.
func (o *ops) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	kernels.CheckMoERouted(o.dev.ActDType(), out, idx, weight, x, logits, gateUp, down, r)
	o.MoERoute(idx, weight, logits, r)
	o.MoEExperts(out, x, idx, weight, gateUp, down)
}
