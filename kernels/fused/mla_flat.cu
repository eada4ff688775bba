// mla_decode's "flat" variant (sm_90a: thread-block clusters): absorbed MLA
// decode in three overlapped launches, none of them cuBLAS, for the few
// rows of a decode step, where the other variants' four launches (two
// batched GEMMs that cannot overlap the kernels around them, the split
// kernel, attn_merge) cost more than the bytes they move.
//
//   1. mla_qlat: q_lat = W_UK[h]ᵀ·q_nope[h] of every row and head, rounded
//      to bf16 as the batched GEMM rounds it. Each block takes 32 latent
//      columns of one head for up to 8 rows; it loads its weights (the
//      head's DN rows of those columns) before its grid_wait, under the
//      kernel before it. mla_decode_rope runs it as mla_qlat_rope, whose
//      grid holds rms_norm_rope's blocks too: the norm and ropes and q_lat
//      in one launch.
//   2. mla_flat: the split attention, MlaKeyTiles (mla.cuh) over the latent
//      cache, every split of a row the same number of keys (the last
//      fewer), counted from
//      the row's length on the device (not from the cache's capacity), so
//      that all blocks finish together at any length and a captured step
//      replays. A block queues its first tiles before its grid_wait (the
//      cached positions are written by earlier steps; the new latent, which
//      the kernel before may still be writing, follows after the wait), by
//      bulk copies (MlaKeyTiles' BULK: a row a copy, issued by one warp), so
//      that issuing them takes a few instructions, not a cp.async of 16
//      bytes a thread at a time.
//      The splits come in clusters of MLF_CLUSTER blocks that merge their
//      outputs through distributed shared memory: each block scales its
//      unnormalised o_lat to the cluster's max, and block k of the cluster
//      sums the k-th slice of the dims over the cluster's blocks; so a row
//      writes one f32 o_lat per cluster, not per split (MLF_CLUSTER times
//      fewer bytes to write and merge).
//   3. mla_out: per (row, head), the clusters' o_lat merged by their
//      log-sum-exp (attn_merge's rule), rounded to bf16, then out = W_UV[h]·
//      o_lat rounded to bf16 as the second batched GEMM rounds it. A block
//      takes MO_ROWS output dims of one head and row and loads those W_UV
//      rows before its grid_wait.
// With -DMLF_PROBE=1 (a measurement build: mlaFlatOpts, TestMLAFlatProbe)
// thread 0 of every block of the three records its phase boundaries
// (MlaProbe, mla_probe.cuh); the normal build has none of it. With
// -DMLF_CP=1 (a test build: TestMLAFlatBulk) mla_flat loads its key tiles
// by cp.async as mla_decode_keys does, the reference its bulk copies are
// held to bit for bit.
// Rounding: mla_decode's (mla.cu): q_lat in bf16, each product in f32, p in
// bf16 for P·C, o_lat merged in f32 and rounded once before W_UV, the
// output rounded once; only the order of f32 sums differs.

#include "hopper.cuh"
#include "mla.cuh"
#include "instances.cuh"
#include "norm_rope.cuh"

#ifdef MLF_CP
#define MLF_BULK false // mla_flat's key tiles by cp.async (the test build)
#else
#define MLF_BULK true // mla_flat's key tiles by bulk copies
#endif
#define MLF_CLUSTER 8                 // blocks of a cluster: the splits that merge in shared memory
#define MLF_STATS (16 * 8)            // after MlaKeyTiles' bytes: each row's (max, sum) for the cluster
#define QL_COLS 32                    // latent columns of a mla_qlat block: 4 threads of 8
#define QL_ROWS 8                     // batch rows of a mla_qlat block
#define QL_MAX_DN 256                 // the most nope dims mla_qlat takes (4 weight rows a thread)
#define MO_ROWS 16                    // output dims of a mla_out block: 4 a warp
#define MO_MAX_R 512                  // the largest rank mla_out takes (two 16-byte chunks a lane)
#define MO_MAX_P 128                  // the most clusters a row mla_out merges: one a thread

__device__ __forceinline__ float2 ld_cluster2(unsigned addr) {
	float2 v;
	asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
	return v;
}
__device__ __forceinline__ float4 ld_cluster4(unsigned addr) {
	float4 v;
	asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
	             : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
	             : "r"(addr)
	             : "memory");
	return v;
}

