// DeepSeek-V2 multi-head latent attention (MLA) on tensor cores: the
// prefill is attention.cuh's flash_prefill, the decode uses its DecodeSplit,
// and attn_merge (attention.cu) merges the decode splits.
//
// The latent cache holds, per position, c (R dims) then the rotated k_pe
// (DR dims), bf16 [B, maxSeq, R+DR]. kv_b_proj [H·(DN+DV), R] holds, per
// head h, W_UK[h] (DN rows) then W_UV[h] (DV rows). Head h's key of
// position s is (W_UK[h]·c_s, k_pe_s), its value W_UV[h]·c_s.

#include "mla.cuh"
#include "instances.cuh"

// MlaKV is flash_prefill's source for MLA prefill, the latents decompressed
// up front (one GEMM with kv_b_proj into rows of [H, DN+DV]: each head's
// k_nope, then its v): a head's key is its k_nope from that buffer followed
// by the k_pe all heads share, read from the cache; its value is its v.
template <int DN, int DR, int DV> struct MlaKV {
	const bf16* kv; // the head's k_nope at the row's position 0; its v DN further
	const bf16* pe; // k_pe at the row's position 0 of the cache
	int kvp, pep;   // pitches of kv and of the cache, elements
	__device__ void loadK(unsigned dst, int k0, int valid, int tid, int nthreads) const {
		typedef Tile<DN + DR> T;
		constexpr int NC = DN / 8; // chunks of k_nope
		for (int i = tid; i < BN * T::CHUNKS; i += nthreads) {
			const int r = i / T::CHUNKS, c = i - r * T::CHUNKS;
			const bool ok = r < valid;
			const long long key = k0 + r;
			const bf16* src = c < NC ? kv + key * kvp + c * 8 : pe + key * pep + (c - NC) * 8;
			cp16(T::at(dst, r, c), ok ? src : kv, ok);
		}
	}
	__device__ void loadV(unsigned dst, int k0, int valid, int tid, int nthreads) const {
		Tile<DV>::template load<BN>(dst, kv + DN + (long long)k0 * kvp, kvp, valid, tid, nthreads);
	}
};

// mla_prefill_n<DN>_r<DR>_v<DV>_w<W>_m<MT> is flash_prefill (causal) of MLA
// for rows r0 + blockIdx.z of the batch, query head blockIdx.y, over keys
// of DN+DR dims and values of DV: HF's DeepseekV2Attention with the keys
// and values decompressed, numerators p rounded to bf16 before P·V as
// SDPA's fused kernels do.
//   out bf16 [T, heads·DV], pitch op; q bf16 [T, heads·(DN+DR)], per head
//   q_nope then the rotated q_pe, pitch qp; kv bf16 [keys, heads·(DN+DV)],
//   pitch kvp: the decompressed positions 0..past[b]+n_b-1 of the rows
//   r0.. one after another (a row with no new tokens takes none), or with
//   kstride > 0 row b's at (b - r0)·kstride (rows past its keys unread);
//   cache
//   bf16 [B, maxSeq, rank+DR], the new latents already appended; start,
//   past as flash_prefill's.
// Launch: grid (ceil(max new tokens / BM), heads, rows), W·32 threads,
// shared BM·Tile<DN+DR>::ROW_BYTES + 2·BN·(Tile<DN+DR>::ROW_BYTES +
// Tile<DV>::ROW_BYTES) bytes.
#define MLA_PREFILL(NAME, DN, DR, DV, W, MT)                                                                  \
	extern "C" __global__ void __launch_bounds__(W * 32) NAME(                                                \
	    bf16* out, int op, const bf16* q, int qp, const bf16* kv, int kvp, const bf16* cache, int rank,       \
	    const int* start, const int* past, int r0, int maxSeq, float scale_log2, int kstride) {               \
		const int b = r0 + blockIdx.z;                                                                       \
		long long at = (long long)(b - r0) * kstride; /* the row's position 0 in kv */                       \
		for (int r = r0; kstride == 0 && r < b; r++)                                                         \
			if (start[r + 1] > start[r]) at += past[r] + start[r + 1] - start[r];                            \
		const int pitch = rank + DR;                                                                         \
		const MlaKV<DN, DR, DV> src{kv + at * kvp + blockIdx.y * (DN + DV),                                  \
		                            cache + (long long)b * maxSeq * pitch + rank, kvp, pitch};               \
		flash_prefill<DN + DR, DV, W, MT>(out, op, q, qp, src, start, past, b, scale_log2, 1);               \
	}
