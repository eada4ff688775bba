// The fused set's memory-bound kernels: each reads its inputs once and writes
// its outputs once, with 16-byte accesses where the host found every row
// start aligned for them (VEC 8), rounding where HF's bf16 code rounds.
// Pitches are in elements.

#include "binary.cuh"
#include "common.cuh"
#include "instances.cuh"
#include "rope.cuh"

// rms_norm is RMSNorm of each row, with the residual add before it when ADD:
//   ADD:  r = bf16(resid + x); resid = r; out = bf16(w · bf16(r · rstd))
//   else: r = x;                          out = bf16(w · bf16(r · rstd))
// with rstd = 1/sqrt(mean(r²) + eps) in f32 over the rounded r, as HF's
// decoder layer adds in bf16 and its RMSNorm normalises in f32.
// out, x, resid bf16 [rows, cols] with pitches op, xp, rp (out may be x when
// !ADD; out must not alias resid or x when ADD); w TW [cols].
// Launch: grid.x = rows (one block per row); a block of T threads holds the
// row in registers, NV accesses of VEC elements per thread, so the row is
// read once: T·NV·VEC >= cols.
// The device function normalises row r with the block's first T threads
// (T a multiple of 32; every thread of the block calls it, as it syncs): a
// kernel whose blocks are wider for other work (rms_norm_rope) sums a row
// as the T-thread rms_norm kernel does, its other warps adding zeros, so
// the two round alike.
template <bool ADD, typename TW, int VEC, int NV>
__device__ void rms_norm(bf16* out, int op, bf16* resid, int rp, const bf16* x, int xp, const TW* w, int cols,
                         float eps, long long r, int T) {
	const bf16* xrow = x + r * xp;
	bf16* rrow = ADD ? resid + r * rp : nullptr;
	const bool mine = threadIdx.x < T;
	float v[NV][VEC];
	float ss = 0.0f;
#pragma unroll
	for (int i = 0; i < NV; i++) {
		const int c = (threadIdx.x + i * T) * VEC;
		if (mine && c < cols) {
			const Vec<bf16, VEC> a = load<bf16, VEC>(xrow + c);
			Vec<bf16, VEC> s;
			if (ADD) s = load<bf16, VEC>(rrow + c);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				float e = to_f32(a.v[j]);
				if (ADD) {
					s.v[j] = __float2bfloat16_rn(e + to_f32(s.v[j]));
					e = to_f32(s.v[j]);
				}
				v[i][j] = e;
				ss += e * e;
			}
			if (ADD) store<bf16, VEC>(rrow + c, s);
		}
	}
	ss = block_reduce<SumOp>(ss);
	const float rstd = rsqrtf(ss / (float)cols + eps);
	bf16* orow = out + r * op;
#pragma unroll
	for (int i = 0; i < NV; i++) {
		const int c = (threadIdx.x + i * T) * VEC;
		if (mine && c < cols) {
			const Vec<TW, VEC> wv = load<TW, VEC>(w + c);
			Vec<bf16, VEC> y;
#pragma unroll
			for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(to_f32(wv.v[j]) * round_bf16(v[i][j] * rstd));
			store<bf16, VEC>(orow + c, y);
		}
	}
}

#define RMS_NORM(NAME, ADD, TW, V, NV)                                                                    \
	extern "C" __global__ void NAME(bf16* out, int op, bf16* resid, int rp,                                 \
	                                                         const bf16* x, int xp, const TW* w, int cols, \
	                                                         float eps) {                                   \
		grid_wait();                                                                                       \
		grid_release();                                                                                    \
		rms_norm<ADD, TW, V, NV>(out, op, resid, rp, x, xp, w, cols, eps, blockIdx.x, blockDim.x);         \
	}
RMS_NORM_INSTANCES(RMS_NORM)

