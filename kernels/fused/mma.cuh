// The tensor-core building blocks of the fused set's kernels, shared by
// every module that multiplies on tensor cores (attention.cu, moe.cu):
// cp.async copies into shared memory, ldmatrix fragment loads, the bf16
// mma.sync m16n8k16, and the swizzled layout of shared-memory tiles.

#pragma once
#include "common.cuh"

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp16 copies 16 bytes from global src to shared dst, or zeroes dst when
// !valid (src is then not read).
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool valid) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// ld_acquire reads a counter other blocks add to, ordered before this
// thread's later reads.
__device__ __forceinline__ int ld_acquire(const int* p) {
	int v;
	asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
	return v;
}

// wait_count holds the block until *counter reaches target: thread 0 reads
// it with acquire (ns nanoseconds between tries), then the block syncs, so
// that every thread sees what the counted blocks wrote before they counted
// (each after a barrier and its thread 0's fence).
__device__ __forceinline__ void wait_count(const int* counter, int target, unsigned ns) {
	if (threadIdx.x == 0)
		while (ld_acquire(counter) < target) __nanosleep(ns);
	__syncthreads();
}

// st_shared16 stores 16 bytes at a shared address.
__device__ __forceinline__ void st_shared16(unsigned dst, uint4 v) {
	asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(addr));
}

// mma16816 is c += a·b for a 16×16 bf16 A (row-major fragment), a 16×8 bf16
// B (column-major fragment) and a 16×8 f32 C.
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	             "{%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// pack2 rounds two floats to a pair of T, bf16 or (for flash_hopper's f16
// instances) half_bits, to nearest even, lo in the low half.
template <typename T = bf16> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *reinterpret_cast<unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<half_bits>(float lo, float hi) {
	unsigned v;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo)); // the first source goes to the high half
	return v;
}

// Tile is the shared-memory layout of row-major tiles of D-wide bf16 rows.
template <int D> struct Tile {
	static constexpr int CHUNKS = D / 8;                     // 16-byte chunks of a row
	static constexpr int ROWC = (CHUNKS + 7) / 8 * 8;        // slots of a row
	static constexpr int ROW_BYTES = ROWC * 16;              //
	__device__ static unsigned at(unsigned base, int r, int c) { // address of chunk c of row r
		return base + r * ROW_BYTES + ((c ^ (r & 7)) << 4);
	}
	// load copies rows [0, n) of a tile from global rows src + r*pitch
	// (bf16 elements), zeroing rows at or past valid, with nthreads threads.
	template <int ROWS>
	__device__ static void load(unsigned base, const bf16* src, long long pitch, int valid, int tid, int nthreads) {
		for (int i = tid; i < ROWS * CHUNKS; i += nthreads) {
			const int r = i / CHUNKS, c = i - r * CHUNKS;
			const bool ok = r < valid;
			cp16(at(base, r, c), ok ? src + r * pitch + c * 8 : src, ok);
		}
	}
};

