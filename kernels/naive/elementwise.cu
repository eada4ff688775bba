// Elementwise ops, RMSNorm, RoPE, argmax and decode_advance of the naive
// set: one simple kernel per torch eager op. Pitches are in elements.

#include "binary.cuh"
#include "common.cuh"
#include "instances.cuh"

#define BINARY(NAME, OP, V)                                                                              \
	extern "C" __global__ void NAME(bf16* out, int outp, const bf16* a, int ap, const bf16* b, int bp, \
	                                       int rows, int cols) {                                         \
		binary<OP, V>(out, outp, a, ap, b, bp, rows, cols);                                              \
	}
BINARY_INSTANCES(BINARY)

// silu is out = x * sigmoid(x) in f32, rounded to bf16 (torch's silu on bf16).
// out, x bf16 [rows, cols] with pitches outp, xp; out may be x.
// Launch: 1-D grid-stride over rows*cols/VEC.
template <int VEC> __device__ void silu(bf16* out, int outp, const bf16* x, int xp, int rows, int cols) {
	const int cv = cols / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const long long r = i / cv;
		const int c = (int)(i - r * cv) * VEC;
		const Vec<bf16, VEC> in = load<bf16, VEC>(x + r * xp + c);
		Vec<bf16, VEC> y;
#pragma unroll
		for (int j = 0; j < VEC; j++) {
			const float v = to_f32(in.v[j]);
			y.v[j] = __float2bfloat16_rn(v / (1.0f + expf(-v)));
		}
		store<bf16, VEC>(out + r * outp + c, y);
	}
}

#define SILU(NAME, V)                                                                                    \
	extern "C" __global__ void NAME(bf16* out, int outp, const bf16* x, int xp, int rows, int cols) { \
		silu<V>(out, outp, x, xp, rows, cols);                                                           \
	}
SILU_INSTANCES(SILU)

// rms_rstd is the first half of RMSNorm: rstd[r] = 1/sqrt(mean(x[r]²) + eps)
// in f32. x bf16 [rows, cols] with pitch xp; rstd f32 [rows].
// Launch: grid.x = rows (one block per row), any multiple of 32 threads.
template <int VEC> __device__ void rms_rstd(float* rstd, const bf16* x, int xp, int cols, float eps) {
	const bf16* row = x + (long long)blockIdx.x * xp;
	float ss = 0.0f;
	for (int c = threadIdx.x * VEC; c < cols; c += blockDim.x * VEC) {
		const Vec<bf16, VEC> in = load<bf16, VEC>(row + c);
#pragma unroll
		for (int j = 0; j < VEC; j++) {
			const float v = to_f32(in.v[j]);
			ss += v * v;
		}
	}
	ss = block_reduce<SumOp>(ss);
	if (threadIdx.x == 0) rstd[blockIdx.x] = rsqrtf(ss / (float)cols + eps);
}

#define RMS_RSTD(NAME, V)                                                                                 \
	extern "C" __global__ void NAME(float* rstd, const bf16* x, int xp, int cols, float eps) { \
		rms_rstd<V>(rstd, x, xp, cols, eps);                                                              \
	}
RMS_RSTD_INSTANCES(RMS_RSTD)

// rms_scale is the second half of RMSNorm, as HF writes it:
// out = w * bf16(x * rstd[r]), rounded to bf16.
// out, x bf16 [rows, cols] with pitches outp, xp (out may be x); rstd f32
// [rows]; w TW [cols]. Launch: 1-D grid-stride over rows*cols/VEC.
template <typename TW, int VEC>
__device__ void rms_scale(bf16* out, int outp, const bf16* x, int xp, const float* rstd, const TW* w, int rows,
                          int cols) {
	const int cv = cols / VEC;
	GRID_STRIDE(i, (long long)rows * cv) {
		const long long r = i / cv;
		const int c = (int)(i - r * cv) * VEC;
		const float s = rstd[r];
		const Vec<bf16, VEC> in = load<bf16, VEC>(x + r * xp + c);
		const Vec<TW, VEC> wv = load<TW, VEC>(w + c);
		Vec<bf16, VEC> y;
#pragma unroll
		for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(to_f32(wv.v[j]) * round_bf16(to_f32(in.v[j]) * s));
		store<bf16, VEC>(out + r * outp + c, y);
	}
}

#define RMS_SCALE(NAME, TW, V)                                                                        \
	extern "C" __global__ void NAME(bf16* out, int outp, const bf16* x, int xp,      \
	                                                 const float* rstd, const TW* w, int rows, int cols) { \
		rms_scale<TW, V>(out, outp, x, xp, rstd, w, rows, cols);                                      \
	}
