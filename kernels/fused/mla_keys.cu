// mla_decode_keys: the "keys" variant of absorbed MLA decode (mla.cu's
// mla_decode is the other one, "latent_split"). It uses DecodeSplit's row,
// split and new-latent bookkeeping (attention.cuh) and mla.cuh's P·C and
// split output, and attn_merge (attention.cu) merges its splits; in the
// "keys_own" variant mla_out (mla_flat.cu) merges them instead, which reads
// the same partials (part and stats as attn_merge reads them).
//
// What changes against mla_decode, and why (kernels/fused/DESIGN.md,
// mla_decode): mla_decode splits Q·Kᵀ of each 64-key tile
// between its 4 warps by dims and sums the partial scores through shared
// memory, 64 KB of reads a tile; its 166 KB of shared memory leave one block
// of 4 warps an SM. Here
//   - key tiles are MLK_BN = 32 positions and each warp scores its own 8 of
//     them over all R+DR dims (one n-tile of the mma; 36 mma at 576 dims),
//     so a warp's scores are whole and nothing partial is exchanged;
//   - the warps share one running max per tile through shared memory (4 ×
//     16 floats), so p = exp2(s·scale − m·scale) is the p a single-block
//     softmax computes and rounds, as flash_decode_keys does for GQA;
//   - p, rounded to bf16, goes to shared memory (16 × 32 bf16) and each warp
//     multiplies all of it by its quarter of the R output dims (P·C), as in
//     mla_decode: the accumulators (16 heads × R f32) do not fit one warp;
//   - the stages are STAGES tiles of 32 positions (36 KB at R+DR = 576),
//     the count chosen on the host so that two blocks fit an SM's shared
//     memory (mla_keys.go), and the next tile's load is issued after the
//     tile's first barrier, which makes a separate end-of-tile barrier
//     unnecessary: three barriers a tile (the tile ready, the max, p);
//   - the first STAGES-1 tiles' cached positions are requested before the
//     grid wait, under the kernel before (the q projection), as mla_flat
//     requests its first tiles: the cache's earlier rows and the step's
//     lengths are no kernel's of the step; the new latent is appended and
//     put in its stage, and the queries requested, after the wait.
// The queries (16 × (R+DR) bf16) stay in shared memory and are read again
// by ldmatrix for every tile: at 576 dims they would take 144 registers
// a thread.
//
// Rounding is mla_decode's (see its comment in mla.cu: q_lat rounded to
// bf16, each q·c product in f32, p rounded to bf16 for P·C, sums in f32,
// o_lat rounded once to bf16 before W_UV, or kept f32 through attn_merge
// when split): the one difference is where the running max moves, every 32
// keys instead of every 64, which changes p's rounding no more than a
// different split point of the cache does. A warp's 36 products are
// summed in two chains (even and odd k-steps) added at the end, where
// mla_decode added four warps' partial sums: both are f32 sums of the same
// products in another order.
//
//   olat, part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads,
//   maxSeq, chunk, scale_log2: as mla_decode's (chunk a multiple of
//   MLK_BN).
// Launch: grid (splits, 1, B), DEC_WARPS·32 threads, shared
// (16 + STAGES·MLK_BN)·Tile<R+DR>::ROW_BYTES + MLK_EXTRA bytes.
//
// With -DMLK_FRAGMENT_STORES=1 (the reference build of TestMLAKeysStagedExact)
// every split's part is stored from the warps' fragments (mla_split_out),
// as before mla_split_part_staged: the same bits by other stores.
// With -DMLF_PROBE=1 (a measurement build: mlaKeysOpts, TestMLAKeysProbe)
// thread 0 of each block stamps its phases (MlaProbe, mla_probe.cuh); the
// normal build has none of it.

#include "mla.cuh"
#include "instances.cuh"

