package cuda

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// copyProbeSrc are TestBlockCopyProbe's kernels: how fast one block moves
// a decode kernel's few tens of KB between global and shared memory after
// its wait, the phases the mla_decode_keys probe found to set its time at
// 16 rows (its queries' 18 KB in 0.74 µs, its part's 32 KB of stores in
// about 1 µs: 20–30 GB/s a block). Each block moves `bytes` of its own
// slice (blockIdx·stride from src or dst), and thread 0 stamps
// %globaltimer at the start (after a barrier), when its own issue is done,
// and when the whole block's bytes have landed (loads: every thread's
// cp.async waited for, then a barrier; stores: every thread's
// __threadfence, which waits for its stores to be visible, then a barrier)
// into stamps[block·3 + i].
//   - load_cp: cp.async of 16 bytes a thread a step, the set's way;
//   - load_bulk: one cp.async.bulk of 2 KB a lane of warp 0, completing on
//     an mbarrier (the copy engine);
//   - store_v4: st.global of 16 bytes a thread a step, a warp 512
//     contiguous bytes an instruction (mla_decode_keys's staged stores);
//   - load_mc2, load_mc4: load_bulk's copies in clusters of 2 or 4 blocks
//     that receive one slice each, every chunk issued once by one block
//     and multicast to all (a decode projection's x, which every block of
//     linear_stream loads whole after its wait, could come so; branch lsmc
//     tried it: bench/TRIED.md).
const copyProbeSrc = `
__device__ __forceinline__ unsigned long long gtime() {
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
	return t;
}
__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// copy_back (after the stamps) writes the block's shared bytes to its
// slice of back, where back is not null: the host's check of the loads.
__device__ __forceinline__ void copy_back(const uint4* buf, uint4* back, long long stride, int bytes) {
	if (back == nullptr) return;
	for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) back[blockIdx.x * stride / 16 + i] = buf[i];
}

// stamp3 is thread 0's record of the block's start, its own issue done and
// now (the bytes landed).
__device__ __forceinline__ void stamp3(unsigned long long* stamps, unsigned long long t0, unsigned long long t1) {
	if (threadIdx.x != 0) return;
	stamps[blockIdx.x * 3] = t0;
	stamps[blockIdx.x * 3 + 1] = t1;
	stamps[blockIdx.x * 3 + 2] = gtime();
}

extern "C" __global__ void load_cp(const uint4* src, long long stride, int bytes, unsigned long long* stamps, uint4* back) {
	extern __shared__ __align__(128) uint4 buf[];
	const uint4* s = src + blockIdx.x * stride / 16;
	__syncthreads();
	const unsigned long long t0 = gtime();
	for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x)
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(buf + i)), "l"(s + i) : "memory");
	asm volatile("cp.async.commit_group;" ::: "memory");
	const unsigned long long t1 = gtime();
	asm volatile("cp.async.wait_group 0;" ::: "memory");
	__syncthreads();
	stamp3(stamps, t0, t1);
	copy_back(buf, back, stride, bytes);
}

// load_chunks<CL> is load_bulk (CL 1), load_mc2 and load_mc4: the block's (or its
// cluster's) slice in 2 KB bulk copies by warp 0's lanes onto one
// mbarrier, each chunk issued once a cluster, multicast to every block of
// it where CL > 1 (each block's mbarrier ready before any block copies, a
// cluster barrier; none leaving while another's copies may land in it,
// another).
template <int CL>
__device__ __forceinline__ void load_chunks(const uint4* src, long long stride, int bytes, unsigned long long* stamps, uint4* back) {
	extern __shared__ __align__(128) uint4 buf[];
	__shared__ __align__(8) unsigned long long bar;
	unsigned rank = 0;
	if (CL > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
	const char* s = reinterpret_cast<const char*>(src) + (blockIdx.x / CL) * stride;
	if (threadIdx.x == 0) {
		asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(saddr(&bar)) : "memory");
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();
	if (CL > 1) asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
	const unsigned long long t0 = gtime();
	const int chunks = bytes / 2048;
	if (threadIdx.x < 32) {
		if (threadIdx.x == 0)
			asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(saddr(&bar)), "r"(bytes) : "memory");
		__syncwarp();
		for (int c = rank + CL * threadIdx.x; c < chunks; c += 32 * CL) {
			const unsigned dst = saddr(reinterpret_cast<char*>(buf) + c * 2048);
			if (CL > 1)
				asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], 2048, [%2], %3;"
				             ::"r"(dst), "l"(s + c * 2048), "r"(saddr(&bar)), "h"((unsigned short)((1u << CL) - 1))
				             : "memory");
			else
				asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 2048, [%2];"
				             ::"r"(dst), "l"(s + c * 2048), "r"(saddr(&bar))
				             : "memory");
		}
	}
	const unsigned long long t1 = gtime();
	unsigned done = 0;
	while (!done)
		asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
		             : "=r"(done) : "r"(saddr(&bar)) : "memory");
	__syncthreads();
	stamp3(stamps, t0, t1);
	copy_back(buf, back, stride, bytes);
	if (CL > 1) asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
extern "C" __global__ void load_bulk(const uint4* src, long long stride, int bytes, unsigned long long* stamps, uint4* back) {
	load_chunks<1>(src, stride, bytes, stamps, back);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) load_mc2(const uint4* src, long long stride, int bytes, unsigned long long* stamps, uint4* back) {
	load_chunks<2>(src, stride, bytes, stamps, back);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) load_mc4(const uint4* src, long long stride, int bytes, unsigned long long* stamps, uint4* back) {
	load_chunks<4>(src, stride, bytes, stamps, back);
}

extern "C" __global__ void store_v4(uint4* dst, long long stride, int bytes, unsigned long long* stamps) {
	uint4* d = dst + blockIdx.x * stride / 16;
	const uint4 v = make_uint4(threadIdx.x, blockIdx.x, 0, 0);
	__syncthreads();
	const unsigned long long t0 = gtime();
	for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = v;
	const unsigned long long t1 = gtime();
	__threadfence();
	__syncthreads();
	stamp3(stamps, t0, t1);
}
`

