// The rotary embedding's arithmetic on rotate_half pairs (Qwen2's layout),
// shared by rope (norm_rope.cuh) and by the kernels that rotate their
// operands as they load them (flash_decode_rope, attention.cu), so that
// both round every element alike.

#pragma once
#include "common.cuh"

// rope_half_pair rotates the pair (x1, x2), dims i and i+dim/2 of a head,
// by the angle whose cosine and sine are c and s: x1' = x1·c − x2·s,
// x2' = x2·c + x1·s, the angle and each product rounded to bf16 first, as
// HF's bf16 code rounds them (naive's rope says how).
__device__ __forceinline__ void rope_half_pair(float x1, float x2, float c, float s, bf16& y1, bf16& y2) {
	const float cb = round_bf16(c), sb = round_bf16(s);
	y1 = __float2bfloat16_rn(round_bf16(x1 * cb) + round_bf16(-x2 * sb));
	y2 = __float2bfloat16_rn(round_bf16(x2 * cb) + round_bf16(x1 * sb));
}

// bits16 is a chunk of 8 bf16 as the 16 bytes st_shared16 stores.
__device__ __forceinline__ uint4 bits16(const Vec<bf16, 8>& v) { return *reinterpret_cast<const uint4*>(v.v); }

// HalfRope rotates every dim of heads of D bf16 by rotate_half pairs at one
// token's angles, 16 bytes at a time: each 16-byte chunk of a rotated head
// is computed from the two unrotated chunks of its pairs, so that a thread
// rotates the chunk it stores without waiting for another's.
template <int D> struct HalfRope {
	static constexpr int HALF = D / 2;
	const float *cs, *sn; // the token's row of the cos and sin tables (f32, ≥ HALF each)

	// at is the angles of position pos[t] in the tables cosT, sinT [maxPos,
	// cspitch] f32, as rope reads them. A position outside [0, maxPos)
	// traps.
	__device__ static HalfRope at(const int* pos, long long t, const float* cosT, const float* sinT, int cspitch,
	                              int maxPos) {
		const int p = pos[t];
		if (p < 0 || p >= maxPos) __trap();
		return HalfRope{cosT + (long long)p * cspitch, sinT + (long long)p * cspitch};
	}

	// chunk is elements [8c, 8c+8) of head rotated, head the D unrotated
	// elements of one head (16-byte aligned).
	__device__ Vec<bf16, 8> chunk(const bf16* head, int c) const {
		static_assert(HALF % 8 == 0, "a chunk's pairs lie in one half");
		const bool hi = c * 8 >= HALF;
		const int i0 = hi ? c * 8 - HALF : c * 8;
		const Vec<bf16, 8> a = load<bf16, 8>(head + i0), b = load<bf16, 8>(head + HALF + i0);
		Vec<bf16, 8> y;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			bf16 y1, y2;
			rope_half_pair(to_f32(a.v[j]), to_f32(b.v[j]), cs[i0 + j], sn[i0 + j], y1, y2);
			y.v[j] = hi ? y2 : y1;
		}
		return y;
	}
};
