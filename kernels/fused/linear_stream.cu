// linear_stream (sm_90a): out = x·wᵀ + bias for the few rows of a decode
// step (M ≤ 16), the weights streamed into shared memory by the copy engine
// and most of them requested before the kernel's grid_wait, under the
// kernel before it.
//
// Operands (pitches in elements):
//   out  TO [M, N], pitch op (bf16 activations, or f32 logits)
//   x    bf16 [M, K], pitch xp; rows start on 16-byte boundaries
//   w    bf16 [N, K], packed, 16-byte aligned; K a multiple of 32
//   bias [N] of dtype biasType (0 none, 1 bf16, 2 f16, 3 f32)
//   status i32 [8]: a timed-out wait's record (hopper.cuh), zero while none
//
// Work: block b of the grid owns the weight rows [b·N/G, (b+1)·N/G) over
// all of K, so no block shares an output with another (no split-K, no
// second pass) and the blocks' bytes differ by one row at most. It walks
// its rows in tiles of LS_ROWS and each tile's k in stages of ks: a stage
// is LS_ROWS weight rows × ks k into a ring of `stages` slots, one bulk
// copy a row, each row LS_WPAD elements apart so that the loads below meet
// no bank conflict; or, where a stage is whole rows (ks ≥ K), the tile's
// contiguous rows packed, K apart, in one copy (two with SwiGLU: the gate
// rows, the up rows): the copy engine's cost is per copy far more than per
// byte, and the loads' bank conflicts on packed rows hide under the stream. The ring's first slots are requested before
// grid_wait: the weights are no kernel's output, so their stream starts
// under the previous kernel's tail, and for the small matrices of a decode
// step that is most or all of the block's bytes. x (every row, all of K)
// follows after the wait, one bulk copy a row.
//
// A stage's k is split among the block's warps; each multiplies its
// k-range of the 16 rows as linear_skinny does (the weights as the mma's
// A operand, 16 rows × 16 k, x as B, 8 tokens a n-tile, so M ≤ 8 costs one
// mma a k-step), with the same permuted k order: thread (g, t) loads k
// [8t, 8t+8) of rows g and g+8 of each 32-k chunk and x's tokens at the
// same k. At a tile's last stage the warps' f32 sums meet in shared memory
// and are added in warp order (deterministic), the bias added, out written.
//
// Rounding: as linear_skinny (linear.cuh's lin_bias): sums in f32, the
// bias rounded to bf16 first when out is bf16, out rounded once.
//
// Epilogues (EPI), each its own instances, the plain ones untouched by the
// others:
//   LS_PLAIN   out = x·wᵀ + bias, as above.
//   LS_SWIGLU  linear_swiglu's: out [M, N/2] = swiglu(x·wᵀ), w [N, K] the
//              gate rows [0, N/2) then the up rows [N/2, N) (no bias).
//              The blocks divide the N/2 output columns as the plain
//              kernel divides rows, and a tile is LS_ROWS/2 columns: its
//              gate rows j..j+7 in the slot's rows 0-7 and their up rows
//              N/2+j..N/2+j+7 in rows 8-15, so the mma's accumulator rows g
//              and g+8 are a column's gate and up, and after the warps' sums
//              meet one thread holds both. Each is rounded as the plain
//              kernel rounds its output (bf16), then as fused's swiglu
//              (elementwise.cu): bf16(bf16(silu(gate)) · up), so that the
//              result is linear_stream's then swiglu's bit for bit.
//   LS_ADD     linear_add's: out = bf16(addend + bf16(x·wᵀ + bias)), the
//              plain output then fused's add (elementwise.cu: binary.cuh's
//              AddOp) bit for bit; addend bf16 [M, N], pitch ap, read after
//              grid_wait by the thread that writes the same element of out,
//              so out may be addend (not a part of it).
//
// Norm first (NORM, instances of their own with the plain and the SwiGLU
// epilogue: add_rms_norm_linear's and add_rms_norm_linear_swiglu's): x is
// not the GEMM's input but what the residual stream adds before the norm,
// and the kernel writes the input itself, as add_rms_norm's kernel of
// normT threads (one 8-element access each: K ≤ 8·1,024) would: the norm's
// weights are read before grid_wait (they are no kernel's output); after
// it, thread t of the block takes the accesses t, t + 256, ... of each row,
// which add_rms_norm's threads of the same index take, so its sums of
// squares are theirs, and sums them per access into the partial sum of its
// virtual warp (t + 256q)/32: the warp's shuffles reduce it as theirs do,
// and every warp reduces the virtual warps' partials in one more warp's
// shuffles, as add_rms_norm's block does; then xs = bf16(gamma · bf16(r ·
// rstd)) with r = bf16(resid + x), the GEMM's input bit for bit. Every
// block reads all of resid, so none may write it before all have: each
// counts itself in *counter once it has read (its thread 0, without
// waiting for the answer), and the one that counted last writes resid =
// bf16(resid + x) of every row after its GEMM and puts the counter back to
// 0 for the next launch. (Blocks are one an SM and at most one a wave: the
// last always comes.)
//
// Shared memory (dynamic; the host's lsShared): LS_BARS bytes of
// mbarriers (a slot's each, then x's), the warps' sums (LS_RED), x's rows
// of ls_xrow(K) elements (rounded up to 128 bytes), then the ring.