// TestBlockCopyProbe runs copyProbeSrc's kernels over a grid of blocks
// that each move 16 or 32 KB, at 128, 256 and 512 threads a block, on 96
// blocks (mla_decode_keys's grid at W4's and W5's lengths, one an SM), 132
// (one an SM) and 264 (two), from a source the L2 holds (the same 9 MB,
// read once before) and from DRAM (a region no launch read before), and
// logs each block's median and slowest time from its start to its bytes
// landed, the median's rate a block and the grid's bytes over the slowest
// block's time; then checks the kernels' addressing (checkCopied).
// Skipped unless FUSELM_COPY_PROBE=1: a measurement, run on demand.
func TestBlockCopyProbe(t *testing.T) {
	d, m := openProbe(t, "FUSELM_COPY_PROBE", "copy_probe", copyProbeSrc)
	const maxBlocks, maxBytes = 264, 32 << 10
	const coldRegions = 24 // fresh DRAM regions, one a launch
	hot := d.Alloc(kernels.I32, maxBlocks*maxBytes/4)
	d.MemsetD8(d.Ptr(hot), 3, maxBlocks*maxBytes)
	cold := d.Alloc(kernels.I32, coldRegions*maxBlocks*maxBytes/4)
	d.MemsetD8(d.Ptr(cold), 5, coldRegions*maxBlocks*maxBytes)
	out := d.Alloc(kernels.I32, maxBlocks*maxBytes/4)
	stamps := d.Alloc(kernels.I32, 2*3*maxBlocks)
	next := 0 // the next fresh region of cold
	for _, k := range []string{"load_cp", "load_bulk", "store_v4"} {
		f := probeFunc(t, m, k)
		if k != "store_v4" {
			if err := f.SetMaxDynamicShared(maxBytes); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
		}
		for _, src := range []string{"L2", "DRAM"} {
			if k == "store_v4" && src == "DRAM" {
				continue // stores land in L2 either way
			}
			for _, bytes := range []int{16 << 10, 32 << 10} {
				for _, threads := range []int{128, 256, 512} {
					for _, blocks := range []int{96, 132, 264} {
						base := d.Ptr(hot)
						switch {
						case k == "store_v4":
							base = d.Ptr(out)
						case src == "DRAM":
							base = d.Ptr(cold) + uintptr(next%coldRegions*maxBlocks*maxBytes)
							next++
						default: // L2: read once first
							d.Launch(f, Dim3{X: uint32(blocks)}, Dim3{X: uint32(threads)}, bytes, base, int64(maxBytes), int32(bytes), d.Ptr(stamps), uintptr(0))
						}
						shared := bytes
						if k == "store_v4" {
							shared = 0
						}
						args := []any{base, int64(maxBytes), int32(bytes), d.Ptr(stamps)}
						if k != "store_v4" {
							args = append(args, uintptr(0))
						}
						d.Launch(f, Dim3{X: uint32(blocks)}, Dim3{X: uint32(threads)}, shared, args...)
						mustSync(t, d)
						issued, landed := blockTimes(t, d, stamps, k, blocks)
						med, worst := landed[len(landed)/2], landed[len(landed)-1]
						t.Logf("%-9s %-4s %2d KB %3d threads %3d blocks: issued %5.0f ns, landed %5.0f ns (slowest %5.0f): %5.1f GB/s a block, %6.0f GB/s the grid",
							k, src, bytes>>10, threads, blocks, issued[len(issued)/2], med, worst, float64(bytes)/med,
							float64(bytes*blocks)/worst)
					}
				}
			}
		}
	}
	// A decode projection's x (16 rows × 2,048 bf16: 64 KB) into every
	// block from L2: bulk copies alone against multicast in clusters.
	const mcBytes = 64 << 10
	x := d.Alloc(kernels.I32, maxBlocks*mcBytes/4)
	d.MemsetD8(d.Ptr(x), 7, maxBlocks*mcBytes)
	for _, k := range []string{"load_bulk", "load_mc2", "load_mc4"} {
		f := probeFunc(t, m, k)
		if err := f.SetMaxDynamicShared(mcBytes); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		for _, bytes := range []int{32 << 10, mcBytes} {
			for _, blocks := range []int{96, 132, 264} {
				launch := func() {
					d.Launch(f, Dim3{X: uint32(blocks)}, Dim3{X: 128}, bytes, d.Ptr(x), int64(mcBytes), int32(bytes), d.Ptr(stamps), uintptr(0))
				}
				launch() // the slices into L2
				launch()
				mustSync(t, d)
				issued, landed := blockTimes(t, d, stamps, k, blocks)
				med, worst := landed[len(landed)/2], landed[len(landed)-1]
				t.Logf("%-9s L2   %2d KB 128 threads %3d blocks: issued %5.0f ns, landed %5.0f ns (slowest %5.0f): %5.1f GB/s into a block",
					k, bytes>>10, blocks, issued[len(issued)/2], med, worst, float64(bytes)/med)
			}
		}
	}
	d.Free(x)
	if err := checkCopied(d, m); err != nil {
		t.Error(err)
	}
	for _, x := range []*kernels.Tensor{hot, cold, out, stamps} {
		d.Free(x)
	}
}

