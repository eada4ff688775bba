// The non-GEMM parts of materialized (eager) attention: appending to the KV
// cache and the masked softmax. Q·Kᵀ and P·V are cuBLAS calls made by the host
// (attention.go, mla.go). Pitches are in elements.

// row_of is the row b of token t in a packed batch: the last b < B with
// start[b] <= t (start i32 [B+1], ascending; empty rows are skipped).
__device__ __forceinline__ int row_of(const int* start, int B, int t) {
	int lo = 0, hi = B - 1;
	while (lo < hi) {
		const int mid = (lo + hi + 1) / 2;
		if (start[mid] <= t) lo = mid;
		else hi = mid - 1;
	}
	return lo;
}

// kv_append writes the new keys and values of a packed batch into the cache.
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

#define KV_APPEND(V)                                                                                     \
	extern "C" __global__ void kv_append_v##V(bf16* kc, bf16* vc, const bf16* ks, int kp, const bf16* vs, \
	                                          int vp, const int* start, const int* past, int B, int heads, \
	                                          int dim, int maxSeq) {                                     \
		kv_append<V>(kc, vc, ks, kp, vs, vp, start, past, B, heads, dim, maxSeq);                        \
	}
KV_APPEND(1)
KV_APPEND(8)

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

#define KV_MASKED_COPY(V)                                                                                 \
	extern "C" __global__ void kv_masked_copy_v##V(bf16* dst, const bf16* src, const int* start,        \
	                                               const int* past, int B, int heads, int dim, int maxSeq) { \
		kv_masked_copy<V>(dst, src, start, past, B, heads, dim, maxSeq);                                 \
	}
KV_MASKED_COPY(1)
KV_MASKED_COPY(8)

// softmax_mask turns scaled attention scores into causally masked
// probabilities, as eager attention's softmax(dtype=f32).to(bf16):
// p[r, j] = exp(s[r, j] - max) / sum for j < valid(r), 0 beyond, with max and
// sum over the valid columns. s f32 [rows, cols] packed; p bf16 [rows, cols]
// packed. Row r is query r % nq of a sequence whose first query sits at
// position first = past ? past[r / rowsPerSeq] : base (device lengths for
// decode, a host value for prefill), so valid(r) = min(cols, first + r % nq + 1).
// With SMEM the row is read from memory once, into cols floats of dynamic
// shared memory (torch's cunn_SoftMaxForwardSmem); else each pass reads it.
// Launch: grid.x = rows (one block per row), any multiple of 32 threads.
template <bool SMEM>
__device__ void softmax_mask(bf16* p, const float* s, int cols, int nq, const int* past, int rowsPerSeq, int base) {
	extern __shared__ float cached[];
	const long long r = blockIdx.x;
	const int first = past ? past[r / rowsPerSeq] : base;
	const int valid = min(cols, first + (int)(r % nq) + 1);
	const float* row = s + r * cols;
	bf16* prow = p + r * cols;

	float m = NEG_INF;
	for (int j = threadIdx.x; j < valid; j += blockDim.x) {
		const float v = row[j];
		if (SMEM) cached[j] = v;
		m = fmaxf(m, v);
	}
	m = block_reduce<MaxOp>(m); // its barriers also publish cached
	if (SMEM) row = cached;
	float sum = 0.0f;
	for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(row[j] - m);
	sum = block_reduce<SumOp>(sum);
	for (int j = threadIdx.x; j < cols; j += blockDim.x)
		prow[j] = __float2bfloat16_rn(j < valid ? expf(row[j] - m) / sum : 0.0f);
}

extern "C" __global__ void softmax_mask_global(bf16* p, const float* s, int cols, int nq, const int* past,
                                               int rowsPerSeq, int base) {
	softmax_mask<false>(p, s, cols, nq, past, rowsPerSeq, base);
}

extern "C" __global__ void softmax_mask_smem(bf16* p, const float* s, int cols, int nq, const int* past,
                                             int rowsPerSeq, int base) {
	softmax_mask<true>(p, s, cols, nq, past, rowsPerSeq, base);
}
