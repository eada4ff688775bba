// The row movers every CUDA set uses: gathers and conversions of whole rows,
// appending new keys and values to a KV cache, and the weighted sum of the
// MoE experts' rows. Pitches are in elements.

#include "common.cuh"
#include "rows_instances.cuh"

// copy_rows converts and moves whole rows:
//   dst[drow(r), :cols] = src[srow(r), :cols] for r < rows, with
//   drow(r) = didx ? didx[r] : r and srow(r) = sidx ? sidx[r] : r / sdiv.
// dst TO [*, dpitch]; src TI [srows, spitch], spitch 0 repeats row 0 (a bias
// broadcast); didx, sidx i32 [rows] or null. An index sidx[r] outside
// [0, srows) traps, as torch's device-side assert does for a bad index.
// Serves Embedding (sidx = ids), Linear's bias (spitch 0) and the MoE token
// gather (sdiv = K, didx = slots). Launch: 1-D grid-stride over rows*cols/VEC.
template <typename TO, typename TI, int VEC>
__device__ void copy_rows(TO* dst, int dpitch, const int* didx, const TI* src, int spitch, const int* sidx,
                          int sdiv, int srows, int rows, int cols) {
	const int cv = cols / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const int r = (int)(i / cv);
		const int c = (int)(i - (long long)r * cv) * VEC;
		const int sr = sidx ? sidx[r] : r / sdiv;
		if (sidx && (sr < 0 || sr >= srows)) __trap();
		const int dr = didx ? didx[r] : r;
		const Vec<TI, VEC> in = load<TI, VEC>(src + (long long)sr * spitch + c);
		Vec<TO, VEC> out;
#pragma unroll
		for (int j = 0; j < VEC; j++) out.v[j] = from_f32<TO>(to_f32(in.v[j]));
		store<TO, VEC>(dst + (long long)dr * dpitch + c, out);
	}
}

#define COPY_ROWS(NAME, TO, TI, V)                                                                           \
	extern "C" __global__ void NAME(TO* dst, int dpitch, const int* didx,      \
	                                                         const TI* src, int spitch, const int* sidx, \
	                                                         int sdiv, int srows, int rows, int cols) {  \
		copy_rows<TO, TI, V>(dst, dpitch, didx, src, spitch, sidx, sdiv, srows, rows, cols);              \
	}
COPY_ROWS_INSTANCES(COPY_ROWS)

// kv_append writes the new keys and values of a packed batch into the cache.
// It moves 2-byte elements as they are: bf16, or f16 (an f16 attention
// prefill's), typed bf16 here.
// kc, vc bf16 [B, heads, maxSeq, dim]; vc (and vs) may be null for a single
// cache (MLA's latents: heads 1, dim = rank+ropeDim). ks, vs bf16 [T, ≥heads*dim]
// with pitches kp, vp: head h of token t at t*pitch + h*dim. start i32 [B+1]
// and past i32 [B] are the device row tables: token t of row b goes to
// position past[b] + t - start[b]. Positions outside [0, maxSeq) are not
// written (the host checks prefill; decode lengths are the caller's duty).
// Launch: grid.x = T (one block per token), threads loop over heads*dim/VEC.
template <int VEC>
__device__ void kv_append(bf16* kc, bf16* vc, const bf16* ks, int kp, const bf16* vs, int vp, const int* start,
                          const int* past, int B, int heads, int dim, int maxSeq) {
	const int t = blockIdx.x;
	const int b = row_of(start, B, t);
	const int pos = past[b] + t - start[b];
	if (pos < 0 || pos >= maxSeq) return;
	const int n = heads * dim / VEC;
	for (int v = threadIdx.x; v < n; v += blockDim.x) {
		const int c = v * VEC, h = c / dim, d = c - h * dim;
		const long long dst = (((long long)b * heads + h) * maxSeq + pos) * dim + d;
		store<bf16, VEC>(kc + dst, load<bf16, VEC>(ks + (long long)t * kp + c));
		if (vc) store<bf16, VEC>(vc + dst, load<bf16, VEC>(vs + (long long)t * vp + c));
	}
}

#define KV_APPEND(NAME, V)                                                                               \
	extern "C" __global__ void NAME(bf16* kc, bf16* vc, const bf16* ks, int kp, const bf16* vs, \
	                                          int vp, const int* start, const int* past, int B, int heads, \
	                                          int dim, int maxSeq) {                                     \
		kv_append<V>(kc, vc, ks, kp, vs, vp, start, past, B, heads, dim, maxSeq);                        \
	}
KV_APPEND_INSTANCES(KV_APPEND)

// moe_combine is out[t] = bf16(Σ_k weight[t, k] · y[slot[t·K + k]]), the
// sum in f32 in k order (HF's weighted sum over top_k of the bf16 expert
// outputs, cast once): the last step of both CUDA sets' MoE, whose rows of
// y are the expert outputs of every choice, sorted by expert.
//   out bf16 [N, outp]; y bf16 [*, yp] (H columns); slot i32 [N·K];
//   weight f32 [N, wp].
// Launch: 1-D grid-stride over N·H/VEC.
template <int VEC>
__device__ void moe_combine(bf16* out, int outp, const bf16* y, int yp, const int* slot, const float* weight, int wp,
                            int N, int K, int H) {
	const int per = H / VEC;
	GRID_STRIDE(i, (long long)N * per) {
		const long long t = i / per;
		const int c = (int)(i - t * per) * VEC;
		float acc[VEC];
#pragma unroll
		for (int j = 0; j < VEC; j++) acc[j] = 0.0f;
		for (int k = 0; k < K; k++) {
			const float wk = weight[t * wp + k];
			const Vec<bf16, VEC> v = load<bf16, VEC>(y + (long long)slot[t * K + k] * yp + c);
#pragma unroll
			for (int j = 0; j < VEC; j++) acc[j] += wk * to_f32(v.v[j]);
		}
		Vec<bf16, VEC> o;
#pragma unroll
		for (int j = 0; j < VEC; j++) o.v[j] = __float2bfloat16_rn(acc[j]);
		store<bf16, VEC>(out + t * outp + c, o);
	}
}

#define MOE_COMBINE(NAME, V)                                                                                    \
	extern "C" __global__ void NAME(bf16* out, int outp, const bf16* y, int yp, const int* slot,   \
	                                            const float* weight, int wp, int N, int K, int H) {            \
		moe_combine<V>(out, outp, y, yp, slot, weight, wp, N, K, H);                                          \
	}
MOE_COMBINE_INSTANCES(MOE_COMBINE)
