// The Hopper building blocks (sm_90a only) of the fused set's warp-
// specialized kernels, flash_hopper (hopper.cu), mla_hopper (mla_hopper.cu),
// group_wgmma (group_wgmma.cu), linear_wgmma (linear_wgmma.cu), linear_swap
// (linear_swap.cu) and mla_flat (mla_flat.cu): tensor maps and the copy engine's tensor copies (multicast
// to a cluster too), mbarriers with a wait that gives up instead of hanging,
// clusters, named barriers, stmatrix, and wgmma with its shared-memory
// descriptors. Built on mma.cuh (smem_addr). mla.cuh includes it too, for
// MlaKeyTiles' bulk copies (mla_flat's only): a function here is emitted
// only where a kernel calls it, so mla.cu and mla_keys.cu still build for
// targets below sm_90.

#pragma once
#include "mma.cuh"

#define HOP_WAIT_CYCLES (1ll << 31) // about a second: a wait this long is a bug

// TmaMap is a CUtensorMap: 128 opaque bytes made by cuTensorMapEncodeTiled.
struct __align__(64) TmaMap {
	unsigned long long v[16];
};

// --- mbarriers and tensor copies -------------------------------------------

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// mbar_expect_tx arrives on bar and adds bytes to the transaction count the
// copies completing on it must bring.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// mbar_arrive_n is count arrivals on bar at once (one thread arriving for
// count warps).
__device__ __forceinline__ void mbar_arrive_n(unsigned bar, unsigned count) {
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ bool mbar_test(unsigned bar, unsigned parity) {
	unsigned ok;
	asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
	             : "=r"(ok)
	             : "r"(bar), "r"(parity)
	             : "memory");
	return ok != 0;
}

// mbar_wait waits for the phase of bar with the given parity to complete.
// It returns false, having recorded why in status unless some wait already
// had, when it waited HOP_WAIT_CYCLES or another wait had timed out.
__device__ __forceinline__ bool mbar_wait(unsigned bar, unsigned parity, int* status, int code, int tile) {
	if (mbar_test(bar, parity)) return true;
	const long long t0 = clock64();
	volatile int* vs = status;
	while (!mbar_test(bar, parity)) {
		if (vs[0] != 0) return false;
		if (clock64() - t0 > HOP_WAIT_CYCLES) {
			if (atomicCAS(status, 0, code) == 0) {
				status[1] = blockIdx.x;
				status[2] = blockIdx.y;
				status[3] = blockIdx.z;
				status[4] = threadIdx.x;
				status[5] = tile;
				status[6] = parity;
				__threadfence();
			}
			return false;
		}
	}
	return true;
}

// mbar_wait_trap waits for the phase of bar with the given parity to
// complete, and traps (failing the launch) when it waited HOP_WAIT_CYCLES:
// mbar_wait for kernels without a status record.
__device__ __forceinline__ void mbar_wait_trap(unsigned bar, unsigned parity) {
	if (mbar_test(bar, parity)) return;
	const long long t0 = clock64();
	while (!mbar_test(bar, parity))
		if (clock64() - t0 > HOP_WAIT_CYCLES) __trap();
}

// mbar_init_fence makes this thread's mbar_init of the barriers before it
// visible to the other threads of the cluster and to the copy engine; a
// barrier of the threads that use them follows.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// cp_async_arrive makes bar's pending arrival of this thread complete
// when all of its earlier cp.async copies have landed (noinc: the arrival
// is one of those bar was initialized to expect).
__device__ __forceinline__ void cp_async_arrive(unsigned bar) {
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// fence_async_shared orders this thread's view of shared memory (stores,
// or cp.async copies it saw complete through an mbarrier) before its later
// operations of the async proxy: wgmma's operand reads, tensor copies.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// tma_load_2d/3d copy the box at coordinates (c0, c1[, c2]) of map into
// shared memory at dst; the copy completes on bar with its bytes.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1) {
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
	             "l"(map), "r"(c0), "r"(c1), "r"(bar)
	             : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2) {
	asm volatile(
	    "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
	    "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
	    : "memory");
}

