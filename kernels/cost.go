package kernels

import "math"

// Cost is the work of one op call: its FLOPs, counted as TileGym's
// benchmarks count them (a multiply-add is two; causal attention counts the
// keys each query attends to), and the fewest bytes it must move (every
// input read once, every output written once). The profile divides them by
// the call's time to give TFLOP/s and GB/s.
//
// StepFLOPs and StepBytes are what one more decode step adds to a call
// replayed from a CUDA graph: the graph runs the call as captured, but
// decode attention then reads one more cached key per row.
type Cost struct {
	FLOPs, Bytes         float64
	StepFLOPs, StepBytes float64
}

// At is the cost of the call replayed steps decode steps after it was
// captured.
func (c Cost) At(steps int) Cost {
	return Cost{FLOPs: c.FLOPs + float64(steps)*c.StepFLOPs, Bytes: c.Bytes + float64(steps)*c.StepBytes}
}

// size is the bytes of t's elements (0 for nil).
func size(t *Tensor) float64 {
	if t == nil {
		return 0
	}
	return float64(t.Numel() * t.DType.Size())
}

func linearCost(out, x, w, bias *Tensor) Cost {
	n, k, m := float64(x.Rows()), float64(x.Cols()), float64(w.Rows())
	return Cost{FLOPs: 2 * n * m * k, Bytes: size(x) + size(w) + size(bias) + size(out)}
}

// normCost is RMSNorm (add false) or AddRMSNorm (add true) of x [N,D]:
// AddRMSNorm reads and writes the residual too.
func normCost(x, w *Tensor, add bool) Cost {
	n := size(x)
	if add {
		return Cost{FLOPs: 5 * float64(x.Numel()), Bytes: 4*n + size(w)}
	}
	return Cost{FLOPs: 4 * float64(x.Numel()), Bytes: 2*n + size(w)}
}

func ropeCost(x *Tensor, heads int, r *Rope) Cost {
	rotated := float64(x.Rows() * heads * r.Dim)
	return Cost{FLOPs: 3 * rotated, Bytes: 2 * rotated * float64(x.DType.Size())}
}

func swigluCost(out *Tensor) Cost {
	return Cost{FLOPs: 6 * float64(out.Numel()), Bytes: 3 * size(out)}
}

// keysAttended is the number of (query, key) pairs of a batch: row b's i-th
// new token attends to Past[b]+i+1 keys (all Past[b]+T_b when nonCausal).
func keysAttended(b *Batch, nonCausal bool) float64 {
	var n float64
	for r := range b.Rows {
		t, p := float64(b.Start[r+1]-b.Start[r]), float64(b.Past[r])
		if nonCausal {
			n += t * (p + t)
		} else {
			n += t*p + t*(t+1)/2
		}
	}
	return n
}

// pastKeys is the number of keys the batch's rows had cached before it.
func pastKeys(b *Batch) float64 {
	var n float64
	for _, p := range b.Past {
		n += float64(p)
	}
	return n
}

// attnCost is GQA attention: q·k and p·v over every attended key per head;
// the bytes are q and out, the new keys and values read and appended to
// the cache, and the cached keys and values read. A decode call reads one
// more cached key per row each step.
func attnCost(a *AttnArgs, decode bool) Cost {
	b, el := a.Batch, float64(a.Q.DType.Size())
	hd, kvd := float64(a.Heads*a.HeadDim), float64(a.KVHeads*a.HeadDim)
	t := float64(b.Tokens)
	c := Cost{
		FLOPs: 4 * hd * keysAttended(b, a.NonCausal && !decode),
		Bytes: el * (2*t*hd + 4*t*kvd + 2*kvd*pastKeys(b)),
	}
	if decode {
		rows := float64(b.Rows)
		c.StepFLOPs, c.StepBytes = 4*hd*rows, el*2*kvd*rows
	}
	return c
}

// mlaCost is DeepSeek-V2 latent attention, counted as infer bench counts it
// (kernels/kbench), the least work of the two forms: for prefill TileGym's
// bench_mla count of the attention (2·(Dqk+Dv) per head and attended key)
// plus kv_b_proj's decompression of every latent the rows attend to
// (2·R·(Dn+Dv) per head and latent); for decode the absorbed form
// (2·(2R+Dr) per head and key) plus W_UK folded into q and W_UV applied to
// the output (2·R·(Dn+Dv) per head and row). The bytes are q, out, the new
// latents, the cached ones read, and kv_b_proj.
func mlaCost(a *MLAArgs, decode bool) Cost {
	b, el := a.Batch, float64(a.Q.DType.Size())
	h, t := float64(a.Heads), float64(b.Tokens)
	lat := float64(a.Rank + a.RopeDim)
	expand := 2 * h * float64(a.Rank) * float64(a.NopeDim+a.VDim)              // kv_b_proj's work for one latent or one row
	perKey, expanded := 2*h*float64(a.NopeDim+a.RopeDim+a.VDim), pastKeys(b)+t // every latent attended to
	if decode {
		perKey, expanded = 2*h*float64(2*a.Rank+a.RopeDim), t // q absorbed and the output expanded, once a row
	}
	c := Cost{
		FLOPs: perKey*keysAttended(b, false) + expand*expanded,
		Bytes: el*(t*h*float64(a.NopeDim+a.RopeDim+a.VDim)+2*t*lat+lat*pastKeys(b)) + size(a.WKVB),
	}
	if decode {
		rows := float64(b.Rows)
		c.StepFLOPs, c.StepBytes = perKey*rows, el*lat*rows
	}
	return c
}

// moeCost is the routed experts: three products of H·I per chosen expert
// and token; the bytes count the experts some token chose at their expected
// number for random routes, E·(1 − (1 − K/E)^N), since the host does not
// know the routes.
func moeCost(out, idx, gateUp, down *Tensor) Cost {
	n, k := float64(idx.Rows()), float64(idx.Cols())
	e, h, i := float64(down.Shape[0]), float64(down.Shape[1]), float64(down.Shape[2])
	touched := e * (1 - math.Pow(1-k/e, n))
	return Cost{FLOPs: 6 * n * k * h * i, Bytes: touched*(size(gateUp)+size(down))/e + 2*size(out)}
}

// groupGemmCost is the grouped GEMM counted as if every row of x were in
// a group (the host does not know the offsets): 2·M·N·K, and x, every
// group's weights and out once each.
func groupGemmCost(out, x, w *Tensor) Cost {
	m, n, k := float64(x.Rows()), float64(w.Shape[1]), float64(w.Shape[2])
	return Cost{FLOPs: 2 * m * n * k, Bytes: size(x) + size(w) + size(out)}
}