// mla_qlat: qlat[b, h·R + c] = Σ_j q[b, h·qhs + j]·w[h·(DN+DV) + j, c] over
// the DN nope dims j, rounded to bf16 (kv_b_proj's W_UK[h] is its rows
// h·(DN+DV) .. + DN). Thread t of a block takes 8 columns (t % 4) and the
// weight rows t / 4, + 64, ...; the 8 row groups of a warp are summed by
// shuffles, the 8 warps through shared memory in warp order.
//   qlat bf16 [B, heads·R]; q bf16 [B, ·], pitch qp, head h's q_nope at
//   h·qhs; w bf16 [heads·(DN+DV), R]. DN ≤ QL_MAX_DN, R a multiple of
//   QL_COLS.
// Launch: grid (R / QL_COLS, heads, ceil(B / QL_ROWS)), 256 threads.
// The device function is the block at (cx, h, bz) of that grid, with its
// 256 threads (it syncs), so that mla_qlat_rope runs it for some of its
// blocks.
__device__ __forceinline__ void mla_qlat_block(bf16* qlat, const bf16* q, int qp, int qhs, const bf16* w, int dn,
                                               int dv, int R, int heads, int B, int cx, int h, int bz) {
	__shared__ float qs[QL_ROWS][QL_MAX_DN];
	__shared__ float red[8][QL_ROWS][QL_COLS];
	const MlaProbe probe(MLA_PROBE_QLAT);
	const int c0 = cx * QL_COLS, b0 = bz * QL_ROWS, nb = min(QL_ROWS, B - b0);
	const int t = threadIdx.x, cc = t & 3, rg = t >> 2, lane = t & 31, warp = t >> 5;
	const bf16* wh = w + (long long)h * (dn + dv) * R + c0 + cc * 8;
	constexpr int J = QL_MAX_DN / 64;
	uint4 wr[J]; // the weights no kernel writes: loaded under the kernel before
#pragma unroll
	for (int k = 0; k < J; k++) {
		const int j = rg + 64 * k;
		wr[k] = j < dn ? *reinterpret_cast<const uint4*>(wh + (long long)j * R) : make_uint4(0, 0, 0, 0);
	}
	probe.stamp(MLA_PRELOADED);
	grid_wait();
	probe.stamp(MLA_WAITED);
	grid_release();
	for (int i = t; i < nb * dn; i += blockDim.x) {
		const int bb = i / dn, j = i - bb * dn;
		qs[bb][j] = __bfloat162float(q[(long long)(b0 + bb) * qp + (long long)h * qhs + j]);
	}
	__syncthreads();
	float acc[QL_ROWS][8];
#pragma unroll
	for (int bb = 0; bb < QL_ROWS; bb++)
#pragma unroll
		for (int e = 0; e < 8; e++) acc[bb][e] = 0.0f;
#pragma unroll
	for (int k = 0; k < J; k++) {
		const int j = rg + 64 * k;
		if (j >= dn) break;
		const bf16* w8 = reinterpret_cast<const bf16*>(&wr[k]);
		float wf[8];
#pragma unroll
		for (int e = 0; e < 8; e++) wf[e] = __bfloat162float(w8[e]);
#pragma unroll
		for (int bb = 0; bb < QL_ROWS; bb++) {
			if (bb >= nb) break;
			const float qv = qs[bb][j];
#pragma unroll
			for (int e = 0; e < 8; e++) acc[bb][e] = fmaf(qv, wf[e], acc[bb][e]);
		}
	}
#pragma unroll
	for (int bb = 0; bb < QL_ROWS; bb++) {
		if (bb >= nb) break;
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float v = acc[bb][e];
			v += __shfl_xor_sync(0xffffffffu, v, 4);
			v += __shfl_xor_sync(0xffffffffu, v, 8);
			v += __shfl_xor_sync(0xffffffffu, v, 16);
			if (lane < 4) red[warp][bb][cc * 8 + e] = v;
		}
	}
	__syncthreads();
	for (int i = t; i < nb * QL_COLS; i += blockDim.x) {
		const int bb = i / QL_COLS, c = i - bb * QL_COLS;
		float v = red[0][bb][c];
#pragma unroll
		for (int wq = 1; wq < 8; wq++) v += red[wq][bb][c];
		qlat[(long long)(b0 + bb) * heads * R + (long long)h * R + c0 + c] = __float2bfloat16(v);
	}
	probe.stamp(MLA_EXIT);
}