#include "hopper.cuh"
#include "linear.cuh"
#include "instances.cuh"

#define LS_WARPS 8                            // warps of a block, each a k-range of every stage
#define LS_THREADS (LS_WARPS * 32)
#define LS_ROWS 16                            // weight rows of a stage: one m16 tile
#define LS_WPAD 32                            // elements between a stage's rows: 64 bytes
#define LS_MAX_STAGES 8                       // slots of the ring at most
#define LS_BARS 128                           // bytes of mbarriers: LS_MAX_STAGES slots, then x
#define LS_RED (LS_WARPS * LS_ROWS * 16 * 4)  // the warps' f32 sums of a tile: [warp][token][row]
#define LS_X (LS_BARS + LS_RED)               // where x starts

// The epilogues (see above): the kernel's EPI.
enum LsEpilogue { LS_PLAIN, LS_SWIGLU, LS_ADD };

// ls_xrow is the elements of x's rows in shared memory: K, with 64 bytes
// more where K·2 is a multiple of 128, so that a row starts 64 bytes
// (mod 128) after the one before and the B loads meet no bank conflict.
__device__ __forceinline__ int ls_xrow(int K) { return K % 64 == 0 ? K + 32 : K; }

// LsNorm is a NORM kernel's norm: the residual (pitch rp), the norm's
// weights, its eps, add_rms_norm's block (normT threads) and the count of
// blocks that have read resid.
struct LsNorm {
	bf16* resid;
	int rp;
	const bf16* gamma;
	float eps;
	int normT;
	int* counter;
};

// LS_NORM_VECS is the 8-element accesses of a row a thread takes at most:
// K ≤ LS_NORM_VECS · LS_THREADS · 8 = 8,192.
#define LS_NORM_VECS 4