// l2_evict_first is an L2 cache policy for data read once (a weight
// stream): its lines go first when L2 needs room, so that what is read
// again (activations, split-K partials) stays.
__device__ __forceinline__ unsigned long long l2_evict_first() {
	unsigned long long p;
	asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
	return p;
}

// tma_load_2d_hint and tma_load_3d_hint are tma_load_2d and tma_load_3d
// under L2 cache policy (l2_evict_first).
__device__ __forceinline__ void tma_load_2d_hint(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1,
                                                 unsigned long long policy) {
	asm volatile(
	    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
	    "l"(map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
	    : "memory");
}
__device__ __forceinline__ void tma_load_3d_hint(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2,
                                                 unsigned long long policy) {
	asm volatile(
	    "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], "
	    "%6;\n" ::"r"(dst),
	    "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
	    : "memory");
}

// bulk_load copies bytes (a multiple of 16, both addresses 16-byte
// aligned) of contiguous global memory at src into shared memory at dst by
// the copy engine, no tensor map needed; the copy completes on bar.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
	             "r"(bytes), "r"(bar)
	             : "memory");
}

// tma_store_2d copies the box at src in shared memory (written with the
// map's swizzle, and made visible to the copy engine by fence_async_shared
// and a barrier) to coordinates (c0, c1) of map; elements past the map's
// bounds are not written. The copy joins this thread's open bulk group,
// which tma_store_commit closes.
__device__ __forceinline__ void tma_store_2d(const TmaMap* map, unsigned src, int c0, int c1) {
	asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map), "r"(c0), "r"(c1),
	             "r"(src)
	             : "memory");
}

// tma_store_commit closes this thread's bulk group of tensor stores.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// tma_store_wait waits until this thread's committed tensor stores have
// read their shared memory (their writes to global memory complete by the
// kernel's end).
__device__ __forceinline__ void tma_store_wait() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// --- clusters -----------------------------------------------------------------

// cluster_rank is this block's rank in its cluster; cluster_id and
// cluster_count are its cluster's index along x in the grid and the
// clusters along x (the grids here are one-dimensional).
__device__ __forceinline__ unsigned cluster_rank() {
	unsigned r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
	return r;
}
__device__ __forceinline__ int cluster_id() {
	int r;
	asm("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
	return r;
}
__device__ __forceinline__ int cluster_count() {
	int r;
	asm("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
	return r;
}
// cluster_sync is a barrier of every thread of the cluster's blocks that
// has not exited, each warp converged: what each wrote to shared memory
// before it, the others read after it.
__device__ __forceinline__ void cluster_sync() {
	asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// cluster_at is the address of a shared address of this block in the
// shared memory of the cluster's block rank.
__device__ __forceinline__ unsigned cluster_at(unsigned addr, unsigned rank) {
	unsigned r;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
	return r;
}

// ld_cluster_f32 loads the f32 at addr, an address cluster_at made (of
// this block or another of the cluster).
__device__ __forceinline__ float ld_cluster_f32(unsigned addr) {
	float v;
	asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
	return v;
}

// mbar_arrive_cluster arrives on the mbarrier at addr, an address
// cluster_at made (of this block or another of the cluster). Its ordering
// is mbar_arrive's (release at the block's scope): enough where the
// arrival says that this thread's reads of shared memory are done, as a
// consumer's after wgmma.wait_group; .release.cluster would put a fence of
// the whole GPU (MEMBAR.ALL.GPU) before every arrival.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned addr) {
	asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}

// mbar_arrive_cluster_n is count arrivals at once on the mbarrier at addr
// (mbar_arrive_cluster's).
__device__ __forceinline__ void mbar_arrive_cluster_n(unsigned addr, unsigned count) {
	asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}

// tma_load_2d_multicast is tma_load_2d into the shared memory of every
// block of the cluster in mask (bit r: rank r): the box lands at dst's
// offset in each, and completes with its bytes on the barrier at bar's
// offset in each.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1,
                                                      unsigned short mask) {
	asm volatile(
	    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], "
	    "%5;\n" ::"r"(dst),
	    "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
	    : "memory");
}