// rope rotates, in place, dims [offset, offset+dim) of every head of one
// token per block: head h of token t starts at x + t*pitch + h*hstride. The
// angle of pair i at position pos[t] is (cos, sin)[pos[t]*cspitch + i], f32
// tables [maxPos, cspitch]. Pairs are (i, i+dim/2) (rotate_half, Qwen2) or
// (2i, 2i+1) (INTERLEAVED, DeepSeek-V2): x1' = x1·cos − x2·sin,
// x2' = x2·cos + x1·sin, rounded as HF's bf16 code (naive's rope says how;
// rope.cuh holds the rotate_half pair's arithmetic, which
// flash_decode_rope shares).
// A thread takes VEC consecutive pairs: VEC elements of each half (half
// layout) or 2·VEC consecutive elements (interleaved). A position outside
// [0, maxPos) traps.
// Launch: grid.x = T (one block per token), threads loop over heads·dim/2/VEC.
// The device function rotates token t's heads with every thread of the
// block; each element's arithmetic is the same whatever the block.
template <bool INTERLEAVED, int VEC>
__device__ void rope(bf16* x, int pitch, int heads, int hstride, int offset, const int* pos, const float* cosT,
                     const float* sinT, int cspitch, int maxPos, int dim, long long t) {
	const int p = pos[t];
	if (p < 0 || p >= maxPos) __trap();
	const int half = dim / 2, groups = half / VEC;
	const float* cs = cosT + (long long)p * cspitch;
	const float* sn = sinT + (long long)p * cspitch;
	for (int g = threadIdx.x; g < heads * groups; g += blockDim.x) {
		const int h = g / groups, i0 = (g - h * groups) * VEC;
		bf16* head = x + t * pitch + (long long)h * hstride + offset;
		const Vec<float, VEC> c = load<float, VEC>(cs + i0), s = load<float, VEC>(sn + i0);
		if (INTERLEAVED) {
			Vec<bf16, 2 * VEC> v = load<bf16, 2 * VEC>(head + 2 * i0);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				const float x1 = to_f32(v.v[2 * j]), x2 = to_f32(v.v[2 * j + 1]);
				v.v[2 * j] = __float2bfloat16_rn(x1 * c.v[j] - x2 * s.v[j]);
				v.v[2 * j + 1] = __float2bfloat16_rn(x2 * c.v[j] + x1 * s.v[j]);
			}
			store<bf16, 2 * VEC>(head + 2 * i0, v);
		} else {
			Vec<bf16, VEC> a = load<bf16, VEC>(head + i0), b = load<bf16, VEC>(head + half + i0);
#pragma unroll
			for (int j = 0; j < VEC; j++) rope_half_pair(to_f32(a.v[j]), to_f32(b.v[j]), c.v[j], s.v[j], a.v[j], b.v[j]);
			store<bf16, VEC>(head + i0, a);
			store<bf16, VEC>(head + half + i0, b);
		}
	}
}

#define ROPE(NAME, INTERLEAVED, V)                                                                             \
	extern "C" __global__ void NAME(bf16* x, int pitch, int heads, int hstride, int offset, const int* pos, \
	                                       const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) { \
		grid_wait();                                                                                                \
		grid_release();                                                                                             \
		rope<INTERLEAVED, V>(x, pitch, heads, hstride, offset, pos, cosT, sinT, cspitch, maxPos, dim, blockIdx.x);  \
	}
ROPE_INSTANCES(ROPE)

// rms_norm_rope is MLA's kv_a_layernorm and the rotary embedding of q's
// and k's rope dims (the op rms_norm_rope) in one launch, in place: for
// token t, kv[t, :rank] = rms_norm(kv[t, :rank]) with weights w, then k_pe
// = kv[t, rank:rank+dim] rotated as one head, and q's heads rotated at
// [offset, offset+dim). The pieces share no element, so they run side by
// side; each calls the same device function as rms_norm and rope with the
// same instance arguments (VEC, NV, RVEC) the set's launchers pick for a
// row of rank and for the rope dims, and with normT, the threads of
// rms_norm's own launch for that row: the results are theirs bit for bit.
// q bf16 [T, ≥heads·hstride] with pitch qp; kv bf16 [T, rank+dim] with
// pitch kvp; w TW [rank]; pos i32 [T]; cosT, sinT f32 [maxPos, cspitch].
// Launch: grid (T, 2), blockIdx.y 0 token t's kv row (its latent, then its
// k_pe), 1 its q row; blocks of at least normT threads, a multiple of 32.
template <bool INTERLEAVED, typename TW, int VEC, int NV, int RVEC>
__device__ void rms_norm_rope(bf16* q, int qp, int heads, int hstride, int offset, bf16* kv, int kvp, const TW* w,
                              int rank, float eps, int normT, const int* pos, const float* cosT, const float* sinT,
                              int cspitch, int maxPos, int dim) {
	const long long t = blockIdx.x;
	if (blockIdx.y == 0) {
		rms_norm<false, TW, VEC, NV>(kv, kvp, nullptr, 0, kv, kvp, w, rank, eps, t, normT);
		rope<INTERLEAVED, RVEC>(kv, kvp, 1, rank + dim, rank, pos, cosT, sinT, cspitch, maxPos, dim, t);
	} else {
		rope<INTERLEAVED, RVEC>(q, qp, heads, hstride, offset, pos, cosT, sinT, cspitch, maxPos, dim, t);
	}
}

#define RMS_NORM_ROPE(NAME, INTERLEAVED, TW, V, NV, RV)                                                       \
	extern "C" __global__ void NAME(bf16* q, int qp, int heads, int hstride, int offset, bf16* kv, int kvp,  \
	                                const TW* w, int rank, float eps, int normT, const int* pos,             \
	                                const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) { \
		grid_wait();                                                                                          \
		grid_release();                                                                                       \
		rms_norm_rope<INTERLEAVED, TW, V, NV, RV>(q, qp, heads, hstride, offset, kv, kvp, w, rank, eps, normT, \
		                                          pos, cosT, sinT, cspitch, maxPos, dim);                       \
	}