template <int R, int DR, int STAGES>
__device__ void mla_decode_keys(bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp,
                                int qhs, const bf16* kn, int kp, bf16* cache, const int* past, int heads, int maxSeq,
                                int chunk, float scale_log2) {
	typedef MlaKeyTiles<R, DR, STAGES> Tiles;
	// Only DecodeSplit's bookkeeping (its loads are of MLK_BN-key tiles);
	// EARLY: the new latent is appended after grid_wait.
	typedef DecodeSplit<R + DR, STAGES, true, false, true> Split;
	static_assert(16 * (R + 8) * 4 <= Tiles::SHARED, "the staged part rows fit the block's shared memory");
	extern __shared__ __align__(128) unsigned char smem[];
	const Split sp(smem, kn, kp, nullptr, 0, cache, cache, past, heads, 1, maxSeq, chunk); // past: the step's input
	const int b = sp.b, split = blockIdx.x, splits = gridDim.x;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const MlaProbe probe(MLA_PROBE_KEYS); // nothing in the normal build (mla_probe.cuh)
	const Tiles tiles(smem, cache + sp.kvBase + (long long)sp.k0 * (R + DR), sp.kNew, sp.nkeys, sp.newAt);
	tiles.probe = probe;

	// Under the kernel before: the cached positions of the first STAGES-1
	// tiles (earlier steps' latents; the new one is kn, not written yet).
#pragma unroll
	for (int j = 0; j < STAGES - 1; j++) {
		if (j < tiles.tiles()) tiles.load(j, true);
		cp_commit();
	}
	probe.stamp(MLA_PRELOADED);
	probe.note(MLA_TILES, tiles.tiles());
	probe.note(MLA_KEYS, sp.nkeys);
	grid_wait();
	probe.stamp(MLA_WAITED);
	grid_release();
	// The query rows first, which the first tile's wait covers (run waits
	// for every group queued before it), then the new latent, into the
	// cache and, if queued early, its stage: its load's round trip is then
	// not before the queries' issue.
	tiles.loadQ(qlat + (long long)b * heads * R, qpe + (long long)b * qp, qhs, heads);
	cp_commit();
	tiles.appendNew(cache + sp.kvBase + (long long)(sp.len - 1) * (R + DR), STAGES - 1);
	probe.stamp(MLA_QUEUED);
	float o[2 * Tiles::DPW][4];
	RowState st[2];
	tiles.run(o, st, scale_log2, STAGES - 1);
	probe.stamp(MLA_RUN_DONE);
	float l[2];
	tiles.sums(st, l);
	probe.stamp(MLA_SUMS);
	// Every warp holds the rows' max and its dims' sums: with several
	// splits, the block's part rows through shared memory (the stages are
	// free after run), with one (or in the reference build, MLK_FRAGMENT_STORES)
	// each warp its dims.
#ifndef MLK_FRAGMENT_STORES
	if (splits > 1) {
		const float m[2] = {st[0].m * scale_log2, st[1].m * scale_log2};
		mla_split_part_staged<R, 2 * Tiles::DPW, Tiles::THREADS>(o, m, l, (long long)b * heads, heads, splits, split,
		                                                          warp * Tiles::DPW, warp, lane,
		                                                          reinterpret_cast<float*>(smem), part, stats);
		probe.stamp(MLA_EXIT);
		return;
	}
#endif
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = (lane >> 2) + i * 8;
		if (r >= heads) continue;
		mla_split_out<R>(o, i, st[i].m * scale_log2, l[i], (long long)b * heads + r, splits, split, warp * Tiles::DPW, warp,
		                 lane, olat, part, stats);
	}
	probe.stamp(MLA_EXIT);
}

// mla_decode_keys_r<R>_p<DR>_s<STAGES>; __launch_bounds__ asks for two
// blocks an SM, which the host's stage count makes room for in shared memory.
#define MLA_DECODE_KEYS(NAME, R, DR, S)                                                                             \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, 2) NAME(                                          \
	    bf16* olat, float* part, float* stats, const bf16* qlat, const bf16* qpe, int qp, int qhs, const bf16* kn,     \
	    int kp, bf16* cache, const int* past, int heads, int maxSeq, int chunk, float scale_log2) {                 \
		mla_decode_keys<R, DR, S>(olat, part, stats, qlat, qpe, qp, qhs, kn, kp, cache, past, heads, maxSeq, chunk, \
		                          scale_log2);                                                                   \
	}
MLA_DECODE_KEYS_INSTANCES(MLA_DECODE_KEYS)