// ls_norm_x writes the GEMM's input into xs (M rows of xrow): RMSNorm of
// resid + x by the weights gv (the thread's accesses of gamma), rounded as
// add_rms_norm rounds it (see NORM above); part is 32·M floats of shared
// memory no other warp uses meanwhile. Every thread of the block calls it;
// thread 0 returns the old count of blocks that had read resid.
__device__ __forceinline__ int ls_norm_x(bf16* xs, int xrow, const bf16* x, int xp, const LsNorm& nm, const uint4 (&gv)[LS_NORM_VECS],
                                         int M, int K, float* part) {
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, vwarps = nm.normT / 32;
	for (int r = 0; r < M; r++) {
		uint4 a[LS_NORM_VECS], v[LS_NORM_VECS];
#pragma unroll
		for (int q = 0; q < LS_NORM_VECS; q++) {
			const int c = (q * LS_THREADS + threadIdx.x) * 8;
			if (c < K) {
				a[q] = *reinterpret_cast<const uint4*>(x + (long long)r * xp + c);
				v[q] = *reinterpret_cast<const uint4*>(nm.resid + (long long)r * nm.rp + c);
			}
		}
#pragma unroll
		for (int q = 0; q < LS_NORM_VECS; q++) {
			const int c = (q * LS_THREADS + threadIdx.x) * 8;
			float ss = 0.0f;
			if (c < K) {
				bf16* av = reinterpret_cast<bf16*>(&a[q]);
				bf16* sv = reinterpret_cast<bf16*>(&v[q]);
#pragma unroll
				for (int j = 0; j < 8; j++) {
					sv[j] = __float2bfloat16_rn(to_f32(av[j]) + to_f32(sv[j]));
					const float e = to_f32(sv[j]);
					ss += e * e;
				}
				*reinterpret_cast<uint4*>(xs + r * xrow + c) = v[q];
			}
			if (q * LS_WARPS + warp < vwarps) { // one of add_rms_norm's warps (warp-uniform; the others' are not read)
				ss = warp_reduce<SumOp>(ss);
				if (lane == 0) part[r * 32 + q * LS_WARPS + warp] = ss;
			}
		}
	}
	__syncthreads();
	int old = 0;
	if (threadIdx.x == 0) old = atomicAdd(nm.counter, 1); // every thread's reads of resid are done
	for (int r = 0; r < M; r++) {
		float t = lane < vwarps ? part[r * 32 + lane] : SumOp::identity();
		t = warp_reduce<SumOp>(t);
		const float rs = rsqrtf(t / (float)K + nm.eps);
#pragma unroll
		for (int q = 0; q < LS_NORM_VECS; q++) {
			const int c = (q * LS_THREADS + threadIdx.x) * 8;
			if (c < K) {
				uint4 v = *reinterpret_cast<const uint4*>(xs + r * xrow + c);
				bf16* sv = reinterpret_cast<bf16*>(&v);
				const bf16* g = reinterpret_cast<const bf16*>(&gv[q]);
#pragma unroll
				for (int j = 0; j < 8; j++) sv[j] = __float2bfloat16_rn(to_f32(g[j]) * round_bf16(to_f32(sv[j]) * rs));
				*reinterpret_cast<uint4*>(xs + r * xrow + c) = v;
			}
		}
	}
	__syncthreads(); // xs is whole, and part (the warps' sums' space) free
	return old;
}

// ls_norm_resid writes resid = bf16(resid + x) of every row: the block
// that counted last, after the GEMM.
__device__ __forceinline__ void ls_norm_resid(const bf16* x, int xp, const LsNorm& nm, int M, int K) {
	for (int r = 0; r < M; r++) {
		for (int c = threadIdx.x * 8; c < K; c += LS_THREADS * 8) {
			const uint4 a = *reinterpret_cast<const uint4*>(x + (long long)r * xp + c);
			uint4 v = *reinterpret_cast<const uint4*>(nm.resid + (long long)r * nm.rp + c);
			const bf16* av = reinterpret_cast<const bf16*>(&a);
			bf16* sv = reinterpret_cast<bf16*>(&v);
#pragma unroll
			for (int j = 0; j < 8; j++) sv[j] = __float2bfloat16_rn(to_f32(av[j]) + to_f32(sv[j]));
			*reinterpret_cast<uint4*>(nm.resid + (long long)r * nm.rp + c) = v;
		}
	}
}