MLA_PREFILL_INSTANCES(MLA_PREFILL)

#define MLA_STAGES 2 // key tiles in flight in mla_decode: one is 64 × 1,152 bytes at R+DR = 576

// mla_decode is absorbed MLA decode, flash-decoding over the latent cache:
// one block per split of one row's cache, all the row's query heads (at
// most 16: the rows of one m-tile) against the latents that every head
// shares. With q_lat[h] = W_UK[h]ᵀ·q_nope[h] (R dims, computed before) and
// q_pe[h], the score of position s is q_lat[h]·c_s + q_pe[h]·k_pe_s: one
// product of the 16 × (R+DR) queries with the key tile. The block
// accumulates o_lat[h] = Σ_s p_s·c_s (R dims); W_UV is applied after the
// merge (out[h] = W_UV[h]·o_lat[h]), so each cached byte is read once for
// all heads.
//
// Key tiles of BN positions come through cp.async, MLA_STAGES in flight
// (DecodeSplit, one tile per stage: the values are the keys' first R
// columns). The 4 warps split the work of a tile two ways: for Q·Kᵀ each
// takes a quarter of the R+DR dims (its Q fragments stay in registers, 8
// independent accumulators of 64 keys), and the partial scores are summed
// through shared memory in warp order, so that every warp holds the same
// full scores, the same running max and the same p (rounded to bf16 as
// SDPA's fused kernels round it); for P·V each takes a quarter of the R
// output dims. The new token's latent is appended by the block whose split
// holds it (DecodeSplit), so no other kernel runs first.
//
// Rounding, against HF's decompressed form: HF rounds k_nope = W_UK·c to
// bf16 and takes q_nope·k_nope in f32; this rounds q_lat = W_UKᵀ·q_nope to
// bf16 and takes q_lat·c in f32. Each error is a sum of independent
// roundings of relative size 2⁻⁹ over the terms of one product: HF's has
// variance 2⁻¹⁸·Σ_j q_j²·k_j² ≈ 2⁻¹⁸·DN·E[q²]·R·E[W²]·E[c²] (k_j sums R
// terms of W·c), this one 2⁻¹⁸·Σ_i q_lat,i²·c_i² ≈ 2⁻¹⁸·R·DN·E[W²]·E[q²]·
// E[c²] (q_lat,i sums DN terms of W·q): the same size. On the value side HF
// rounds v = W_UV·c (then averages it by p) and the output; this rounds
// o_lat, whose error W_UV spreads into an error of relative size 2⁻⁹ of the
// output, and the output: again the same order, one rounding of the output
// more.
//   olat bf16 [B, heads·R]: o_lat, written when there is one split; part
//   f32 [B·heads, splits, R], stats f32 [B·heads, splits, 2]: each split's
//   unnormalised o_lat and (max·scale_log2, sum), for attn_merge (D = R)
//   when there are several; qlat bf16 [B·heads, R]; qpe bf16: head h of row
//   b's q_pe at qpe + b·qp + h·qhs; kn bf16 [B, R+DR], pitch kp: the new
//   latents; cache bf16 [B, maxSeq, R+DR]; past i32 [B]: positions cached
//   before the new one. A length past maxSeq traps.
// Launch: grid (splits, 1, B), DEC_WARPS·32 threads, shared
// (16 + MLA_STAGES·BN)·Tile<R+DR>::ROW_BYTES bytes, plus MLA_RED_BYTES
// when 16 query rows are fewer bytes than that (the partial scores then
// follow the stages; else they reuse the query rows).
#define MLA_RED_BYTES (DEC_WARPS * (BN / 8) * 2 * 32 * 8)

