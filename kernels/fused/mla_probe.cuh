// MlaProbe: in-kernel timestamps of mla_decode's flat variant (mla_flat.cu)
// and of its keys variant's kernel (mla_keys.cu) for a measurement build,
// compiled with -DMLF_PROBE=1 (mlaFlatOpts in mla_flat.go, mlaKeysOpts in
// mla_keys.go; TestMLAFlatProbe and TestMLAKeysProbe read them). In the
// normal build MlaProbe is empty and every call on it compiles to nothing.
// Each module has its own globals: a module's kernels fill only their rows.
//
// Thread 0 of every block of mla_qlat, mla_flat, mla_out and
// mla_decode_keys records, at each
// phase boundary of MlaStamp, %globaltimer (ns, one clock for all SMs) and
// %clock64 (its SM's cycles) into
//   mla_probe[kernel][call][block][stamp] = {globaltimer, clock64}, u64,
// block the linear id in the grid, call the block's count of earlier runs
// since the host zeroed mla_probe_runs (a launch overlaps the kernel
// before it only, whose grid_wait waits for the one before that: a kernel
// of a call starts after the same kernel of the call before has finished,
// so the counts go in call order). Blocks past
// MLA_PROBE_BLOCKS and calls past MLA_PROBE_CALLS record nothing. A stamp
// marks where thread 0 is: the others may be elsewhere, except after a
// barrier.

#pragma once

#define MLA_PROBE_CALLS 2     // the calls recorded after the host zeroes the run counts
#define MLA_PROBE_BLOCKS 1024 // the blocks of a launch recorded
#define MLA_PROBE_STAMPS 32   // the slots of a block
#define MLA_PROBE_TILES 8     // the key tiles whose ready and computed times a block records

// The probed kernels, the first index of mla_probe.
enum MlaProbeKernel { MLA_PROBE_QLAT, MLA_PROBE_FLAT, MLA_PROBE_OUT, MLA_PROBE_KEYS, MLA_PROBE_KERNELS };

// A block's slots: times, then values (in the globaltimer half, clock 0).
enum MlaStamp {
	MLA_ENTRY,                                // the kernel's first instruction
	MLA_PRELOADED,                            // thread 0's loads before grid_wait issued (flat, keys: the stages; qlat, out: weights)
	MLA_WAITED,                               // grid_wait returned
	MLA_QUEUED,                               // flat, keys: the new latent stored, the queries queued; the tile loop begins
	MLA_READY,                                // flat, keys: tile j's wait and barrier done, j < MLA_PROBE_TILES
	MLA_COMPUTED = MLA_READY + MLA_PROBE_TILES, // flat, keys: tile j's P·C issued (thread 0's warp)
	MLA_RUN_DONE = MLA_COMPUTED + MLA_PROBE_TILES, // flat, keys: the loop's last wait and barrier done
	MLA_SUMS,                                 // flat: row sums and statistics in shared memory: cluster barrier 1 begins; keys: row sums done
	MLA_SYNC1,                                // flat: cluster barrier 1 done
	MLA_SCALED,                               // flat: o_lat scaled into shared memory: cluster barrier 2 begins
	MLA_SYNC2,                                // flat: cluster barrier 2 done
	MLA_MERGED,                               // flat: the slice summed over the cluster and stored: cluster barrier 3 begins
	MLA_EXIT,                                 // the kernel's last instruction (flat: after barrier 3; keys: its stores issued)
	MLA_SMID,                                 // value: the SM the block ran on
	MLA_TILES,                                // value: flat's and keys's key tiles of the block
	MLA_KEYS,                                 // value: flat's and keys's keys of the block
	MLA_RANK,                                 // value: flat's rank in its cluster
};
static_assert(MLA_RANK < MLA_PROBE_STAMPS, "a block's slots hold every stamp");

#ifdef MLF_PROBE

__device__ unsigned long long mla_probe[MLA_PROBE_KERNELS][MLA_PROBE_CALLS][MLA_PROBE_BLOCKS][MLA_PROBE_STAMPS][2];
__device__ unsigned mla_probe_runs[MLA_PROBE_KERNELS][MLA_PROBE_BLOCKS];

__device__ __forceinline__ unsigned long long probe_globaltimer() {
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
	return t;
}
__device__ __forceinline__ unsigned long long probe_clock() {
	unsigned long long c;
	asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
	return c;
}

// MlaProbe is one block's slots in mla_probe, held by thread 0 (none for
// the others and for blocks or calls past the limits). The run count's
// atomic is not waited for until the first stamp after the entry,
// MLA_PRELOADED, which also writes the entry's times and the SM: the
// loads before it are issued without the round trip.
struct MlaProbe {
	unsigned long long* slots = nullptr; // this block's slots of call 0
	unsigned call = MLA_PROBE_CALLS;     // this block's earlier runs
	unsigned long long t0 = 0, c0 = 0;   // the entry's times
	unsigned sm = 0;

	__device__ MlaProbe() {}
	// MlaProbe(kernel) takes this block's slots for the kernel and reads the
	// entry's times.
	__device__ explicit MlaProbe(MlaProbeKernel kernel) {
		if (threadIdx.x != 0) return;
		t0 = probe_globaltimer();
		c0 = probe_clock();
		const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
		if (block >= MLA_PROBE_BLOCKS) return;
		// inc, not add: the compiler aggregates an add over the warp, which
		// waits for the result here.
		asm volatile("atom.global.inc.u32 %0, [%1], 0x7fffffff;" : "=r"(call) : "l"(&mla_probe_runs[kernel][block]));
		asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
		slots = &mla_probe[kernel][0][block][0][0];
	}
	// at is this call's slots, null where none.
	__device__ __forceinline__ unsigned long long* at() const {
		if (!slots || call >= MLA_PROBE_CALLS) return nullptr;
		return slots + (unsigned long long)call * MLA_PROBE_BLOCKS * MLA_PROBE_STAMPS * 2;
	}
	__device__ __forceinline__ void stamp(int s) const {
		const unsigned long long t = probe_globaltimer(), c = probe_clock();
		unsigned long long* p = at();
		if (!p) return;
		if (s == MLA_PRELOADED) {
			p[2 * MLA_ENTRY] = t0;
			p[2 * MLA_ENTRY + 1] = c0;
			p[2 * MLA_SMID] = sm;
			p[2 * MLA_SMID + 1] = 0;
		}
		p[2 * s] = t;
		p[2 * s + 1] = c;
	}
	// tile stamps tile j's MLA_READY or MLA_COMPUTED.
	__device__ __forceinline__ void tile(int s, int j) const {
		if (j < MLA_PROBE_TILES) stamp(s + j);
	}
	__device__ __forceinline__ void note(int s, unsigned long long v) const {
		unsigned long long* p = at();
		if (!p) return;
		p[2 * s] = v;
		p[2 * s + 1] = 0;
	}
};

#else

// The normal build's MlaProbe: nothing.
struct MlaProbe {
	__device__ MlaProbe() {}
	__device__ explicit MlaProbe(MlaProbeKernel) {}
	__device__ __forceinline__ void stamp(int) const {}
	__device__ __forceinline__ void tile(int, int) const {}
	__device__ __forceinline__ void note(int, unsigned long long) const {}
};

#endif