extern "C" __global__ void __launch_bounds__(256)
    mla_qlat(bf16* qlat, const bf16* q, int qp, int qhs, const bf16* w, int dn, int dv, int R, int heads, int B) {
	mla_qlat_block(qlat, q, qp, qhs, w, dn, dv, R, heads, B, blockIdx.x, blockIdx.y, blockIdx.z);
}

// mla_qlat_rope is rms_norm_rope (norm_rope.cuh) and mla_qlat in one
// launch: the op mla_decode_rope's first step, where the two were two
// dependent launches. mla_qlat reads q's nope dims only, which the norm and
// ropes leave, and writes qlat, which they do not read, so the blocks of
// both run side by side; each calls its kernel's device function with that
// kernel's arguments and block coordinates, so its results are bit for bit
// that kernel's (the rope loops stride over 256 threads, which changes no
// element's arithmetic; rms_norm sums over normT threads, the other warps
// adding zeros, as rms_norm_rope's wider blocks do).
//   qlat, wkvb (mla_qlat's w), dn, dv, B: mla_qlat's; q .. dim:
//   rms_norm_rope's, q also mla_qlat's (qp its pitch, hstride its qhs) and
//   rank its R.
// Launch: grid 2·B + (R / QL_COLS)·heads·ceil(B / QL_ROWS), 1-D (B rows of
// one token each): block i < 2·B is rms_norm_rope's block (i / 2, i % 2),
// the others mla_qlat's in its grid's x, y, z order; 256 threads, which
// must be at least rms_norm_rope's block for the call (normT and the rope
// loop's threads).
template <bool INTERLEAVED, typename TW, int VEC, int NV, int RVEC>
__device__ __forceinline__ void mla_qlat_rope(bf16* qlat, const bf16* wkvb, int dn, int dv, int B, bf16* q, int qp,
                                              int heads, int hstride, int offset, bf16* kv, int kvp, const TW* w,
                                              int rank, float eps, int normT, const int* pos, const float* cosT,
                                              const float* sinT, int cspitch, int maxPos, int dim) {
	const int nr = 2 * B, i = blockIdx.x;
	if (i < nr) {
		grid_wait();
		grid_release();
		rms_norm_rope<INTERLEAVED, TW, VEC, NV, RVEC>(q, qp, heads, hstride, offset, kv, kvp, w, rank, eps, normT,
		                                              pos, cosT, sinT, cspitch, maxPos, dim, i / 2, i % 2);
		return;
	}
	const int j = i - nr, xs = rank / QL_COLS;
	mla_qlat_block(qlat, q, qp, hstride, wkvb, dn, dv, rank, heads, B, j % xs, j / xs % heads, j / (xs * heads));
}

#define MLA_QLAT_ROPE(NAME, INTERLEAVED, TW, V, NV, RV)                                                              \
	extern "C" __global__ void __launch_bounds__(256)                                                               \
	    NAME(bf16* qlat, const bf16* wkvb, int dn, int dv, int B, bf16* q, int qp, int heads, int hstride, int offset, \
	         bf16* kv, int kvp, const TW* w, int rank, float eps, int normT, const int* pos, const float* cosT,      \
	         const float* sinT, int cspitch, int maxPos, int dim) {                                                  \
		mla_qlat_rope<INTERLEAVED, TW, V, NV, RV>(qlat, wkvb, dn, dv, B, q, qp, heads, hstride, offset, kv, kvp, w, \
		                                          rank, eps, normT, pos, cosT, sinT, cspitch, maxPos, dim);        \
	}
MLA_QLAT_ROPE_INSTANCES(MLA_QLAT_ROPE)

