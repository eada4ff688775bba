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
//   - rows_bulk<R, STAGES>: a stage is R whole rows, R·4,096 contiguous
//     bytes, one bulk copy by thread 0 completing on the stage's mbarrier
//     (linear_stream's way).
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

template <int R, int STAGES>
__device__ void rows_bulk(const char* w, int tiles, int* ticket, float* sink) {
	extern __shared__ __align__(128) char sm[];
	__shared__ __align__(8) unsigned long long bars[STAGES];
	__shared__ int tk;
	constexpr int STAGE = R * 4096, KSTEPS = 64 / R;
	const int tid = threadIdx.x;
	if (tid == 0) {
		for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sm_u32(&bars[s])) : "memory");
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();
	unsigned phase = 0;    // bit s: the parity slot s completes next
	int issued = 0, used = 0; // stages over the block's life; slot = count % STAGES
	float acc = 0.0f;
	for (;;) {
		const char* tw = next_tile(w, tiles, ticket, tk);
		if (tw == nullptr) break;
		auto load = [&](int ks) {
			const int slot = issued % STAGES;
			if (tid == 0) {
				const unsigned bar = sm_u32(&bars[slot]);
				asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(STAGE) : "memory");
				asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
				                 sm_u32(sm) + slot * STAGE),
				             "l"(tw + (long long)ks * STAGE), "r"(STAGE), "r"(bar)
				             : "memory");
			}
			issued++;
		};
		for (int s = 0; s < STAGES - 1 && s < KSTEPS; s++) load(s);
		for (int ks = 0; ks < KSTEPS; ks++) {
			if (ks + STAGES - 1 < KSTEPS) load(ks + STAGES - 1); // the slot the step before read, freed by its barrier
			const int slot = used % STAGES;
			bar_wait(sm_u32(&bars[slot]), (phase >> slot) & 1);
			phase ^= 1u << slot;
			used++;
			acc += *reinterpret_cast<const float*>(sm + slot * STAGE + tid * 4);
			__syncthreads();
		}
	}
	sink[blockIdx.x * blockDim.x + tid] = acc;
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
// shared memory and the blocks an SM runs it with.
var streamProbeKernels = []struct {
	name          string
	shared, perSM int
}{
	{"cp256_s3", 3 * 64 * 256, 3},          // moe_one's weights alone, its 3 blocks an SM
	{"cp256_s3_x", 3 * (64*256 + 4096), 3}, // moe_one's weights and x: its ring (60 KB)
	{"cp256_s4_x", 4 * (64*256 + 4096), 2}, // a stage more: two blocks an SM
	{"cp512_s3", 3 * 64 * 512, 2},          // 512 bytes a row a stage
	{"bulk4_s4", 4 * 4 * 4096, 3},          // whole rows: 4 a stage, one bulk copy
	{"bulk8_s3", 3 * 8 * 4096, 2},          // 8 a stage
	{"bulk16_s2", 2 * 16 * 4096, 1},        // 16 a stage
}

// TestStreamPatternProbe measures the read bandwidth from DRAM that each
// way of streaming a decode MoE kernel's weight tiles into shared memory
// reaches on this GPU: streamProbeSrc's kernels over 3,300 tiles of
// 256 KB (845 MB: what W5's 48.8 experts a layer hold), each on its
// persistent grid of blocks an SM times the SMs taking tickets, timed by
// events, the median of five launches after one; every launch's ticket
// count is checked. It is the figure that says whether moe_one's 16-byte
// copies of 256-byte row pieces cost it bandwidth against whole rows by
// the copy engine (W5's moe_one runs at 94% of its bytes at the copy
// rate). Skipped unless FUSELM_STREAM_PROBE=1: a measurement, run on
// demand.
func TestStreamPatternProbe(t *testing.T) {
	d, m := openProbe(t, "FUSELM_STREAM_PROBE", "stream_probe", streamProbeSrc)
	const tiles, tileBytes, runs = 3300, 64 * 4096, 6
	w := d.Alloc(kernels.BF16, tiles*tileBytes/2)
	d.MemsetD8(d.Ptr(w), 1, tiles*tileBytes)
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
		blocks := k.perSM * sms
		var ms []float64
		for i := range runs {
			if err := d.WriteI32(ticket, []int32{0}); err != nil {
				t.Fatal(err)
			}
			from := d.Mark()
			d.Launch(f, Dim3{X: uint32(blocks)}, Dim3{X: 128}, k.shared, d.Ptr(w), d.Ptr(x), int32(tiles), d.Ptr(ticket), d.Ptr(sink))
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
		t.Logf("%-11s %3d blocks (%d an SM), %6d bytes of shared memory: %7.1f µs, %.2f TB/s", k.name, blocks, k.perSM,
			k.shared, med*1e3, float64(tiles*tileBytes)/med/1e9)
	}
}

// TestStreamProbeCompiles compiles TestStreamPatternProbe's kernels for
// sm_90a without a GPU, where FUSELM_NVRTC names a libnvrtc.so.
func TestStreamProbeCompiles(t *testing.T) { compileProbe(t, "stream_probe", streamProbeSrc) }