// Launch: grid min(outputs, SMs) blocks of LS_THREADS (outputs: N, or N/2
// with LS_SWIGLU), lsShared bytes of dynamic shared memory; ks a multiple
// of 8·32 (each warp's k-range whole chunks), 1 ≤ stages ≤ LS_MAX_STAGES.
// NORM: x and resid rows on 16-byte boundaries, K ≤ 8,192 a multiple of
// 8, normT = add_rms_norm's threads for K (a multiple of 32, ≥ K/8).
template <int NT, typename TO, int EPI, bool NORM>
__device__ __forceinline__ void linear_stream(TO* out, int op, const bf16* x, int xp, const bf16* w, const void* bias, int biasType,
                                              const bf16* addend, int ap, const LsNorm& nm, int M, int N, int K, int ks, int stages,
                                              int* status) {
	constexpr bool SWIGLU = EPI == LS_SWIGLU;
	constexpr int UNITS = SWIGLU ? LS_ROWS / 2 : LS_ROWS; // outputs of a tile
	extern __shared__ __align__(128) unsigned char smem[];
	const unsigned bars = smem_addr(smem), xbar = bars + 8 * LS_MAX_STAGES;
	float* red = reinterpret_cast<float*>(smem + LS_BARS);
	// A stage of whole rows (ks ≥ K, one stage a tile) packs them, K
	// apart, and moves them in one copy (two with SwiGLU); else each row is
	// a copy, LS_WPAD elements apart.
	const bool packed = ks >= K;
	const int xrow = ls_xrow(K), wrow = packed ? K : ks + LS_WPAD;
	bf16* xs = reinterpret_cast<bf16*>(smem + LS_X);
	bf16* ring = reinterpret_cast<bf16*>(smem + LS_X + (M * xrow * 2 + 127) / 128 * 128);

	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	// The block's outputs [r0, r1): w's rows, or with SwiGLU out's columns.
	const int F = SWIGLU ? N / 2 : N;
	const int r0 = (int)((long long)blockIdx.x * F / gridDim.x), r1 = (int)((long long)(blockIdx.x + 1) * F / gridDim.x);
	const int kst = (K + ks - 1) / ks;                    // stages of a tile
	const int total = (r1 - r0 + UNITS - 1) / UNITS * kst; // stages of the block

	// issue, by warp 0, requests stage s into its slot: one bulk copy of
	// each of its rows' k-range. Slot row i holds w's row row0 + i; with
	// SwiGLU, rows 0-7 the gate rows row0 + i, rows 8-15 their up rows.
	auto issue = [&](int s) {
		const int slot = s % stages, tile = s / kst, k0 = (s - tile * kst) * ks;
		const int row0 = r0 + tile * UNITS, rows = min(UNITS, r1 - row0), kn = min(ks, K - k0);
		const unsigned bar = bars + 8 * slot;
		if (lane == 0) mbar_expect_tx(bar, (SWIGLU ? 2 : 1) * rows * kn * 2);
		__syncwarp();
		if (packed) {
			// The tile's rows are contiguous in w: with SwiGLU its gate rows
			// to slot rows 0.., its up rows to slot rows UNITS.., a copy each.
			if (lane < (SWIGLU ? 2 : 1))
				bulk_load(smem_addr(ring + (slot * LS_ROWS + lane * UNITS) * wrow), w + (long long)(lane * F + row0) * K,
				          rows * K * 2, bar);
		} else if (SWIGLU) {
			const int i = lane % UNITS, up = lane / UNITS;
			if (lane < LS_ROWS && i < rows)
				bulk_load(smem_addr(ring + (slot * LS_ROWS + lane) * wrow), w + (long long)(up * F + row0 + i) * K + k0, kn * 2, bar);
		} else if (lane < rows) {
			bulk_load(smem_addr(ring + (slot * LS_ROWS + lane) * wrow), w + (long long)(row0 + lane) * K + k0, kn * 2, bar);
		}
	};

	if (threadIdx.x == 0) {
		for (int s = 0; s < stages; s++) mbar_init(bars + 8 * s, 1);
		mbar_init(xbar, 1);
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();
	if (warp == 0)
		for (int s = 0; s < min(stages, total); s++) issue(s);
	uint4 gv[LS_NORM_VECS]; // the norm's weights: this thread's accesses
	if (NORM) {
#pragma unroll
		for (int q = 0; q < LS_NORM_VECS; q++) {
			const int c = (q * LS_THREADS + threadIdx.x) * 8;
			if (c < K) gv[q] = *reinterpret_cast<const uint4*>(nm.gamma + c);
		}
	}
	grid_wait();
	grid_release();
	int counted = 0; // thread 0's: the blocks that had read resid before this one
	if (NORM) {
		counted = ls_norm_x(xs, xrow, x, xp, nm, gv, M, K, red);
	} else {
		if (warp == 0) {
			if (lane == 0) mbar_expect_tx(xbar, M * K * 2);
			__syncwarp();
			if (lane < M) bulk_load(smem_addr(xs + lane * xrow), x + (long long)lane * xp, K * 2, xbar);
		}
		if (!mbar_wait(xbar, 0, status, 1, -1)) return;
	}

	float acc[NT][4];
#pragma unroll
	for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
	const int kw = ks / LS_WARPS; // each warp's k of a stage
	for (int s = 0; s < total; s++) {
		const int slot = s % stages, tile = s / kst, kc = s - tile * kst, k0 = kc * ks;
		if (!mbar_wait(bars + 8 * slot, (s / stages) & 1, status, 2, s)) return;
		const bf16* wa = ring + (slot * LS_ROWS + g) * wrow + 8 * t;
		const bf16* wb = wa + 8 * wrow;
		const int kb = warp * kw, ke = min(kb + kw, K - k0);
		for (int c = kb; c < ke; c += 32) {
			const uint4 a = lin_lds(wa + c), b = lin_lds(wb + c);
			uint4 xv[NT];
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const int tok = j * 8 + g;
				xv[j] = tok < M ? lin_lds(xs + tok * xrow + k0 + c + 8 * t) : make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const unsigned af[4] = {lin_word(a, 2 * h), lin_word(b, 2 * h), lin_word(a, 2 * h + 1), lin_word(b, 2 * h + 1)};
#pragma unroll
				for (int j = 0; j < NT; j++) mma16816(acc[j], af, lin_word(xv[j], 2 * h), lin_word(xv[j], 2 * h + 1));
			}
		}
		const bool last = kc == kst - 1;
		if (last) {
			// Accumulator (j, e): row g (+8 from e = 2), token 8j + 2t + (e & 1).
			float* mine = red + warp * LS_ROWS * 16;
#pragma unroll
			for (int j = 0; j < NT; j++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					mine[(j * 8 + 2 * t + (e & 1)) * LS_ROWS + g + (e < 2 ? 0 : 8)] = acc[j][e];
					acc[j][e] = 0.0f;
				}
			}
		}
		__syncthreads(); // every warp is done with the slot (and has written its sums)
		if (warp == 0 && s + stages < total) issue(s + stages);
		if (last) {
			// Thread (tok, row) sums the warps' partial sums of the tile's
			// row in warp order; with SwiGLU the threads of rows 0-7 take a
			// gate row and its up row (row + 8), each summed so.
			const int tok = threadIdx.x / LS_ROWS, row = threadIdx.x % LS_ROWS, f = r0 + tile * UNITS + row;
			if (tok < M && f < r1 && row < UNITS) {
				float v = 0.0f;
#pragma unroll
				for (int q = 0; q < LS_WARPS; q++) v += red[(q * 16 + tok) * LS_ROWS + row];
				if (SWIGLU) {
					float u = 0.0f;
#pragma unroll
					for (int q = 0; q < LS_WARPS; q++) u += red[(q * 16 + tok) * LS_ROWS + row + UNITS];
					const float gate = round_bf16(v + lin_bias<TO>(bias, biasType, f));
					const float up = round_bf16(u + lin_bias<TO>(bias, biasType, F + f));
					out[(long long)tok * op + f] = from_f32<TO>(lin_swiglu(gate, up));
				} else if (EPI == LS_ADD) {
					const float y = round_bf16(v + lin_bias<TO>(bias, biasType, f));
					out[(long long)tok * op + f] = from_f32<TO>(to_f32(addend[(long long)tok * ap + f]) + y);
				} else {
					out[(long long)tok * op + f] = from_f32<TO>(v + lin_bias<TO>(bias, biasType, f));
				}
			}
			__syncthreads(); // the sums are read before the next tile writes them
		}
	}
	if (NORM) {
		// red is free after the last tile: thread 0 tells the block whether
		// it counted last.
		if (threadIdx.x == 0) red[0] = counted == (int)gridDim.x - 1 ? 1.0f : 0.0f;
		__syncthreads();
		if (red[0] != 0.0f) {
			ls_norm_resid(x, xp, nm, M, K);
			if (threadIdx.x == 0) *nm.counter = 0;
		}
	}
}

