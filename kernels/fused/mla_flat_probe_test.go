package fused

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The flat variant's timestamp probe (mla_probe.cuh): where mla_flat's time
// goes at batch 1, block by block.

// mlaProbeEnv must be "1" for TestMLAFlatProbe to run: a measurement, not a
// check of the normal tiers.
const mlaProbeEnv = "FUSELM_MLF_PROBE"

// mlaProbeOpt builds mla_flat.cu with its probe.
const mlaProbeOpt = "-DMLF_PROBE=1"

// mla_probe.cuh's limits, kernels and slots (TestMLAProbeHeader holds them
// to the header).
const (
	probeCalls, probeBlocks, probeStamps, probeTiles = 2, 1024, 32, 8
)

const (
	probeQlat = iota
	probeFlat
	probeOut
	probeKeys
	probeKernels
)

const (
	stEntry = iota
	stPreloaded
	stWaited
	stQueued
	stReady
	stComputed = stReady + probeTiles
	stRunDone  = stComputed + probeTiles
)

const (
	stSums = stRunDone + 1 + iota
	stSync1
	stScaled
	stSync2
	stMerged
	stExit
	stSMID
	stTiles
	stKeys
	stRank
)

// probeStampNames are MlaStamp's names in order, as the header spells them.
var probeStampNames = []string{"MLA_ENTRY", "MLA_PRELOADED", "MLA_WAITED", "MLA_QUEUED", "MLA_READY", "MLA_COMPUTED",
	"MLA_RUN_DONE", "MLA_SUMS", "MLA_SYNC1", "MLA_SCALED", "MLA_SYNC2", "MLA_MERGED", "MLA_EXIT", "MLA_SMID", "MLA_TILES",
	"MLA_KEYS", "MLA_RANK"}

