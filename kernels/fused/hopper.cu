// Flash attention for Hopper (sm_90a only: wgmma, setmaxnreg and the copy
// engine's tensor copies), the "wgmma" variant of attn_prefill. Same
// problem, layouts and rounding as flash_prefill (attention.cu): base-2
// online softmax with scale·log2(e) folded into one FFMA per score, p
// rounded to bf16 for P·V and summed unrounded in f32, O / l rounded to
// bf16 once (softmax_tile and p_frag of flash.cuh, on the same fragments).
//
// A block takes HOP_BM = 128 queries of one row and head, as three
// warpgroups of 128 threads:
//   - warpgroup 0, the producer, gives its registers back (setmaxnreg down
//     to HOP_PRODUCER_REGS); one thread issues the tensor copies: the Q tile
//     once, then every K and V tile of BN = 128 keys into a ring of STAGES
//     stages, each stage guarded by mbarriers: kfull/vfull (the copy engine
//     completes them with the bytes it wrote) and empty (each consumer warp
//     arrives when its wgmmas no longer read the stage).
//   - warpgroups 1 and 2, the consumers (setmaxnreg up to
//     HOP_CONSUMER_REGS), own 64 query rows each: S = Q·Kᵀ by wgmma
//     m64n128k16 with Q and K from shared memory, the softmax in registers,
//     O += P·V by wgmma m64nDk16 with P from registers (the S accumulator
//     repacked to bf16 A fragments) and V from shared memory read N-major.
//     Within a warpgroup the next tile's Q·Kᵀ is issued before this tile's
//     P·V, and its softmax runs while that P·V is in flight; the two
//     consumer warpgroups overlap each other's softmax and GEMMs as the warp
//     schedulers interleave them.
// Shared tiles are rows of 64 bf16 (128 bytes) written by the copy engine
// with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)), a
// D-wide tile being D/64 such boxes one after the other; every box starts
// on 1024 bytes, so the wgmma descriptors' swizzle matches the copy's.
//
// Causal tiles wholly above a warpgroup's diagonal are not computed, only
// the ones crossing it are masked. Keys past the row's end (cache positions
// nobody wrote, NaN in the tests) are masked to -inf in S and their V rows
// zeroed in shared memory before P·V, since 0·NaN would reach O.
//
// A wait that lasts HOP_WAIT_CYCLES records what it waited for in status
// (code, block, thread, tile, parity) and the kernel winds down instead of
// hanging; later waits of every block see the record and give up at once.

#define HOP_BM 128           // queries of a block: HOP_CONSUMERS × 64
#define HOP_BN 128           // keys of a K or V tile
#define HOP_CONSUMERS 2      // consumer warpgroups
#define HOP_THREADS (128 * (1 + HOP_CONSUMERS))
#define HOP_PRODUCER_REGS 24 // setmaxnreg of the producer warpgroup
#define HOP_CONSUMER_REGS 240 // and of the consumers: 24·128 + 240·256 ≤ 64K registers
#define HOP_BOX 64           // bf16 columns of a tensor-copy box: 128 bytes, the swizzle's span
#define HOP_ROW_BYTES 128    // bytes of a box row

// Codes of status[0] when a wait timed out.
#define HOP_WAIT_Q 1
#define HOP_WAIT_K 2
#define HOP_WAIT_V 3
#define HOP_WAIT_EMPTY 4

// HopLayout is the shared memory of flash_hopper<D, STAGES>: the Q tile,
// then per stage a K tile and a V tile, each D/64 boxes of rows × 128 bytes.
template <int D, int STAGES> struct HopLayout {
	static constexpr int BOXES = D / HOP_BOX;
	static constexpr int Q_BYTES = HOP_BM * D * 2;
	static constexpr int KV_BYTES = HOP_BN * D * 2;
	static constexpr int ALIGN = 1024; // the 128-byte swizzle's period; the dynamic base is rounded up to it
	static constexpr int SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + ALIGN;
};

// --- the kernel ------------------------------------------------------------

