package naive

import (
	"github.com/fuselm/fuselm/kernels"
)

// mask says where each row of softmax_mask's scores starts: at position
// base (prefill, a host value) or at past[r / rowsPerSeq] (decode, read on
// the device from the i32 array at past).
type mask struct {
	past       uintptr
	rowsPerSeq int
	base       int
}

// softmax launches softmax_mask: probs (bf16, or f32 for the math backend's
// rounding) = the masked softmax numerators of scores, both packed [rows,
// cols], row r being query r % nq of its sequence, and sums [rows] their f32
// sums. A row that fits in shared memory is read once.
func (o *ops) softmax(probs, sums, scores mat, rows, cols, nq int, m mask) {
	kernel, shared := "softmax_mask_global_"+probs.dt.String(), 0
	if row := cols * kernels.F32.Size(); row <= o.maxShared {
		kernel, shared = "softmax_mask_smem_"+probs.dt.String(), row
	}
	o.launchShared(kernel, rows, threadsFor(cols), shared,
		probs.p, sums.p, scores.p, int32(cols), int32(nq), m.past, int32(max(1, m.rowsPerSeq)), int32(m.base))
}

// normalize launches attn_normalize: out (bf16, pitched [T, heads*dim]) =
// acc (f32 P·V of the numerators, same layout) / the sum of the scores row
// of token t and head h, sums[t*lt + h*lh].
func (o *ops) normalize(out, acc, sums mat, T, heads, dim, lt, lh int) {
	o.launchItems("attn_normalize", int64(T)*int64(heads)*int64(dim), out.p, int32(out.pitch), acc.p,
		int32(acc.pitch), sums.p, int32(lt), int32(lh), int32(T), int32(heads), int32(dim))
}

// appendKV launches kv_append: the new rows of src (and vsrc) go into cache
// (and vcache), [B, heads, MaxSeq, dim], at the positions the device tables
// Batch.StartDev and Batch.PastDev give. vcache and vsrc may be nil.
func (o *ops) appendKV(cache, vcache, src, vsrc *kernels.Tensor, b *kernels.Batch, heads, dim int) {
	c, s := o.mat(cache), o.mat(src)
	var vc, vs mat
	ms := []mat{c, s}
	if vcache != nil {
		vc, vs = o.mat(vcache), o.mat(vsrc)
		ms = append(ms, vc, vs)
	}
	v := vecFor(dim, ms...)
	o.launch(vname("kv_append", v), b.Tokens, threadsFor(heads*dim/v),
		c.p, vc.p, s.p, int32(s.pitch), vs.p, int32(vs.pitch), o.d.Ptr(b.StartDev), o.d.Ptr(b.PastDev),
		int32(b.Rows), int32(heads), int32(dim), int32(b.MaxSeq))
}

// maskedCache is a scratch copy of the first B rows of cache [B, heads,
// MaxSeq, dim] with the positions past every row's device length zeroed
// (kv_masked_copy), for the GEMMs that run over the whole capacity.
func (o *ops) maskedCache(cache *kernels.Tensor, b *kernels.Batch, heads, dim int) mat {
	src := o.mat(cache)
	rows := b.Rows * heads * b.MaxSeq
	dst := o.scratch(slotMaskedKV, kernels.BF16, rows, dim)
	v := vecFor(dim, src, dst)
	o.launchItems(vname("kv_masked_copy", v), int64(rows)*int64(dim/v), dst.p, src.p,
		o.d.Ptr(b.StartDev), o.d.Ptr(b.PastDev), int32(b.Rows), int32(heads), int32(dim), int32(b.MaxSeq))
	return dst
}

// checkBatch checks a batch's host tables; prefill also checks that every
// row's new tokens fit its cache.
func checkBatch(op kernels.Op, b *kernels.Batch, prefill bool) {
	need(b != nil && len(b.Start) == b.Rows+1 && len(b.Past) == b.Rows && b.Start[b.Rows] == b.Tokens,
		op, "batch tables do not describe %d rows of %d tokens", b.Rows, b.Tokens)
	need(b.StartDev != nil && b.StartDev.Numel() == b.Rows+1 && b.PastDev != nil && b.PastDev.Numel() == b.Rows,
		op, "batch device tables missing or of the wrong size")
	if !prefill {
		need(b.Tokens == b.Rows, op, "decode of %d tokens for %d rows", b.Tokens, b.Rows)
		return
	}
	for r := range b.Rows {
		n := b.Start[r+1] - b.Start[r]
		need(n >= 0 && b.Past[r] >= 0 && b.Past[r]+n <= b.MaxSeq, op,
			"row %d: %d cached + %d new tokens exceed the cache's %d", r, b.Past[r], n, b.MaxSeq)
	}
}

// cacheFits reports whether cache holds [≥B, heads, MaxSeq] rows.
func cacheFits(cache *kernels.Tensor, b *kernels.Batch, heads int) bool {
	per := heads * b.MaxSeq
	return per > 0 && cache.Rows()%per == 0 && cache.Rows() >= b.Rows*per
}

func checkAttn(op kernels.Op, a *kernels.AttnArgs, prefill bool) {
	b := a.Batch
	checkBatch(op, b, prefill)
	need(a.KVHeads > 0 && a.Heads%a.KVHeads == 0 && a.HeadDim > 0, op,
		"%d heads over %d kv heads of %d dims", a.Heads, a.KVHeads, a.HeadDim)
	qw, kw := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	need(isAct(a.Q) && a.Q.Rows() == b.Tokens && a.Q.Cols() == qw, op, "q %v", a.Q)
	need(isAct(a.Out) && a.Out.Rows() == b.Tokens && a.Out.Cols() == qw, op, "out %v", a.Out)
	for _, t := range []*kernels.Tensor{a.K, a.V} {
		need(isAct(t) && t.Rows() == b.Tokens && t.Cols() == kw, op, "new keys or values %v", t)
	}
	for _, t := range []*kernels.Tensor{a.KCache, a.VCache} {
		need(isAct(t) && t.Packed() && t.Cols() == a.HeadDim && cacheFits(t, b, a.KVHeads), op,
			"cache %v for %d rows × %d kv heads × %d positions", t, b.Rows, a.KVHeads, b.MaxSeq)
	}
}

