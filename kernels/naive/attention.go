package naive

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// mask says where each row of softmax_mask's scores starts: at position
// base (prefill, a host value) or at past[r / rowsPerSeq] (decode, read on
// the device from the i32 array at past).
type mask struct {
	past       uintptr
	rowsPerSeq int
	base       int
}

// softmax launches softmax_mask: probs (bf16, f16 for an f16 prefill, or
// f32 for the math backend's rounding) = the masked softmax numerators of scores, both packed [rows,
// cols], row r being query r % nq of its sequence, and sums [rows] their f32
// sums. A row that fits in shared memory is read once.
func (o *ops) softmax(probs, sums, scores cudaset.Mat, rows, cols, nq int, m mask) {
	kernel, shared := softmaxKernel(false, probs.DT), 0
	if row := cols * kernels.F32.Size(); row <= o.maxShared {
		kernel, shared = softmaxKernel(true, probs.DT), row
	}
	o.LaunchShared(kernel, rows, cudaset.ThreadsFor(cols), shared,
		probs.P, sums.P, scores.P, int32(cols), int32(nq), m.past, int32(max(1, m.rowsPerSeq)), int32(m.base))
}

// normalize launches attn_normalize: out (bf16 or f16, pitched [T,
// heads*dim]) = acc (f32 P·V of the numerators, same layout) / the sum of
// the scores row of token t and head h, sums[t*lt + h*lh].
func (o *ops) normalize(out, acc, sums cudaset.Mat, T, heads, dim, lt, lh int) {
	o.LaunchItems(normalizeKernel(out.DT), int64(T)*int64(heads)*int64(dim), out.P, int32(out.Pitch), acc.P,
		int32(acc.Pitch), sums.P, int32(lt), int32(lh), int32(T), int32(heads), int32(dim))
}

// maskedCache is a scratch copy of the first B rows of cache [B, heads,
// MaxSeq, dim] with the positions past every row's device length zeroed
// (kv_masked_copy), for the GEMMs that run over the whole capacity.
func (o *ops) maskedCache(cache *kernels.Tensor, b *kernels.Batch, heads, dim int) cudaset.Mat {
	src := o.Mat(cache)
	rows := b.Rows * heads * b.MaxSeq
	dst := o.Scratch(scrMaskedKV, kernels.BF16, rows, dim)
	v := cudaset.VecFor(dim, src, dst)
	o.LaunchItems(vname("kv_masked_copy", v), int64(rows)*int64(dim/v), dst.P, src.P,
		o.D.Ptr(b.StartDev), o.D.Ptr(b.PastDev), int32(b.Rows), int32(heads), int32(dim), int32(b.MaxSeq))
	return dst
}