// TestMLAProbeHeader holds the Go mirror of mla_probe.cuh to the header:
// its limits, its kernels' order and its slots' order and values.
func TestMLAProbeHeader(t *testing.T) {
	src, err := fs.ReadFile(sources, "mla_probe.cuh")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"MLA_PROBE_CALLS": probeCalls, "MLA_PROBE_BLOCKS": probeBlocks,
		"MLA_PROBE_STAMPS": probeStamps, "MLA_PROBE_TILES": probeTiles} {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindSubmatch(src)
		if m == nil {
			t.Errorf("mla_probe.cuh defines no %s", name)
		} else if got, _ := strconv.Atoi(string(m[1])); got != want {
			t.Errorf("%s is %d in mla_probe.cuh, %d here", name, got, want)
		}
	}
	if !bytes.Contains(src, []byte("enum MlaProbeKernel { MLA_PROBE_QLAT, MLA_PROBE_FLAT, MLA_PROBE_OUT, MLA_PROBE_KEYS, MLA_PROBE_KERNELS };")) {
		t.Errorf("mla_probe.cuh's MlaProbeKernel is not (qlat, flat, out, keys)")
	}
	body := regexp.MustCompile(`(?s)enum MlaStamp \{(.*?)\};`).FindSubmatch(src)
	if body == nil {
		t.Fatal("mla_probe.cuh has no enum MlaStamp")
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(MLA_[A-Z0-9_]+)`).FindAllSubmatch(body[1], -1) {
		names = append(names, string(m[1]))
	}
	if !slices.Equal(names, probeStampNames) {
		t.Errorf("MlaStamp is %v in mla_probe.cuh, here %v", names, probeStampNames)
	}
	for _, c := range []struct {
		name string
		got  int
		want string
	}{{"MLA_COMPUTED", stComputed, "MLA_READY + MLA_PROBE_TILES"}, {"MLA_RUN_DONE", stRunDone, "MLA_COMPUTED + MLA_PROBE_TILES"}} {
		if !bytes.Contains(body[1], []byte(c.name+" = "+c.want+",")) {
			t.Errorf("mla_probe.cuh's %s is not %s", c.name, c.want)
		}
	}
	if stRank != stExit+4 || stExit != stRunDone+6 || stRank >= probeStamps {
		t.Errorf("the slots after MLA_RUN_DONE: exit %d, rank %d", stExit, stRank)
	}
}

// TestMLAFlatProbeCompiles compiles mla_flat.cu with and without its probe,
// and its cp.async reference build (mlaFlatCPOpt), with the NVRTC library
// at $FUSELM_NVRTC for $FUSELM_NVRTC_ARCH (sm_90a when unset), without a
// GPU, as kernels/cudaset's TestNVRTCCompile does: each must define every
// kernel, the probe build its two globals, and the others neither. It
// logs ptxas's report of V2-Lite's instance in each; with
// $FUSELM_NVRTC_OUT set it writes the cubins there. Skipped when
// FUSELM_NVRTC is unset.
func TestMLAFlatProbeCompiles(t *testing.T) {
	c := nvrtcCompiler(t, "mla_flat.cu")
	lite := mlaFlatKernel(mlaLatent{512, 64}, 4)
	for _, build := range []struct {
		opts []string
		name string
	}{{nil, "probe=false"}, {[]string{mlaProbeOpt}, "probe=true"}, {[]string{mlaFlatCPOpt}, "cp"}} {
		saved := mlaFlatOpts
		mlaFlatOpts = build.opts
		m := mlaFlatModule()
		mlaFlatOpts = saved
		probeBuild(t, c, m, build.name, lite)
	}
}

// TestMLAKeysProbeCompiles compiles mla_keys.cu with and without its probe
// (mlaKeysOpts), and its fragment-store reference build
// (mlaKeysFragmentOpt), as TestMLAFlatProbeCompiles does mla_flat.cu.
// Skipped when FUSELM_NVRTC is unset.
func TestMLAKeysProbeCompiles(t *testing.T) {
	c := nvrtcCompiler(t, "mla_keys.cu")
	lite := mlaKeysKernel(mlaLatent{512, 64}, 2)
	for _, build := range []struct {
		opts []string
		name string
	}{{nil, "probe=false"}, {[]string{mlaProbeOpt}, "probe=true"}, {[]string{mlaKeysFragmentOpt}, "fragment"}} {
		saved := mlaKeysOpts
		mlaKeysOpts = build.opts
		m := mlaKeysModule()
		mlaKeysOpts = saved
		probeBuild(t, c, m, build.name, lite)
	}
}

// probeBuild compiles module m (a build of it, name) with ptxas's report:
// it must define every kernel, and hold the probe's two globals exactly
// where its options ask for the probe (mlaProbeOpt). It logs the report of
// kernel lite; with $FUSELM_NVRTC_OUT set it writes the cubin there.
func probeBuild(t *testing.T, c *cuda.Compiler, m cudaset.Module, name, lite string) {
	t.Helper()
	probe := slices.Contains(m.Opts, mlaProbeOpt)
	img, log := compileReport(t, c, m, name)
	for _, f := range m.Funcs {
		if !strings.Contains(log, "Compiling entry function '"+f+"'") {
			t.Errorf("%s: no kernel %s in ptxas's report", name, f)
		}
	}
	for _, g := range []string{"mla_probe", "mla_probe_runs"} {
		if has := bytes.Contains(img, []byte("\x00"+g+"\x00")); has != probe {
			t.Errorf("%s: the cubin holds the global %s: %v", name, g, has)
		}
	}
	report := regexp.MustCompile(`(?s)Compiling entry function '` + lite + `'.*?Used [^\n]*`).FindString(log)
	t.Logf("%s, options %q: %d kernels, %d bytes of cubin; %s", name, m.Opts, len(m.Funcs), len(img), report)
}

// probeBlock is one block's slots: %globaltimer (ns) and %clock64 (its
// SM's cycles) at each stamp; a value slot holds the value in t.
type probeBlock struct{ t, c [probeStamps]uint64 }

// probeCall is one call's blocks of each kernel, by linear block id.
type probeCall [probeKernels][]probeBlock

// mlaProbe reads and zeroes a probe build's globals on the device.
type mlaProbe struct {
	dev                *cuda.Device
	stamps, runs       uintptr
	stampBytes, nRuns  int
	grid               [probeKernels]int // the blocks each kernel launches
	kernel             string            // the mla_flat instance
	clusters, clusterN int               // mla_flat's clusters and blocks of a cluster
	keyBytes           int               // bytes of a key in the latent cache
}

func newMLAProbe(t *testing.T, dev *cuda.Device, mod *cuda.Module) *mlaProbe {
	t.Helper()
	p := &mlaProbe{dev: dev}
	var err error
	if p.stamps, p.stampBytes, err = mod.Global("mla_probe"); err != nil {
		t.Fatalf("the mla_flat module has no probe (built without %s?): %v", mlaProbeOpt, err)
	}
	if want := probeKernels * probeCalls * probeBlocks * probeStamps * 2 * 8; p.stampBytes != want {
		t.Fatalf("mla_probe is %d bytes, want %d", p.stampBytes, want)
	}
	if p.runs, p.nRuns, err = mod.Global("mla_probe_runs"); err != nil {
		t.Fatal(err)
	}
	return p
}

// reset zeroes the stamps and the run counts: the next calls are calls 0
// and 1.
func (p *mlaProbe) reset() {
	p.dev.MemsetD8(p.stamps, 0, p.stampBytes)
	p.dev.MemsetD8(p.runs, 0, p.nRuns)
}

// globalBytes waits for the queued work and returns size bytes of device
// memory at ptr (a module's global), through a device buffer read back.
func globalBytes(t *testing.T, dev *cuda.Device, ptr uintptr, size int) []byte {
	t.Helper()
	buf := dev.Alloc(kernels.I32, size/4)
	defer dev.Free(buf)
	dev.Memcpy(dev.Ptr(buf), ptr, size)
	w, err := dev.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 4*len(w))
	for i, x := range w {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(x))
	}
	return raw
}

// read waits for the queued work and returns the calls' stamps.
func (p *mlaProbe) read(t *testing.T) [probeCalls]probeCall {
	t.Helper()
	raw := globalBytes(t, p.dev, p.stamps, p.stampBytes)
	u64 := func(i int) uint64 { return binary.LittleEndian.Uint64(raw[8*i:]) }
	var out [probeCalls]probeCall
	for k := range probeKernels {
		for c := range probeCalls {
			out[c][k] = make([]probeBlock, probeBlocks)
			for b := range probeBlocks {
				base := ((k*probeCalls+c)*probeBlocks + b) * probeStamps * 2
				for s := range probeStamps {
					out[c][k][b].t[s] = u64(base + 2*s)
					out[c][k][b].c[s] = u64(base + 2*s + 1)
				}
			}
		}
	}
	return out
}

var probeKernelNames = [probeKernels]string{"mla_qlat", "mla_flat", "mla_out", "mla_decode_keys"}

// problems are what is wrong with the stamps of n calls: every block of
// every kernel of calls 0..n-1 must have stamped its entry, its loads, its
// grid_wait and its exit (mla_flat: every phase and its recorded tiles)
// in order of time, and nothing else may have stamped. A probe that
// measured nothing fails here.
func (p *mlaProbe) problems(rec [probeCalls]probeCall, n int) []string {
	var out []string
	for c := range probeCalls {
		for k := range probeKernels {
			missing, stray := 0, 0
			for b, blk := range rec[c][k] {
				if c >= n || b >= p.grid[k] {
					if blk.t != ([probeStamps]uint64{}) {
						stray++
					}
					continue
				}
				need := []int{stEntry, stPreloaded, stWaited, stExit}
				if k == probeFlat || k == probeKeys {
					need = []int{stEntry, stPreloaded, stWaited, stQueued}
					for j := range min(int(blk.t[stTiles]), probeTiles) {
						need = append(need, stReady+j, stComputed+j)
					}
					need = append(need, stRunDone, stSums)
					if k == probeFlat {
						need = append(need, stSync1, stScaled, stSync2, stMerged)
					}
					need = append(need, stExit)
				}
				for i, s := range need {
					if blk.t[s] == 0 || blk.c[s] == 0 || i > 0 && (blk.t[s] < blk.t[need[i-1]] || blk.c[s] < blk.c[need[i-1]]) {
						missing++
						break
					}
				}
			}
			if missing > 0 {
				out = append(out, fmt.Sprintf("call %d, %s: %d of %d blocks lack stamps or have them out of order (the probe did not run?)",
					c, probeKernelNames[k], missing, p.grid[k]))
			}
			if stray > 0 {
				out = append(out, fmt.Sprintf("call %d, %s: %d blocks stamped that were not launched", c, probeKernelNames[k], stray))
			}
		}
	}
	return out
}

// TestMLAFlatProbe builds the fused set with mla_flat.cu's probe and runs
// mla_decode's flat variant at batch 1 on DeepSeek-V2-Lite's dims (16 heads,
// rank 512, rope 64, nope 128, v 128) at 1, 4,096, 11,042 and 32,768 keys:
// warm calls, then one probed call, then two probed calls back to back,
// and logs where each block's time went (report). It fails where the
// stamps are missing. Skipped unless FUSELM_MLF_PROBE=1.
func TestMLAFlatProbe(t *testing.T) {
	if os.Getenv(mlaProbeEnv) != "1" {
		t.Skipf("%s is not 1: the probe is a measurement, run on demand", mlaProbeEnv)
	}
	saved := mlaFlatOpts
	defer func() { mlaFlatOpts = saved }()
	mlaFlatOpts = []string{mlaProbeOpt}
	dev, o := openHopperSet(t, "mla_flat", func(o *ops) error { return o.mlaFlat.ready() })
	kernel, stages := useFlat(t, dev)
	d := mlaHopperDims
	const heads = 16
	p := newMLAProbe(t, dev, o.Func(kernel).Module())
	p.kernel, p.clusterN, p.keyBytes = kernel, mlfCluster, (d.rank+d.rope)*2
	p.clusters = min(moMaxPerRow, max(1, o.mlaFlat.clusters[kernel])) // perRow at one row
	p.grid = [probeKernels]int{d.rank / qlCols * heads, mlfCluster * p.clusters, heads * ((d.v + moRows - 1) / moRows)}
	for k, n := range p.grid {
		if n > probeBlocks {
			t.Fatalf("%s launches %d blocks; the probe records %d", probeKernelNames[k], n, probeBlocks)
		}
	}
	t.Logf("%s, %s (%d stages), %d clusters of %d at batch 1; grids (qlat, flat, out) %v; FUSELM_PDL=%q",
		dev.Props().Name, kernel, stages, p.clusters, mlfCluster, p.grid, os.Getenv("FUSELM_PDL"))

	for i, keys := range []int{1, 4096, 11042, 32768} {
		prob := newMLAHopperProblem(t, dev, mlaHopperCase{lens: []int{1}, past: []int{keys - 1}, heads: heads, maxSeq: keys}, int64(300+i))
		a := prob.args()
		for range 10 {
			o.MLADecode(a)
		}
		p.reset()
		o.MLADecode(a)
		one := p.read(t)
		for _, e := range p.problems(one, 1) {
			t.Errorf("%d keys, one call: %s", keys, e)
		}
		t.Logf("%d keys, one call\n%s", keys, p.report(one, 1))
		p.reset()
		o.MLADecode(a)
		o.MLADecode(a)
		two := p.read(t)
		for _, e := range p.problems(two, 2) {
			t.Errorf("%d keys, two calls: %s", keys, e)
		}
		t.Logf("%d keys, two calls back to back\n%s", keys, p.report(two, 2))
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
		for _, x := range []*kernels.Tensor{prob.q, prob.kv, prob.wkvb, prob.cache, prob.o} {
			dev.Free(x)
		}
	}
}

// spread is the first, median and last of xs.
func spread(xs []float64) (lo, med, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[0], s[len(s)/2], s[len(s)-1]
}

// report is the calls' stamps as tables: times are µs from call 0's first
// mla_qlat entry (globaltimer); durations are ns across mla_flat's blocks,
// from clock64 at the SM clock the blocks themselves show (their cycles
// over their globaltimer spans), so that a coarse globaltimer does not
// round them.
func (p *mlaProbe) report(rec [probeCalls]probeCall, calls int) string {
	var sb strings.Builder
	origin := ^uint64(0)
	for _, blk := range rec[0][probeQlat][:p.grid[probeQlat]] {
		origin = min(origin, blk.t[stEntry])
	}
	us := func(t uint64) float64 { return float64(int64(t-origin)) / 1e3 }

	// The globaltimer's step: the smallest positive difference of two
	// stamps of a block.
	step := ^uint64(0)
	for c := range calls {
		for k := range probeKernels {
			for _, blk := range rec[c][k][:p.grid[k]] {
				ts := []uint64{}
				for s := range stSMID {
					if blk.t[s] != 0 {
						ts = append(ts, blk.t[s])
					}
				}
				slices.Sort(ts)
				for i := 1; i < len(ts); i++ {
					if d := ts[i] - ts[i-1]; d > 0 {
						step = min(step, d)
					}
				}
			}
		}
	}
	last := func(c, k, s int) uint64 {
		var x uint64
		for _, blk := range rec[c][k][:p.grid[k]] {
			x = max(x, blk.t[s])
		}
		return x
	}
	first := func(c, k, s int) uint64 {
		x := ^uint64(0)
		for _, blk := range rec[c][k][:p.grid[k]] {
			x = min(x, blk.t[s])
		}
		return x
	}
	gap := func(to, from uint64) float64 { return float64(int64(to-from)) / 1e3 }
	for c := range calls {
		flat := rec[c][probeFlat][:p.grid[probeFlat]]
		var tiles, keys, loops []float64
		bytes := 0.0
		for _, blk := range flat {
			loops = append(loops, float64(blk.c[stRunDone]-blk.c[stQueued]))
			bytes += float64(blk.t[stKeys]) * float64(p.keyBytes)
			tiles = append(tiles, float64(blk.t[stTiles]))
			keys = append(keys, float64(blk.t[stKeys]))
		}
		ghz, sms, most := clockAndSMs(flat)
		tl, tm, th := spread(tiles)
		kl, km, kh := spread(keys)
		fmt.Fprintf(&sb, "call %d: %s, %d clusters of %d = %d blocks on %d SMs (at most %d a SM); SM clock %.3f GHz (clock64 over globaltimer); globaltimer step %d ns\n",
			c, p.kernel, p.clusters, p.clusterN, len(flat), sms, most, ghz, step)
		_, lm, lx := spread(loops)
		fmt.Fprintf(&sb, "  mla_flat key tiles a block min/med/max %.0f/%.0f/%.0f, keys %.0f/%.0f/%.0f; all blocks' keys over the median / longest tile loop: %.0f / %.0f GB/s\n",
			tl, tm, th, kl, km, kh, bytes/(lm/ghz), bytes/(lx/ghz))
		fmt.Fprintf(&sb, "  grid_wait passed: mla_flat's first %.2f µs after mla_qlat's last exit, mla_out's first %.2f µs after mla_flat's last exit\n",
			gap(first(c, probeFlat, stWaited), last(c, probeQlat, stExit)), gap(first(c, probeOut, stWaited), last(c, probeFlat, stExit)))

		// Each kernel's blocks in time.
		tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  kernel (µs)\tblocks\tfirst entry\tlast entry\tfirst waited\tlast waited\tfirst exit\tlast exit\twall\t")
		for k := range probeKernels {
			var entry, waited, exit []float64
			for _, blk := range rec[c][k][:p.grid[k]] {
				entry = append(entry, us(blk.t[stEntry]))
				waited = append(waited, us(blk.t[stWaited]))
				exit = append(exit, us(blk.t[stExit]))
			}
			e0, _, e1 := spread(entry)
			w0, _, w1 := spread(waited)
			x0, _, x1 := spread(exit)
			fmt.Fprintf(tw, "  %s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", probeKernelNames[k], p.grid[k], e0, e1, w0, w1, x0, x1, x1-e0)
		}
		tw.Flush()

		// mla_flat's phases: each one's duration across the blocks, and
		// when its end came (first, median, last block).
		tw, phase := loopPhases(&sb, "mla_flat", flat, ghz, us)
		at := probeAt
		phase("cluster barrier 1", at(stSums), at(stSync1))
		phase("cluster max, o_lat scaled", at(stSync1), at(stScaled))
		phase("cluster barrier 2", at(stScaled), at(stSync2))
		phase("DSM merge, part stores", at(stSync2), at(stMerged))
		phase("cluster barrier 3", at(stMerged), at(stExit))
		phase("entry -> exit", at(stEntry), at(stExit))
		tw.Flush()

		// mla_qlat's and mla_out's phases.
		tw = tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  other kernels (ns)\tentry -> loads issued\tgrid_wait\twaited -> exit\t")
		for _, k := range []int{probeQlat, probeOut} {
			var a, b, x []float64
			for _, blk := range rec[c][k][:p.grid[k]] {
				a = append(a, float64(blk.c[stPreloaded]-blk.c[stEntry])/ghz)
				b = append(b, float64(blk.c[stWaited]-blk.c[stPreloaded])/ghz)
				x = append(x, float64(blk.c[stExit]-blk.c[stWaited])/ghz)
			}
			_, am, ax := spread(a)
			_, bm, bx := spread(b)
			_, xm, xx := spread(x)
			fmt.Fprintf(tw, "  %s med/max\t%.0f/%.0f\t%.0f/%.0f\t%.0f/%.0f\t\n", probeKernelNames[k], am, ax, bm, bx, xm, xx)
		}
		tw.Flush()
	}
	if calls == 2 {
		fmt.Fprintf(&sb, "call 1 after call 0: its mla_qlat's first entry %.2f µs after call 0's mla_out's last exit, its mla_flat's first entry %.2f µs after call 0's mla_flat's last exit\n",
			gap(first(1, probeQlat, stEntry), last(0, probeOut, stExit)), gap(first(1, probeFlat, stEntry), last(0, probeFlat, stExit)))
	}
	return sb.String()
}

// phaseTable writes rows of a probe report's phase table: each phase's
// duration across blocks (clock64 over the SM clock ghz, ns) and when its
// end came (globaltimer, us from the report's origin).
type phaseTable struct {
	tw     *tabwriter.Writer
	blocks []probeBlock
	ghz    float64
	us     func(uint64) float64
}

// row is the phase from stamp from(blk) to stamp to(blk) of every block
// where both are at least 0 (first, median, last block's end).
func (pt phaseTable) row(name string, from, to func(probeBlock) int) {
	var dur, end []float64
	for _, blk := range pt.blocks {
		f, e := from(blk), to(blk)
		if f < 0 || e < 0 {
			continue
		}
		dur = append(dur, float64(blk.c[e]-blk.c[f])/pt.ghz)
		end = append(end, pt.us(blk.t[e]))
	}
	if len(dur) == 0 {
		return
	}
	_, dm, dx := spread(dur)
	e0, em, e1 := spread(end)
	fmt.Fprintf(pt.tw, "  %s (%d blocks)\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t\n", name, len(dur), dm, dx, e0, em, e1)
}

// probeAt is the stamp s of every block.
func probeAt(s int) func(probeBlock) int { return func(probeBlock) int { return s } }

// lastComputed is a block's last tile's MLA_COMPUTED stamp (its queries'
// MLA_QUEUED when it had none; -1 when that tile was past the recorded).
func lastComputed(blk probeBlock) int {
	n := int(blk.t[stTiles])
	if n == 0 {
		return stQueued
	}
	if n > probeTiles {
		return -1 // the last tiles were not recorded
	}
	return stComputed + n - 1
}

// clockAndSMs is the SM clock the blocks show (their clock64 cycles over
// their globaltimer spans, entry to exit, in GHz), the SMs they ran on
// (MLA_SMID) and the most of them one SM ran.
func clockAndSMs(blocks []probeBlock) (ghz float64, sms, most int) {
	var cyc, ns float64
	on := map[uint64]int{}
	for _, blk := range blocks {
		cyc += float64(blk.c[stExit] - blk.c[stEntry])
		ns += float64(blk.t[stExit] - blk.t[stEntry])
		on[blk.t[stSMID]]++
	}
	for _, n := range on {
		most = max(most, n)
	}
	return cyc / ns, len(on), most
}

// loopPhases starts a phase table (phaseTable) of kernel's blocks on w
// with the rows mla_flat and mla_decode_keys share: the prologue, each
// recorded tile's wait (from the one before's compute, or the queries
// queued) and compute for the blocks that have it (MLA_TILES), and the
// loop's end to the row sums. The caller adds its own rows with phase and
// flushes tw.
func loopPhases(w io.Writer, kernel string, blocks []probeBlock, ghz float64,
	us func(uint64) float64) (tw *tabwriter.Writer, phase func(string, func(probeBlock) int, func(probeBlock) int)) {
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  %s phase\tmed ns\tmax ns\tends at µs: first\tmed\tlast\t\n", kernel)
	phase = phaseTable{tw, blocks, ghz, us}.row
	at := probeAt
	phase("entry -> stages queued", at(stEntry), at(stPreloaded))
	phase("grid_wait", at(stPreloaded), at(stWaited))
	phase("new latent, queries queued", at(stWaited), at(stQueued))
	for j := range probeTiles {
		// has is stamp s for the blocks that have tile j, -1 for the others.
		has := func(s int) func(probeBlock) int {
			return func(blk probeBlock) int {
				if int(blk.t[stTiles]) <= j {
					return -1
				}
				return s
			}
		}
		begins := stQueued // tile j's wait begins when the queries are queued, or the tile before is computed
		if j > 0 {
			begins = stComputed + j - 1
		}
		phase(fmt.Sprintf("tile %d wait", j), has(begins), has(stReady+j))
		phase(fmt.Sprintf("tile %d compute", j), has(stReady+j), has(stComputed+j))
	}
	phase("loop end (last wait, barrier)", lastComputed, at(stRunDone))
	phase("tile loop in all", at(stQueued), at(stRunDone))
	phase("row sums", at(stRunDone), at(stSums))
	return tw, phase
}

// TestMLAProbeReport runs the probe's check and report, without a GPU, on
// made-up stamps: whole ones pass and print every table, and missing,
// disordered or stray stamps are each found.
func TestMLAProbeReport(t *testing.T) {
	p := &mlaProbe{grid: [probeKernels]int{4, 16, 2, 6}, kernel: "mla_flat_test", clusters: 2, clusterN: mlfCluster, keyBytes: 1152}
	var rec [probeCalls]probeCall
	for c := range probeCalls {
		for k := range probeKernels {
			rec[c][k] = make([]probeBlock, probeBlocks)
			for b := range p.grid[k] {
				blk := &rec[c][k][b]
				t0 := uint64(1_000_000 + c*50_000 + k*3_000 + b*40)
				order := []int{stEntry, stPreloaded, stWaited, stQueued}
				for j := range probeTiles {
					order = append(order, stReady+j, stComputed+j)
				}
				order = append(order, stRunDone, stSums, stSync1, stScaled, stSync2, stMerged, stExit)
				for i, s := range order {
					blk.t[s] = t0 + uint64(i)*500
					blk.c[s] = 7_000_000 + uint64(i)*990
				}
				blk.t[stSMID], blk.t[stTiles], blk.t[stKeys], blk.t[stRank] = uint64(b), uint64(b%10), uint64(32*(b%10)), uint64(b%mlfCluster)
			}
		}
	}
	if e := p.problems(rec, 2); e != nil {
		t.Fatalf("whole stamps: %v", e)
	}
	r := p.report(rec, 2)
	for _, want := range []string{"call 0:", "call 1:", "mla_qlat", "mla_out", "grid_wait", "tile 8 wait", "cluster barrier 3", "call 1 after call 0"} {
		if want == "tile 8 wait" {
			if strings.Contains(r, want) {
				t.Errorf("the report shows a tile past the %d recorded", probeTiles)
			}
			continue
		}
		if !strings.Contains(r, want) {
			t.Errorf("the report lacks %q:\n%s", want, r)
		}
	}
	t.Logf("made-up report:\n%s", r)
	k := p.keysReport(rec, 2)
	for _, want := range []string{"call 0: mla_flat_test, 6 blocks", "call 1:", "tile 0 compute", "partial stores issued", "call 1 after call 0"} {
		if !strings.Contains(k, want) {
			t.Errorf("the keys report lacks %q:\n%s", want, k)
		}
	}
	t.Logf("made-up keys report:\n%s", k)

	if e := p.problems(rec, 1); len(e) != probeKernels || !strings.Contains(e[0], "not launched") {
		t.Errorf("call 1 stamped where one call ran: %v", e)
	}
	broken := rec
	broken[0][probeFlat] = slices.Clone(rec[0][probeFlat])
	broken[0][probeFlat][3].t[stSync2] = 0
	broken[0][probeFlat][5].c[stReady+2], broken[0][probeFlat][5].c[stComputed+2] = 9e9, 9e9+1 // tile 2 after the loop's end
	if e := p.problems(broken, 2); len(e) != 1 || !strings.Contains(e[0], "mla_flat: 2 of 16 blocks") {
		t.Errorf("a missing and a disordered stamp of mla_flat: %v", e)
	}
	var none [probeCalls]probeCall
	for c := range probeCalls {
		for k := range probeKernels {
			none[c][k] = make([]probeBlock, probeBlocks)
		}
	}
	if e := p.problems(none, 1); len(e) != probeKernels {
		t.Errorf("no stamps at all: %v", e)
	}
}