// AttentionPrefill is eager GQA attention, one row at a time and in chunks of
// queries whose scores fit chunkBudget: per kv head g, S = Q·Kᵀ·Scale over
// its group's query heads (one strided-batched GEMM, stride 0 on the shared
// K), the masked softmax numerators, P·V in f32, then its division by the
// numerators' sums written into Out (see softmax_mask for why).
func (o *ops) AttentionPrefill(a *kernels.AttnArgs) {
	op := kernels.OpAttnPrefill
	checkAttn(op, a, true)
	b := a.Batch
	o.appendKV(a.KCache, a.VCache, a.K, a.V, b, a.KVHeads, a.HeadDim)

	dim, group := a.HeadDim, a.Heads/a.KVHeads
	q, out := o.mat(a.Q), o.mat(a.Out)
	kc, vc := o.mat(a.KCache), o.mat(a.VCache) // [B*KVHeads*MaxSeq, HeadDim]
	for r := range b.Rows {
		n, past := b.Start[r+1]-b.Start[r], b.Past[r]
		if n == 0 {
			continue
		}
		step := chunkRows(group, past+n, n)
		for i0 := 0; i0 < n; i0 += step {
			nq := min(step, n-i0)
			keys := past + i0 + nq // the chunk's last query sees them all
			t0 := b.Start[r] + i0
			scores := o.scratch(slotScores, kernels.F32, group*nq, keys)
			probs := o.scratch(slotProbs, kernels.BF16, group*nq, keys)
			sums := o.scratch(slotAttnSum, kernels.F32, group*nq, 1)
			acc := o.scratch(slotAttnAcc, kernels.F32, nq, group*dim)
			qkv := int64(nq) * int64(keys) // scores of one head
			for g := range a.KVHeads {
				cache := (r*a.KVHeads + g) * b.MaxSeq
				o.gemmBatched(true, nq, keys, dim, a.Scale, q.sub(t0, g*group*dim), int64(dim),
					kc.sub(cache, 0), 0, 0, scores, qkv, group)
				o.softmax(probs, sums, scores, group*nq, keys, nq, mask{base: past + i0})
				o.gemmBatched(false, nq, dim, keys, 1, probs, qkv, vc.sub(cache, 0), 0,
					0, acc, int64(dim), group)
				o.normalize(out.sub(t0, g*group*dim), acc, sums, nq, group, dim, 1, nq)
			}
		}
	}
}

// AttentionDecode is eager attention against a static cache: the scores of
// every query head over the whole cache capacity (GEMMs batched over rows or
// kv heads, whichever is longer), the softmax masked at each row's device
// length, and P·V over the whole capacity, with V read from a copy whose
// unused tail is zeroed (see kv_masked_copy). Nothing is read on the host,
// so a CUDA graph can replay it.
func (o *ops) AttentionDecode(a *kernels.AttnArgs) {
	op := kernels.OpAttnDecode
	checkAttn(op, a, false)
	b := a.Batch
	o.appendKV(a.KCache, a.VCache, a.K, a.V, b, a.KVHeads, a.HeadDim)

	dim, group, seq := a.HeadDim, a.Heads/a.KVHeads, b.MaxSeq
	q, out := o.mat(a.Q), o.mat(a.Out)
	scores := o.scratch(slotScores, kernels.F32, b.Rows*a.Heads, seq)
	probs := o.scratch(slotProbs, kernels.BF16, b.Rows*a.Heads, seq)
	sums := o.scratch(slotAttnSum, kernels.F32, b.Rows*a.Heads, 1)
	acc := o.scratch(slotAttnAcc, kernels.F32, b.Rows, a.Heads*dim)
	// Problem (row i, kv head j): the group's query heads are group
	// consecutive vectors of row i of q (lda = dim), its cache is
	// [i, j] of [B, KVHeads, MaxSeq, dim], its scores rows i*Heads + j*group.
	qs := batch2{m: mat{p: q.p, pitch: dim, dt: q.dt}, si: int64(q.pitch), sj: int64(group * dim)}
	cacheRow, cacheHead := int64(a.KVHeads*seq*dim), int64(seq*dim)
	ks := batch2{m: o.mat(a.KCache), si: cacheRow, sj: cacheHead}
	vs := batch2{m: o.maskedCache(a.VCache, b, a.KVHeads, dim), si: cacheRow, sj: cacheHead}
	ss := batch2{m: scores, si: int64(a.Heads * seq), sj: int64(group * seq)}
	ps := batch2{m: probs, si: ss.si, sj: ss.sj}
	accs := batch2{m: mat{p: acc.p, pitch: dim, dt: acc.dt}, si: int64(a.Heads * dim), sj: int64(group * dim)}

	o.gemmBatch2(true, group, seq, dim, a.Scale, qs, ks, 0, ss, b.Rows, a.KVHeads)
	o.softmax(probs, sums, scores, b.Rows*a.Heads, seq, 1, mask{past: o.d.Ptr(b.PastDev), rowsPerSeq: a.Heads})
	o.gemmBatch2(false, group, dim, seq, 1, ps, vs, 0, accs, b.Rows, a.KVHeads)
	o.normalize(out, acc, sums, b.Rows, a.Heads, dim, a.Heads, 1)
}