// AttentionPrefill is eager GQA attention, one row at a time and in chunks of
// queries whose scores fit chunkBudget: per kv head g, S = Q·Kᵀ·Scale over
// its group's query heads (one strided-batched GEMM, stride 0 on the shared
// K), the masked softmax numerators, P·V in f32, then its division by the
// numerators' sums written into Out (see softmax_mask for why). Its
// operands may be f16 (kbench's fp16 rows, whose reference it is beyond
// the cpu set's reach): the numerators are then rounded to f16, as SDPA's
// fused kernels round them for f16 inputs.
func (o *ops) AttentionPrefill(a *kernels.AttnArgs) {
	a.Check(kernels.OpAttnPrefill, o.D.ActDType(), true, kernels.F16)
	b := a.Batch
	o.AppendKV(a.KCache, a.VCache, a.K, a.V, b, a.KVHeads, a.HeadDim)

	dim, group := a.HeadDim, a.Heads/a.KVHeads
	q, out := o.Mat(a.Q), o.Mat(a.Out)
	kc, vc := o.Mat(a.KCache), o.Mat(a.VCache) // [B*KVHeads*MaxSeq, HeadDim]
	for r := range b.Rows {
		n, past := b.Start[r+1]-b.Start[r], b.Past[r]
		if n == 0 {
			continue
		}
		step := chunkRows(group, past+n, n)
		for i0 := 0; i0 < n; i0 += step {
			nq := min(step, n-i0)
			keys, first := past+i0+nq, past+i0 // the chunk's last query sees all keys; its first query's position
			if a.NonCausal {
				keys, first = past+n, past+n // every query sees every key of the row
			}
			t0 := b.Start[r] + i0
			scores := o.Scratch(scrScores, kernels.F32, group*nq, keys)
			probs := o.Scratch(scrProbs, a.Q.DType, group*nq, keys)
			sums := o.Scratch(scrAttnSum, kernels.F32, group*nq, 1)
			acc := o.Scratch(scrAttnAcc, kernels.F32, nq, group*dim)
			qkv := int64(nq) * int64(keys) // scores of one head
			for g := range a.KVHeads {
				cache := (r*a.KVHeads + g) * b.MaxSeq
				o.GemmBatched(true, nq, keys, dim, a.Scale, q.Sub(t0, g*group*dim), int64(dim),
					kc.Sub(cache, 0), 0, 0, scores, qkv, group)
				o.softmax(probs, sums, scores, group*nq, keys, nq, mask{base: first})
				o.GemmBatched(false, nq, dim, keys, 1, probs, qkv, vc.Sub(cache, 0), 0,
					0, acc, int64(dim), group)
				o.normalize(out.Sub(t0, g*group*dim), acc, sums, nq, group, dim, 1, nq)
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
	a.Check(kernels.OpAttnDecode, o.D.ActDType(), false)
	b := a.Batch
	o.AppendKV(a.KCache, a.VCache, a.K, a.V, b, a.KVHeads, a.HeadDim)

	dim, group, seq := a.HeadDim, a.Heads/a.KVHeads, b.MaxSeq
	q, out := o.Mat(a.Q), o.Mat(a.Out)
	scores := o.Scratch(scrScores, kernels.F32, b.Rows*a.Heads, seq)
	probs := o.Scratch(scrProbs, kernels.BF16, b.Rows*a.Heads, seq)
	sums := o.Scratch(scrAttnSum, kernels.F32, b.Rows*a.Heads, 1)
	acc := o.Scratch(scrAttnAcc, kernels.F32, b.Rows, a.Heads*dim)
	// Problem (row i, kv head j): the group's query heads are group
	// consecutive vectors of row i of q (lda = dim), its cache is
	// [i, j] of [B, KVHeads, MaxSeq, dim], its scores rows i*Heads + j*group.
	qs := cudaset.Batch2{M: cudaset.Mat{P: q.P, Pitch: dim, DT: q.DT}, Si: int64(q.Pitch), Sj: int64(group * dim)}
	cacheRow, cacheHead := int64(a.KVHeads*seq*dim), int64(seq*dim)
	ks := cudaset.Batch2{M: o.Mat(a.KCache), Si: cacheRow, Sj: cacheHead}
	vs := cudaset.Batch2{M: o.maskedCache(a.VCache, b, a.KVHeads, dim), Si: cacheRow, Sj: cacheHead}
	ss := cudaset.Batch2{M: scores, Si: int64(a.Heads * seq), Sj: int64(group * seq)}
	ps := cudaset.Batch2{M: probs, Si: ss.Si, Sj: ss.Sj}
	accs := cudaset.Batch2{M: cudaset.Mat{P: acc.P, Pitch: dim, DT: acc.DT}, Si: int64(a.Heads * dim), Sj: int64(group * dim)}

	o.GemmBatch2(true, group, seq, dim, a.Scale, qs, ks, 0, ss, b.Rows, a.KVHeads)
	o.softmax(probs, sums, scores, b.Rows*a.Heads, seq, 1, mask{past: o.D.Ptr(b.PastDev), rowsPerSeq: a.Heads})
	o.GemmBatch2(false, group, dim, seq, 1, ps, vs, 0, accs, b.Rows, a.KVHeads)
	o.normalize(out, acc, sums, b.Rows, a.Heads, dim, a.Heads, 1)
}