template <int R, int DR>
__device__ void mla_decode(bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs,
                           const bf16* kn, int kp, bf16* cache, const int* past, int heads, int maxSeq, int chunk,
                           float scale_log2) {
	constexpr int W = R + DR, KS = W / 16, KSW = (KS + DEC_WARPS - 1) / DEC_WARPS, NT = BN / 8;
	constexpr int DP = R / 16, DPW = (DP + DEC_WARPS - 1) / DEC_WARPS;
	typedef Tile<W> T;
	typedef DecodeSplit<W, MLA_STAGES, true> Split;
	constexpr bool RED_IN_Q = 16 * T::ROW_BYTES >= MLA_RED_BYTES;
	extern __shared__ __align__(128) unsigned char smem[];
	const Split sp(smem, kn, kp, nullptr, 0, cache, cache, past, heads, 1, maxSeq, chunk);
	const int b = sp.b, split = blockIdx.x, splits = gridDim.x;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int nkeys = sp.nkeys, ntiles = sp.ntiles;
	// The partial scores, [warp][n-tile][row half][lane], as C fragments.
	float2* red = reinterpret_cast<float2*>(smem + (RED_IN_Q ? 0 : (16 + MLA_STAGES * BN) * T::ROW_BYTES));
	auto redAt = [&](int w, int nt, int i) { return ((w * NT + nt) * 2 + i) * 32 + lane; };

	// The query rows: q_lat then q_pe of each head, zero past the heads.
	for (int i = tid; i < 16 * T::CHUNKS; i += Split::THREADS) {
		const int r = i / T::CHUNKS, c = i - r * T::CHUNKS;
		const bool ok = r < heads;
		const bf16* src = c < R / 8 ? qlat + ((long long)b * heads + r) * R + c * 8
		                            : qpe + (long long)b * qp + r * qhs + (c - R / 8) * 8;
		cp16(T::at(sp.sQ, r, c), ok ? src : qlat, ok);
	}
	sp.prime();

	const int ks0 = warp * KSW, dp0 = warp * DPW; // the warp's first k-step of Q·Kᵀ, dim pair of P·V
	unsigned qa[KSW][4];
	float o[2 * DPW][4];
	RowState st[2] = {{NEG_INF, 0.0f}, {NEG_INF, 0.0f}};
#pragma unroll
	for (int d = 0; d < 2 * DPW; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

	for (int j = 0; j < ntiles; j++) {
		sp.next(j);
		if (j == 0) {
#pragma unroll
			for (int k = 0; k < KSW; k++)
				if (ks0 + k < KS) ldsm_x4(qa[k], T::at(sp.sQ, lane & 15, (ks0 + k) * 2 + (lane >> 4)));
			if (RED_IN_Q) __syncthreads(); // every warp has its queries before red overwrites them
		}
		const unsigned kT = sp.sK(j % MLA_STAGES);
		float s[NT][4];
#pragma unroll
		for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
		for (int k = 0; k < KSW; k++) {
			if (ks0 + k >= KS) break;
#pragma unroll
			for (int np = 0; np < NT / 2; np++) {
				unsigned kb[4];
				ldsm_x4(kb, T::at(kT, np * 16 + (lane & 7) + ((lane >> 4) << 3), (ks0 + k) * 2 + ((lane >> 3) & 1)));
				mma16816(s[2 * np], qa[k], kb[0], kb[1]);
				mma16816(s[2 * np + 1], qa[k], kb[2], kb[3]);
			}
		}
		// Sum the warps' partial scores, in warp order in every warp.
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int i = 0; i < 2; i++) red[redAt(warp, nt, i)] = make_float2(s[nt][2 * i], s[nt][2 * i + 1]);
		__syncthreads();
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int i = 0; i < 2; i++) {
				float2 v = red[redAt(0, nt, i)];
#pragma unroll
				for (int w = 1; w < DEC_WARPS; w++) {
					const float2 x = red[redAt(w, nt, i)];
					v.x += x.x;
					v.y += x.y;
				}
				s[nt][2 * i] = v.x;
				s[nt][2 * i + 1] = v.y;
			}
		if ((j + 1) * BN > nkeys) {
#pragma unroll
			for (int nt = 0; nt < NT; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					if (j * BN + nt * 8 + 2 * (lane & 3) + (e & 1) >= nkeys) s[nt][e] = NEG_INF;
		}
		float alpha[2];
		softmax_tile<NT>(s, st, scale_log2, alpha);
		rescale(o, alpha);
		// o_lat += P·C over the warp's dims; C is the tile's first R columns.
#pragma unroll
		for (int kk = 0; kk < NT / 2; kk++) {
			unsigned pa[4];
			p_frag<NT>(pa, s, kk);
			mla_pc<R, T>(o, pa, kT, kk, dp0, lane);
		}
		__syncthreads(); // the stage, and red, are free again
	}
	cp_wait<0>();

	// Every warp holds the rows' whole state; each writes its dims.
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = (lane >> 2) + i * 8;
		const float l = quad_sum(st[i].l);
		if (r >= heads) continue;
		mla_split_out<R>(o, i, st[i].m * scale_log2, l, (long long)b * heads + r, splits, split, dp0, warp, lane, olat, part,
		                 stats);
	}
}