// --- named barriers and stmatrix ---------------------------------------------

// bar_sync waits at named barrier id for threads threads (a multiple of 32,
// whole warps); 0 is __syncthreads'.
__device__ __forceinline__ void bar_sync(int id, int threads) {
	asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar_all is bar_sync that also reports whether ok held on every thread
// that arrived: a decision the threads of a barrier then take together.
__device__ __forceinline__ bool bar_all(int id, int threads, bool ok) {
	unsigned all;
	asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
	             : "=r"(all)
	             : "r"((unsigned)ok), "r"(id), "r"(threads)
	             : "memory");
	return all != 0;
}

// stsm_x4 stores four 8×8 matrices of 16-bit elements to shared memory, each
// in the mma C-fragment layout (thread t holds row t/4, elements 2(t%4) and
// 2(t%4)+1, in r[i] for matrix i); lane l gives the address of row l%8 of
// matrix l/8, 16 bytes.
__device__ __forceinline__ void stsm_x4(unsigned addr, const unsigned (&r)[4]) {
	asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
	             "r"(r[2]), "r"(r[3])
	             : "memory");
}

// --- wgmma -----------------------------------------------------------------

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// keep pins registers an asynchronous wgmma reads or writes to this point
// of the program, so that the compiler neither reads them early nor reuses
// them before the wgmma.wait_group that precedes it.
template <int N> __device__ __forceinline__ void keep(float (&r)[N][4]) {
#pragma unroll
	for (int i = 0; i < N; i++)
		asm volatile("" : "+f"(r[i][0]), "+f"(r[i][1]), "+f"(r[i][2]), "+f"(r[i][3])::"memory");
}
template <int N> __device__ __forceinline__ void keep(unsigned (&r)[N][4]) {
#pragma unroll
	for (int i = 0; i < N; i++)
		asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
}

// sw128_desc is the wgmma descriptor of a 128-byte-swizzled operand at
// shared address addr: 8-row groups 1024 bytes apart (the stride byte
// offset) and, for an N-major operand wider than 64 columns, lbo bytes
// between its 64-column boxes (the leading byte offset; K-major operands
// ignore it).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo) {
	return (unsigned long long)((addr & 0x3FFFF) >> 4) | (unsigned long long)((lbo >> 4) & 0x3FFF) << 16 |
	       (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}

#define HOP_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define HOP_ACC8(d) HOP_ACC4(d, 0), HOP_ACC4(d, 1)
#define HOP_ACC16(d) HOP_ACC8(d), HOP_ACC4(d, 2), HOP_ACC4(d, 3)
#define HOP_ACC32(d)                                                                                         \
	HOP_ACC4(d, 0), HOP_ACC4(d, 1), HOP_ACC4(d, 2), HOP_ACC4(d, 3), HOP_ACC4(d, 4), HOP_ACC4(d, 5), HOP_ACC4(d, 6), \
	    HOP_ACC4(d, 7)
#define HOP_ACC64(d)                                                                                          \
	HOP_ACC32(d), HOP_ACC4(d, 8), HOP_ACC4(d, 9), HOP_ACC4(d, 10), HOP_ACC4(d, 11), HOP_ACC4(d, 12), HOP_ACC4(d, 13), \
	    HOP_ACC4(d, 14), HOP_ACC4(d, 15)
#define HOP_ACC32_AT(d, o)                                                                                      \
	HOP_ACC4(d, o + 0), HOP_ACC4(d, o + 1), HOP_ACC4(d, o + 2), HOP_ACC4(d, o + 3), HOP_ACC4(d, o + 4), HOP_ACC4(d, o + 5), \
	    HOP_ACC4(d, o + 6), HOP_ACC4(d, o + 7)
