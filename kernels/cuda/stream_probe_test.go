package cuda

import (
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// streamProbeSrc are TestStreamPatternProbe's kernels: each streams tiles
// of a weight matrix from DRAM into shared memory the way a decode MoE
// kernel could, and does nothing else with them (a thread reads one word
// of each stage, so that no load is dead). A tile is 64 rows of 4,096
// bytes (64 rows of K = 2,048 bf16: the 256 KB of one of moe_one's gate/up
// tiles), a block's tiles come from one ticket counter, and a tile's ring
// starts empty, as moe_one's does.
//   - rows_cp<ROWB, STAGES, XB>: a stage is ROWB bytes of each of the 64
//     rows, copied by the block's 128 threads in 16-byte cp.async copies
//     (moe_one's weights at ROWB 256: BK = 128), and XB bytes of an
//     L2-resident x beside them (moe_one's 16 rows of x: 4,096 bytes);
//   - the rings on mbarriers (ring_mbar, below): whole rows by one bulk
//     copy a stage (rows_bulk, linear_stream's way), and moe_one's ring by a
//     bulk copy a row or by tensor copies.
//
// sink [blocks·128] keeps each thread's reads alive.
const streamProbeSrc = `
__device__ __forceinline__ unsigned sm_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// next_tile takes the block's next ticket (tk: the block's shared copy)
// and returns its tile of w, or null once every tile is taken.
__device__ __forceinline__ const char* next_tile(const char* w, int tiles, int* ticket, int& tk) {
	if (threadIdx.x == 0) tk = atomicAdd(ticket, 1);
	__syncthreads();
	const int t = tk;
	return t < tiles ? w + (long long)t * 64 * 4096 : nullptr;
}

template <int ROWB, int STAGES, int XB>
__device__ void rows_cp(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	extern __shared__ __align__(128) char sm[];
	__shared__ int tk;
	constexpr int STAGE = 64 * ROWB + XB, KSTEPS = 4096 / ROWB, CH = 64 * ROWB / 16 / 128;
	const int tid = threadIdx.x;
	float acc = 0.0f;
	for (;;) {
		const char* tw = next_tile(w, tiles, ticket, tk);
		if (tw == nullptr) break;
		auto load = [&](int ks) {
			const unsigned base = sm_u32(sm) + (ks % STAGES) * STAGE;
#pragma unroll
			for (int i = 0; i < CH; i++) {
				const int c = tid + i * 128, r = c / (ROWB / 16), q = c % (ROWB / 16);
				cp16(base + c * 16, tw + r * 4096 + ks * ROWB + q * 16);
			}
			for (int c = tid; c < XB / 16; c += 128) cp16(base + 64 * ROWB + c * 16, x + ks * XB + c * 16);
		};
#pragma unroll
		for (int s = 0; s < STAGES - 1; s++) {
			if (s < KSTEPS) load(s);
			cp_commit();
		}
		for (int ks = 0; ks < KSTEPS; ks++) {
			cp_wait<STAGES - 2>();
			__syncthreads();
			if (ks + STAGES - 1 < KSTEPS) load(ks + STAGES - 1);
			cp_commit();
			acc += *reinterpret_cast<const float*>(sm + (ks % STAGES) * STAGE + tid * 4);
		}
		cp_wait<0>();
		__syncthreads();
	}
	sink[blockIdx.x * blockDim.x + tid] = acc;
}

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
	unsigned ok = 0;
	while (!ok)
		asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
		             : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
}

// The rings whose stages complete on mbarriers rather than cp.async
// groups (ring_mbar):
//   - rows_bulk<R, STAGES>: a stage is R whole rows, R·4,096 contiguous
//     bytes, one bulk copy by thread 0 (linear_stream's way);
//   - bulk1_s3_x: moe_one's ring (64 rows of 256 bytes and x's 4,096 a
//     stage), lanes 0-63 copying one row's 256 bytes each by a bulk copy
//     into rows of 272 bytes (padded, as an ldmatrix reader wants) and
//     thread 64 x's bytes;
//   - rows_tma<BOX>: moe_one's ring by thread 0's tensor copies of wmap's
//     BOX × 64 boxes (one unswizzled box of 128 columns, or two
//     128-byte-swizzled boxes of 64), and x by one bulk copy.
struct __align__(64) TmaMap {
	unsigned long long v[16];
};

__device__ __forceinline__ void bar_init(unsigned bar) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
	             "l"(src), "r"(bytes), "r"(bar)
	             : "memory");
}
__device__ __forceinline__ void tma2d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1) {
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
	             "l"(map), "r"(c0), "r"(c1), "r"(bar)
	             : "memory");
}

// ring_mbar streams each ticket's tile of w (64 rows of 4,096 bytes) in
// KSTEPS stages of STAGE bytes through a ring of STAGES, a tile's ring
// starting empty; issue(dst, t, tw, ks, bar) queues step ks of tile t
// (at tw) into the stage at shared address dst (every thread calls it; it
// arms bar with the stage's bytes). The stages start on a 1,024-byte
// boundary (the 128-byte swizzle's period): 1 KB more shared memory asked.
template <int STAGES, int STAGE, int KSTEPS, typename Issue>
__device__ void ring_mbar(const char* w, int tiles, int* ticket, float* sink, Issue issue) {
	extern __shared__ __align__(1024) char sm[];
	__shared__ __align__(8) unsigned long long bars[STAGES];
	__shared__ int tk;
	const int tid = threadIdx.x;
	if (tid == 0) {
		for (int s = 0; s < STAGES; s++) bar_init(sm_u32(&bars[s]));
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();
	const unsigned pad = (1024 - sm_u32(sm) % 1024) % 1024;
	const unsigned base = sm_u32(sm) + pad;
	unsigned phase = 0;
	int issued = 0, used = 0;
	float acc = 0.0f;
	for (;;) {
		const char* tw = next_tile(w, tiles, ticket, tk);
		if (tw == nullptr) break;
		const int t = (int)((tw - w) / (64 * 4096));
		auto load = [&](int ks) {
			const int slot = issued % STAGES;
			issue(base + slot * STAGE, t, tw, ks, sm_u32(&bars[slot]));
			issued++;
		};
		for (int s = 0; s < STAGES - 1; s++) load(s);
		for (int ks = 0; ks < KSTEPS; ks++) {
			if (ks + STAGES - 1 < KSTEPS) load(ks + STAGES - 1);
			const int slot = used % STAGES;
			bar_wait(sm_u32(&bars[slot]), (phase >> slot) & 1);
			phase ^= 1u << slot;
			used++;
			acc += *reinterpret_cast<const float*>(sm + pad + slot * STAGE + tid * 4);
			__syncthreads();
		}
	}
	sink[blockIdx.x * blockDim.x + tid] = acc;
}

template <int R, int STAGES>
__device__ void rows_bulk(const char* w, int tiles, int* ticket, float* sink) {
	constexpr int STAGE = R * 4096;
	ring_mbar<STAGES, STAGE, 64 / R>(w, tiles, ticket, sink, [&](unsigned dst, int, const char* tw, int ks, unsigned bar) {
		if (threadIdx.x == 0) {
			bar_expect(bar, STAGE);
			bulk(dst, tw + (long long)ks * STAGE, STAGE, bar);
		}
	});
}

extern "C" __global__ void __launch_bounds__(128) bulk1_s3_x(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	constexpr int PITCH = 272, STAGE = 64 * PITCH + 4096;
	ring_mbar<3, STAGE, 16>(w, tiles, ticket, sink, [&](unsigned dst, int, const char* tw, int ks, unsigned bar) {
		const int tid = threadIdx.x;
		if (tid == 0) bar_expect(bar, 64 * 256 + 4096);
		if (tid < 64) bulk(dst + tid * PITCH, tw + tid * 4096 + ks * 256, 256, bar);
		if (tid == 64) bulk(dst + 64 * PITCH, x + ks * 4096, 4096, bar);
	});
}
template <int BOX>
__device__ void rows_tma(const TmaMap* wmap, const char* w, const char* x, int tiles, int* ticket, float* sink) {
	constexpr int STAGE = 64 * 256 + 4096;
	ring_mbar<3, STAGE, 16>(w, tiles, ticket, sink, [&](unsigned dst, int t, const char*, int ks, unsigned bar) {
		if (threadIdx.x == 0) {
			bar_expect(bar, 64 * 256 + 4096);
#pragma unroll
			for (int b = 0; b < 128 / BOX; b++) tma2d(dst + b * 64 * BOX * 2, wmap, bar, ks * 128 + b * BOX, t * 64);
			bulk(dst + 64 * 256, x + ks * 4096, 4096, bar);
		}
	});
}
extern "C" __global__ void __launch_bounds__(128) tma128_s3_x(const __grid_constant__ TmaMap wmap, const char* w, const char* x,
                                                             int tiles, int* ticket, float* sink) {
	rows_tma<128>(&wmap, w, x, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) tma64x2_s3_x(const __grid_constant__ TmaMap wmap, const char* w, const char* x,
                                                              int tiles, int* ticket, float* sink) {
	rows_tma<64>(&wmap, w, x, tiles, ticket, sink);
}

extern "C" __global__ void __launch_bounds__(128) cp256_s3(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_cp<256, 3, 0>(w, x, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) cp256_s3_x(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_cp<256, 3, 4096>(w, x, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) cp256_s4_x(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_cp<256, 4, 4096>(w, x, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) cp512_s3(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_cp<512, 3, 0>(w, x, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) bulk4_s4(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_bulk<4, 4>(w, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) bulk8_s3(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_bulk<8, 3>(w, tiles, ticket, sink);
}
extern "C" __global__ void __launch_bounds__(128) bulk16_s2(const char* w, const char* x, int tiles, int* ticket, float* sink) {
	rows_bulk<16, 2>(w, tiles, ticket, sink);
}`

// streamProbeKernels are the probe's instances: the kernel, its dynamic
// shared memory, the blocks an SM runs it with, and the box of the tensor
// map over the weights it takes first (0: none).
var streamProbeKernels = []struct {
	name          string
	shared, perSM int
	box           int
}{
	{"cp256_s3", 3 * 64 * 256, 3, 0},          // moe_one's weights alone, its 3 blocks an SM
	{"cp256_s3_x", 3 * (64*256 + 4096), 3, 0}, // moe_one's weights and x: its ring (60 KB)
	{"cp256_s4_x", 4 * (64*256 + 4096), 2, 0}, // a stage more: two blocks an SM
	{"cp512_s3", 3 * 64 * 512, 2, 0},          // 512 bytes a row a stage
	{"bulk4_s4", 4*4*4096 + 1024, 3, 0},       // whole rows: 4 a stage, one bulk copy
	{"bulk8_s3", 3*8*4096 + 1024, 2, 0},       // 8 a stage
	{"bulk16_s2", 2*16*4096 + 1024, 1, 0},     // 16 a stage
	// moe_one's ring (3 stages of 64 rows × 256 bytes and 4 KB of x) on mbarriers:
	{"bulk1_s3_x", 3*(64*272+4096) + 1024, 3, 0},    // a bulk copy a row
	{"tma128_s3_x", 3*(64*256+4096) + 1024, 3, 128}, // one tensor copy a stage
	{"tma64x2_s3_x", 3*(64*256+4096) + 1024, 3, 64}, // two 128-byte-swizzled boxes a stage
}

// streamProbeTiles are the tile counts the probe streams: W4's gate/up
// tiles (one prompt on 6 experts: 264 of 256 KB, fewer than moe_one's 396
// blocks, so each block streams one and the grid is not full) and W5's
// (3,300: 845 MB, every block several).
var streamProbeTiles = []int{264, 3300}

// TestStreamPatternProbe measures the read bandwidth from DRAM that each
// way of streaming a decode MoE kernel's weight tiles into shared memory
// reaches on this GPU: streamProbeSrc's kernels over each count of
// streamProbeTiles tiles of 256 KB, each on its persistent grid of blocks
// an SM times the SMs taking tickets, timed by events, the median of five
// launches after one; every launch's ticket count is checked. At W5's
// count it is the figure that says whether moe_one's 16-byte copies of
// 256-byte row pieces cost it bandwidth against whole rows by the copy
// engine (W5's moe_one runs at 94% of its bytes at the copy rate); at W4's
// (fewer tiles than blocks) it is what one block streams on its own when
// DRAM is not the limit, the rate W4's gate/up tiles and W5's last tiles
// run at. Skipped unless FUSELM_STREAM_PROBE=1: a measurement, run on
// demand.
func TestStreamPatternProbe(t *testing.T) {
	d, m := openProbe(t, "FUSELM_STREAM_PROBE", "stream_probe", streamProbeSrc)
	const tileBytes, runs = 64 * 4096, 6
	most := slices.Max(streamProbeTiles)
	w := d.Alloc(kernels.BF16, most*tileBytes/2)
	d.MemsetD8(d.Ptr(w), 1, most*tileBytes)
	x := d.Alloc(kernels.BF16, 16*4096/2)
	d.MemsetD8(d.Ptr(x), 1, 16*4096)
	ticket := d.Alloc(kernels.I32, 1)
	sms := d.Props().SMs
	sink := d.Alloc(kernels.F32, 3*sms*128)
	for _, k := range streamProbeKernels {
		f := probeFunc(t, m, k.name)
		if err := f.SetMaxDynamicShared(k.shared); err != nil {
			t.Fatalf("%s: %v", k.name, err)
		}
		var args []any
		if k.box > 0 {
			swizzle := 0
			if k.box*2 <= 128 {
				swizzle = k.box * 2
			}
			wmap, err := d.EncodeTiled(Tiled{Addr: d.Ptr(w), Elem: 2, Dims: []uint64{2048, uint64(most * 64)}, Strides: []uint64{4096},
				Box: []uint32{uint32(k.box), 64}, Swizzle: swizzle})
			if err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			args = append(args, wmap)
		}
		blocks := k.perSM * sms
		for _, tiles := range streamProbeTiles {
			var ms []float64
			for i := range runs {
				if err := d.WriteI32(ticket, []int32{0}); err != nil {
					t.Fatal(err)
				}
				from := d.Mark()
				d.Launch(f, Dim3{X: uint32(blocks)}, Dim3{X: 128}, k.shared,
					append(args, d.Ptr(w), d.Ptr(x), int32(tiles), d.Ptr(ticket), d.Ptr(sink))...)
				to := d.Mark()
				mustSync(t, d)
				got, err := d.ReadI32(ticket)
				if err != nil {
					t.Fatal(err)
				}
				if want := int32(tiles + blocks); got[0] != want {
					t.Fatalf("%s: %d tickets taken, want %d (each tile once, each block one past the last)", k.name, got[0], want)
				}
				e, err := d.Elapsed(from, to)
				if err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					ms = append(ms, e)
				}
			}
			slices.Sort(ms)
			med := ms[len(ms)/2]
			busy := min(tiles, blocks)
			t.Logf("%-12s %4d tiles on %3d blocks (%d an SM), %6d bytes of shared memory: %7.1f µs, %.2f TB/s, %.1f GB/s a busy block",
				k.name, tiles, blocks, k.perSM, k.shared, med*1e3, float64(tiles*tileBytes)/med/1e9,
				float64(tiles*tileBytes)/med/1e6/float64(busy))
		}
	}
}

// TestStreamProbeCompiles compiles TestStreamPatternProbe's kernels for
// sm_90a without a GPU, where FUSELM_NVRTC names a libnvrtc.so.
func TestStreamProbeCompiles(t *testing.T) { compileProbe(t, "stream_probe", streamProbeSrc) }
