// What the Hopper GEMMs share (sm_90a only): group_wgmma (group_wgmma.cu,
// the MoE's grouped GEMM), linear_wgmma (linear_wgmma.cu, prefill's dense
// linear) and linear_swap (linear_swap.cu, decode's, its B tile x's token
// rows). Each is a producer (a warpgroup, or linear_swap's warp) filling a
// ring of stages, each a 128-row tile of A and a BN-row tile of B of HG_BK
// k, 128-byte swizzled, and two consumer warpgroups of 64 rows each that
// multiply them by wgmma:
// HopRing is the ring's barriers and phases, hop_gemm_steps one tile's
// k-steps on a consumer.

#pragma once
#include "hopper.cuh"

#define HG_BK 64        // k of a stage: one 128-byte swizzle row of bf16
#define HG_ROW_BYTES 128 // bytes of a stage row
#define HG_CONSUMERS 2  // consumer warpgroups, 64 rows of a tile each
// Codes of status[0] when a wait of the ring timed out: the consumers'
// wait for a full stage, the producer's for an empty one.
#define HG_WAIT_FULL 1
#define HG_WAIT_EMPTY 2
// HG_REGS_FIT says whether setmaxnreg's producer and consumer registers
// stay within what a block of THREADS gets (hop_attention.cuh says why).
#define HG_REGS_FIT(PRODUCER, CONSUMER, THREADS) \
	((PRODUCER) * 128 + (CONSUMER) * 128 * HG_CONSUMERS <= 65536 / (THREADS) / 8 * 8 * (THREADS))

