// Online softmax on tensor-core accumulator fragments, shared by the
// mma.sync kernels (attention.cu) and the wgmma one (hopper.cu): both hold
// scores as C fragments of 8 columns, float[4] per thread (rows g and g+8 of
// 16, g = lane/4; columns 2·(lane%4) and +1), the layout of an mma.sync
// m16n8 C and of each 8-column slice of a wgmma m64nN accumulator. Built on
// mma.cuh (smem_addr, pack2).

#pragma once
#include "mma.cuh"

// exp2_ftz is 2^x by the special-function unit, subnormal results flushed
// to zero (a p that small is 0 to every bf16 sum), as fast-math exp2f.
__device__ __forceinline__ float exp2_ftz(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

// row_max and row_sum combine a value over the 4 threads of a quad, which
// hold one row of an mma C fragment between them.
__device__ __forceinline__ float quad_max(float v) {
	v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
	return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
	v += __shfl_xor_sync(FULL_MASK, v, 1);
	return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// Softmax state of one query row held by a thread: the running max of its
// raw scores and its share of the running sum.
struct RowState {
	float m, l;
};

// softmax_tile folds one m-tile's scores s[NT][4] (C fragments: this
// thread's columns of rows g and g+8, masked ones -inf) into the rows'
// states: it leaves p = exp2(s·scale - m_new·scale) in s, one FFMA and one
// exp2 per score, and each row's factor for rescaling O in alpha.
template <int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], RowState (&st)[2], float scale, float (&alpha)[2]) {
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float mx = NEG_INF;
#pragma unroll
		for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
		mx = quad_max(mx);
		const float m_new = fmaxf(st[i].m, mx);
		const float base = m_new == NEG_INF ? 0.0f : m_new * scale; // a row that has seen no key yet
		alpha[i] = exp2_ftz(fmaf(st[i].m, scale, -base));
		float sum = 0.0f;
#pragma unroll
		for (int n = 0; n < NT; n++) {
			s[n][2 * i] = exp2_ftz(fmaf(s[n][2 * i], scale, -base));
			s[n][2 * i + 1] = exp2_ftz(fmaf(s[n][2 * i + 1], scale, -base));
			sum += s[n][2 * i] + s[n][2 * i + 1];
		}
		st[i].m = m_new;
		st[i].l = st[i].l * alpha[i] + sum;
	}
}

// rescale multiplies O's C fragments by their rows' factors (alpha[0] for
// row g, alpha[1] for row g+8), as softmax_tile leaves them.
template <int N> __device__ __forceinline__ void rescale(float (&o)[N][4], const float (&alpha)[2]) {
#pragma unroll
	for (int d = 0; d < N; d++) {
		o[d][0] *= alpha[0];
		o[d][1] *= alpha[0];
		o[d][2] *= alpha[1];
		o[d][3] *= alpha[1];
	}
}

// p_frag is the A fragment of P for keys [16kk, 16kk+16) of an m-tile whose
// p = exp2(...) sit in C fragments s: two n-tiles of C make one k-step of A,
// p rounded to T (bf16, or half_bits for flash_hopper's f16 instances).
template <int NT, typename T = bf16>
__device__ __forceinline__ void p_frag(unsigned (&a)[4], const float (&s)[NT][4], int kk) {
	a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
	a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
	a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
	a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