// flash_hopper: see the top of this file.
//   qmap: q bf16 [T, heads·D] (rotated; pitch qp), 2-D, box {64, HOP_BM};
//   kmap, vmap: the caches bf16 [B·kvh, maxSeq, D], 3-D, box {64, HOP_BN, 1};
//   all three with the 128-byte swizzle, out-of-bounds elements zero.
//   out bf16 [T, heads·D], pitch op; start i32 [B+1], past i32 [B]: token
//   t0+i of row b (t0 = start[b]) sits at position past[b]+i and sees keys
//   0..past[b]+i (all past[b]+n keys when causal is 0) of kv head
//   h / (heads/kvh). status i32 [8], zero: see the top of this file.
// Launch: grid (ceil(max new tokens / HOP_BM), heads, B), HOP_THREADS
// threads, HopLayout<D, STAGES>::SMEM bytes of dynamic shared memory.
template <int D, int STAGES>
__device__ __forceinline__ void flash_hopper(const TmaMap* qmap, const TmaMap* kmap, const TmaMap* vmap, bf16* out, int op,
                                             const int* start, const int* past, int heads, int kvh, float scale_log2,
                                             int causal, int* status) {
	typedef HopLayout<D, STAGES> L;
	constexpr int BOXES = L::BOXES, KS = D / 16, PK = HOP_BN / 16, NO = D / 8;
	extern __shared__ unsigned char smem_raw[];
	__shared__ __align__(8) unsigned long long bars[1 + 3 * STAGES];

	const int b = blockIdx.z, h = blockIdx.y;
	const int t0 = start[b], n = start[b + 1] - t0, p0 = past[b];
	const int q0 = (gridDim.x - 1 - blockIdx.x) * HOP_BM; // the latest queries (most keys) first
	if (q0 >= n) return;
	const int kend = p0 + (causal ? min(q0 + HOP_BM, n) : n); // keys [0, kend) are read
	const int ntiles = (kend + HOP_BN - 1) / HOP_BN;
	const int bh = b * kvh + h / (heads / kvh); // the (row, kv head) of the caches' 3-D maps

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	const unsigned sQ = base;
	auto sK = [&](int s) { return base + L::Q_BYTES + 2 * s * L::KV_BYTES; };
	auto sV = [&](int s) { return base + L::Q_BYTES + (2 * s + 1) * L::KV_BYTES; };
	const unsigned barQ = smem_addr(&bars[0]);
	auto kfull = [&](int s) { return smem_addr(&bars[1 + s]); };
	auto vfull = [&](int s) { return smem_addr(&bars[1 + STAGES + s]); };
	auto empty = [&](int s) { return smem_addr(&bars[1 + 2 * STAGES + s]); };

	if (threadIdx.x == 0) {
		mbar_init(barQ, 1);
		for (int s = 0; s < STAGES; s++) {
			mbar_init(kfull(s), 1);
			mbar_init(vfull(s), 1);
			mbar_init(empty(s), HOP_CONSUMERS * 4); // one arrival per consumer warp
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();

	const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
	if (wg == 0) {
		// The producer.
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(HOP_PRODUCER_REGS));
		if (tid != 0) return;
		mbar_expect_tx(barQ, L::Q_BYTES);
#pragma unroll
		for (int c = 0; c < BOXES; c++) tma_load_2d(sQ + c * HOP_BM * HOP_ROW_BYTES, qmap, barQ, h * D + c * HOP_BOX, t0 + q0);
		for (int j = 0; j < ntiles; j++) {
			const int s = j % STAGES;
			if (j >= STAGES && !mbar_wait(empty(s), (j / STAGES - 1) & 1, status, HOP_WAIT_EMPTY, j)) return;
			mbar_expect_tx(kfull(s), L::KV_BYTES);
#pragma unroll
			for (int c = 0; c < BOXES; c++)
				tma_load_3d(sK(s) + c * HOP_BN * HOP_ROW_BYTES, kmap, kfull(s), c * HOP_BOX, j * HOP_BN, bh);
			mbar_expect_tx(vfull(s), L::KV_BYTES);
#pragma unroll
			for (int c = 0; c < BOXES; c++)
				tma_load_3d(sV(s) + c * HOP_BN * HOP_ROW_BYTES, vmap, vfull(s), c * HOP_BOX, j * HOP_BN, bh);
		}
		return;
	}

	// A consumer: warpgroup w owns the block's rows [64w, 64w+64), warp wi
	// of it 16 of them, this thread rows g and g+8 of those.
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(HOP_CONSUMER_REGS));
	const int w = wg - 1, wi = tid / 32, lane = tid % 32;
	const int qrow = q0 + 64 * w + 16 * wi + lane / 4; // the thread's first row in the row's new tokens
	const int qpos = p0 + qrow;                        // its position
	// Tiles this warpgroup computes: those holding a key some row of it sees.
	const int wend = causal ? min(kend, p0 + q0 + 64 * w + 64) : kend;
	const int nw = (wend + HOP_BN - 1) / HOP_BN;
	const unsigned qA = sQ + 64 * w * HOP_ROW_BYTES; // this warpgroup's rows of box 0 of Q

	auto release = [&](int s) { // this warp's wgmmas no longer read stage s
		__syncwarp();
		if (lane == 0) mbar_arrive(empty(s));
	};
	// S = Q·Kᵀ over the tile in stage s: D/16 k-steps, 32 bytes apart in a
	// box, the next box after 4.
	auto issue_qk = [&](float (&sc)[HOP_BN / 8][4], int s) {
#pragma unroll
		for (int k = 0; k < KS; k++) {
			const int c = k / 4, kk = k % 4;
			Wgmma<HOP_BN>::ss(sc, sw128_desc(qA + c * HOP_BM * HOP_ROW_BYTES + kk * 32, 16),
			                  sw128_desc(sK(s) + c * HOP_BN * HOP_ROW_BYTES + kk * 32, 16), k > 0);
		}
	};
	// O += P·V over the tile in stage s: k-steps of 16 keys (2048 bytes);
	// V is N-major, its 64-column boxes HOP_BN rows apart.
	auto issue_pv = [&](float (&o)[NO][4], const unsigned (&pa)[PK][4], int s) {
#pragma unroll
		for (int kk = 0; kk < PK; kk++)
			Wgmma<D>::rs(o, pa[kk], sw128_desc(sV(s) + kk * 16 * HOP_ROW_BYTES, HOP_BN * HOP_ROW_BYTES));
	};
	// Mask keys past a row's position, or past kend, on tiles that cross
	// the warpgroup's diagonal or the end.
	auto mask = [&](float (&sc)[HOP_BN / 8][4], int j) {
		const int k0 = j * HOP_BN;
		if (!(causal && k0 + HOP_BN - 1 > p0 + q0 + 64 * w || k0 + HOP_BN > kend)) return;
#pragma unroll
		for (int i = 0; i < HOP_BN / 8; i++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int key = k0 + 8 * i + 2 * (lane & 3) + (e & 1);
				if (causal && key > qpos + 8 * (e >> 1) || key >= kend) sc[i][e] = NEG_INF;
			}
	};
	// Zero the V rows of the tile in stage s at or past kend, for P·V.
	auto zero_tail = [&](int j, int s) {
		const int k0 = j * HOP_BN;
		if (k0 + HOP_BN <= kend) return;
		const int first = kend - k0, chunks = (HOP_BN - first) * (HOP_ROW_BYTES / 16);
		for (int i = tid; i < BOXES * chunks; i += 128) {
			const int c = i / chunks, r = first + (i % chunks) / (HOP_ROW_BYTES / 16), x = i % (HOP_ROW_BYTES / 16);
			asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sV(s) + (c * HOP_BN + r) * HOP_ROW_BYTES + x * 16),
			             "r"(0)
			             : "memory");
		}
		asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // the zeros, seen by wgmma
		asm volatile("bar.sync %0, 128;\n" ::"r"(1 + w) : "memory");
	};

	float o[NO][4];