#define MLA_DECODE(NAME, R, DR)                                                                                 \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) NAME(                                        \
	    bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs, const bf16* kn, \
	    int kp, bf16* cache, const int* past, int heads, int maxSeq, int chunk, float scale_log2) {             \
		grid_wait();                                                                                           \
		grid_release();                                                                                        \
		mla_decode<R, DR>(olat, part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads, maxSeq, chunk,    \
		                  scale_log2);                                                                      \
	}
MLA_DECODE_INSTANCES(MLA_DECODE)

// mla_absorb is absorbed MLA decode's per-head projections on tensor cores,
// a kernel launched to overlap the one before it (no cuBLAS batched GEMM,
// which cannot): for every head h and row b < M ≤ 16
//   c[b, h·sc + n] = Σ_k a[b, h·sa + k] · B_h(k, n),   n < N, k < K,
// B_h(k, n) = w[h·sw + n·wp + k] with BT (the rows of w are n: out =
// W_UV[h]·o_lat, w at kv_b_proj's first W_UV row) and w[h·sw + k·wp + n]
// without (the rows of w are k: q_lat = W_UK[h]ᵀ·q_nope, w at kv_b_proj).
// Block (x, h) computes columns [x·NT, x·NT + NT) of head h for all rows:
// its NT columns of w over all of K are requested before grid_wait (no
// kernel writes them), a's 16 rows (zero past M) after it; each warp
// multiplies its n-tiles over its share of K (KSPLIT warps split K, in
// 16-wide steps taken in turn), and split sums meet in shared memory,
// added in k-group order. Sums in f32, c rounded once to bf16 (as cuBLAS
// rounds; the order of the sums differs from cuBLAS's).
//   c, a, w bf16; pitches cp, ap, wp and strides sc, sa, sw in elements,
//   each a multiple of 8, the pointers 16-byte aligned; K a multiple of 16
//   and N of 8.
// Launch: grid (ceil(N / NT), heads), 128 threads, shared
// mla_absorb_shared (host: mlaAbsorbConfig.shared).
template <int BT, int NT, int KSPLIT>
__device__ void mla_absorb(bf16* c, int cp, long long sc, const bf16* a, int ap, long long sa, const bf16* w, int wp,
                           long long sw, int M, int N, int K) {
	extern __shared__ __align__(16) unsigned char smem[];
	constexpr int WARPS = 4, NW = WARPS / KSPLIT, NPW = NT / 8 / NW; // warps along n; n-tiles of a warp
	static_assert(NPW * NW * 8 == NT && NW * KSPLIT == WARPS, "NT is 8·(warps along n)·(n-tiles a warp)");
	const int h = blockIdx.y, n0 = blockIdx.x * NT, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int ka = K + 8, nb = NT + 8; // rows in shared memory, padded by 16 bytes: no bank conflicts below
	bf16* As = reinterpret_cast<bf16*>(smem); // [16][ka]
	bf16* Bs = As + 16 * ka;                  // BT: [NT][ka]; else [K][nb]
	const bf16* wh = w + h * sw;
	const int kChunks = K / 8;
	if constexpr (BT) {
		for (int i = tid; i < NT * kChunks; i += blockDim.x) {
			const int r = i / kChunks, ch = i - r * kChunks;
			const bool ok = n0 + r < N;
			cp16(smem_addr(Bs + r * ka + ch * 8), ok ? wh + (long long)(n0 + r) * wp + ch * 8 : wh, ok);
		}
	} else {
		constexpr int chunks = NT / 8;
		for (int i = tid; i < K * chunks; i += blockDim.x) {
			const int r = i / chunks, ch = i - r * chunks;
			const bool ok = n0 + ch * 8 < N;
			cp16(smem_addr(Bs + r * nb + ch * 8), ok ? wh + (long long)r * wp + n0 + ch * 8 : wh, ok);
		}
	}
	cp_commit();
	grid_wait();
	grid_release();
	const bf16* ah = a + h * sa;
	for (int i = tid; i < 16 * kChunks; i += blockDim.x) {
		const int r = i / kChunks, ch = i - r * kChunks;
		const bool ok = r < M;
		cp16(smem_addr(As + r * ka + ch * 8), ok ? ah + (long long)r * ap + ch * 8 : ah, ok);
	}
	cp_commit();
	cp_wait<0>();
	__syncthreads();

	const int g = lane >> 2, t = lane & 3, wn = warp % NW, wk = warp / NW;
	const unsigned short* Bu = reinterpret_cast<const unsigned short*>(Bs);
	float acc[NPW][4] = {};
	for (int k0 = wk * 16; k0 < K; k0 += 16 * KSPLIT) {
		unsigned af[4];
		af[0] = *reinterpret_cast<const unsigned*>(As + g * ka + k0 + 2 * t);
		af[1] = *reinterpret_cast<const unsigned*>(As + (g + 8) * ka + k0 + 2 * t);
		af[2] = *reinterpret_cast<const unsigned*>(As + g * ka + k0 + 2 * t + 8);
		af[3] = *reinterpret_cast<const unsigned*>(As + (g + 8) * ka + k0 + 2 * t + 8);
#pragma unroll
		for (int j = 0; j < NPW; j++) {
			const int n = (wn * NPW + j) * 8 + g; // the B column this thread loads
			unsigned b0, b1;
			if constexpr (BT) {
				b0 = *reinterpret_cast<const unsigned*>(Bs + n * ka + k0 + 2 * t);
				b1 = *reinterpret_cast<const unsigned*>(Bs + n * ka + k0 + 2 * t + 8);
			} else {
				const int k = k0 + 2 * t;
				b0 = Bu[k * nb + n] | (unsigned)Bu[(k + 1) * nb + n] << 16;
				b1 = Bu[(k + 8) * nb + n] | (unsigned)Bu[(k + 9) * nb + n] << 16;
			}
			mma16816(acc[j], af, b0, b1);
		}
	}
	bf16* ch = c + h * sc + n0;
	if constexpr (KSPLIT == 1) {
#pragma unroll
		for (int j = 0; j < NPW; j++) {
			const int col = (wn * NPW + j) * 8 + 2 * t;
			if (n0 + col >= N) continue;
			if (g < M) *reinterpret_cast<unsigned*>(ch + (long long)g * cp + col) = pack2(acc[j][0], acc[j][1]);
			if (g + 8 < M) *reinterpret_cast<unsigned*>(ch + (long long)(g + 8) * cp + col) = pack2(acc[j][2], acc[j][3]);
		}
	} else {
		__syncthreads(); // every warp is done with As: its bytes take the split sums
		float* red = reinterpret_cast<float*>(smem); // [KSPLIT][16][NT]
#pragma unroll
		for (int j = 0; j < NPW; j++) {
			const int col = (wn * NPW + j) * 8 + 2 * t;
			float* r = red + wk * 16 * NT;
			r[g * NT + col] = acc[j][0];
			r[g * NT + col + 1] = acc[j][1];
			r[(g + 8) * NT + col] = acc[j][2];
			r[(g + 8) * NT + col + 1] = acc[j][3];
		}
		__syncthreads();
		for (int i = tid; i < 16 * NT / 2; i += blockDim.x) {
			const int row = i / (NT / 2), col = (i - row * (NT / 2)) * 2;
			if (row >= M || n0 + col >= N) continue;
			float s0 = 0, s1 = 0;
#pragma unroll
			for (int q = 0; q < KSPLIT; q++) {
				s0 += red[(q * 16 + row) * NT + col];
				s1 += red[(q * 16 + row) * NT + col + 1];
			}
			*reinterpret_cast<unsigned*>(ch + (long long)row * cp + col) = pack2(s0, s1);
		}
	}
}

// mla_absorb_t16: BT (1), 16 columns a block, four warps splitting K (out =
// W_UV[h]·o_lat: K = rank); mla_absorb_n64: w's rows are k, 64 columns a
// block, a warp 16 of them over all of K (q_lat = W_UK[h]ᵀ·q_nope: K =
// the nope dims).
#define MLA_ABSORB(NAME, BT, NT, KSPLIT)                                                                        \
	extern "C" __global__ void __launch_bounds__(128)                                                          \
	    NAME(bf16* c, int cp, long long sc, const bf16* a, int ap, long long sa, const bf16* w, int wp,         \
	         long long sw, int M, int N, int K) {                                                               \
		mla_absorb<BT, NT, KSPLIT>(c, cp, sc, a, ap, sa, w, wp, sw, M, N, K);                                    \
	}
MLA_ABSORB_INSTANCES(MLA_ABSORB)
