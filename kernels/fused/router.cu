// linear_route (sm_90a): linear_route's op for a decode step's few tokens,
// a MoE router's f32 logits = x·wᵀ and the routes chosen from them
// (route_token, moe_route's code) in one launch, where the router's
// linear_stream and moe_route were two launches on the decode chain.
//
// Operands (pitches in elements):
//   idx    i32 [N, K], pitch ip; weight f32 [N, K], pitch wp: the routes
//   logits f32 [N, E], pitch lp: the logits, written too
//   x      bf16 [N, H], pitch xp; rows on 16-byte boundaries
//   w      bf16 [E, H], packed, 16-byte aligned
// E ≤ RT_CL·RT_Q = 64 experts, H a multiple of 8 and at most RT_THREADS·8 = 2,048.
//
// Work: a cluster of RT_CL blocks a token (the grid's cluster c is token
// c). Block rank r owns the experts [r·q, r·q + ne), q = ⌈E/RT_CL⌉: each
// thread loads its 8-element chunk (chunk t of the row) of every owned
// expert's row into registers before grid_wait (w is no kernel's output,
// so the loads run under the kernel before; a block's share is H·q·2
// bytes, 64 KB at DeepSeek-V2-Lite's router, which one SM streams in
// about the time of the norm before it). After the wait it loads its chunk
// of the token's x and multiplies, in f32. A warp's q partial sums are
// summed across its lanes by halving exchanges, after which lane l holds
// expert l mod q's warp sum; the warps' sums are then added in warp order
// by thread e (deterministic: launch to launch the same logits). Each block
// writes its logits to global memory and into rank 0's shared memory;
// after the cluster's barrier rank 0's first warp routes the token as
// moe_route does (route_token over the logits in shared memory), so that
// given these logits the routes are moe_route's bit for bit.
//
// Rounding: the logits are f32 sums of exact bf16 products, in an order of
// their own (not linear_stream's): they differ from the router's
// linear_stream in the last bits, and a near-tie may route differently.

#include "hopper.cuh"
#include "route.cuh"

#define RT_WARPS 8
#define RT_THREADS (RT_WARPS * 32)
#define RT_CL 4 // blocks of a token's cluster
#define RT_Q 16 // experts a block at most: E ≤ RT_CL·RT_Q; H ≤ RT_THREADS·8

__device__ __forceinline__ void st_cluster_f32(unsigned addr, float v) {
	asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// The cluster's barrier in two halves: a block may write another's shared
// memory only once that block has started, which the wait after every
// block's arrival says.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// rt_halve is one halving exchange of width S over a warp's sums v: a lane
// keeps the half of its 2·S sums its bit S selects and adds its partner's
// of the same half.
template <int S>
__device__ __forceinline__ void rt_halve(float (&v)[RT_Q], int lane) {
	const bool up = lane & S;
#pragma unroll
	for (int i = 0; i < S; i++) {
		const float send = up ? v[i] : v[i + S];
		const float keep = up ? v[i + S] : v[i];
		v[i] = keep + __shfl_xor_sync(FULL_MASK, send, S);
	}
}

extern "C" __global__ void __cluster_dims__(RT_CL, 1, 1) __launch_bounds__(RT_THREADS)
    linear_route(int* idx, int ip, float* weight, int wp, float* logits, int lp, const bf16* x, int xp, const bf16* w, int E, int H,
                 int K, int groupLimited, int groups, int topkGroups, int norm, float scale) {
	__shared__ float red[RT_WARPS][RT_Q];
	__shared__ float lg[RT_CL * RT_Q];
	__shared__ float sc[32 * ROUTE_PER_LANE];
	const unsigned rank = cluster_rank();
	const int t = cluster_id(), q = (E + RT_CL - 1) / RT_CL, e0 = rank * q, ne = max(0, min(q, E - e0));
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = threadIdx.x;
	const bool mine = c < H / 8;

	uint4 wv[RT_Q];
#pragma unroll
	for (int j = 0; j < RT_Q; j++)
		if (j < ne && mine) wv[j] = __ldg(reinterpret_cast<const uint4*>(w + (long long)(e0 + j) * H + c * 8));
	cluster_arrive_relaxed();
	grid_wait();
	grid_release();

	uint4 xv = make_uint4(0, 0, 0, 0);
	if (mine) xv = *reinterpret_cast<const uint4*>(x + (long long)t * xp + c * 8);
	float v[RT_Q];
	const bf16* a = reinterpret_cast<const bf16*>(&xv);
#pragma unroll
	for (int j = 0; j < RT_Q; j++) {
		float s = 0.0f;
		if (j < ne && mine) {
			const bf16* b = reinterpret_cast<const bf16*>(&wv[j]);
#pragma unroll
			for (int k = 0; k < 8; k++) s = fmaf(to_f32(a[k]), to_f32(b[k]), s);
		}
		v[j] = s;
	}
	// After the four halvings lane l's v[0] is expert l mod 16's sum over
	// its half-warp; the last exchange adds the other half's.
	rt_halve<8>(v, lane);
	rt_halve<4>(v, lane);
	rt_halve<2>(v, lane);
	rt_halve<1>(v, lane);
	v[0] += __shfl_xor_sync(FULL_MASK, v[0], 16);
	if (lane < RT_Q) red[warp][lane] = v[0];
	cluster_wait(); // every block of the cluster has started: rank 0's lg may be written
	__syncthreads();
	if (threadIdx.x < ne) {
		float s = 0.0f;
#pragma unroll
		for (int p = 0; p < RT_WARPS; p++) s += red[p][threadIdx.x];
		const int e = e0 + threadIdx.x;
		logits[(long long)t * lp + e] = s;
		st_cluster_f32(cluster_at(smem_addr(lg + e), 0), s);
	}
	cluster_sync(); // every logit is in rank 0's lg
	if (rank != 0 || warp != 0) return;
	const Route r{E, K, groupLimited, groups, topkGroups, norm, scale};
	int e;
	float wt;
	route_token(lg, r, sc, e, wt);
	if (lane < K) {
		idx[(long long)t * ip + lane] = e;
		weight[(long long)t * wp + lane] = wt;
	}
}
