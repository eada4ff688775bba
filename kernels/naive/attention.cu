// The non-GEMM parts of materialized (eager) attention: the masked cache copy
// of decode and the masked softmax. Q·Kᵀ and P·V are cuBLAS calls made by the
// host (attention.go, mla.go); appending to the cache is cudaset's kv_append.
// Pitches are in elements.

#include "common.cuh"
#include "instances.cuh"

// kv_masked_copy copies a cache with the positions past each row's length
// past[b] + start[b+1] - start[b] zeroed, as a zero-initialized static cache
// holds them. Decode multiplies zero probabilities by the whole cache
// capacity; positions never written may hold NaN bit patterns, and
// 0·NaN = NaN, so P·V reads the masked copy.
// dst, src bf16 [B, heads, maxSeq, dim] packed; start i32 [B+1], past i32 [B].
// Launch: 1-D grid-stride over B*heads*maxSeq*dim/VEC.
template <int VEC>
__device__ void kv_masked_copy(bf16* dst, const bf16* src, const int* start, const int* past, int B, int heads,
                               int dim, int maxSeq) {
	const int cv = dim / VEC;
	GRID_STRIDE(i, (long long)B * heads * maxSeq * cv) {
		const long long row = i / cv; // (b*heads + h)*maxSeq + pos
		const long long at = row * dim + (i - row * cv) * VEC;
		const int pos = (int)(row % maxSeq);
		const int b = (int)(row / maxSeq / heads);
		Vec<bf16, VEC> v;
		if (pos < past[b] + start[b + 1] - start[b]) {
			v = load<bf16, VEC>(src + at);
		} else {
#pragma unroll
			for (int j = 0; j < VEC; j++) v.v[j] = __float2bfloat16_rn(0.0f);
		}
		store<bf16, VEC>(dst + at, v);
	}
}

#define KV_MASKED_COPY(NAME, V)                                                                           \
	extern "C" __global__ void NAME(bf16* dst, const bf16* src, const int* start,        \
	                                               const int* past, int B, int heads, int dim, int maxSeq) { \
		kv_masked_copy<V>(dst, src, start, past, B, heads, dim, maxSeq);                                 \
	}
KV_MASKED_COPY_INSTANCES(KV_MASKED_COPY)

// softmax_mask turns scaled attention scores into causally masked softmax
// numerators, rounded as HF's default attention (SDPA's fused kernels on
// bf16) rounds them: p[r, j] = bf16(exp(s[r, j] - max)) for j < valid(r), 0
// beyond, and sums[r] = the f32 sum of the unrounded numerators, by which
// attn_normalize divides P·V. (Eager attention's softmax(dtype=f32).to(bf16)
// rounds the normalized probabilities instead; on the bf16 HF fixtures that
// lands 1.4% from HF's logits where this lands 0.18%.) With P = float the
// numerators are not rounded: SDPA's math backend, which HF's attention
// takes for head dims its fused kernels refuse (kernels.SDPAFused).
// s f32 [rows, cols] packed; p P [rows, cols] packed; sums f32 [rows].
// Row r is query r % nq of a sequence whose first query sits at position
// first = past ? past[r / rowsPerSeq] : base (device lengths for decode, a
// host value for prefill), so valid(r) = min(cols, first + r % nq + 1), and
// max is over the valid columns. With SMEM the row is read from memory once,
// into cols floats of dynamic shared memory (torch's cunn_SoftMaxForwardSmem);
// else each pass reads it.
// Launch: grid.x = rows (one block per row), any multiple of 32 threads.
template <bool SMEM, typename P>
__device__ void softmax_mask(P* p, float* sums, const float* s, int cols, int nq, const int* past,
                             int rowsPerSeq, int base) {
	extern __shared__ float cached[];
	const long long r = blockIdx.x;
	const int first = past ? past[r / rowsPerSeq] : base;
	const int valid = min(cols, first + (int)(r % nq) + 1);
	const float* row = s + r * cols;
	P* prow = p + r * cols;

	float m = NEG_INF;
	for (int j = threadIdx.x; j < valid; j += blockDim.x) {
		const float v = row[j];
		if (SMEM) cached[j] = v;
		m = fmaxf(m, v);
	}
	m = block_reduce<MaxOp>(m); // its barriers also publish cached
	if (SMEM) row = cached;
	float sum = 0.0f;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		const float e = j < valid ? expf(row[j] - m) : 0.0f;
		sum += e;
		prow[j] = from_f32<P>(e);
	}
	sum = block_reduce<SumOp>(sum);
	if (threadIdx.x == 0) sums[r] = sum;
}

#define SOFTMAX_MASK(NAME, SMEM, P)                                                                   \
	extern "C" __global__ void NAME(P* p, float* sums, const float* s, int cols, int nq, const int* past, \
	                                int rowsPerSeq, int base) {                                          \
		softmax_mask<SMEM, P>(p, sums, s, cols, nq, past, rowsPerSeq, base);                             \
	}
SOFTMAX_MASK_INSTANCES(SOFTMAX_MASK)

// attn_normalize divides the P·V products of softmax_mask's numerators by
// their sums and rounds: out[t, h*dim + d] = O(acc[t, h*dim + d] /
// sums[t*lt + h*lh]). out O [T, heads*dim] (bf16, or f16 for an f16
// prefill) with pitch op; acc f32 [T, heads*dim] with pitch ap; sums f32,
// indexed by the strides lt (tokens) and lh (heads) of the scores' row
// order. Launch: 1-D grid-stride over T*heads*dim.
template <typename O>
__device__ void attn_normalize(O* out, int op, const float* acc, int ap, const float* sums, int lt, int lh, int T,
                               int heads, int dim) {
	const long long width = (long long)heads * dim;
	GRID_STRIDE(i, (long long)T * width) {
		const long long t = i / width;
		const int c = (int)(i - t * width), h = c / dim;
		out[t * op + c] = from_f32<O>(acc[t * ap + c] / sums[t * lt + (long long)h * lh]);
	}
}

#define ATTN_NORMALIZE(NAME, O)                                                                                   \
	extern "C" __global__ void NAME(O* out, int op, const float* acc, int ap, const float* sums, int lt, int lh, \
	                                int T, int heads, int dim) {                                                \
		attn_normalize<O>(out, op, acc, ap, sums, lt, lh, T, heads, dim);                                       \
	}
ATTN_NORMALIZE_INSTANCES(ATTN_NORMALIZE)