#pragma unroll
	for (int d = 0; d < NO; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
	RowState st[2] = {{NEG_INF, 0.0f}, {NEG_INF, 0.0f}};
	float sc[HOP_BN / 8][4];
	unsigned pa[PK][4];
	bool ok = mbar_wait(barQ, 0, status, HOP_WAIT_Q, -1) && mbar_wait(kfull(0), 0, status, HOP_WAIT_K, 0);
	if (!ok) return;
	__syncwarp();

	// Tile 0's scores and p.
	wg_fence();
	issue_qk(sc, 0);
	wg_commit();
	wg_wait<0>();
	keep(sc);
	mask(sc, 0);
	float alpha[2];
	softmax_tile<HOP_BN / 8>(sc, st, scale_log2, alpha); // O is 0: alpha unused
#pragma unroll
	for (int kk = 0; kk < PK; kk++) p_frag<HOP_BN / 8>(pa[kk], sc, kk);

	// Tiles 0 .. nw-2: S of tile j+1 in flight with, then its softmax
	// during, P·V of tile j.
	for (int j = 0; j + 1 < nw; j++) {
		const int s = j % STAGES, s1 = (j + 1) % STAGES;
		if (!mbar_wait(kfull(s1), ((j + 1) / STAGES) & 1, status, HOP_WAIT_K, j + 1)) return;
		__syncwarp();
		wg_fence();
		issue_qk(sc, s1);
		wg_commit();
		if (!mbar_wait(vfull(s), (j / STAGES) & 1, status, HOP_WAIT_V, j)) return;
		__syncwarp();
		zero_tail(j, s);
		wg_fence();
		issue_pv(o, pa, s);
		wg_commit();
		wg_wait<1>(); // S of tile j+1 is done, P·V of tile j may not be
		keep(sc);
		mask(sc, j + 1);
		softmax_tile<HOP_BN / 8>(sc, st, scale_log2, alpha);
		wg_wait<0>();
		keep(o);
		keep(pa);
		release(s);
		rescale(o, alpha);
#pragma unroll
		for (int kk = 0; kk < PK; kk++) p_frag<HOP_BN / 8>(pa[kk], sc, kk);
	}
	{ // P·V of the last tile
		const int j = nw - 1, s = j % STAGES;
		if (!mbar_wait(vfull(s), (j / STAGES) & 1, status, HOP_WAIT_V, j)) return;
		__syncwarp();
		zero_tail(j, s);
		wg_fence();
		issue_pv(o, pa, s);
		wg_commit();
		wg_wait<0>();
		keep(o);
		keep(pa);
		release(s);
	}
	// Tiles wholly above this warpgroup's diagonal: the other one reads
	// them; waiting for each copy keeps the empty arrivals in their phase.
	for (int j = nw; j < ntiles; j++) {
		if (!mbar_wait(kfull(j % STAGES), (j / STAGES) & 1, status, HOP_WAIT_K, j)) return;
		release(j % STAGES);
	}

	// out = O / l for the rows that are new tokens of the row.
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int row = qrow + 8 * i;
		const float inv = 1.0f / quad_sum(st[i].l);
		if (row >= n) continue;
		bf16* dst = out + (long long)(t0 + row) * op + h * D + 2 * (lane & 3);
#pragma unroll
		for (int d = 0; d < NO; d++)
			*reinterpret_cast<unsigned*>(dst + d * 8) = pack2(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
	}
}

#define FLASH_HOPPER(D, STAGES)                                                                                   \
	extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1) flash_hopper_d##D##_s##STAGES(                \
	    const __grid_constant__ TmaMap qmap, const __grid_constant__ TmaMap kmap, const __grid_constant__ TmaMap vmap, \
	    bf16* out, int op, const int* start, const int* past, int heads, int kvh, float scale_log2, int causal,   \
	    int* status) {                                                                                          \
		flash_hopper<D, STAGES>(&qmap, &kmap, &vmap, out, op, start, past, heads, kvh, scale_log2, causal, status); \
	}
FLASH_HOPPER(128, 2)
FLASH_HOPPER(128, 3)
FLASH_HOPPER(64, 2)
FLASH_HOPPER(64, 4)