#define LINEAR_STREAM(NAME, NT, TO)                                                                         \
	extern "C" __global__ void __launch_bounds__(LS_THREADS, 1)                                             \
	    NAME(TO* out, int op, const bf16* x, int xp, const bf16* w, const void* bias, int biasType, int M,  \
	         int N, int K, int ks, int stages, int* status) {                                               \
		linear_stream<NT, TO, LS_PLAIN, false>(out, op, x, xp, w, bias, biasType, nullptr, 0, LsNorm{}, M, N, \
		                                       K, ks, stages, status);                                      \
	}
LINEAR_STREAM_INSTANCES(LINEAR_STREAM)

// linear_stream_swiglu: LS_SWIGLU's instances, bf16 out; N is w's rows (2I).
#define LINEAR_STREAM_SWIGLU(NAME, NT)                                                                      \
	extern "C" __global__ void __launch_bounds__(LS_THREADS, 1)                                             \
	    NAME(bf16* out, int op, const bf16* x, int xp, const bf16* w, int M, int N, int K, int ks,          \
	         int stages, int* status) {                                                                     \
		linear_stream<NT, bf16, LS_SWIGLU, false>(out, op, x, xp, w, nullptr, 0, nullptr, 0, LsNorm{}, M, N, \
		                                          K, ks, stages, status);                                   \
	}