// HopRing is a ring of STAGES stages between one producer and the consumer
// warps. K-steps are counted over all of a block's tiles, on both sides
// alike: step it uses stage it % STAGES, in phase it / STAGES. full(s)
// completes when the stage's copies have landed (the copy engine's bytes,
// and any arrivals the producer adds), empty(s) when every consumer warp is
// done reading it. With CLUSTER > 1 the blocks of a cluster copy into each
// other's stages (multicast), so stage s is free only once the consumer
// warps of every block of the cluster are done with it: each warp arrives
// on empty(s) of every block, and each producer waits on its own.
template <int STAGES, int CLUSTER = 1> struct HopRing {
	unsigned long long* bars; // 2·STAGES mbarriers in shared memory

	__device__ unsigned full(int s) const { return smem_addr(&bars[s]); }
	__device__ unsigned empty(int s) const { return smem_addr(&bars[STAGES + s]); }
	__device__ static int stage(int it) { return it % STAGES; }
	__device__ static unsigned parity(int it) { return (it / STAGES) & 1; }

	// init, by one thread before a barrier of the block (of the cluster,
	// with CLUSTER > 1): full expecting fullArrivals arrivals a phase, empty
	// one from each of consumerWarps (those of the whole cluster).
	__device__ void init(unsigned fullArrivals, unsigned consumerWarps) const {
		for (int s = 0; s < STAGES; s++) {
			mbar_init(full(s), fullArrivals);
			mbar_init(empty(s), consumerWarps);
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}

	// acquire is the producer's wait for step it's stage to be free (the
	// first STAGES steps find it so); false when the wait gave up.
	__device__ bool acquire(int it, int* status, int code) const {
		return it < STAGES || mbar_wait(empty(stage(it)), parity(it) ^ 1, status, code, it);
	}

	// release is a consumer warp's arrival on stage s's empty barrier (of
	// each block of the cluster: lane r arrives on rank r's) once its wgmmas
	// no longer read it.
	__device__ void release(int s) const {
		__syncwarp();
		if constexpr (CLUSTER == 1) {
			if ((threadIdx.x & 31) == 0) mbar_arrive(empty(s));
		} else {
			const unsigned lane = threadIdx.x & 31;
			if (lane < CLUSTER) mbar_arrive_cluster(cluster_at(empty(s), lane));
		}
	}

	// release_for is release by one thread for warps consumer warps (of
	// each block of the cluster): where what frees the stage is known to
	// that thread alone, as the reads of its own tensor stores.
	__device__ void release_for(int s, unsigned warps) const {
		if constexpr (CLUSTER == 1) {
			mbar_arrive_n(empty(s), warps);
		} else {
#pragma unroll
			for (int r = 0; r < CLUSTER; r++) mbar_arrive_cluster_n(cluster_at(empty(s), r), warps);
		}
	}
};

// HG_BOX is the columns of an output box the consumers stage for a tensor
// store: 128 bytes of bf16, the swizzle's span.
#define HG_BOX 64

// hg_box writes output box c of a consumer warpgroup's tile (columns
// [col0 + c·HG_BOX, + HG_BOX) of its 64 rows) from acc into the box at
// shared address buf, in the layout of the store map's 128-byte swizzle:
// epi.frag(acc, j, row, col, lo, hi) gives output 8-column block j as this
// thread's bf16 pairs (columns col and col + 1 of rows row and row + 8);
// this thread's rows are frow and frow + 8, and it gives stmatrix the
// address of the box's row srow, 16-byte chunk pair schunk (lanes
// 8i..8i+7 give matrix i's rows: i odd the lower 8 of the warp's 16).
template <typename E, int NB>
__device__ __forceinline__ void hg_box(const E& epi, const float (&acc)[NB][4], int c, unsigned buf, int frow, int col0, int lane,
                                       int srow, int schunk) {
#pragma unroll
	for (int p = 0; p < HG_BOX / 16; p++) {
		const int j = c * (HG_BOX / 8) + 2 * p; // output blocks j and j + 1
		const int col = col0 + 8 * j + 2 * (lane & 3);
		unsigned r[4];
		epi.frag(acc, j, frow, col, r[0], r[1]);
		epi.frag(acc, j + 1, frow, col + 8, r[2], r[3]);
		stsm_x4(buf + srow * HG_ROW_BYTES + (((2 * p + schunk) ^ (srow & 7)) << 4), r);
	}
}

// HopNoStep is hop_gemm_steps' default per-step hook: nothing.
struct HopNoStep {
	__device__ __forceinline__ void operator()(int) const {}
};

// hop_gemm_steps is a consumer warpgroup's k-steps of one tile: ktiles
// steps from the block's step it (advanced past them), each HG_BK/16
// wgmma m64nBNk16 into acc of its 64 rows of A at a(s) and the BN rows of B
// at b(s) (shared addresses of stage s, both operands K-major, 128-byte
// swizzled). One step's wgmmas stay in flight while the next step's are
// issued; a stage is released once the wgmmas after it have been waited
// for, the last when all are done (unless keep_last: then the caller owns
// the last step's stage, free of wgmma reads, and releases it). FENCE
// orders operands the producer's threads copied (cp.async) before wgmma
// reads them. step(kt) runs after each step's wgmmas are issued (and the
// stage before it released), while they run. It returns false when a wait
// gave up (recorded in status with code).
template <int BN, int STAGES, bool FENCE, int CLUSTER, typename A, typename B, typename S = HopNoStep>
__device__ __forceinline__ bool hop_gemm_steps(float (&acc)[BN / 8][4], const HopRing<STAGES, CLUSTER>& ring, int& it, int ktiles,
                                               A a, B b, int* status, int code, bool keep_last = false, S step = S()) {
#pragma unroll
	for (int n = 0; n < BN / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
	for (int kt = 0; kt < ktiles; kt++, it++) {
		const int s = ring.stage(it);
		if (!mbar_test(ring.full(s), ring.parity(it))) {
			// The stage is late: drain the wgmmas in flight first, so that
			// the waiting (and its timeout's record) holds no accumulator
			// of a running wgmma (else ptxas serializes them all, C7511).
			wg_wait<0>();
			if (!mbar_wait(ring.full(s), ring.parity(it), status, code, it)) return false;
		}
		if (FENCE) fence_async_shared();
		__syncwarp();
		wg_fence();
#ifndef HG_NO_MMA
#pragma unroll
		for (int kk = 0; kk < HG_BK / 16; kk++)
			Wgmma<BN>::ss(acc, sw128_desc(a(s) + kk * 32, 16), sw128_desc(b(s) + kk * 32, 16), 1);
#endif // a diagnostic build (TestWgmmaProbe) leaves the products out
		wg_commit();
		if (kt > 0) {
			wg_wait<1>(); // the previous step's wgmmas are done
			ring.release(ring.stage(it - 1));
		}
		step(kt);
	}
	wg_wait<0>();
	keep(acc);
	if (ktiles > 0 && !keep_last) ring.release(ring.stage(it - 1));
	return true;
}
