// hop_attention, the warp-specialized flash attention body (sm_90a only)
// that flash_hopper (hopper.cu, GQA over the KV cache) and mla_hopper
// (mla_hopper.cu, DeepSeek-V2's MLA prefill) both run, each with its own
// source of Q, K and V tiles. Compiled after mma.cuh, flash.cuh
// (smem_addr, pack2, softmax_tile, rescale, p_frag) and hopper.cuh (the
// mbarrier ring, tensor copies, wgmma); hopper.cu's top comment describes
// the design, the numbers below are its tiles.

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
#define HOP_WAIT_EMPTY 4

// HopLayout is the shared memory of hop_attention<DQK, DV, BN, STAGES>: the
// Q tile, then per stage a K tile and a V tile, each a run of 64-column
// boxes of rows × 128 bytes (DQK/64 boxes of HOP_BM or BN rows, DV/64 of BN)
// of 2-byte elements, bf16 or f16.
template <int DQK, int DV, int BN, int STAGES> struct HopLayout {
	static constexpr int Q_BYTES = HOP_BM * DQK * 2;
	static constexpr int K_BYTES = BN * DQK * 2;
	static constexpr int V_BYTES = BN * DV * 2;
	static constexpr int ALIGN = 1024; // the 128-byte swizzle's period; the dynamic base is rounded up to it
	static constexpr int SMEM = Q_BYTES + STAGES * (K_BYTES + V_BYTES) + ALIGN;
};

// --- the kernel body --------------------------------------------------------