// blockTimes reads the stamps of a launch of kernel k on blocks blocks and
// returns each block's issue and landing time (ns from its start), sorted.
func blockTimes(t *testing.T, d *Device, stamps *kernels.Tensor, k string, blocks int) (issued, landed []float64) {
	t.Helper()
	raw, err := d.ReadI32(stamps)
	if err != nil {
		t.Fatal(err)
	}
	for b := range blocks {
		at := func(i int) uint64 {
			j := 2 * (3*b + i)
			return uint64(uint32(raw[j])) | uint64(uint32(raw[j+1]))<<32
		}
		t0, t1, t2 := at(0), at(1), at(2)
		if t0 == 0 || t1 < t0 || t2 < t1 {
			t.Fatalf("%s: block %d's stamps %d, %d, %d are not in order", k, b, t0, t1, t2)
		}
		issued = append(issued, float64(t1-t0))
		landed = append(landed, float64(t2-t0))
	}
	slices.Sort(issued)
	slices.Sort(landed)
	return issued, landed
}

// checkCopied checks the kernels' addressing, without which their
// timings mean nothing: store_v4 must write each block's pattern over its
// whole slice, and the loads must bring each block's slice of a source
// into shared memory whole (their copy_back writes it out; in clusters,
// the cluster's slice into every block of it).
func checkCopied(d *Device, m *Module) error {
	const blocks, bytes = 4, 32 << 10
	src := d.Alloc(kernels.I32, blocks*bytes/4)
	defer d.Free(src)
	back := d.Alloc(kernels.I32, blocks*bytes/4)
	defer d.Free(back)
	stamps := d.Alloc(kernels.I32, 2*3*blocks)
	defer d.Free(stamps)
	d.MemsetD8(d.Ptr(src), 0, blocks*bytes)
	store, err := m.Func("store_v4")
	if err != nil {
		return err
	}
	d.Launch(store, Dim3{X: blocks}, Dim3{X: 128}, 0, d.Ptr(src), int64(bytes), int32(bytes), d.Ptr(stamps))
	want, err := d.ReadI32(src)
	if err != nil {
		return err
	}
	for b := range blocks {
		for i := range bytes / 16 {
			w := want[(b*bytes/16+i)*4:]
			if w[0] != int32(i%128) || w[1] != int32(b) || w[2] != 0 || w[3] != 0 {
				return fmt.Errorf("store_v4: block %d's piece %d is %v, want [%d %d 0 0]", b, i, w[:4], i%128, b)
			}
		}
	}
	for _, k := range []struct {
		name    string
		cluster int // blocks of a cluster, which load one slice
	}{{"load_cp", 1}, {"load_bulk", 1}, {"load_mc2", 2}, {"load_mc4", 4}} {
		f, err := m.Func(k.name)
		if err != nil {
			return err
		}
		if err := f.SetMaxDynamicShared(bytes); err != nil {
			return err
		}
		d.MemsetD8(d.Ptr(back), 0xff, blocks*bytes)
		d.Launch(f, Dim3{X: blocks}, Dim3{X: 256}, bytes, d.Ptr(src), int64(bytes), int32(bytes), d.Ptr(stamps), d.Ptr(back))
		got, err := d.ReadI32(back)
		if err != nil {
			return err
		}
		for b := range blocks {
			slice := b / k.cluster
			if !slices.Equal(got[b*bytes/4:(b+1)*bytes/4], want[slice*bytes/4:(slice+1)*bytes/4]) {
				return fmt.Errorf("%s: block %d's bytes are not slice %d of the source", k.name, b, slice)
			}
		}
	}
	return nil
}

// TestCopyProbeCompiles compiles TestBlockCopyProbe's kernels for sm_90a
// without a GPU, where FUSELM_NVRTC names a libnvrtc.so.
func TestCopyProbeCompiles(t *testing.T) { compileProbe(t, "copy_probe", copyProbeSrc) }