LINEAR_STREAM_SWIGLU_INSTANCES(LINEAR_STREAM_SWIGLU)

// linear_stream_add: LS_ADD's instances, bf16 out; addend may be out.
#define LINEAR_STREAM_ADD(NAME, NT)                                                                         \
	extern "C" __global__ void __launch_bounds__(LS_THREADS, 1)                                             \
	    NAME(bf16* out, int op, const bf16* x, int xp, const bf16* w, const void* bias, int biasType,       \
	         const bf16* addend, int ap, int M, int N, int K, int ks, int stages, int* status) {            \
		linear_stream<NT, bf16, LS_ADD, false>(out, op, x, xp, w, bias, biasType, addend, ap, LsNorm{}, M, N, \
		                                       K, ks, stages, status);                                      \
	}
LINEAR_STREAM_ADD_INSTANCES(LINEAR_STREAM_ADD)

// linear_stream_norm: NORM with the plain epilogue (add_rms_norm_linear's),
// bf16 out; x is what is added to resid before the norm.
#define LINEAR_STREAM_NORM(NAME, NT)                                                                        \
	extern "C" __global__ void __launch_bounds__(LS_THREADS, 1)                                             \
	    NAME(bf16* out, int op, const bf16* x, int xp, bf16* resid, int rp, const bf16* gamma, float eps,   \
	         int normT, int* counter, const bf16* w, const void* bias, int biasType, int M, int N, int K,    \
	         int ks, int stages, int* status) {                                                             \
		const LsNorm nm{resid, rp, gamma, eps, normT, counter};                                             \
		linear_stream<NT, bf16, LS_PLAIN, true>(out, op, x, xp, w, bias, biasType, nullptr, 0, nm, M, N, K, \
		                                        ks, stages, status);                                        \
	}
LINEAR_STREAM_NORM_INSTANCES(LINEAR_STREAM_NORM)

// linear_stream_norm_swiglu: NORM with LS_SWIGLU (add_rms_norm_linear_swiglu's).
#define LINEAR_STREAM_NORM_SWIGLU(NAME, NT)                                                                 \
	extern "C" __global__ void __launch_bounds__(LS_THREADS, 1)                                             \
	    NAME(bf16* out, int op, const bf16* x, int xp, bf16* resid, int rp, const bf16* gamma, float eps,   \
	         int normT, int* counter, const bf16* w, int M, int N, int K, int ks, int stages, int* status) { \
		const LsNorm nm{resid, rp, gamma, eps, normT, counter};                                             \
		linear_stream<NT, bf16, LS_SWIGLU, true>(out, op, x, xp, w, nullptr, 0, nullptr, 0, nm, M, N, K,    \
		                                         ks, stages, status);                                       \
	}
LINEAR_STREAM_NORM_SWIGLU_INSTANCES(LINEAR_STREAM_NORM_SWIGLU)