// mla_flat splits row b = blockIdx.z's keys into gridDim.x splits of equal
// length (the last shorter), in clusters of MLF_CLUSTER, and writes each cluster's o_lat
// (unnormalised, scaled to the cluster's max) and (max·scale_log2, sum).
//   part f32 [B·heads, P, R], stats f32 [B·heads, P, 2], P = gridDim.x /
//   MLF_CLUSTER; qlat bf16 [B, heads·R]; qpe, qp, qhs, kn, kp, cache, past,
//   maxSeq, scale_log2: as mla_decode's (mla.cu). A length past maxSeq
//   traps.
// Launch: grid (MLF_CLUSTER·P, 1, B), DEC_WARPS·32 threads, shared
// MlaKeyTiles<R, DR, STAGES, true>::SHARED + MLF_STATS bytes: 16·Tile<R+DR>::
// ROW_BYTES of queries, STAGES·MLK_BN·MlkRows<R+DR>::ROW_BYTES of keys,
// MLK_EXTRA, the stages' mbarriers (8·STAGES bytes rounded up to 16), the
// rows' (max, sum); the MLF_CP build needs less (no padding, no mbarriers).
template <int R, int DR, int STAGES>
__device__ void mla_flat(float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs, const bf16* kn,
                         int kp, bf16* cache, const int* past, int heads, int maxSeq, float scale_log2) {
	typedef MlaKeyTiles<R, DR, STAGES, MLF_BULK> Tiles;
	constexpr int W = R + DR, DPW = Tiles::DPW, OP = R + 8; // OP: a row of the cluster's o_lat buffer, f32, padded
	constexpr int SLICE = R / MLF_CLUSTER;                  // dims a block of the cluster sums
	static_assert(R % (4 * MLF_CLUSTER) == 0, "each block of a cluster sums whole float4s of the dims");
	static_assert(16 * OP * 4 <= STAGES * Tiles::STAGE_BYTES, "the cluster's o_lat fits in the stages");
	extern __shared__ __align__(128) unsigned char smem[];
	const MlaProbe probe(MLA_PROBE_FLAT);
	const int b = blockIdx.z, split = blockIdx.x, splits = gridDim.x;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int len = past[b] + 1; // the step's inputs, written before any kernel of the step
	if (len < 1 || len > maxSeq) __trap();
	const int chunk = (len + splits - 1) / splits; // not whole tiles: the bytes, not the tiles, are what is shared out
	const int k0 = split * chunk, nkeys = max(0, min(k0 + chunk, len) - k0), newAt = len - 1 - k0;
	bf16* row = cache + (long long)b * maxSeq * W;
	const bf16* kNew = kn + (long long)b * kp;
	const Tiles tiles(smem, row + (long long)k0 * W, kNew, nkeys, newAt);
	tiles.probe = probe;

	// Under the kernel before: the cached positions of the first tiles, a
	// tile a stage (a short split, all of it).
	tiles.initBars();
#pragma unroll
	for (int j = 0; j < STAGES; j++) {
		if (j < tiles.tiles()) tiles.load(j, true);
		if constexpr (!MLF_BULK) cp_commit(); // a cp.async group a stage
	}
	probe.stamp(MLA_PRELOADED);
	probe.note(MLA_TILES, tiles.tiles());
	probe.note(MLA_KEYS, nkeys);
	grid_wait();
	probe.stamp(MLA_WAITED);
	grid_release();
	if (newAt >= 0 && newAt < nkeys) {
		for (int i = tid; i < W / 8; i += Tiles::THREADS)
			*reinterpret_cast<uint4*>(row + (long long)(len - 1) * W + i * 8) = *reinterpret_cast<const uint4*>(kNew + i * 8);
		if (newAt < STAGES * MLK_BN) tiles.newRow(newAt / MLK_BN);
	}
	tiles.loadQ(qlat + (long long)b * heads * R, qpe + (long long)b * qp, qhs, heads);
	cp_commit();
	probe.stamp(MLA_QUEUED);
	float o[2 * DPW][4];
	RowState st[2];
	tiles.run(o, st, scale_log2, STAGES);
	probe.stamp(MLA_RUN_DONE);
	float l[2];
	tiles.sums(st, l);

	// The cluster's max and sum of each row, from every block's.
	float* rowStat = reinterpret_cast<float*>(smem + Tiles::SHARED);
	const float mine[2] = {l[0] > 0.0f ? st[0].m * scale_log2 : NEG_INF, l[1] > 0.0f ? st[1].m * scale_log2 : NEG_INF};
	if (warp == 0 && (lane & 3) == 0)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			rowStat[2 * ((lane >> 2) + 8 * i)] = mine[i];
			rowStat[2 * ((lane >> 2) + 8 * i) + 1] = l[i];
		}
	probe.stamp(MLA_SUMS);
	cluster_sync();
	probe.stamp(MLA_SYNC1);
	float f[2], M[2], L[2];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const unsigned at = smem_addr(rowStat + 2 * ((lane >> 2) + 8 * i));
		float2 ml[MLF_CLUSTER]; // every load in flight at once
