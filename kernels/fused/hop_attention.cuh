// hop_attention, the warp-specialized flash attention body (sm_90a only)
// that flash_hopper (hopper.cu, GQA over the KV cache) and mla_hopper
// (mla_hopper.cu, DeepSeek-V2's MLA prefill) both run, each with its own
// source of Q, K and V tiles. Built on mma.cuh, flash.cuh
// (smem_addr, pack2, softmax_tile, rescale, p_frag) and hopper.cuh (the
// mbarrier ring, tensor copies, wgmma); hopper.cu's top comment describes
// the design, the numbers below are its tiles.

#pragma once
#include "flash.cuh"
#include "hopper.cuh"

#define HOP_BM 128           // queries of a block: HOP_CONSUMERS × 64
#define HOP_CONSUMERS 2      // consumer warpgroups
#define HOP_THREADS (128 * (1 + HOP_CONSUMERS))
#define HOP_PRODUCER_REGS 24 // setmaxnreg of the producer warpgroup
#define HOP_CONSUMER_REGS 240 // and of the consumers
// setmaxnreg moves registers within what the block was launched with (168
// a thread: 64K / HOP_THREADS, in steps of 8): an increase beyond it never
// completes, and no wait's timeout catches that (a branch's producer at 32
// with these consumers hung the device).
#define HOP_LAUNCH_REGS (65536 / HOP_THREADS / 8 * 8)
static_assert(HOP_PRODUCER_REGS * 128 + HOP_CONSUMER_REGS * 128 * HOP_CONSUMERS <= HOP_LAUNCH_REGS * HOP_THREADS,
              "setmaxnreg asks for more registers than the block has");
// Named barriers of the consumer warpgroups (0 is __syncthreads'):
// HOP_WG_BAR + w is warpgroup w's own (128 threads), HOP_TURN_BAR + w says
// it is warpgroup w's turn to issue wgmmas (256 threads: see the turns in
// hop_attention).
#define HOP_WG_BAR 1
#define HOP_TURN_BAR (HOP_WG_BAR + HOP_CONSUMERS)
#define HOP_BOX 64           // 2-byte columns of a tensor-copy box: 128 bytes, the swizzle's span
#define HOP_ROW_BYTES 128    // bytes of a box row

// Codes of status[0] when a wait timed out.
#define HOP_WAIT_Q 1
#define HOP_WAIT_K 2
#define HOP_WAIT_V 3
#define HOP_WAIT_KFREE 4
#define HOP_WAIT_VFREE 5
#define HOP_WAIT_QFREE 6

// HopLayout is the shared memory of hop_attention<DQK, DV, BN, KST, VST,
// QBUF>: QBUF Q tiles, then a ring of KST K tiles and one of VST V tiles,
// each a run of 64-column boxes of rows × 128 bytes (DQK/64 boxes of HOP_BM
// or BN rows, DV/64 of BN) of 2-byte elements, bf16 or f16.
template <int DQK, int DV, int BN, int KST, int VST, int QBUF> struct HopLayout {
	static constexpr int Q_BYTES = HOP_BM * DQK * 2;
	static constexpr int K_BYTES = BN * DQK * 2;
	static constexpr int V_BYTES = BN * DV * 2;
	static constexpr int ALIGN = 1024; // the 128-byte swizzle's period; the dynamic base is rounded up to it
	static constexpr int SMEM = QBUF * Q_BYTES + KST * K_BYTES + VST * V_BYTES + ALIGN;
	static_assert(DV <= DQK, "a warpgroup's output is staged in its rows of the Q tile");
};

// HopWork is an item of hop_attention: queries [q0, q0+HOP_BM) of the n
// new tokens of one row (token t0+i at position p0+i, q0 < n), query head
// h, whose tiles src brings (see hop_attention).
template <typename Src> struct HopWork {
	Src src;
	int t0, n, p0, q0, h;
};

// HopOne is the schedule of a block that takes one item.
template <typename S> struct HopOne {
	typedef S Src;
	HopWork<S> work;
	__device__ int items() const { return 1; }
	__device__ bool item(int, HopWork<S>& w) const {
		w = work;
		return true;
	}
};

// --- the kernel body --------------------------------------------------------

