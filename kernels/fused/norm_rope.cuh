// RMSNorm, RoPE and MLA's norm and ropes as device functions: elementwise.cu
// launches each as a kernel of its own, and mla_flat.cu's mla_qlat_rope
// runs rms_norm_rope's blocks beside mla_qlat's in one grid. Pitches are in
// elements.

#pragma once
#include "common.cuh"
#include "rope.cuh"

// rms_norm is RMSNorm of each row, with the residual add before it when ADD:
//   ADD:  r = bf16(resid + x); resid = r; out = bf16(w · bf16(r · rstd))
//   else: r = x;                          out = bf16(w · bf16(r · rstd))
// with rstd = 1/sqrt(mean(r²) + eps) in f32 over the rounded r, as HF's
// decoder layer adds in bf16 and its RMSNorm normalises in f32. With ADD2
// (and ADD) the residual's addend is itself a sum, rounded first as add
// rounds it: x stands for bf16(x + y) above (add_add_rms_norm, the MoE's
// routed and shared outputs); the code of the other instances is that of
// a function without y.
// out, x, resid bf16 [rows, cols] with pitches op, xp, rp (out may be x when
// !ADD; out must not alias resid or x when ADD); y bf16 [rows, cols] with
// pitch yp when ADD2, else unread; w TW [cols].
// Launch: grid.x = rows (one block per row); a block of T threads holds the
// row in registers, NV accesses of VEC elements per thread, so the row is
// read once: T·NV·VEC >= cols.
// The device function normalises row r with the block's first T threads
// (T a multiple of 32; every thread of the block calls it, as it syncs): a
// kernel whose blocks are wider for other work (rms_norm_rope) sums a row
// as the T-thread rms_norm kernel does, its other warps adding zeros, so
// the two round alike.
template <bool ADD, typename TW, int VEC, int NV, bool ADD2 = false>
__device__ void rms_norm(bf16* out, int op, bf16* resid, int rp, const bf16* x, int xp, const TW* w, int cols,
                         float eps, long long r, int T, const bf16* y = nullptr, int yp = 0) {
	static_assert(ADD || !ADD2, "a second addend is summed into the residual");
	const bf16* xrow = x + r * xp;
	const bf16* yrow = ADD2 ? y + r * yp : nullptr;
	bf16* rrow = ADD ? resid + r * rp : nullptr;
	const bool mine = threadIdx.x < T;
	float v[NV][VEC];
	float ss = 0.0f;
#pragma unroll
	for (int i = 0; i < NV; i++) {
		const int c = (threadIdx.x + i * T) * VEC;
		if (mine && c < cols) {
			const Vec<bf16, VEC> a = load<bf16, VEC>(xrow + c);
			Vec<bf16, VEC> b, s;
			if (ADD2) b = load<bf16, VEC>(yrow + c);
			if (ADD) s = load<bf16, VEC>(rrow + c);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				float e = to_f32(a.v[j]);
				if (ADD2) e = round_bf16(e + to_f32(b.v[j]));
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

// rope rotates, in place, dims [offset, offset+dim) of every head of one
// token per block: head h of token t starts at x + t*pitch + h*hstride. The
// angle of pair i at position pos[t] is (cos, sin)[pos[t]*cspitch + i], f32
// tables [maxPos, cspitch]. Pairs are (i, i+dim/2) (rotate_half, Qwen2) or
// (2i, 2i+1) (INTERLEAVED, DeepSeek-V2): x1' = x1·cos − x2·sin,
// x2' = x2·cos + x1·sin, rounded as HF's bf16 code (naive's rope says how).
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
// The device function does piece (0 the kv row, 1 the q row) of token t
// with every thread of the block (it syncs), so that a kernel whose grid
// holds other blocks (mla_qlat_rope) calls it for some of them.
template <bool INTERLEAVED, typename TW, int VEC, int NV, int RVEC>
__device__ void rms_norm_rope(bf16* q, int qp, int heads, int hstride, int offset, bf16* kv, int kvp, const TW* w,
                              int rank, float eps, int normT, const int* pos, const float* cosT, const float* sinT,
                              int cspitch, int maxPos, int dim, long long t, int piece) {
	if (piece == 0) {
		rms_norm<false, TW, VEC, NV>(kv, kvp, nullptr, 0, kv, kvp, w, rank, eps, t, normT);
		rope<INTERLEAVED, RVEC>(kv, kvp, 1, rank + dim, rank, pos, cosT, sinT, cspitch, maxPos, dim, t);
	} else {
		rope<INTERLEAVED, RVEC>(q, qp, heads, hstride, offset, pos, cosT, sinT, cspitch, maxPos, dim, t);
	}
}
