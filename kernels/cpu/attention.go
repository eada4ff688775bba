package cpu

import (
	"math"

	"github.com/fuselm/fuselm/kernels"
)

// rowSpans are the new tokens of each batch row for one step: row b's tokens
// are [start[b], start[b+1]) at positions past[b], past[b]+1, ...
type rowSpans struct {
	start, past []int
	row         []int // row[t] is the batch row of token t
	ok          []bool
}

// prefillSpans takes the rows from the batch's host fields (checked by the
// op's contract check).
func prefillSpans(bt *kernels.Batch) rowSpans { return newSpans(bt.Start, bt.Past) }

// decodeSpans is one token per row, at the lengths in Batch.PastDev (as a
// GPU decode kernel reads them); a length that does not fit the cache is
// reported at Sync and its row skipped.
func (o *ops) decodeSpans(op kernels.Op, bt *kernels.Batch) rowSpans {
	dev := ints(op, "Batch.PastDev", bt.PastDev)
	start, past := make([]int, bt.Rows+1), make([]int, bt.Rows)
	for b := range bt.Rows {
		start[b+1] = b + 1
		past[b] = int(dev[b])
	}
	s := newSpans(start, past)
	for b, p := range past {
		if p < 0 || p >= bt.MaxSeq {
			o.dev.fail("%s: row %d has %d cached tokens, the cache holds %d", op, b, p, bt.MaxSeq)
			s.ok[b] = false
		}
	}
	return s
}

func newSpans(start, past []int) rowSpans {
	s := rowSpans{start: start, past: past, row: make([]int, start[len(start)-1]), ok: make([]bool, len(past))}
	for b := range past {
		s.ok[b] = true
		for t := start[b]; t < start[b+1]; t++ {
			s.row[t] = b
		}
	}
	return s
}

// pos is the cache position of token t.
func (s rowSpans) pos(t int) int { b := s.row[t]; return s.past[b] + t - s.start[b] }

// end is the length of row b's cache after the step.
func (s rowSpans) end(b int) int { return s.past[b] + s.start[b+1] - s.start[b] }

// AttentionPrefill appends the new keys and values to the caches, then runs
// causal grouped-query attention of every new token over its row's cache.
// Its operands may be f16 besides the activations' type (see ops).
func (o *ops) AttentionPrefill(a *kernels.AttnArgs) {
	a.Check(kernels.OpAttnPrefill, o.dev.ActDType(), true, kernels.F16)
	o.as(a.Q.DType).attention(kernels.OpAttnPrefill, a, prefillSpans(a.Batch))
}

// AttentionDecode is AttentionPrefill for one token per row, at the row
// lengths in Batch.PastDev.
func (o *ops) AttentionDecode(a *kernels.AttnArgs) {
	a.Check(kernels.OpAttnDecode, o.dev.ActDType(), false)
	o.attention(kernels.OpAttnDecode, a, o.decodeSpans(kernels.OpAttnDecode, a.Batch))
}

// attention: Out, Q [T, Heads·D]; K, V [T, KVHeads·D]; caches
// [B, KVHeads, MaxSeq, D], all o.act. Query head h reads kv head
// h/(Heads/KVHeads); token t at position p attends to cache positions 0..p.
// Scores, softmax and the weighted sum of values are f32 (with bf16
// activations, as SDPA computes them: see weightedSum); the output is
// rounded to the activation type.
func (o *ops) attention(op kernels.Op, a *kernels.AttnArgs, sp rowSpans) {
	q, k, v := o.in(op, "Q", a.Q), o.in(op, "K", a.K), o.in(op, "V", a.V)
	out, commit := o.out(op, "Out", a.Out)
	kc, vc := o.actArg(op, "KCache", a.KCache), o.actArg(op, "VCache", a.VCache)
	d, hq, hkv, maxSeq := a.HeadDim, a.Heads, a.KVHeads, a.Batch.MaxSeq
	n := q.rows
	cacheRow := func(b, kvh, p int) int { return (b*hkv+kvh)*maxSeq + p }

	for t := range n {
		b := sp.row[t]
		if !sp.ok[b] {
			continue
		}
		p := sp.pos(t)
		for g := range hkv {
			kc.put(cacheRow(b, g, p), k.row(t)[g*d:(g+1)*d])
			vc.put(cacheRow(b, g, p), v.row(t)[g*d:(g+1)*d])
		}
	}

	group := hq / hkv
	roundP := o.bf16 && kernels.SDPAFused(d, d)
	kernels.Parallel(n*hq, grainFor(d*(maxSeq/2+1)), func(lo, hi int) {
		scores := make([]float32, maxSeq)
		acc := make([]float32, d)
		kRow, vRow := make([]float32, d), make([]float32, d) // 16-bit cache rows, widened
		for task := lo; task < hi; task++ {
			t, h := task/hq, task%hq
			b := sp.row[t]
			dst := out.row(t)[h*d : (h+1)*d]
			if !sp.ok[b] {
				clear(dst)
				continue
			}
			qh := q.row(t)[h*d : (h+1)*d]
			base := cacheRow(b, h/group, 0)
			keys := sp.pos(t) + 1
			if a.NonCausal {
				keys = sp.end(b)
			}
			s := scores[:keys]
			for j := range s {
				s[j] = dot(qh, kc.row(base+j, kRow)) * a.Scale
			}
			weightedSum(acc, s, func(j int) []float32 { return vc.row(base+j, vRow) }, roundP)
			copy(dst, acc)
		}
	})
	commit()
}