#pragma unroll
		for (int q = 0; q < MLF_CLUSTER; q++) ml[q] = ld_cluster2(cluster_at(at, q));
		M[i] = NEG_INF;
#pragma unroll
		for (int q = 0; q < MLF_CLUSTER; q++)
			if (ml[q].y > 0.0f) M[i] = fmaxf(M[i], ml[q].x);
		L[i] = 0.0f;
#pragma unroll
		for (int q = 0; q < MLF_CLUSTER; q++)
			if (ml[q].y > 0.0f) L[i] += ml[q].y * exp2f(ml[q].x - M[i]);
		f[i] = l[i] > 0.0f ? exp2f(mine[i] - M[i]) : 0.0f;
	}

	// This block's o_lat scaled to the cluster's max, into the stages.
	float* ob = reinterpret_cast<float*>(smem + 16 * Tiles::T::ROW_BYTES);
	const int dp0 = warp * DPW;
#pragma unroll
	for (int x = 0; x < DPW; x++) {
		const int dp = dp0 + x;
		if (dp >= R / 16) break;
#pragma unroll
		for (int hh = 0; hh < 2; hh++)
#pragma unroll
			for (int i = 0; i < 2; i++)
				*reinterpret_cast<float2*>(ob + ((lane >> 2) + 8 * i) * OP + dp * 16 + hh * 8 + 2 * (lane & 3)) =
				    make_float2(o[2 * x + hh][2 * i] * f[i], o[2 * x + hh][2 * i + 1] * f[i]);
	}
	probe.stamp(MLA_SCALED);
	cluster_sync();
	probe.stamp(MLA_SYNC2);

	// Block k of the cluster sums dims [k·SLICE, (k+1)·SLICE) of every head
	// over the cluster's blocks, in rank order.
	const unsigned rank = cluster_rank();
	probe.note(MLA_RANK, rank);
	const int P = splits / MLF_CLUSTER, cl = split / MLF_CLUSTER;
	for (int i = tid; i < heads * (SLICE / 4); i += Tiles::THREADS) {
		const int r = i / (SLICE / 4), d = rank * SLICE + 4 * (i - r * (SLICE / 4));
		const unsigned at = smem_addr(ob + r * OP + d);
		float4 x[MLF_CLUSTER]; // every load in flight at once
#pragma unroll
		for (int q = 0; q < MLF_CLUSTER; q++) x[q] = ld_cluster4(cluster_at(at, q));
		float4 v = x[0];
#pragma unroll
		for (int q = 1; q < MLF_CLUSTER; q++) {
			v.x += x[q].x;
			v.y += x[q].y;
			v.z += x[q].z;
			v.w += x[q].w;
		}
		*reinterpret_cast<float4*>(part + (((long long)b * heads + r) * P + cl) * R + d) = v;
	}
	if (rank == 0 && warp == 0 && (lane & 3) == 0)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = (lane >> 2) + 8 * i;
			if (r >= heads) continue;
			float* s = stats + (((long long)b * heads + r) * P + cl) * 2;
			s[0] = M[i];
			s[1] = L[i];
		}
	probe.stamp(MLA_MERGED);
	cluster_sync(); // no block leaves while another reads its shared memory
	probe.stamp(MLA_EXIT);
}

// mla_flat_r<R>_p<DR>_s<STAGES>.
#define MLA_FLAT(NAME, R, DR, S)                                                                                   \
	extern "C" __global__ void __cluster_dims__(MLF_CLUSTER, 1, 1) __launch_bounds__(DEC_WARPS * 32) NAME(         \
	    float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs, const bf16* kn, int kp,       \
	    bf16* cache, const int* past, int heads, int maxSeq, float scale_log2) {                                    \
		mla_flat<R, DR, S>(part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads, maxSeq, scale_log2);         \
	}
MLA_FLAT_INSTANCES(MLA_FLAT)