#define HOP_ACC64_AT(d, o) HOP_ACC32_AT(d, o), HOP_ACC32_AT(d, o + 8)
#define HOP_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define HOP_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define HOP_REGS32                                                                                                  \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
	"%24, %25, %26, %27, %28, %29, %30, %31}"
#define HOP_REGS64                                                                                                  \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
	"%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
	"%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define HOP_REGS128 \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
	"%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
	"%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
	"%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
	"%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
	"%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, " \
	"%120, %121, %122, %123, %124, %125, %126, %127}"

// Wgmma<N, T> issues one wgmma m64nNk16 (T in: bf16, or half_bits for
// f16; f32 accumulators d[N/8][4], the mma C-fragment order per 8
// columns): ss with A and B from shared memory, both K-major; rs with A
// from registers (an mma A fragment per warp, two T a register) and B
// N-major. scale_d 0 overwrites d, 1 accumulates. HOP_WGMMA defines N =
// 64 and 128 for one input type, PTX its name in the instruction.
template <int N, typename T = bf16> struct Wgmma;
#define HOP_WGMMA(T, PTX)                                                                                             \
	template <> struct Wgmma<128, T> {                                                                                   \
		__device__ static void ss(float (&d)[16][4], unsigned long long a, unsigned long long b, int scale_d) {        \
			asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                  \
			             "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " HOP_REGS64                       \
			             ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                              \
			             : HOP_ACC64(d)                                                                                 \
			             : "l"(a), "l"(b), "r"(scale_d));                                                               \
		}                                                                                                            \
		__device__ static void rs(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b) {                 \
			asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                  \
			             "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " HOP_REGS64                       \
			             ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                \
			             : HOP_ACC64(d)                                                                                 \
			             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                 \
		}                                                                                                            \
	};                                                                                                               \
	template <> struct Wgmma<64, T> {                                                                                    \
		__device__ static void ss(float (&d)[8][4], unsigned long long a, unsigned long long b, int scale_d) {         \
			asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                  \
			             "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " HOP_REGS32                        \
			             ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                                              \
			             : HOP_ACC32(d)                                                                                 \
			             : "l"(a), "l"(b), "r"(scale_d));                                                               \
		}                                                                                                            \
		__device__ static void rs(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b) {                  \
			asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                  \
			             "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " HOP_REGS32                        \
			             ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                \
			             : HOP_ACC32(d)                                                                                 \
			             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                 \
		}                                                                                                            \
	};
HOP_WGMMA(bf16, "bf16")
HOP_WGMMA(half_bits, "f16")
// N = 16 and 32, linear_swap's (its N is decode's token rows), are bf16
// and ss only.
template <> struct Wgmma<16, bf16> {
	__device__ static void ss(float (&d)[2][4], unsigned long long a, unsigned long long b, int scale_d) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
		             "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " HOP_REGS8 ", %8, %9, p, 1, 1, 0, 0;\n}\n"
		             : HOP_ACC8(d)
		             : "l"(a), "l"(b), "r"(scale_d));
	}
};
template <> struct Wgmma<32, bf16> {
	__device__ static void ss(float (&d)[4][4], unsigned long long a, unsigned long long b, int scale_d) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
		             "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " HOP_REGS16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
		             : HOP_ACC16(d)
		             : "l"(a), "l"(b), "r"(scale_d));
	}
};
// N = 256, group_wgmma's, is bf16 only.
template <> struct Wgmma<256, bf16> {
	__device__ static void ss(float (&d)[32][4], unsigned long long a, unsigned long long b, int scale_d) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
		             "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " HOP_REGS128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
		             : HOP_ACC64(d), HOP_ACC64_AT(d, 16)
		             : "l"(a), "l"(b), "r"(scale_d));
	}
};