RMS_SCALE_INSTANCES(RMS_SCALE)

// rope rotates, in place, dims [offset, offset+dim) of every head of every
// token. Head h of token t starts at x + t*pitch + h*hstride; x bf16. The
// angle of pair i (i < dim/2) at position pos[t] is (cos, sin)[pos[t]*cspitch + i],
// f32 tables [maxPos, cspitch]; pos i32 [T]. Pair i is the dims (i, i+dim/2)
// (rotate_half, Qwen2) or (2i, 2i+1) (INTERLEAVED, DeepSeek-V2):
//   x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin.
// Each is computed as HF's bf16 eager code does it: DeepSeek-V2's complex
// product in f32, rounded once; Qwen2's q*cos + rotate_half(q)*sin in bf16,
// with cos and sin cast to bf16 and each product and the sum rounded.
// A position outside [0, maxPos) traps. Launch: 1-D grid-stride over T*heads*dim/2.
template <bool INTERLEAVED>
__device__ void rope(bf16* x, int pitch, int T, int heads, int hstride, int offset, const int* pos,
                     const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) {
	const int half = dim / 2;
	const long long perToken = (long long)heads * half;
	GRID_STRIDE(i, (long long)T * perToken) {
		const long long t = i / perToken;
		const int rem = (int)(i - t * perToken);
		const int h = rem / half, j = rem - h * half;
		const int p = pos[t];
		if (p < 0 || p >= maxPos) __trap();
		const float c = cosT[(long long)p * cspitch + j], s = sinT[(long long)p * cspitch + j];
		bf16* head = x + t * pitch + (long long)h * hstride + offset;
		const int i1 = INTERLEAVED ? 2 * j : j, i2 = INTERLEAVED ? 2 * j + 1 : j + half;
		const float x1 = to_f32(head[i1]), x2 = to_f32(head[i2]);
		if (INTERLEAVED) {
			head[i1] = __float2bfloat16_rn(x1 * c - x2 * s);
			head[i2] = __float2bfloat16_rn(x2 * c + x1 * s);
		} else {
			const float cb = round_bf16(c), sb = round_bf16(s);
			head[i1] = __float2bfloat16_rn(round_bf16(x1 * cb) + round_bf16(-x2 * sb));
			head[i2] = __float2bfloat16_rn(round_bf16(x2 * cb) + round_bf16(x1 * sb));
		}
	}
}

#define ROPE(NAME, INTERLEAVED)                                                                               \
	extern "C" __global__ void NAME(bf16* x, int pitch, int T, int heads, int hstride, int offset, const int* pos, \
	                                const float* cosT, const float* sinT, int cspitch, int maxPos, int dim) {     \
		rope<INTERLEAVED>(x, pitch, T, heads, hstride, offset, pos, cosT, sinT, cspitch, maxPos, dim);             \
	}
ROPE_INSTANCES(ROPE)

// argmax is out[r·os] = the first index of the largest element of row r;
// NaN counts as the largest, as in torch.argmax. With os = 2,
// out[r·2 + 1] is that element's value as f32 bits. x T [rows, cols] with
// pitch xp; out i32 [rows, os]. Launch: grid.x = rows (one block per row),
// any multiple of 32 threads.
template <typename T> __device__ void argmax(int* out, int os, const T* x, int xp, int cols) {
	const T* row = x + (long long)blockIdx.x * xp;
	float bv;
	int bi;
	block_argmax_of(row, 0, cols, bv, bi);
	if (threadIdx.x == 0) put_choice(out, os, blockIdx.x, bv, bi);
}

#define ARGMAX(NAME, T)                                                                       \
	extern "C" __global__ void NAME(int* out, int os, const T* x, int xp, int cols) {        \
		argmax<T>(out, os, x, xp, cols);                                                      \
	}
ARGMAX_INSTANCES(ARGMAX)

// decode_advance makes a greedy decode step's next inputs from its argmax:
// ids[b] = choice[b·2] (the chosen token; choice[b·2 + 1], its logit's
// bits, is not read), past[b] += 1, pos[b] = the new past[b]. ids, pos,
// past i32 [B]; choice i32 [B, 2]; none overlapping. Launch: 1-D
// grid-stride over B, one thread a row.
extern "C" __global__ void decode_advance(int* ids, int* pos, int* past, const int* choice, int B) {
	GRID_STRIDE(b, B) {
		const int n = past[b] + 1;
		ids[b] = choice[2 * b];
		past[b] = n;
		pos[b] = n;
	}
}