// weightedSum sets acc to Σ_j softmax(s)_j · value(j) for the scores s
// (which it overwrites). Plain, the softmax is f32 with its sum in float64
// and the weighted sum is f32: SDPA's math backend, which computes bf16
// inputs in f32. With roundP it is what SDPA's fused kernels do with bf16
// inputs: the numerators e_j = exp(s_j − max) are rounded to bf16 for the
// P·V product, and their f32 sum divides the result,
//
//	acc = (Σ_j bf16(e_j)·value(j)) · (1 / Σ_j e_j).
//
// The kernels take the max over the blocks of keys seen so far (64 to 256
// keys a block) and rescale; this is their result for up to one block.
func weightedSum(acc, s []float32, value func(j int) []float32, roundP bool) {
	clear(acc)
	if !roundP {
		softmax(s)
		for j, p := range s {
			axpy(p, value(j), acc)
		}
		return
	}
	m := float32(math.Inf(-1))
	for _, v := range s {
		m = max(m, v)
	}
	var sum float32
	for j, v := range s {
		e := float32(math.Exp(float64(v - m)))
		sum += e
		axpy(roundBF16(e), value(j), acc)
	}
	inv := 1 / sum
	for i := range acc {
		acc[i] *= inv
	}
}

// softmax replaces s by exp(s - max)/Σ, the sum taken in float64.
func softmax(s []float32) {
	m := float32(math.Inf(-1))
	for _, v := range s {
		m = max(m, v)
	}
	var sum float64
	for j, v := range s {
		e := math.Exp(float64(v - m))
		s[j] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for j := range s {
		s[j] *= inv
	}
}

// MLAPrefill appends the new latents to the cache, then runs DeepSeek-V2
// multi-head latent attention of every new token over its row's cache.
func (o *ops) MLAPrefill(a *kernels.MLAArgs) {
	a.Check(kernels.OpMLAPrefill, o.dev.ActDType(), true)
	o.mla(kernels.OpMLAPrefill, a, prefillSpans(a.Batch))
}

// MLADecode is MLAPrefill for one token per row, at the row lengths in
// Batch.PastDev.
func (o *ops) MLADecode(a *kernels.MLAArgs) {
	a.Check(kernels.OpMLADecode, o.dev.ActDType(), false)
	o.mla(kernels.OpMLADecode, a, o.decodeSpans(kernels.OpMLADecode, a.Batch))
}

// MLADecodeRoPE is RMSNormRoPE of a.Q and a.KV, then MLADecode(a)
// (kernels.MLADecodeRoPEParts), rounded as those ops round.
func (o *ops) MLADecodeRoPE(a *kernels.MLAArgs, w *kernels.Tensor, eps float32, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckMLADecodeRoPE(o.dev.ActDType(), a, w, pos, r)
	kernels.MLADecodeRoPEParts(o, a, w, eps, pos, r)
}

// mla: Out [T, Heads·VDim]; Q [T, Heads·(Nope+Rope)]; KV [T, Rank+Rope];
// Cache [B, MaxSeq, Rank+Rope], all act; WKVB [Heads·(Nope+VDim), Rank] any
// float type. With f32 activations it uses the absorbed form, equal to
// decompressing the cache: with W_UK, W_UV the head's rows of WKVB,
//
//	q_nope·(W_UK·c) = (W_UKᵀ·q_nope)·c   and   Σ_s p_s·W_UV·c_s = W_UV·(Σ_s p_s·c_s)
//
// so a token costs O(Rank) per cached position instead of O((Nope+V)·Rank).
// With bf16 activations it decompresses (mlaExpanded): HF rounds
// k_nope = W_UK·c and v = W_UV·c to bf16, which the absorbed form cannot.
func (o *ops) mla(op kernels.Op, a *kernels.MLAArgs, sp rowSpans) {
	q, kv := o.in(op, "Q", a.Q), o.in(op, "KV", a.KV)
	out, commit := o.out(op, "Out", a.Out)
	cache, w := o.actArg(op, "Cache", a.Cache), weightArg(op, "WKVB", a.WKVB)
	nh, dn, dr, dv, rank, maxSeq := a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank, a.Batch.MaxSeq
	n, dq := q.rows, dn+dr

	for t := range n {
		if b := sp.row[t]; sp.ok[b] {
			cache.put(b*maxSeq+sp.pos(t), kv.row(t))
		}
	}
	defer commit()
	if o.bf16 {
		mlaExpanded(out, q, cache, w, a, sp)
		return
	}

	// Tasks are (head, block of tokens): the head's WKVB rows are widened
	// once per task.
	tb := max(1, min(n, 64))
	blocks := (n + tb - 1) / tb
	kernels.Parallel(nh*blocks, grainFor(dq*rank+(maxSeq/2)*2*rank), func(lo, hi int) {
		var scratch []float32
		if w.u16 != nil {
			scratch = make([]float32, (dn+dv)*rank)
		}
		wh := make([][]float32, dn+dv)
		qa, ctx := make([]float32, rank), make([]float32, rank)
		scores := make([]float32, maxSeq)
		cRow := make([]float32, rank+dr) // a 16-bit cache row, widened
		for task := lo; task < hi; task++ {
			h, blk := task/blocks, task%blocks
			for j := range wh {
				var dst []float32
				if scratch != nil {
					dst = scratch[j*rank:]
				}
				wh[j] = w.row(h*(dn+dv)+j, dst)
			}
			wuk, wuv := wh[:dn], wh[dn:]
			for t := blk * tb; t < min(n, (blk+1)*tb); t++ {
				b := sp.row[t]
				dst := out.row(t)[h*dv : (h+1)*dv]
				if !sp.ok[b] {
					clear(dst)
					continue
				}
				qh := q.row(t)[h*dq : (h+1)*dq]
				clear(qa)
				for j, x := range qh[:dn] {
					axpy(x, wuk[j], qa)
				}
				qpe := qh[dn:]
				s := scores[:sp.pos(t)+1]
				for j := range s {
					c := cache.row(b*maxSeq+j, cRow)
					s[j] = (dot(qa, c[:rank]) + dot(qpe, c[rank:])) * a.Scale
				}
				weightedSum(ctx, s, func(j int) []float32 { return cache.row(b*maxSeq+j, cRow)[:rank] }, false)
				for j := range dst {
					dst[j] = dot(wuv[j], ctx)
				}
			}
		}
	})
}

// mlaExpanded is mla as HF's DeepseekV2Attention computes it in bf16: every
// cached latent c decompressed into k_nope = W_UK·c and v = W_UV·c, each
// rounded to bf16 (kv_b_proj's output, which HF caches), then SDPA over
// (q_nope, q_pe) · (k_nope, k_pe) and v as weightedSum computes it. A task
// decompresses each row's positions once for all its tokens of that row.
func mlaExpanded(out, q mat, cache, w wmat, a *kernels.MLAArgs, sp rowSpans) {
	nh, dn, dr, dv, rank, maxSeq := a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank, a.Batch.MaxSeq
	n, dq := q.rows, dn+dr
	roundP := kernels.SDPAFused(dq, dv)
	tb := max(1, min(n, 64))
	blocks := (n + tb - 1) / tb
	kernels.Parallel(nh*blocks, grainFor((dn+dv)*rank*(maxSeq/2+1)), func(lo, hi int) {
		var scratch []float32
		if w.u16 != nil {
			scratch = make([]float32, (dn+dv)*rank)
		}
		wh := make([][]float32, dn+dv)
		kNope, kPE, v := make([]float32, maxSeq*dn), make([]float32, maxSeq*dr), make([]float32, maxSeq*dv)
		cRow, scores, acc := make([]float32, rank+dr), make([]float32, maxSeq), make([]float32, dv)
		for task := lo; task < hi; task++ {
			h, blk := task/blocks, task%blocks
			for j := range wh {
				var dst []float32
				if scratch != nil {
					dst = scratch[j*rank:]
				}
				wh[j] = w.row(h*(dn+dv)+j, dst)
			}
			wuk, wuv := wh[:dn], wh[dn:]
			row, done := -1, 0 // kNope, kPE, v hold positions [0, done) of batch row `row`
			for t := blk * tb; t < min(n, (blk+1)*tb); t++ {
				b := sp.row[t]
				dst := out.row(t)[h*dv : (h+1)*dv]
				if !sp.ok[b] {
					clear(dst)
					continue
				}
				if b != row {
					row, done = b, 0
				}
				p := sp.pos(t)
				for ; done <= p; done++ {
					c := cache.row(b*maxSeq+done, cRow)
					kn, vj := kNope[done*dn:(done+1)*dn], v[done*dv:(done+1)*dv]
					for i := range kn {
						kn[i] = roundBF16(dot(wuk[i], c[:rank]))
					}
					for i := range vj {
						vj[i] = roundBF16(dot(wuv[i], c[:rank]))
					}
					copy(kPE[done*dr:(done+1)*dr], c[rank:])
				}
				qh := q.row(t)[h*dq : (h+1)*dq]
				s := scores[:p+1]
				for j := range s {
					s[j] = (dot(qh[:dn], kNope[j*dn:(j+1)*dn]) + dot(qh[dn:], kPE[j*dr:(j+1)*dr])) * a.Scale
				}
				weightedSum(acc, s, func(j int) []float32 { return v[j*dv : (j+1)*dv] }, roundP)
				copy(dst, acc)
			}
		}
	})
}
