package naive

import (
	"github.com/fuselm/fuselm/kernels"
)

func checkMLA(op kernels.Op, a *kernels.MLAArgs, prefill bool) {
	b := a.Batch
	checkBatch(op, b, prefill)
	need(a.Heads > 0 && a.NopeDim > 0 && a.RopeDim > 0 && a.VDim > 0 && a.Rank > 0, op,
		"%d heads, dims nope %d rope %d v %d rank %d", a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank)
	width := a.Rank + a.RopeDim
	need(isAct(a.Q) && a.Q.Rows() == b.Tokens && a.Q.Cols() == a.Heads*(a.NopeDim+a.RopeDim), op, "q %v", a.Q)
	need(isAct(a.KV) && a.KV.Rows() == b.Tokens && a.KV.Cols() == width, op, "new latents %v", a.KV)
	need(isAct(a.Out) && a.Out.Rows() == b.Tokens && a.Out.Cols() == a.Heads*a.VDim, op, "out %v", a.Out)
	need(isAct(a.Cache) && a.Cache.Packed() && a.Cache.Cols() == width && cacheFits(a.Cache, b, 1), op,
		"cache %v for %d rows × %d positions", a.Cache, b.Rows, b.MaxSeq)
	need(isAct(a.WKVB) && a.WKVB.Rows() == a.Heads*(a.NopeDim+a.VDim) && a.WKVB.Cols() == a.Rank, op,
		"kv_b_proj %v (bf16, as cuBLAS multiplies the bf16 latents by it)", a.WKVB)
}

// MLAPrefill is HF's DeepseekV2Attention, eager: per row, the latents of
// all its positions are decompressed by one GEMM with kv_b_proj into every
// head's k_nope and v (bf16, as torch keeps them); then, in chunks of
// queries whose scores fit chunkBudget, the scores of all heads are
// q_nope·k_nopeᵀ plus q_pe·k_peᵀ (two strided-batched GEMMs, the second
// accumulating, stride 0 on the shared k_pe), the masked softmax numerators,
// P·V in f32 and its division by their sums (see softmax_mask).
func (o *ops) MLAPrefill(a *kernels.MLAArgs) {
	op := kernels.OpMLAPrefill
	checkMLA(op, a, true)
	b := a.Batch
	o.appendKV(a.Cache, nil, a.KV, nil, b, 1, a.Rank+a.RopeDim)

	perPos := a.Heads * (a.NopeDim + a.VDim) // decompressed width of one position
	cache := o.mat(a.Cache)                  // [B*MaxSeq, Rank+RopeDim]
	for r := range b.Rows {
		n, past := b.Start[r+1]-b.Start[r], b.Past[r]
		if n == 0 {
			continue
		}
		keys := past + n
		kv := o.scratch(slotLatentKV, kernels.BF16, keys, perPos)
		latents := cache.sub(r*b.MaxSeq, 0)
		o.gemm(true, keys, perPos, a.Rank, 1, latents, o.mat(a.WKVB), 0, kv)
		step := chunkRows(a.Heads, keys, n)
		for i0 := 0; i0 < n; i0 += step {
			nq := min(step, n-i0)
			o.mlaAttend(a, b.Start[r]+i0, nq, past+i0+nq, kv, latents.sub(0, a.Rank), mask{base: past + i0})
		}
	}
}

// MLADecode is MLAPrefill against the whole cache capacity of every row,
// masked at the device lengths, so that a CUDA graph can replay it: the
// latents are read from a copy whose unused tail is zeroed (see
// kv_masked_copy), rows are decompressed a pass at a time (as many as
// chunkBudget holds), then each row's one query attends to its MaxSeq
// positions.
func (o *ops) MLADecode(a *kernels.MLAArgs) {
	op := kernels.OpMLADecode
	checkMLA(op, a, false)
	b := a.Batch
	o.appendKV(a.Cache, nil, a.KV, nil, b, 1, a.Rank+a.RopeDim)

	seq := b.MaxSeq
	perPos := a.Heads * (a.NopeDim + a.VDim)
	cache := o.maskedCache(a.Cache, b, 1, a.Rank+a.RopeDim)
	perRow := int64(seq) * int64(perPos) * int64(kernels.BF16.Size())
	pass := int(max(1, min(int64(b.Rows), chunkBudget/perRow)))
	for r0 := 0; r0 < b.Rows; r0 += pass {
		nr := min(pass, b.Rows-r0)
		kv := o.scratch(slotLatentKV, kernels.BF16, pass*seq, perPos) // the same size every pass and step
		o.gemm(true, nr*seq, perPos, a.Rank, 1, cache.sub(r0*seq, 0), o.mat(a.WKVB), 0, kv)
		for r := r0; r < r0+nr; r++ {
			past := o.d.Ptr(a.Batch.PastDev) + uintptr(r*kernels.I32.Size())
			o.mlaAttend(a, r, 1, seq, kv.sub((r-r0)*seq, 0), cache.sub(r*seq, a.Rank), mask{past: past, rowsPerSeq: a.Heads})
		}
	}
}

// mlaAttend is the attention of nq queries (tokens t0.. of a.Q) over keys
// positions of one row: kv holds their decompressed [keys, Heads*(Nope+V)]
// (per head k_nope then v), kpe their shared rotated keys (pitched rows of
// the cache).
func (o *ops) mlaAttend(a *kernels.MLAArgs, t0, nq, keys int, kv, kpe mat, m mask) {
	heads, nope, vdim := a.Heads, a.NopeDim, a.VDim
	// HF's attention rounds the numerators for these head dims, or (its math
	// backend) computes P·V in f32 from the bf16 values.
	pType, values := kernels.BF16, kv
	if !kernels.SDPAFused(nope+a.RopeDim, vdim) {
		perPos := heads * (nope + vdim)
		pType, values = kernels.F32, o.scratch(slotLatentF32, kernels.F32, keys, perPos)
		o.copyRows(values, 0, kv, 0, 1, keys, keys, perPos)
	}
	scores := o.scratch(slotScores, kernels.F32, heads*nq, keys)
	probs := o.scratch(slotProbs, pType, heads*nq, keys)
	sums := o.scratch(slotAttnSum, kernels.F32, heads*nq, 1)
	acc := o.scratch(slotAttnAcc, kernels.F32, nq, heads*vdim)
	q := o.mat(a.Q).sub(t0, 0)
	qStride, kvStride, sStride := int64(nope+a.RopeDim), int64(nope+vdim), int64(nq)*int64(keys)
	o.gemmBatched(true, nq, keys, nope, a.Scale, q, qStride, kv, kvStride, 0, scores, sStride, heads)
	o.gemmBatched(true, nq, keys, a.RopeDim, a.Scale, q.sub(0, nope), qStride, kpe, 0, 1, scores, sStride, heads)
	o.softmax(probs, sums, scores, heads*nq, keys, nq, m)
	o.gemmBatched(false, nq, vdim, keys, 1, probs, sStride, values.sub(0, nope), kvStride, 0, acc, int64(vdim), heads)
	o.normalize(o.mat(a.Out).sub(t0, 0), acc, sums, nq, heads, vdim, 1, nq)
}
