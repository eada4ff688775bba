package cuda

import (
	"encoding/binary"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// flowProbeSrc are TestFlowProbe's kernels: a chain of projections of 16
// rows, each x [16, 2048] · wᵀ (w [2048, 2048] bf16, 8 MB) into the next
// link's x, the shape of a decode step's chain of DeepSeek-V2-Lite
// projections at W4's and W5's rows. Block b of 128 owns output columns
// [16b, 16b + 16) over all of k; its eight warps take 256 of k each, the
// weights (the mma's A: rows g and g + 8, k [8t, 8t + 8) of each 32-k
// chunk) loaded into registers before anything waits, x (the B operand,
// the same k of tokens g and g + 8) from L2 after; the warps' f32 sums
// meet in shared memory and are added in warp order.
//   - link: one link a kernel, launched overlapped (the fused set's way:
//     its weights loaded, then grid_wait, then the release);
//   - flow: every link in one persistent grid; after its output a block
//     publishes a flag (a fence, then a release store), and in the next
//     link each warp waits only for the 16 flags of the blocks that wrote
//     its k range, then loads it, so that a warp starts while later blocks
//     still finish (a warp's dataflow, no kernel boundary);
//   - flow_all: the same grid where every warp waits for all 128 flags (a
//     barrier between links);
//   - link_nox: link with x taken as zeros, not loaded (x's round trip
//     left out of the link; its output is not checked);
//   - link_chains4: link with four independent chains of mmas a token
//     tile instead of one, added at the end (its first link is checked,
//     not its chain's last output, whose rounding differs);
//   - link_pair: link in blocks that fit two an SM, x through shared
//     memory, so that a link's blocks load their weights beside the link
//     before's (the same sums as link's).
//
// The persistent grids' last block puts the flags back to zero.
const flowProbeSrc = `
typedef unsigned short bf16raw;
#define FM 16
#define FK 2048
#define FN 2048
#define FWARPS 8
#define FKW (FK / FWARPS)
#define FCH (FKW / 32)
#define FTILES (FN / 16)

__device__ __forceinline__ void wait_prev() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void release_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ unsigned word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ bf16raw f2bf(float f) {
	unsigned u = __float_as_uint(f);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (bf16raw)(u >> 16);
}
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// load_w loads this thread's weights of block b's columns of w.
__device__ __forceinline__ void load_w(uint4 (&wa)[FCH], uint4 (&wb)[FCH], const bf16raw* w, int b) {
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const bf16raw* pa = w + (long long)(16 * b + g) * FK + warp * FKW + 8 * t;
	const bf16raw* pb = pa + 8 * FK;
#pragma unroll
	for (int c = 0; c < FCH; c++) {
		wa[c] = __ldg(reinterpret_cast<const uint4*>(pa + 32 * c));
		wb[c] = __ldg(reinterpret_cast<const uint4*>(pb + 32 * c));
	}
}

// store_sums writes block b's 16 columns of y for the 16 rows: each
// warp's accumulators (acc[j][e]: row g, +8 from e = 2, token 8j + 2t +
// (e & 1)) meet in red and are added in warp order.
__device__ __forceinline__ void store_sums(const float (&acc)[2][4], float* red, bf16raw* y, int b) {
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	float* mine = red + warp * 256;
#pragma unroll
	for (int j = 0; j < 2; j++)
#pragma unroll
		for (int e = 0; e < 4; e++) mine[(j * 8 + 2 * t + (e & 1)) * 16 + g + (e < 2 ? 0 : 8)] = acc[j][e];
	__syncthreads();
	const int tok = threadIdx.x / 16, row = threadIdx.x % 16;
	float s = 0.0f;
#pragma unroll
	for (int q = 0; q < FWARPS; q++) s += red[q * 256 + tok * 16 + row];
	y[(long long)tok * FN + 16 * b + row] = f2bf(s);
}

// product writes block b's 16 columns of y = x·wᵀ for the 16 rows; x is
// read from L2 (another block, or another kernel, wrote it).
template <int CHAINS = 1>
__device__ __forceinline__ void product(const uint4 (&wa)[FCH], const uint4 (&wb)[FCH], const bf16raw* x, bf16raw* y, int b,
                                        float* red, bool loadx = true) {
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	uint4 xv[FCH][2];
#pragma unroll
	for (int c = 0; c < FCH; c++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			xv[c][j] = loadx ? __ldcg(reinterpret_cast<const uint4*>(x + (long long)(8 * j + g) * FK + warp * FKW + 32 * c + 8 * t))
			                 : make_uint4(0, 0, 0, 0);
	// CHAINS independent accumulators a token tile (the k-steps dealt
	// round robin), added at the end: shorter chains of dependent mmas.
	float acc[CHAINS][2][4];
#pragma unroll
	for (int q = 0; q < CHAINS; q++)
#pragma unroll
		for (int j = 0; j < 2; j++) acc[q][j][0] = acc[q][j][1] = acc[q][j][2] = acc[q][j][3] = 0.0f;
#pragma unroll
	for (int c = 0; c < FCH; c++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const unsigned af[4] = {word(wa[c], 2 * h), word(wb[c], 2 * h), word(wa[c], 2 * h + 1), word(wb[c], 2 * h + 1)};
#pragma unroll
			for (int j = 0; j < 2; j++) mma(acc[(2 * c + h) % CHAINS][j], af, word(xv[c][j], 2 * h), word(xv[c][j], 2 * h + 1));
		}
#pragma unroll
	for (int q = 1; q < CHAINS; q++)
#pragma unroll
		for (int j = 0; j < 2; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[0][j][e] += acc[q][j][e];
	store_sums(acc[0], red, y, b);
	__syncthreads(); // red is read before the next link writes it
}

// link_body is a link kernel's: its weights loaded, the wait, the release,
// the product (of CHAINS chains of mmas; x as zeros without LOADX).
template <int CHAINS, bool LOADX>
__device__ __forceinline__ void link_body(const bf16raw* w, const bf16raw* x, bf16raw* y) {
	__shared__ float red[FWARPS * 256];
	uint4 wa[FCH], wb[FCH];
	load_w(wa, wb, w, blockIdx.x);
	wait_prev();
	release_next();
	product<CHAINS>(wa, wb, x, y, blockIdx.x, red, LOADX);
}
extern "C" __global__ void __launch_bounds__(256, 1) link(const bf16raw* w, const bf16raw* x, bf16raw* y) {
	link_body<1, true>(w, x, y);
}
// link_chains4 is link with four chains of accumulation a token tile
// (its sums differ from link's in rounding).
extern "C" __global__ void __launch_bounds__(256, 1) link_chains4(const bf16raw* w, const bf16raw* x, bf16raw* y) {
	link_body<4, true>(w, x, y);
}
// link_nox is link without x's loads (x taken as zeros): what the
// product, the sums and the store cost a link without x's round trip.
extern "C" __global__ void __launch_bounds__(256, 1) link_nox(const bf16raw* w, const bf16raw* x, bf16raw* y) {
	link_body<1, false>(w, x, y);
}
// link_pair is link in blocks that fit two an SM (at most 128 registers
// a thread; x copied into shared memory by cp.async, rows 64 bytes apart,
// then read from there), so that the next link's blocks, launched as this
// link's pass their wait, load their weights beside this link's instead
// of after them.
#define FXROW (FK + 32)
extern "C" __global__ void __launch_bounds__(256, 2) link_pair(const bf16raw* w, const bf16raw* x, bf16raw* y) {
	extern __shared__ __align__(128) unsigned char fsm[];
	__shared__ float red[FWARPS * 256];
	bf16raw* xs = reinterpret_cast<bf16raw*>(fsm);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	uint4 wa[FCH], wb[FCH];
	load_w(wa, wb, w, blockIdx.x);
	wait_prev();
	release_next();
	// x: 16 rows of 256 16-byte pieces, 16 a thread.
	for (int i = threadIdx.x; i < FM * FK / 8; i += 256) {
		const int r = i / (FK / 8), c = i % (FK / 8);
		const unsigned dst = (unsigned)__cvta_generic_to_shared(xs + r * FXROW + 8 * c);
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(x + (long long)r * FK + 8 * c) : "memory");
	}
	asm volatile("cp.async.commit_group;" ::: "memory");
	asm volatile("cp.async.wait_group 0;" ::: "memory");
	__syncthreads();
	float acc[2][4];
#pragma unroll
	for (int j = 0; j < 2; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
	for (int c = 0; c < FCH; c++) {
		uint4 xv[2];
#pragma unroll
		for (int j = 0; j < 2; j++) xv[j] = *reinterpret_cast<const uint4*>(xs + (8 * j + g) * FXROW + warp * FKW + 32 * c + 8 * t);
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const unsigned af[4] = {word(wa[c], 2 * h), word(wb[c], 2 * h), word(wa[c], 2 * h + 1), word(wb[c], 2 * h + 1)};
#pragma unroll
			for (int j = 0; j < 2; j++) mma(acc[j], af, word(xv[j], 2 * h), word(xv[j], 2 * h + 1));
		}
	}
	store_sums(acc, red, y, blockIdx.x);
}

// flow runs links links in one grid of FTILES blocks: link l reads act's
// slice l and writes slice l + 1 with w's matrix l % wcount. With all,
// each warp waits for every block of the link before; else for the 16
// that wrote its k range.
template <bool ALL>
__device__ void flow(const bf16raw* w, int wcount, bf16raw* act, int* flags, int links) {
	__shared__ float red[FWARPS * 256];
	const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	for (int l = 0; l < links; l++) {
		uint4 wa[FCH], wb[FCH];
		load_w(wa, wb, w + (long long)(l % wcount) * FN * FK, b);
		if (l > 0) {
			const int* f = flags + (l - 1) * FTILES;
			for (int i = ALL ? lane : (lane < 16 ? 16 * warp + lane : FTILES); i < FTILES; i += ALL ? 32 : FTILES) {
				int v;
				do {
					asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(f + i) : "memory");
				} while (v == 0);
			}
			__syncwarp();
		}
		product(wa, wb, act + (long long)l * FM * FK, act + (long long)(l + 1) * FM * FK, b, red);
		__threadfence();
		__syncthreads();
		if (threadIdx.x == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flags + l * FTILES + b), "r"(1) : "memory");
	}
	// The last block to finish puts every flag back to zero (flags[links·FTILES] counts).
	if (threadIdx.x == 0) {
		__threadfence();
		if (atomicAdd(flags + links * FTILES, 1) == FTILES - 1) {
			for (int i = 0; i <= links * FTILES; i++) flags[i] = 0;
			__threadfence();
		}
	}
}
extern "C" __global__ void __launch_bounds__(256, 1) flow_warp(const bf16raw* w, int wcount, bf16raw* act, int* flags, int links) {
	flow<false>(w, wcount, act, flags, links);
}
extern "C" __global__ void __launch_bounds__(256, 1) flow_all(const bf16raw* w, int wcount, bf16raw* act, int* flags, int links) {
	flow<true>(w, wcount, act, flags, links);
}`

// TestFlowProbe measures what a chain of 16-row projections costs a link
// as kernels of their own, overlapped (the fused set's chain), and as one
// persistent grid whose links wait on flags, each warp for the blocks
// that wrote its k range or for all of them: the figure that says whether
// a decode step's projections should overlap by dataflow rather than by
// kernel boundaries. Beside them, three variants of the overlapped
// kernels take a link apart: x not loaded, four chains of mmas, and
// blocks that fit two an SM. 16 links of 8 MB matrices, 16 distinct (from
// DRAM) or 2 (from L2), each way captured in a graph and replayed. The
// first link's output is checked against the f64 product rounded to bf16
// (1e-2 of the largest), and the last link's outputs of the ways that sum
// as link does must agree with its bit for bit. Skipped unless
// FUSELM_FLOW_PROBE=1: a measurement, run on demand.
func TestFlowProbe(t *testing.T) {
	d, m := openProbe(t, "FUSELM_FLOW_PROBE", "flow_probe", flowProbeSrc)
	fn := func(name string) *Func { return probeFunc(t, m, name) }
	link, linkNoX, linkChains4, linkPair := fn("link"), fn("link_nox"), fn("link_chains4"), fn("link_pair")
	flowWarp, flowAll := fn("flow_warp"), fn("flow_all")
	const pairShared = 16 * (2048 + 32) * 2
	if err := linkPair.SetMaxDynamicShared(pairShared); err != nil {
		t.Fatal(err)
	}
	const rows, k, n, links, replays = 16, 2048, 2048, 16, 9
	rng := rand.New(rand.NewSource(29))
	upload := func(tn *kernels.Tensor, scale float64) []float32 {
		v := make([]float32, tn.Numel())
		raw := make([]byte, 4*len(v))
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v[i]))
		}
		if err := d.Upload(tn, raw, kernels.F32); err != nil {
			t.Fatal(err)
		}
		return v
	}
	w := d.Alloc(kernels.BF16, links, n, k)
	wv := upload(w, 1/math.Sqrt(k))
	act := d.Alloc(kernels.BF16, links+1, rows, k)
	x0 := upload(act, 1)[:rows*k]
	flags := d.Alloc(kernels.I32, links*(n/16)+1)
	if err := d.WriteI32(flags, make([]int32, links*(n/16)+1)); err != nil {
		t.Fatal(err)
	}
	roundBF := func(f float32) float32 {
		u := math.Float32bits(f)
		u += 0x7fff + (u>>16)&1
		return math.Float32frombits(u &^ 0xffff)
	}
	x0r, w0r := make([]float64, len(x0)), make([]float64, n*k)
	for i := range x0r {
		x0r[i] = float64(roundBF(x0[i]))
	}
	for i := range w0r {
		w0r[i] = float64(roundBF(wv[i]))
	}
	grid, block := Dim3{X: n / 16}, Dim3{X: 256}
	rowBytes := uintptr(rows * k * 2)
	var last []float32
	for _, wcount := range []int{links, 2} {
		// chain queues the links as kernels f of their own, overlapped.
		chain := func(f *Func, shared int) func() {
			return func() {
				for l := range links {
					d.LaunchOverlapped(f, grid, block, shared, d.Ptr(w)+uintptr(l%wcount)*uintptr(n*k*2),
						d.Ptr(act)+uintptr(l)*rowBytes, d.Ptr(act)+uintptr(l+1)*rowBytes)
				}
			}
		}
		for _, c := range []struct {
			name   string
			record func()
		}{
			{"kernels, overlapped", chain(link, 0)},
			{"kernels, no x loads", chain(linkNoX, 0)},
			{"kernels, 4 chains of mmas", chain(linkChains4, 0)},
			{"kernels, two an SM", chain(linkPair, pairShared)},
			{"one grid, a warp's flags", func() {
				d.Launch(flowWarp, grid, block, 0, d.Ptr(w), int32(wcount), d.Ptr(act), d.Ptr(flags), int32(links))
			}},
			{"one grid, every flag", func() {
				d.Launch(flowAll, grid, block, 0, d.Ptr(w), int32(wcount), d.Ptr(act), d.Ptr(flags), int32(links))
			}},
		} {
			med := replayMedian(t, d, capture(t, d, c.record), replays, nil)
			got, err := d.ReadF32(act)
			if err != nil {
				t.Fatal(err)
			}
			if c.name != "kernels, no x loads" {
				// The first link against the f64 product of its rounded inputs.
				worst, big := 0.0, 0.0
				for r := range rows {
					for j := range n {
						var s float64
						for q := range k {
							s += x0r[r*k+q] * w0r[j*k+q]
						}
						big = max(big, math.Abs(s))
						worst = max(worst, math.Abs(float64(got[rows*k+r*n+j])-float64(roundBF(float32(s)))))
					}
				}
				if worst > 1e-2*big {
					t.Fatalf("%d matrices, %s: the first link's output is %.3g off its f64 product (largest %.3g)", wcount, c.name, worst, big)
				}
				out := got[links*rows*k:]
				if last != nil && c.name != "kernels, 4 chains of mmas" && !slices.Equal(out, last) {
					t.Fatalf("%d matrices, %s: the chain's output differs from the overlapped kernels'", wcount, c.name)
				}
				if c.name == "kernels, overlapped" {
					last = slices.Clone(out)
				}
			}
			t.Logf("%2d matrices (%3d MB), %-26s %6.2f µs a link (median of %d replays of %d links: %.1f µs; the bytes alone %.2f µs a link at 4.2 TB/s)",
				wcount, wcount*n*k*2>>20, c.name+":", med*1e3/links, replays-1, links, med*1e3, float64(n*k*2)/4.2e6)
		}
		last = nil
	}
}

// TestFlowProbeCompiles compiles TestFlowProbe's kernels for sm_90a
// without a GPU, where FUSELM_NVRTC names a libnvrtc.so.
func TestFlowProbeCompiles(t *testing.T) { compileProbe(t, "flow_probe", flowProbeSrc) }