// hop_attention is flash attention of queries [q0, q0+HOP_BM) of the n new
// tokens of one row (token t0+i at position p0+i), query head h, over keys
// of DQK dims and values of DV dims in tiles of BN keys, STAGES of them in
// flight: hopper.cu's top comment tells how. Src brings the tiles by tensor
// copies, each completing on the barrier it is given:
//   load_q(dst, bar): the block's Q tile, DQK/64 boxes of HOP_BM rows;
//   load_k(dst, bar, j), load_v(dst, bar, j): key tile j (keys [j·BN,
//   j·BN+BN)), DQK/64 and DV/64 boxes of BN rows, out-of-range rows
//   anything finite or zero (they are masked, and V's past kend zeroed).
//   out E [T, heads·DV], pitch op; omap, when not null, a 2-D map over out
//   (box {HOP_BOX, 64}, the 128-byte swizzle) through which a warpgroup
//   whose 64 rows are all new tokens of the row stores them (the others
//   store directly). The caller has returned already when q0 ≥ n. status:
//   see hopper.cu.
// E is the element type of Q, K, V and out: bf16, or half_bits (f16, with
// wgmma's f16 form and P rounded to f16); everything else is as for bf16.
template <int DQK, int DV, int BN, int STAGES, typename Src, typename E>
__device__ __forceinline__ void hop_attention(const Src& src, E* out, int op, const TmaMap* omap, int t0, int n, int p0,
                                              int q0, int h, float scale_log2, int causal, int* status) {
	typedef HopLayout<DQK, DV, BN, STAGES> L;
	constexpr int KS = DQK / 16, PK = BN / 16, NO = DV / 8, NS = BN / 8;
	constexpr int VBOXES = DV / HOP_BOX;
	extern __shared__ unsigned char smem_raw[];
	__shared__ __align__(8) unsigned long long bars[1 + 3 * STAGES];

	const int kend = p0 + (causal ? min(q0 + HOP_BM, n) : n); // keys [0, kend) are read
	const int ntiles = (kend + BN - 1) / BN;

	const unsigned base = (smem_addr(smem_raw) + L::ALIGN - 1) & ~(unsigned)(L::ALIGN - 1);
	const unsigned sQ = base;
	auto sK = [&](int s) { return base + L::Q_BYTES + s * (L::K_BYTES + L::V_BYTES); };
	auto sV = [&](int s) { return base + L::Q_BYTES + s * (L::K_BYTES + L::V_BYTES) + L::K_BYTES; };
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
		src.load_q(sQ, barQ);
		for (int j = 0; j < ntiles; j++) {
			const int s = j % STAGES;
			if (j >= STAGES && !mbar_wait(empty(s), (j / STAGES - 1) & 1, status, HOP_WAIT_EMPTY, j)) return;
			mbar_expect_tx(kfull(s), L::K_BYTES);
			src.load_k(sK(s), kfull(s), j);
			mbar_expect_tx(vfull(s), L::V_BYTES);
			src.load_v(sV(s), vfull(s), j);
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
	auto tiles_of = [&](int wg) { return ((causal ? min(kend, p0 + q0 + 64 * wg + 64) : kend) + BN - 1) / BN; };
	const int nw = tiles_of(w);
	const unsigned qA = sQ + 64 * w * HOP_ROW_BYTES; // this warpgroup's rows of box 0 of Q

	// Turns (FA3's ping-pong): the two consumer warpgroups issue their
	// wgmmas in turn, each while the other runs its softmax, rather than
	// both at once and then both waiting. A turn is taken before a group of
	// wgmmas is issued (tile 0's Q·Kᵀ, each step's Q·Kᵀ and P·V, the last
	// P·V: nw + 1 turns) and passed right after. Warpgroup 0 goes first; a
	// warpgroup with fewer tiles (by one at most: the causal diagonal)
	// takes and passes the turns it lacks once done, and the last turn of
	// all is not passed, so that every arrival meets its wait.
	const int turns = max(tiles_of(0), tiles_of(1)) + 1;
	int turn = 0;
	auto take_turn = [&]() { asm volatile("bar.sync %0, 256;\n" ::"r"(HOP_TURN_BAR + w) : "memory"); };
	auto pass_turn = [&]() {
		if (++turn < turns || w == 0) asm volatile("bar.arrive %0, 256;\n" ::"r"(HOP_TURN_BAR + 1 - w) : "memory");
	};
	auto idle_turns = [&]() { // the turns this warpgroup has not taken
		while (turn < turns) {
			take_turn();
			pass_turn();
		}
	};
	if (w == 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(HOP_TURN_BAR) : "memory"); // warpgroup 0 first

	auto release = [&](int s) { // this warp's wgmmas no longer read stage s
		__syncwarp();
		if (lane == 0) mbar_arrive(empty(s));
	};
	// S = Q·Kᵀ over the tile in stage s: DQK/16 k-steps, 32 bytes apart in a
	// box, the next box after 4.
	auto issue_qk = [&](float (&sc)[NS][4], int s) {
#pragma unroll
		for (int k = 0; k < KS; k++) {
			const int c = k / 4, kk = k % 4;
			Wgmma<BN, E>::ss(sc, sw128_desc(qA + c * HOP_BM * HOP_ROW_BYTES + kk * 32, 16),
			                 sw128_desc(sK(s) + c * BN * HOP_ROW_BYTES + kk * 32, 16), k > 0);
		}
	};
	// O += P·V over the tile in stage s: k-steps of 16 keys (2048 bytes);
	// V is N-major, its 64-column boxes BN rows apart.
	auto issue_pv = [&](float (&o)[NO][4], const unsigned (&pa)[PK][4], int s) {
#pragma unroll
		for (int kk = 0; kk < PK; kk++)
			Wgmma<DV, E>::rs(o, pa[kk], sw128_desc(sV(s) + kk * 16 * HOP_ROW_BYTES, BN * HOP_ROW_BYTES));
	};
	// Mask keys past a row's position, or past kend, on tiles that cross
	// the warpgroup's diagonal or the end.
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
	// Zero the V rows of the tile in stage s at or past kend, for P·V.
	auto zero_tail = [&](int j, int s) {
		const int k0 = j * BN;
		if (k0 + BN <= kend) return;
		const int first = kend - k0, chunks = (BN - first) * (HOP_ROW_BYTES / 16);
		for (int i = tid; i < VBOXES * chunks; i += 128) {
			const int c = i / chunks, r = first + (i % chunks) / (HOP_ROW_BYTES / 16), x = i % (HOP_ROW_BYTES / 16);
			asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sV(s) + (c * BN + r) * HOP_ROW_BYTES + x * 16),
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
	// A wait that gives up passes the turns left on (idle_turns), so that
	// the other warpgroup winds down too instead of waiting for one forever.
	bool ok = mbar_wait(barQ, 0, status, HOP_WAIT_Q, -1) && mbar_wait(kfull(0), 0, status, HOP_WAIT_K, 0);
	if (!ok) return idle_turns();
	__syncwarp();

	// Tile 0's scores and p.
	take_turn();
	wg_fence();
	issue_qk(sc, 0);
	wg_commit();
	pass_turn();
	wg_wait<0>();
	keep(sc);
	mask(sc, 0);
	float alpha[2];
	softmax_tile<NS>(sc, st, scale_log2, alpha); // O is 0: alpha unused
#pragma unroll
	for (int kk = 0; kk < PK; kk++) p_frag<NS, E>(pa[kk], sc, kk);

	// Tiles 0 .. nw-2: S of tile j+1 in flight with, then its softmax
	// during, P·V of tile j.
	for (int j = 0; j + 1 < nw; j++) {
		const int s = j % STAGES, s1 = (j + 1) % STAGES;
		// Both waits come before either wgmma is issued: a wait that gives up
		// returns, and a return with wgmmas in flight is a divergent path on
		// which ptxas serializes every wgmma of the kernel (C7518). V of tile
		// j was copied before K of tile j+1, so waiting for it first costs
		// nothing.
		if (!mbar_wait(vfull(s), (j / STAGES) & 1, status, HOP_WAIT_V, j)) return idle_turns();
		if (!mbar_wait(kfull(s1), ((j + 1) / STAGES) & 1, status, HOP_WAIT_K, j + 1)) return idle_turns();
		__syncwarp();
		zero_tail(j, s);
		take_turn();
		wg_fence();
		issue_qk(sc, s1);
		wg_commit();
		wg_fence();
		issue_pv(o, pa, s);
		wg_commit();
		pass_turn();
		wg_wait<1>(); // S of tile j+1 is done, P·V of tile j may not be
		keep(sc);
		mask(sc, j + 1);
		softmax_tile<NS>(sc, st, scale_log2, alpha);
		wg_wait<0>();
		keep(o);
		keep(pa);
		release(s);
		rescale(o, alpha);
#pragma unroll
		for (int kk = 0; kk < PK; kk++) p_frag<NS, E>(pa[kk], sc, kk);
	}
	{ // P·V of the last tile
		const int j = nw - 1, s = j % STAGES;
		if (!mbar_wait(vfull(s), (j / STAGES) & 1, status, HOP_WAIT_V, j)) return idle_turns();
		__syncwarp();
		zero_tail(j, s);
		take_turn();
		wg_fence();
		issue_pv(o, pa, s);
		wg_commit();
		pass_turn();
		wg_wait<0>();
		keep(o);
		keep(pa);
		release(s);
	}
	// Tiles wholly above this warpgroup's diagonal: the other one reads
	// them; waiting for each copy keeps the empty arrivals in their phase.
	for (int j = nw; j < ntiles; j++) {
		if (!mbar_wait(kfull(j % STAGES), (j / STAGES) & 1, status, HOP_WAIT_K, j)) return idle_turns();
		release(j % STAGES);
	}
	idle_turns();

	// out = O / l for the rows that are new tokens of the row.
	float inv[2];
#pragma unroll
	for (int i = 0; i < 2; i++) inv[i] = 1.0f / quad_sum(st[i].l);
	if (omap && q0 + 64 * w + 64 <= n) {
		// Through shared memory: the warpgroup's rows of the Q tile, which
		// no wgmma reads any more, take its O in the layout the tensor
		// copies swizzle (the 16-byte chunk of column d·8 of row r at
		// chunk (d % 8) ^ (r % 8) of the row; each warp's stores then hit 32
		// different banks), then one thread stores the DV/64 boxes.
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const unsigned row = sQ + (64 * w + 16 * wi + lane / 4 + 8 * i) * HOP_ROW_BYTES + 4 * (lane & 3);
#pragma unroll
			for (int d = 0; d < NO; d++)
				asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row + (d / 8) * HOP_BM * HOP_ROW_BYTES + (((d % 8) ^ (lane / 4)) * 16)),
				             "r"(pack2<E>(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]))
				             : "memory");
		}
		fence_async_shared();
		asm volatile("bar.sync %0, 128;\n" ::"r"(HOP_WG_BAR + w) : "memory");
		if (tid == 0) {
#pragma unroll
			for (int c = 0; c < VBOXES; c++)
				tma_store_2d(omap, sQ + c * HOP_BM * HOP_ROW_BYTES + 64 * w * HOP_ROW_BYTES, h * DV + c * HOP_BOX, t0 + q0 + 64 * w);
			tma_store_wait();
		}
		return;
	}
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int row = qrow + 8 * i;
		if (row >= n) continue;
		E* dst = out + (long long)(t0 + row) * op + h * DV + 2 * (lane & 3);
#pragma unroll
		for (int d = 0; d < NO; d++)
			*reinterpret_cast<unsigned*>(dst + d * 8) = pack2<E>(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]);
	}
}
