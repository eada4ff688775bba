// What the two absorbed MLA decode kernels share, mla_decode (mla.cu) and
// mla_decode_keys (mla_keys.cu): P·C into a warp's o_lat dims, and a
// split's output.

#pragma once
#include "attention.cuh"

// mla_pc adds P·C of k-step kk (keys [16kk, 16kk+16) of the tile at kT,
// whose first R columns are C; pa P's A fragment) to this warp's o_lat dims
// (NO/2 groups of 16 from group dp0): mla_decode's and mla_decode_keys's.
template <int R, typename T, int NO>
__device__ __forceinline__ void mla_pc(float (&o)[NO][4], const unsigned (&pa)[4], unsigned kT, int kk, int dp0, int lane) {
	constexpr int DP = R / 16, DPW = NO / 2;
#pragma unroll
	for (int x = 0; x < DPW; x++) {
		const int dp = dp0 + x;
		if (dp >= DP) break;
		unsigned vb[4];
		ldsm_x4_t(vb, T::at(kT, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
		mma16816(o[2 * x], pa, vb[0], vb[1]);
		mma16816(o[2 * x + 1], pa, vb[2], vb[3]);
	}
}

// mla_split_out is the end of mla_decode and mla_decode_keys for one (row,
// head), bh, fragment row half i: this warp's o_lat dims (NO/2 groups of 16
// from group dp0) as o / l rounded to bf16 into olat when the split is the
// only one, else o unnormalised into part and (m, l), m the scaled max,
// into stats (written by warp 0's quad leaders).
template <int R, int NO>
__device__ __forceinline__ void mla_split_out(const float (&o)[NO][4], int i, float m, float l, long long bh,
                                              int splits, int split, int dp0, int warp, int lane, bf16* olat,
                                              float* part, float* stats) {
	constexpr int DP = R / 16, DPW = NO / 2;
	if (splits == 1) {
		const float inv = 1.0f / l;
		bf16* dst = olat + bh * R + 2 * (lane & 3);
#pragma unroll
		for (int x = 0; x < DPW; x++) {
			const int dp = dp0 + x;
			if (dp >= DP) break;
#pragma unroll
			for (int hh = 0; hh < 2; hh++)
				*reinterpret_cast<unsigned*>(dst + dp * 16 + hh * 8) =
				    pack2(o[2 * x + hh][2 * i] * inv, o[2 * x + hh][2 * i + 1] * inv);
		}
		return;
	}
	const long long at = bh * splits + split;
	if (warp == 0 && (lane & 3) == 0) {
		stats[at * 2] = m;
		stats[at * 2 + 1] = l;
	}
#pragma unroll
	for (int x = 0; x < DPW; x++) {
		const int dp = dp0 + x;
		if (dp >= DP) break;
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			float* dst = part + at * R + dp * 16 + hh * 8 + 2 * (lane & 3);
			dst[0] = o[2 * x + hh][2 * i];
			dst[1] = o[2 * x + hh][2 * i + 1];
		}
	}
}
