// The router of DeepSeek-V2's MoE on one warp (route_token), shared by every
// kernel that routes tokens: moe_route and moe_gate_up_route (moe.cu) and
// moe_routed_split (moe_split.cu), so that their routes agree bit for bit.

#pragma once
#include "common.cuh"

// ROUTE_PER_LANE is the experts' scores every lane holds: a router has at
// most 32·ROUTE_PER_LANE experts.
#define ROUTE_PER_LANE 8

// warp_max and warp_sum combine v over a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }

// Route is a router's configuration (kernels.Routing) over E experts: the
// top K, group-limited or greedy, normalised or not, times scale.
struct Route {
	int E, K, groupLimited, groups, topkGroups, norm;
	float scale;
};

// route_token chooses one token's experts as DeepSeek-V2's MoEGate and the
// cpu set do, by the 32 lanes of one warp: scores = softmax(logits) in f32;
// with groupLimited, only the experts of the topkGroups groups (E/groups
// consecutive experts each) whose best score is highest compete and the
// others score 0; the K best scores win, in descending order. Every choice
// breaks ties to the lower index (groups and experts alike), as the cpu
// set's argmax. weight = score / (Σ chosen, summed in choice order,
// + 1e-20) when norm (and K > 1), times scale. Lane k < K gets choice k,
// its expert and its weight. Every kernel that routes calls it
// (moe_route, moe_gate_up_route, moe_routed_split), so that their routes agree bit for bit.
//   row f32 [E] the token's logits; sc f32 [32·ROUTE_PER_LANE], the warp's
//   shared scratch (group-limited only). E ≤ 32·ROUTE_PER_LANE, K ≤ 32,
//   groups ≤ 32 (checked by the host).
// Expert e sits in lane e % 32, slot e / 32, so a lane's slots ascend in
// expert index and a lane's own argmax keeps the lowest of equal scores.
__device__ __forceinline__ void route_token(const float* row, const Route r, float* sc, int& expert, float& weight) {
	const int lane = threadIdx.x & 31, E = r.E, K = r.K;
	float s[ROUTE_PER_LANE];
	float mx = NEG_INF;
#pragma unroll
	for (int j = 0; j < ROUTE_PER_LANE; j++) {
		const int e = lane + 32 * j;
		s[j] = e < E ? row[e] : NEG_INF;
		mx = fmaxf(mx, s[j]);
	}
	mx = warp_max(mx);
	float sum = 0.0f;
#pragma unroll
	for (int j = 0; j < ROUTE_PER_LANE; j++) {
		s[j] = lane + 32 * j < E ? expf(s[j] - mx) : 0.0f;
		sum += s[j];
	}
	sum = warp_sum(sum);
#pragma unroll
	for (int j = 0; j < ROUTE_PER_LANE; j++) s[j] = lane + 32 * j < E ? s[j] / sum : NEG_INF;

	if (r.groupLimited) {
		// Lane g finds group g's best score from the warp's scores in shared
		// memory; topkGroups rounds of a warp argmax keep the best groups.
		const int groups = r.groups;
#pragma unroll
		for (int j = 0; j < ROUTE_PER_LANE; j++)
			if (lane + 32 * j < E) sc[lane + 32 * j] = s[j];
		__syncwarp();
		const int gsize = E / groups;
		float best = NEG_INF;
		if (lane < groups)
			for (int i = 0; i < gsize; i++) best = fmaxf(best, sc[lane * gsize + i]);
		bool kept = false;
		for (int k = 0; k < r.topkGroups; k++) {
			float bv = lane < groups ? best : NEG_INF;
			int bi = lane < groups ? lane : NO_INDEX;
			warp_argmax(bv, bi);
			if (lane == bi) {
				kept = true;
				best = NEG_INF;
			}
		}
		const unsigned keep = __ballot_sync(FULL_MASK, kept);
#pragma unroll
		for (int j = 0; j < ROUTE_PER_LANE; j++) {
			const int e = lane + 32 * j;
			if (e < E && !(keep >> (e / gsize) & 1)) s[j] = 0.0f;
		}
	}

	// K rounds of a warp argmax; lane k keeps round k's winner.
	float myW = 0.0f, total = 0.0f;
	int myI = 0;
	for (int k = 0; k < K; k++) {
		float bv = NEG_INF;
		int bi = NO_INDEX;
#pragma unroll
		for (int j = 0; j < ROUTE_PER_LANE; j++)
			if (s[j] > bv) {
				bv = s[j];
				bi = lane + 32 * j;
			}
		warp_argmax(bv, bi);
		// The winner's lane takes it out of the running, by selects (a
		// store at a computed slot would put s in local memory).
		const int won = (bi & 31) == lane ? bi >> 5 : -1;
#pragma unroll
		for (int j = 0; j < ROUTE_PER_LANE; j++) s[j] = j == won ? NEG_INF : s[j];
		if (lane == k) {
			myW = bv;
			myI = bi;
		}
		total += bv;
	}
	if (lane < K) {
		const float denom = r.norm && K > 1 ? total + 1e-20f : 1.0f;
		expert = myI;
		weight = myW / denom * r.scale;
	}
}
