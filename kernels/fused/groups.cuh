// The groups of the grouped GEMMs (group_gemm in moe.cu, group_wgmma in
// group_wgmma.cu): group g's rows [first[g], first[g+1]) make
// ceil(rows / BM) m-tiles, numbered group after group, found on the device
// from the offsets alone (no host read, so a graph replays any routing).

#pragma once
#include "common.cuh"

// MAX_GROUPS is the most groups a grouped GEMM schedules.
#define MAX_GROUPS 256

// group_tile_starts writes start[g], group g's first m-tile, for g in
// [0, E], by a scan of the tile counts; the 32 threads of one warp call it
// (the caller synchronizes before reading start). Offsets that are not
// ascending within [0, M] trap.
template <int BM> __device__ void group_tile_starts(const int* first, int E, int M, int* start) {
	const int lane = threadIdx.x & 31;
	int run = 0;
	for (int g0 = 0; g0 < E; g0 += 32) {
		const int gg = g0 + lane;
		int n = 0;
		if (gg < E) {
			const int a = first[gg], b = first[gg + 1];
			if (a < 0 || b < a || b > M) __trap();
			n = (b - a + BM - 1) / BM;
		}
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int v = __shfl_up_sync(FULL_MASK, n, o);
			if (lane >= o) n += v;
		}
		if (gg < E) start[gg + 1] = run + n;
		run += __shfl_sync(FULL_MASK, n, 31);
	}
	if (lane == 0) start[0] = 0;
}

// group_of_tile is the group of m-tile mt < start[E]: the last group whose
// first m-tile is at or before mt (empty groups before it skipped).
__device__ __forceinline__ int group_of_tile(const int* start, int E, int mt) {
	int lo = 0, hi = E - 1;
	while (lo < hi) {
		const int mid = (lo + hi + 1) >> 1;
		if (start[mid] <= mt) lo = mid;
		else hi = mid - 1;
	}
	return lo;
}
