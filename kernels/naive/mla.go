package naive

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// checkMLA is the ops' contract plus what cuBLAS needs: bf16 kv_b_proj.
func (o *ops) checkMLA(op kernels.Op, a *kernels.MLAArgs, prefill bool) {
	a.Check(op, o.D.ActDType(), prefill)
	o.Need(cudaset.IsBF16(a.WKVB), op, "kv_b_proj %v (bf16, as cuBLAS multiplies the bf16 latents by it)", a.WKVB)
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
	o.checkMLA(op, a, true)
	b := a.Batch
	o.AppendKV(a.Cache, nil, a.KV, nil, b, 1, a.Rank+a.RopeDim)

	perPos := a.Heads * (a.NopeDim + a.VDim) // decompressed width of one position
	cache := o.Mat(a.Cache)                  // [B*MaxSeq, Rank+RopeDim]
	for r := range b.Rows {
		n, past := b.Start[r+1]-b.Start[r], b.Past[r]
		if n == 0 {
			continue
		}
		keys := past + n
		kv := o.Scratch(scrLatentKV, kernels.BF16, keys, perPos)
		latents := cache.Sub(r*b.MaxSeq, 0)
		o.Gemm(true, keys, perPos, a.Rank, 1, latents, o.Mat(a.WKVB), 0, kv)
		step := chunkRows(a.Heads, keys, n)
		for i0 := 0; i0 < n; i0 += step {
			nq := min(step, n-i0)
			o.mlaAttend(a, b.Start[r]+i0, nq, past+i0+nq, kv, latents.Sub(0, a.Rank), mask{base: past + i0})
		}
	}
}

// MLADecodeRoPE is the set's RMSNormRoPE (its rms_norm and ropes), then
// its MLADecode, launch by launch as HF's eager code runs them.
func (o *ops) MLADecodeRoPE(a *kernels.MLAArgs, w *kernels.Tensor, eps float32, pos *kernels.Tensor, r *kernels.Rope) {
	kernels.CheckMLADecodeRoPE(o.D.ActDType(), a, w, pos, r)
	kernels.MLADecodeRoPEParts(o, a, w, eps, pos, r)
}

// MLADecode is MLAPrefill against the whole cache capacity of every row,
// masked at the device lengths, so that a CUDA graph can replay it: the
// latents are read from a copy whose unused tail is zeroed (see
// kv_masked_copy), rows are decompressed a pass at a time (as many as
// chunkBudget holds), then each row's one query attends to its MaxSeq
// positions.
func (o *ops) MLADecode(a *kernels.MLAArgs) {
	op := kernels.OpMLADecode
	o.checkMLA(op, a, false)
	b := a.Batch
	o.AppendKV(a.Cache, nil, a.KV, nil, b, 1, a.Rank+a.RopeDim)

	seq := b.MaxSeq
	perPos := a.Heads * (a.NopeDim + a.VDim)
	cache := o.maskedCache(a.Cache, b, 1, a.Rank+a.RopeDim)
	perRow := int64(seq) * int64(perPos) * int64(kernels.BF16.Size())
	pass := int(max(1, min(int64(b.Rows), chunkBudget/perRow)))
	for r0 := 0; r0 < b.Rows; r0 += pass {
		nr := min(pass, b.Rows-r0)
		kv := o.Scratch(scrLatentKV, kernels.BF16, pass*seq, perPos) // the same size every pass and step
		o.Gemm(true, nr*seq, perPos, a.Rank, 1, cache.Sub(r0*seq, 0), o.Mat(a.WKVB), 0, kv)
		for r := r0; r < r0+nr; r++ {
			past := o.D.Ptr(a.Batch.PastDev) + uintptr(r*kernels.I32.Size())
			o.mlaAttend(a, r, 1, seq, kv.Sub((r-r0)*seq, 0), cache.Sub(r*seq, a.Rank), mask{past: past, rowsPerSeq: a.Heads})
		}
	}
}

// mlaAttend is the attention of nq queries (tokens t0.. of a.Q) over keys
// positions of one row: kv holds their decompressed [keys, Heads*(Nope+V)]
// (per head k_nope then v), kpe their shared rotated keys (pitched rows of
// the cache).
func (o *ops) mlaAttend(a *kernels.MLAArgs, t0, nq, keys int, kv, kpe cudaset.Mat, m mask) {
	heads, nope, vdim := a.Heads, a.NopeDim, a.VDim
	// HF's attention rounds the numerators for these head dims, or (its math
	// backend) computes P·V in f32 from the bf16 values.
	pType, values := kernels.BF16, kv
	if !kernels.SDPAFused(nope+a.RopeDim, vdim) {
		perPos := heads * (nope + vdim)
		pType, values = kernels.F32, o.Scratch(scrLatentF32, kernels.F32, keys, perPos)
		o.CopyRows(values, 0, kv, 0, 1, keys, keys, perPos)
	}
	scores := o.Scratch(scrScores, kernels.F32, heads*nq, keys)
	probs := o.Scratch(scrProbs, pType, heads*nq, keys)
	sums := o.Scratch(scrAttnSum, kernels.F32, heads*nq, 1)
	acc := o.Scratch(scrAttnAcc, kernels.F32, nq, heads*vdim)
	q := o.Mat(a.Q).Sub(t0, 0)
	qStride, kvStride, sStride := int64(nope+a.RopeDim), int64(nope+vdim), int64(nq)*int64(keys)
	o.GemmBatched(true, nq, keys, nope, a.Scale, q, qStride, kv, kvStride, 0, scores, sStride, heads)
	o.GemmBatched(true, nq, keys, a.RopeDim, a.Scale, q.Sub(0, nope), qStride, kpe, 0, 1, scores, sStride, heads)
	o.softmax(probs, sums, scores, heads*nq, keys, nq, m)
	o.GemmBatched(false, nq, vdim, keys, 1, probs, sStride, values.Sub(0, nope), kvStride, 0, acc, int64(vdim), heads)
	o.normalize(o.Mat(a.Out).Sub(t0, 0), acc, sums, nq, heads, vdim, 1, nq)
}