// mla_out: out[b, h·DV + d] = Σ_i w[h·(DN+DV) + DN + d, i]·o_lat[i] rounded
// to bf16, o_lat = the P clusters' part merged by their log-sum-exp
// (Σ_p part_p·2^(M_p − M) / Σ_p L_p·2^(M_p − M) over the p with L_p > 0),
// rounded to bf16. Each warp takes 4 of the block's MO_ROWS output dims, a
// lane two 16-byte chunks of each of their W_UV rows.
//   out bf16 [B, heads·DV], pitch op; part, stats: mla_flat's, or
//   mla_decode_keys's with P its splits (mla_decode's "keys_own" variant:
//   the same layout, f32 [B·heads, P, R] and [B·heads, P, 2], and the same
//   scale); w: kv_b_proj. R ≤ MO_MAX_R, a multiple of 8; P ≤ MO_MAX_P.
// Launch: grid (heads, ceil(DV / MO_ROWS), B), 128 threads.
extern "C" __global__ void __launch_bounds__(128) mla_out(bf16* out, int op, const float* part, const float* stats,
                                                          const bf16* w, int dn, int dv, int R, int heads, int P) {
	__shared__ __align__(16) float ol[MO_MAX_R];
	__shared__ float wts[MO_MAX_P]; // each cluster's weight
	__shared__ float red[4];        // the warps' max, then their sums
	const MlaProbe probe(MLA_PROBE_OUT);
	const int h = blockIdx.x, d0 = blockIdx.y * MO_ROWS, b = blockIdx.z;
	const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
	const bf16* wv = w + ((long long)h * (dn + dv) + dn) * R;
	constexpr int CH = MO_MAX_R / 8 / 32; // 16-byte chunks of a row a lane
	uint4 wr[4][CH];                       // the weights, loaded under the kernel before
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const int d = d0 + warp * 4 + k;
#pragma unroll
		for (int c = 0; c < CH; c++) {
			const int ch = lane + 32 * c;
			wr[k][c] = d < dv && ch < R / 8 ? *reinterpret_cast<const uint4*>(wv + (long long)d * R + ch * 8)
			                                : make_uint4(0, 0, 0, 0);
		}
	}
	probe.stamp(MLA_PRELOADED);
	grid_wait();
	probe.stamp(MLA_WAITED);
	grid_release();
	// Each cluster's weight 2^(M_p − M), M the max over the clusters that
	// saw keys (0 for the others), the stats loaded at once, a thread a
	// cluster; then o_lat = Σ_p part_p·w_p / Σ_p L_p·w_p, p in order.
	const long long bh = (long long)b * heads + h;
	float2 ml = make_float2(NEG_INF, 0.0f);
	if (t < P) ml = *reinterpret_cast<const float2*>(stats + (bh * P + t) * 2);
	const bool seen = ml.y > 0.0f;
	float M = warp_reduce<MaxOp>(seen ? ml.x : NEG_INF);
	if (lane == 0) red[warp] = M;
	__syncthreads();
	M = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
	const float wt = seen ? exp2f(ml.x - M) : 0.0f;
	if (t < P) wts[t] = wt;
	float L = warp_reduce<SumOp>(ml.y * wt);
	__syncthreads(); // every warp has read red
	if (lane == 0) red[warp] = L;
	__syncthreads();
	const float inv = 1.0f / (red[0] + red[1] + red[2] + red[3]);
	const float* pp = part + bh * P * R;
	for (int d = 4 * t; d < R; d += 4 * blockDim.x) {
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
		for (int p = 0; p < P; p++) {
			const float s = wts[p];
			const float4 x = *reinterpret_cast<const float4*>(pp + (long long)p * R + d);
			acc.x = fmaf(x.x, s, acc.x);
			acc.y = fmaf(x.y, s, acc.y);
			acc.z = fmaf(x.z, s, acc.z);
			acc.w = fmaf(x.w, s, acc.w);
		}
		ol[d] = __bfloat162float(__float2bfloat16(acc.x * inv));
		ol[d + 1] = __bfloat162float(__float2bfloat16(acc.y * inv));
		ol[d + 2] = __bfloat162float(__float2bfloat16(acc.z * inv));
		ol[d + 3] = __bfloat162float(__float2bfloat16(acc.w * inv));
	}
	__syncthreads();
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const int d = d0 + warp * 4 + k;
		float s = 0.0f;
#pragma unroll
		for (int c = 0; c < CH; c++) {
			const int ch = lane + 32 * c;
			if (ch >= R / 8) break;
			const bf16* w8 = reinterpret_cast<const bf16*>(&wr[k][c]);
#pragma unroll
			for (int e = 0; e < 8; e++) s = fmaf(__bfloat162float(w8[e]), ol[ch * 8 + e], s);
		}
		s = warp_reduce<SumOp>(s);
		if (lane == 0 && d < dv) out[(long long)b * op + (long long)h * dv + d] = __float2bfloat16(s);
	}
	probe.stamp(MLA_EXIT);
}
