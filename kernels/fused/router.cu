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
// E ≤ 2·RT_LANES experts, H a multiple of 8 and at most RT_XV·RT_THREADS·8.
//
// Work: a cluster of two blocks a token (the grid's cluster c is token c).
// Block rank r owns the experts [r·half, r·half + ne), half = ⌈E/2⌉: their
// rows of w, one contiguous run, are requested into its shared memory by
// bulk copies before grid_wait (w is no kernel's output, so they stream
// under the kernel before), which a whole router would not fit. After the
// wait each thread loads its 8-element chunks of the token's x (chunk t,
// t + RT_THREADS, ...), and when the weights have landed multiplies them
// by its chunks of every owned expert's row, in f32. A warp's 32 partial
// sums (one an expert) are summed across its lanes by halving exchanges,
// after which lane l holds expert l's warp sum; the warps' sums are then
// added in warp order by thread e (deterministic: launch to launch the
// same logits). Each block writes its logits to global memory and into
// rank 0's shared memory; after the cluster's barrier rank 0's first warp
// routes the token as moe_route does (route_token over the logits in
// shared memory), so that given these logits the routes are moe_route's
// bit for bit.
//
// Rounding: the logits are f32 sums of exact bf16 products, in an order of
// their own (not linear_stream's): they differ from the router's
// linear_stream in the last bits, and a near-tie may route differently.
//
// Shared memory (dynamic; the host's routerShared): RT_HEAD bytes of the
// mbarrier, the warps' sums [RT_WARPS][32], the exchanged logits
// [2·RT_LANES] and route_token's scratch, then the block's weight rows.

#include "hopper.cuh"
#include "route.cuh"

#define RT_WARPS 8
#define RT_THREADS (RT_WARPS * 32)
#define RT_LANES 32                          // experts a block at most: one a lane
#define RT_XV 2                              // 8-element chunks of x a thread at most
#define RT_RED 128                           // the warps' sums, after the mbarrier
#define RT_LG (RT_RED + RT_WARPS * RT_LANES * 4) // the cluster's logits (rank 0's)
#define RT_SC (RT_LG + 2 * RT_LANES * 4)         // route_token's scratch
#define RT_HEAD (RT_SC + 32 * ROUTE_PER_LANE * 4) // where the weight rows start
#define RT_CHUNK 16384                       // bytes of one bulk copy of the weights

__device__ __forceinline__ void st_cluster_f32(unsigned addr, float v) {
	asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// The cluster's barrier in two halves: a block may write another's shared
// memory only once that block has started, which the wait after every
// block's arrival says.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// rt_halve is one halving exchange of width S over a warp's sums v (see
// linear_route).
template <int S>
__device__ __forceinline__ void rt_halve(float (&v)[RT_LANES], int lane) {
	const bool up = lane & S;
#pragma unroll
	for (int i = 0; i < S; i++) {
		const float send = up ? v[i] : v[i + S];
		const float keep = up ? v[i + S] : v[i];
		v[i] = keep + __shfl_xor_sync(FULL_MASK, send, S);
	}
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(RT_THREADS, 1)
    linear_route(int* idx, int ip, float* weight, int wp, float* logits, int lp, const bf16* x, int xp, const bf16* w, int E, int H,
                 int K, int groupLimited, int groups, int topkGroups, int norm, float scale) {
	extern __shared__ __align__(128) unsigned char sm[];
	const unsigned base = smem_addr(sm), bar = base;
	float* red = reinterpret_cast<float*>(sm + RT_RED);
	float* lg = reinterpret_cast<float*>(sm + RT_LG);
	float* sc = reinterpret_cast<float*>(sm + RT_SC);
	const bf16* ws = reinterpret_cast<const bf16*>(sm + RT_HEAD);
	const unsigned rank = cluster_rank();
	const int t = cluster_id(), half = (E + 1) / 2, e0 = rank * half, ne = min(half, E - e0);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = H / 8;
	const unsigned bytes = (unsigned)ne * H * 2;

	if (threadIdx.x == 0) {
		mbar_init(bar, 1);
		mbar_init_fence();
		mbar_expect_tx(bar, bytes);
		const char* src = reinterpret_cast<const char*>(w + (long long)e0 * H);
		for (unsigned off = 0; off < bytes; off += RT_CHUNK)
			bulk_load(base + RT_HEAD + off, src + off, min((unsigned)RT_CHUNK, bytes - off), bar);
	}
	cluster_arrive_relaxed();
	grid_wait();
	grid_release();

	uint4 xv[RT_XV];
#pragma unroll
	for (int i = 0; i < RT_XV; i++) {
		const int c = threadIdx.x + i * RT_THREADS;
		if (c < chunks) xv[i] = *reinterpret_cast<const uint4*>(x + (long long)t * xp + c * 8);
	}
	__syncthreads(); // the mbarrier's init is seen before anyone waits on it
	mbar_wait_trap(bar, 0);

	float v[RT_LANES];
#pragma unroll
	for (int j = 0; j < RT_LANES; j++) {
		float s = 0.0f;
		if (j < ne) {
#pragma unroll
			for (int i = 0; i < RT_XV; i++) {
				const int c = threadIdx.x + i * RT_THREADS;
				if (c < chunks) {
					const uint4 wv = *reinterpret_cast<const uint4*>(ws + (long long)j * H + c * 8);
					const bf16* a = reinterpret_cast<const bf16*>(&xv[i]);
					const bf16* b = reinterpret_cast<const bf16*>(&wv);
#pragma unroll
					for (int k = 0; k < 8; k++) s = fmaf(to_f32(a[k]), to_f32(b[k]), s);
				}
			}
		}
		v[j] = s;
	}
	// Halving exchanges: at width s, a lane keeps the half of its s·2 sums
	// its bit s selects and adds its partner's of the same half; after the
	// last, lane l's v[0] is expert l's sum over the warp.
	rt_halve<16>(v, lane);
	rt_halve<8>(v, lane);
	rt_halve<4>(v, lane);
	rt_halve<2>(v, lane);
	rt_halve<1>(v, lane);
	red[warp * RT_LANES + lane] = v[0];
	cluster_wait(); // both blocks have started: rank 0's lg may be written
	__syncthreads();
	if (threadIdx.x < ne) {
		float s = 0.0f;
#pragma unroll
		for (int q = 0; q < RT_WARPS; q++) s += red[q * RT_LANES + threadIdx.x];
		const int e = e0 + threadIdx.x;
		logits[(long long)t * lp + e] = s;
		st_cluster_f32(cluster_at(smem_addr(lg + e), 0), s);
	}
	cluster_sync(); // every logit is in rank 0's lg; no block leaves while rank 0 may still be written
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
