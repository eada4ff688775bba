package cuda

import (
	"os"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// chainProbeSrc are the links of TestChainBoundaryProbe's chains. Each
// link is the least a kernel of a decode step does across its boundary:
// every block reads what the link before wrote (v) and block 0 writes
// what the next reads (v + 1).
//   - link: a kernel of its own, its wait before its release (the fused
//     set's kernels: grid_wait, then grid_release);
//   - link_rf: the same with the release first (tried in the fused set
//     as GRID_RELEASE_FIRST and withdrawn);
//   - phases: steps links in one persistent grid, a link's blocks waiting
//     for every block's arrival of the link before on a counter (after a
//     fence), the last block putting the counters back to zero.
//
// sink [blocks] keeps each block's read alive.
const chainProbeSrc = `
__device__ __forceinline__ void wait_prev() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void release_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void step(int* v, int* sink) {
	const int x = *(volatile int*)v;
	sink[blockIdx.x] = x;
	if (blockIdx.x == 0) *(volatile int*)v = x + 1;
}
extern "C" __global__ void link(int* v, int* sink) {
	wait_prev();
	release_next();
	if (threadIdx.x == 0) step(v, sink);
}
extern "C" __global__ void link_rf(int* v, int* sink) {
	release_next();
	wait_prev();
	if (threadIdx.x == 0) step(v, sink);
}
extern "C" __global__ void phases(int* v, int* sink, int* arrive, int steps) {
	if (threadIdx.x == 0) {
		for (int s = 0; s < steps; s++) {
			const int target = s * (int)gridDim.x;
			for (;;) {
				int n;
				asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(n) : "l"(arrive) : "memory");
				if (n >= target) break;
			}
			step(v, sink);
			__threadfence();
			atomicAdd(arrive, 1);
		}
		__threadfence();
		if (atomicAdd(arrive + 1, 1) == (int)gridDim.x - 1) {
			arrive[0] = 0;
			arrive[1] = 0;
		}
	}
}`

// TestChainBoundaryProbe measures what one boundary of a chain of kernels
// costs on this GPU, the figure that decides whether a decode step's
// chain should become one persistent kernel: chains of chainSteps links,
// each captured in a graph and replayed, per link, as separate launches
// (overlapped as the fused set launches them, plainly, and overlapped
// with the release first) and as the phases of one persistent grid
// synchronised by a counter; at 16, 132 and 264 blocks a link. Each
// chain's count is checked before it is timed. Skipped unless
// FUSELM_CHAIN_PROBE=1: a measurement, run on demand.
func TestChainBoundaryProbe(t *testing.T) {
	d, m := openProbe(t, "FUSELM_CHAIN_PROBE", "chain_probe", chainProbeSrc)
	fn := func(name string) *Func { return probeFunc(t, m, name) }
	link, linkRF, phases := fn("link"), fn("link_rf"), fn("phases")
	const chainSteps, replays = 256, 9
	v := d.Alloc(kernels.I32, 1)
	arrive := d.Alloc(kernels.I32, 2)
	sink := d.Alloc(kernels.I32, 512)
	block := Dim3{X: 128}
	for _, blocks := range []int{16, 132, 264} {
		grid := Dim3{X: uint32(blocks)}
		for _, c := range []struct {
			name   string
			record func()
		}{
			{"launches, overlapped", func() {
				for range chainSteps {
					d.LaunchOverlapped(link, grid, block, 0, d.Ptr(v), d.Ptr(sink))
				}
			}},
			{"launches, plain", func() {
				for range chainSteps {
					d.Launch(link, grid, block, 0, d.Ptr(v), d.Ptr(sink))
				}
			}},
			{"launches, overlapped, release first", func() {
				for range chainSteps {
					d.LaunchOverlapped(linkRF, grid, block, 0, d.Ptr(v), d.Ptr(sink))
				}
			}},
			{"one persistent grid", func() {
				d.Launch(phases, grid, block, 0, d.Ptr(v), d.Ptr(sink), d.Ptr(arrive), int32(chainSteps))
			}},
		} {
			if err := d.WriteI32(v, []int32{0}); err != nil {
				t.Fatal(err)
			}
			if err := d.WriteI32(arrive, []int32{0, 0}); err != nil {
				t.Fatal(err)
			}
			med := replayMedian(t, d, capture(t, d, c.record), replays, func(i int) {
				got, err := d.ReadI32(v)
				if err != nil {
					t.Fatal(err)
				}
				if want := int32((i + 1) * chainSteps); got[0] != want {
					t.Fatalf("%d blocks, %s: the chain counted %d after %d replays, want %d", blocks, c.name, got[0], i+1, want)
				}
			})
			t.Logf("%3d blocks a link, %-36s %7.2f µs a link (median of %d replays of %d links: %.1f µs)",
				blocks, c.name+":", med*1e3/chainSteps, replays-1, chainSteps, med*1e3)
		}
	}
}

// replayMedian replays g replays times, calling after (when not nil) once
// each replay has finished with its index, closes g, and returns the
// median of the replays' times in ms but the first (which loads the
// graph).
func replayMedian(t *testing.T, d *Device, g kernels.Graph, replays int, after func(i int)) float64 {
	t.Helper()
	var ms []float64
	for i := range replays {
		from := d.Mark()
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
		to := d.Mark()
		mustSync(t, d)
		if after != nil {
			after(i)
		}
		e, err := d.Elapsed(from, to)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			ms = append(ms, e)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ms)
	return ms[len(ms)/2]
}

// TestChainProbeCompiles compiles TestChainBoundaryProbe's kernels for
// sm_90a without a GPU, where FUSELM_NVRTC names a libnvrtc.so.
func TestChainProbeCompiles(t *testing.T) { compileProbe(t, "chain_probe", chainProbeSrc) }

// openProbe opens GPU 0 and compiles a probe's source there, skipping
// unless the probe's variable env is 1: a probe is a measurement, run on
// demand.
func openProbe(t *testing.T, env, name, src string) (*Device, *Module) {
	t.Helper()
	if os.Getenv(env) != "1" {
		t.Skip(env + " is not 1: the probe is a measurement, run on demand")
	}
	d := openDevice(t)
	m, err := d.Module(name, src)
	if err != nil {
		t.Fatal(err)
	}
	return d, m
}

// probeFunc is kernel name of a probe's module, failing the test where
// the module has none.
func probeFunc(t *testing.T, m *Module, name string) *Func {
	t.Helper()
	f, err := m.Func(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// compileProbe compiles a probe's source for sm_90a by the NVRTC library
// FUSELM_NVRTC names, failing with NVRTC's log; skipped where it is unset.
func compileProbe(t *testing.T, name, src string) {
	t.Helper()
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile the probe without a GPU")
	}
	c, err := NewCompiler(lib, "sm_90a")
	if err != nil {
		t.Fatal(err)
	}
	if _, log, err := c.Compile(Program{Name: name, Src: src}); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
}