// hop_attention is flash attention over keys of DQK dims and values of DV
// dims in tiles of BN keys, for the items a block's schedule sched gives
// (sched.items() of them, item(k, w) false for one that is empty), one
// after the other: hopper.cu's top comment tells how. An item's src brings
// its tiles by tensor copies, each completing on the barrier it is given:
//   load_q(dst, bar): the item's Q tile, DQK/64 boxes of HOP_BM rows;
//   load_k(dst, bar, j), load_v(dst, bar, j): key tile j (keys [j·BN,
//   j·BN+BN)), DQK/64 and DV/64 boxes of BN rows, out-of-range rows
//   anything, NaN too (their scores are replaced by a select, and V's rows
//   past kend zeroed).
// K tiles go through a ring of KST stages, V tiles through one of VST, Q
// through QBUF buffers (with 2, an item's Q copies while the last one
// runs); the rings run on across items.
//   out E [T, heads·DV], pitch op; omap, when not null, a 2-D map over out
//   (box {HOP_BOX, 64}, the 128-byte swizzle) through which a warpgroup
//   whose 64 rows are all new tokens of the row stores them (the others
//   store directly). status: see hopper.cu.
// E is the element type of Q, K, V and out: bf16, or half_bits (f16, with
// wgmma's f16 form and P rounded to f16); everything else is as for bf16.
template <int DQK, int DV, int BN, int KST, int VST, int QBUF, typename Sched, typename E>
__device__ __forceinline__ void hop_attention(const Sched& sched, E* out, int op, const TmaMap* omap, float scale_log2, int causal,
                                              int* status) {
	typedef HopLayout<DQK, DV, BN, KST, VST, QBUF> L;
	static_assert(QBUF == 1 || QBUF == 2, "one or two Q buffers");
	constexpr int KS = DQK / 16, PK = BN / 16, NO = DV / 8, NS = BN / 8;
	constexpr int VBOXES = DV / HOP_BOX;
	extern __shared__ unsigned char smem_raw[];
	__shared__ __align__(8) unsigned long long bars[2 * (QBUF + KST + VST)];

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	auto sQ = [&](int b) { return base + b * L::Q_BYTES; };
	auto sK = [&](int s) { return base + QBUF * L::Q_BYTES + s * L::K_BYTES; };
	auto sV = [&](int s) { return base + QBUF * L::Q_BYTES + KST * L::K_BYTES + s * L::V_BYTES; };
	// full barriers complete with their copy's bytes; free ones when every
	// consumer (a thread of each warpgroup for Q, each warp for K and V) is
	// done reading.
	auto qfull = [&](int b) { return smem_addr(&bars[b]); };
	auto qfree = [&](int b) { return smem_addr(&bars[QBUF + b]); };
	auto kfull = [&](int s) { return smem_addr(&bars[2 * QBUF + s]); };
	auto kfree = [&](int s) { return smem_addr(&bars[2 * QBUF + KST + s]); };
	auto vfull = [&](int s) { return smem_addr(&bars[2 * QBUF + 2 * KST + s]); };
	auto vfree = [&](int s) { return smem_addr(&bars[2 * QBUF + 2 * KST + VST + s]); };

	if (threadIdx.x == 0) {
		for (int b = 0; b < QBUF; b++) {
			mbar_init(qfull(b), 1);
			mbar_init(qfree(b), HOP_CONSUMERS);
		}
		for (int s = 0; s < KST; s++) {
			mbar_init(kfull(s), 1);
			mbar_init(kfree(s), HOP_CONSUMERS * 4);
		}
		for (int s = 0; s < VST; s++) {
			mbar_init(vfull(s), 1);
			mbar_init(vfree(s), HOP_CONSUMERS * 4);
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();

	// keys [0, kend) of an item are read, in tiles of BN.
	auto kend_of = [&](const HopWork<typename Sched::Src>& it) { return it.p0 + (causal ? min(it.q0 + HOP_BM, it.n) : it.n); };

	const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
	if (wg == 0) {
		// The producer: each item's Q, then its K and V tiles, K running one
		// tile ahead of V (the order in which the consumers free them).
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(HOP_PRODUCER_REGS));
		if (tid != 0) return;
		int kc = 0, vc = 0, qi = 0; // K tiles, V tiles and Q tiles copied so far
		for (int k = 0; k < sched.items(); k++) {
			HopWork<typename Sched::Src> it;
			if (!sched.item(k, it)) continue;
			const int b = qi % QBUF;
			if (qi >= QBUF && !mbar_wait(qfree(b), (qi / QBUF - 1) & 1, status, HOP_WAIT_QFREE, -1)) return;
			qi++;
			mbar_expect_tx(qfull(b), L::Q_BYTES);
			it.src.load_q(sQ(b), qfull(b));
			const int nt = (kend_of(it) + BN - 1) / BN;
			for (int j = 0; j <= nt; j++) {
				if (j < nt) {
					const int s = kc % KST;
					if (kc >= KST && !mbar_wait(kfree(s), (kc / KST - 1) & 1, status, HOP_WAIT_KFREE, j)) return;
					mbar_expect_tx(kfull(s), L::K_BYTES);
					it.src.load_k(sK(s), kfull(s), j);
					kc++;
				}
				if (j > 0) {
					const int s = vc % VST;
					if (vc >= VST && !mbar_wait(vfree(s), (vc / VST - 1) & 1, status, HOP_WAIT_VFREE, j - 1)) return;
					mbar_expect_tx(vfull(s), L::V_BYTES);
					it.src.load_v(sV(s), vfull(s), j - 1);
					vc++;
				}
			}
		}
		return;
	}

	// A consumer: warpgroup w owns an item's rows [64w, 64w+64), warp wi of
	// it 16 of them, this thread rows g and g+8 of those.
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(HOP_CONSUMER_REGS));
	const int w = wg - 1, wi = tid / 32, lane = tid % 32;

	// Turns (FA3's ping-pong): the two consumer warpgroups issue their
	// wgmmas in turn, each while the other runs its softmax, rather than
	// both at once and then both waiting. A turn is taken before a group of
	// wgmmas is issued (tile 0's Q·Kᵀ, each step's Q·Kᵀ and P·V, the last
	// P·V: nw + 1 turns an item) and passed right after. Warpgroup 0 goes
	// first; of an item, a warpgroup with fewer tiles (by one at most: the
	// causal diagonal) takes and passes the turns it lacks once done, so
	// both take as many; and warpgroup 0 takes one more at the end, the
	// last one warpgroup 1 passed, so that every arrival meets its wait.
	auto take_turn = [&]() { asm volatile("bar.sync %0, 256;\n" ::"r"(HOP_TURN_BAR + w) : "memory"); };
	auto pass_turn = [&]() { asm volatile("bar.arrive %0, 256;\n" ::"r"(HOP_TURN_BAR + 1 - w) : "memory"); };
	if (w == 1) pass_turn(); // warpgroup 0 first

	auto release = [&](unsigned bar) { // this warp's wgmmas no longer read the stage of bar
		__syncwarp();
		if (lane == 0) mbar_arrive(bar);
	};
	// S = Q·Kᵀ over the K tile in stage s, Q's rows of this warpgroup at qA:
	// DQK/16 k-steps, 32 bytes apart in a box, the next box after 4.
	auto issue_qk = [&](float (&sc)[NS][4], unsigned qA, int s) {
#pragma unroll
		for (int k = 0; k < KS; k++) {
			const int c = k / 4, kk = k % 4;
			Wgmma<BN, E>::ss(sc, sw128_desc(qA + c * HOP_BM * HOP_ROW_BYTES + kk * 32, 16),
			                 sw128_desc(sK(s) + c * BN * HOP_ROW_BYTES + kk * 32, 16), k > 0);
		}
	};
	// O += P·V over the V tile in stage s: k-steps of 16 keys (2048 bytes);
	// V is N-major, its 64-column boxes BN rows apart.
	auto issue_pv = [&](float (&o)[NO][4], const unsigned (&pa)[PK][4], int s) {
#pragma unroll
		for (int kk = 0; kk < PK; kk++)
			Wgmma<DV, E>::rs(o, pa[kk], sw128_desc(sV(s) + kk * 16 * HOP_ROW_BYTES, BN * HOP_ROW_BYTES));
	};

	int kc = 0, vc = 0, qi = 0; // as the producer's
	int owed = -1;              // QBUF 2: the Q buffer this warpgroup has not yet released (qfree)
	bool stored = false;        // thread 0: its tensor stores of O may still read shared memory
	bool live = true;           // no wait has given up
	for (int k = 0; k < sched.items(); k++) {
		HopWork<typename Sched::Src> it;
		if (!sched.item(k, it)) continue;
		const int b = qi % QBUF;
		const unsigned qpar = (qi / QBUF) & 1;
		qi++;
		const int n = it.n, p0 = it.p0, q0 = it.q0;
		const int kend = kend_of(it), ntiles = (kend + BN - 1) / BN;
		// Tiles warpgroup x computes: those holding a key some row of it sees.
		auto tiles_of = [&](int x) { return ((causal ? min(kend, p0 + q0 + 64 * x + 64) : kend) + BN - 1) / BN; };
		const int nw = tiles_of(w), turns = max(tiles_of(0), tiles_of(1)) + 1;
		int turn = 0;
		const int kc0 = kc, vc0 = vc; // the item's tile j is K tile kc0 + j of the ring, V tile vc0 + j
		kc += ntiles;
		vc += ntiles;
		do {
			if (!live) break;
			auto ks = [&](int j) { return (kc0 + j) % KST; };
			auto kpar = [&](int j) { return (unsigned)((kc0 + j) / KST) & 1; };
			auto vs = [&](int j) { return (vc0 + j) % VST; };
			auto vpar = [&](int j) { return (unsigned)((vc0 + j) / VST) & 1; };
			const int qrow = q0 + 64 * w + 16 * wi + lane / 4; // the thread's first row in the row's new tokens
			const int qpos = p0 + qrow;                        // its position
			const unsigned qA = sQ(b) + 64 * w * HOP_ROW_BYTES; // this warpgroup's rows of box 0 of Q
			// Mask keys past a row's position, or past kend, on tiles that
			// cross the warpgroup's diagonal or the end.
			auto mask = [&](float (&sc)[NS][4], int j) {
				const int k0 = j * BN;
				if (!(causal && k0 + BN - 1 > p0 + q0 + 64 * w || k0 + BN > kend)) return;
#pragma unroll
				for (int i = 0; i < NS; i++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						const int key = k0 + 8 * i + 2 * (lane & 3) + (e & 1);
						if (causal && key > qpos + 8 * (e >> 1) || key >= kend) sc[i][e] = NEG_INF;
					}
			};
			// Zero the V rows of tile j at or past kend, for P·V.
			auto zero_tail = [&](int j) {
				const int k0 = j * BN;
				if (k0 + BN <= kend) return;
				const int first = kend - k0, chunks = (BN - first) * (HOP_ROW_BYTES / 16);
				for (int i = tid; i < VBOXES * chunks; i += 128) {
					const int c = i / chunks, r = first + (i % chunks) / (HOP_ROW_BYTES / 16), x = i % (HOP_ROW_BYTES / 16);
					asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sV(vs(j)) + (c * BN + r) * HOP_ROW_BYTES + x * 16),
					             "r"(0)
					             : "memory");
				}
				asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // the zeros, seen by wgmma
				asm volatile("bar.sync %0, 128;\n" ::"r"(HOP_WG_BAR + w) : "memory");
			};
			float o[NO][4];
#pragma unroll
			for (int d = 0; d < NO; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
			RowState st[2] = {{NEG_INF, 0.0f}, {NEG_INF, 0.0f}};
			float sc[NS][4];
			unsigned pa[PK][4];
			// A step's turn, once its tiles have landed: V of tile j readied
			// for P·V, the turn taken and the wgmmas fenced; end_turn passes
			// it on.
			auto begin_turn = [&](int j) {
				__syncwarp();
				zero_tail(j);
				take_turn();
				wg_fence();
			};
			auto end_turn = [&]() {
				pass_turn();
				turn++;
			};
			// P·V of tile j is done: O and P may be read, V's stage freed.
			auto pv_done = [&](int j) {
				wg_wait<0>();
				keep(o);
				keep(pa);
				release(vfree(vs(j)));
			};

			// A wait that gives up ends the warpgroup's work (live false):
			// it passes the item's turns left on, and those of every item
			// after, so that the other warpgroup winds down too instead of
			// waiting for one forever.
			if (!mbar_wait(qfull(b), qpar, status, HOP_WAIT_Q, -1) || !mbar_wait(kfull(ks(0)), kpar(0), status, HOP_WAIT_K, 0)) {
				live = false;
				break;
			}
			__syncwarp();

			// Tile 0's scores and p.
			take_turn();
			wg_fence();
			issue_qk(sc, qA, ks(0));
			wg_commit();
			end_turn();
			wg_wait<0>();
			keep(sc);
			release(kfree(ks(0)));
			if (QBUF == 2 && owed >= 0) { // the last item's Q buffer, once its stores have read it
				if (tid == 0) {
					if (stored) tma_store_wait();
					stored = false;
					mbar_arrive(qfree(owed));
				}
				owed = -1;
			}
			mask(sc, 0);
			float alpha[2];
			softmax_tile<NS>(sc, st, scale_log2, alpha); // O is 0: alpha unused
#pragma unroll
			for (int kk = 0; kk < PK; kk++) p_frag<NS, E>(pa[kk], sc, kk);

			// Tiles 0 .. nw-2: S of tile j+1 in flight with, then its softmax
			// during, P·V of tile j.
			for (int j = 0; j + 1 < nw; j++) {
				// Both waits come before either wgmma is issued: a wait that
				// gives up leaves the loop, and a path out with wgmmas in
				// flight is a divergent one on which ptxas serializes every
				// wgmma of the kernel (C7518). V of tile j was copied before K
				// of tile j+1, so waiting for it first costs nothing.
				if (!mbar_wait(vfull(vs(j)), vpar(j), status, HOP_WAIT_V, j) ||
				    !mbar_wait(kfull(ks(j + 1)), kpar(j + 1), status, HOP_WAIT_K, j + 1)) {
					live = false;
					break;
				}
				begin_turn(j);
				issue_qk(sc, qA, ks(j + 1));
				wg_commit();
				wg_fence();
				issue_pv(o, pa, vs(j));
				wg_commit();
				end_turn();
				wg_wait<1>(); // S of tile j+1 is done, P·V of tile j may not be
				keep(sc);
				release(kfree(ks(j + 1)));
				mask(sc, j + 1);
				softmax_tile<NS>(sc, st, scale_log2, alpha);
				pv_done(j);
				rescale(o, alpha);
#pragma unroll
				for (int kk = 0; kk < PK; kk++) p_frag<NS, E>(pa[kk], sc, kk);
			}
			if (!live) break;
			{ // P·V of the last tile
				const int j = nw - 1;
				if (!mbar_wait(vfull(vs(j)), vpar(j), status, HOP_WAIT_V, j)) {
					live = false;
					break;
				}
				begin_turn(j);
				issue_pv(o, pa, vs(j));
				wg_commit();
				end_turn();
				pv_done(j);
			}
			// Tiles wholly above this warpgroup's diagonal: the other one
			// reads them; waiting for each copy keeps the free arrivals in
			// their phase.
			for (int j = nw; j < ntiles; j++) {
				if (!mbar_wait(kfull(ks(j)), kpar(j), status, HOP_WAIT_K, j) ||
				    !mbar_wait(vfull(vs(j)), vpar(j), status, HOP_WAIT_V, j)) {
					live = false;
					break;
				}
				release(kfree(ks(j)));
				release(vfree(vs(j)));
			}
			if (!live) break;

			// out = O / l for the rows that are new tokens of the row.
			float inv[2];
#pragma unroll
			for (int i = 0; i < 2; i++) inv[i] = 1.0f / quad_sum(st[i].l);
			if (omap && q0 + 64 * w + 64 <= n) {
				// Through shared memory: the warpgroup's rows of the Q tile,
				// which no wgmma reads any more, take its O in the layout the
				// tensor copies swizzle (the 16-byte chunk of column d·8 of row
				// r at chunk (d % 8) ^ (r % 8) of the row; each warp's stores
				// then hit 32 different banks), then one thread stores the
				// DV/64 boxes.
#pragma unroll
				for (int i = 0; i < 2; i++) {
					const unsigned row = sQ(b) + (64 * w + 16 * wi + lane / 4 + 8 * i) * HOP_ROW_BYTES + 4 * (lane & 3);
#pragma unroll
					for (int d = 0; d < NO; d++)
						asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row + (d / 8) * HOP_BM * HOP_ROW_BYTES +
						                                                 (((d % 8) ^ (lane / 4)) * 16)),
						             "r"(pack2<E>(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]))
						             : "memory");
				}
				fence_async_shared();
				asm volatile("bar.sync %0, 128;\n" ::"r"(HOP_WG_BAR + w) : "memory");
				if (tid == 0) {
#pragma unroll
					for (int c = 0; c < VBOXES; c++)
						tma_store_2d(omap, sQ(b) + c * HOP_BM * HOP_ROW_BYTES + 64 * w * HOP_ROW_BYTES, it.h * DV + c * HOP_BOX,
						             it.t0 + q0 + 64 * w);
					tma_store_commit();
					stored = true;
				}
			} else {
#pragma unroll
				for (int i = 0; i < 2; i++) {
					const int row = qrow + 8 * i;
					if (row >= n) continue;
					E* dst = out + (long long)(it.t0 + row) * op + it.h * DV + 2 * (lane & 3);
#pragma unroll
					for (int d = 0; d < NO; d++)
						*reinterpret_cast<unsigned*>(dst + d * 8) = pack2<E>(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]);
				}
			}
			// The Q buffer is free once the stores have read it: with one
			// buffer now, with two after the next item's first tile.
			if (QBUF == 1) {
				if (tid == 0) {
					if (stored) tma_store_wait();
					stored = false;
					mbar_arrive(qfree(b));
				}
			} else {
				owed = b;
			}
		} while (false);
		for (; turn < turns; turn++) { // the turns this warpgroup has not taken
			take_turn();
			pass_turn();
		}
	}
	if (w == 0) take_turn(); // warpgroup 1's last pass
	if (tid == 0 && stored) tma_store_wait();
}