RMS_NORM_ROPE_INSTANCES(RMS_NORM_ROPE)

// swiglu is out = bf16(bf16(silu(gate)) · up) with gate = gu[:, :inter] and
// up = gu[:, inter:], as HF's act_fn(gate_proj(x)) * up_proj(x) in bf16: one
// pass where eager torch makes two.
// out bf16 [rows, inter] with pitch op; gu bf16 [rows, 2·inter] with pitch gp.
// Launch: 1-D grid-stride over rows·inter/VEC.
template <int VEC> __device__ void swiglu(bf16* out, int op, const bf16* gu, int gp, int rows, int inter) {
	const int cv = inter / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const long long r = i / cv;
		const int c = (int)(i - r * cv) * VEC;
		const Vec<bf16, VEC> g = load<bf16, VEC>(gu + r * gp + c);
		const Vec<bf16, VEC> u = load<bf16, VEC>(gu + r * gp + inter + c);
		Vec<bf16, VEC> y;
#pragma unroll
		for (int j = 0; j < VEC; j++) {
			const float v = to_f32(g.v[j]);
			y.v[j] = __float2bfloat16_rn(round_bf16(v / (1.0f + expf(-v))) * to_f32(u.v[j]));
		}
		store<bf16, VEC>(out + r * op + c, y);
	}
}

#define SWIGLU(NAME, V)                                                                                      \
	extern "C" __global__ void NAME(bf16* out, int op, const bf16* gu, int gp, int rows, int inter) {        \
		grid_wait();                                                                                         \
		grid_release();                                                                                      \
		swiglu<V>(out, op, gu, gp, rows, inter);                                                             \
	}
SWIGLU_INSTANCES(SWIGLU)

// add is naive's binary<AddOp> (binary.cuh), launched to overlap the kernel
// before it (a decode step's MoE adds its shared experts' output to the
// routed ones'). Launch: 1-D grid-stride over rows·cols/VEC.
#define ADD(NAME, V)                                                                                            \
	extern "C" __global__ void NAME(bf16* out, int op, const bf16* a, int ap, const bf16* b, int bp, int rows, \
	                                int cols) {                                                                 \
		grid_wait();                                                                                            \
		grid_release();                                                                                         \
		binary<AddOp, V>(out, op, a, ap, b, bp, rows, cols);                                                   \
	}
ADD_INSTANCES(ADD)

// argmax_split is out[b·os] = the first index of the largest element of row
// b, NaN counting as the largest (as torch.argmax), and with os = 2
// out[b·2 + 1] = that element's value as f32 bits. One block per row reads
// a vocabulary's logits at a fraction of the memory's rate; here a row is
// cut into ARGMAX_CHUNK columns a block, so that the row's bytes are read
// by many SMs at once, and the row's last block to finish reduces the
// blocks' pairs.
// out i32 [B, os]; x T [B, cols] with pitch xp; part int2 [B, splits]
// scratch (value bits, index); counters i32 [≥ B], zero between launches
// (the last block puts its row's back).
// Launch: grid (splits, B) of ARGMAX_THREADS, splits = ceil(cols / ARGMAX_CHUNK).
#define ARGMAX_THREADS 256
#define ARGMAX_CHUNK 4096

template <typename T>
__device__ void argmax_split(int* out, int os, const T* x, int xp, int cols, int2* part, int* counters) {
	__shared__ bool lastBlock;
	const int b = blockIdx.y, s = blockIdx.x, splits = gridDim.x;
	const T* row = x + (long long)b * xp;
	float bv;
	int bi;
	block_argmax_of(row, s * ARGMAX_CHUNK, min(cols, (s + 1) * ARGMAX_CHUNK), bv, bi);
	if (threadIdx.x == 0) {
		part[(long long)b * splits + s] = make_int2(__float_as_int(bv), bi);
		__threadfence();
		lastBlock = atomicAdd(&counters[b], 1) == splits - 1;
	}
	__syncthreads();
	if (!lastBlock) return;
	__threadfence();
	bv = NEG_INF;
	bi = NO_INDEX;
	for (int i = threadIdx.x; i < splits; i += ARGMAX_THREADS) {
		const int2 p = __ldcg(&part[(long long)b * splits + i]);
		if (better(__int_as_float(p.x), p.y, bv, bi)) {
			bv = __int_as_float(p.x);
			bi = p.y;
		}
	}
	block_argmax(bv, bi);
	if (threadIdx.x == 0) {
		put_choice(out, os, b, row, bi);
		counters[b] = 0; // ready for the next launch
	}
}

#define ARGMAX_SPLIT(NAME, T)                                                                                \
	extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                                             \
	    NAME(int* out, int os, const T* x, int xp, int cols, int2* part, int* counters) {                      \
		grid_wait();                                                                                         \
		grid_release();                                                                                      \
		argmax_split<T>(out, os, x, xp, cols, part, counters);                                               \
	}
ARGMAX_SPLIT_INSTANCES(ARGMAX_SPLIT)
