package fused

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// The folded path's timestamp probe (moe.cu's moe_stamp, built with
// -DMOE_PROBE=1): where the persistent gate/up and down kernels' time goes,
// block by block, at DeepSeek-V2-Lite's expert dims and 16 tokens.

const (
	moeProbeBlocks, moeProbeStamps, moeProbeTiles = 1024, 24, 4
	msEntry, msWaited, msCounted, msTile          = 0, 1, 2, 3
	msCombine                                     = msTile + 2*moeProbeTiles
	msCombined, msExit, msSMID, msTiles           = msCombine + 1, msCombine + 2, msCombine + 3, msCombine + 4
)

// TestMoEFoldProbe runs moe_experts' folded path on the persistent grid at
// 16 tokens (shared routing as W4's identical rows, distinct as W5's):
// the default, moe_one, whose gate/up and down tiles it reports as two
// kernels, or with FUSELM_MOE_PROBE_TWO=1 the two launches. Warm calls,
// then one probed call after the stream is idle, then two back to back
// (the second probed); it logs each kernel's phases in µs from the gate/up
// kernel's first entry. Skipped unless FUSELM_MOE_PROBE=1.
func TestMoEFoldProbe(t *testing.T) {
	if os.Getenv("FUSELM_MOE_PROBE") != "1" {
		t.Skip("FUSELM_MOE_PROBE is not 1: the probe is a measurement, run on demand")
	}
	saved := moeOpts
	defer func() { moeOpts = saved }()
	moeOpts = []string{"-DMOE_PROBE=1"}
	dev, o := openSet(t)
	mod := o.Func(dynConfig().foldDynGateUpKernel()).Module()
	ptr, size, err := mod.Global("moe_probe")
	if err != nil {
		t.Fatalf("moe.cu built without its probe: %v", err)
	}
	if want := 2 * moeProbeBlocks * moeProbeStamps * 8; size != want {
		t.Fatalf("moe_probe is %d bytes, want %d", size, want)
	}
	readProbe := func() [2][][moeProbeStamps]uint64 {
		raw := globalBytes(t, dev, ptr, size)
		var out [2][][moeProbeStamps]uint64
		for k := range 2 {
			out[k] = make([][moeProbeStamps]uint64, moeProbeBlocks)
			for b := range moeProbeBlocks {
				for s := range moeProbeStamps {
					out[k][b][s] = binary.LittleEndian.Uint64(raw[8*((k*moeProbeBlocks+b)*moeProbeStamps+s):])
				}
			}
		}
		return out
	}
	rng := rand.New(rand.NewSource(7))
	random := normalOn(t, dev, rng)
	const hidden, inter, experts, k, n = 2048, 1408, 64, 6, 16
	gateUp := random(kernels.BF16, 1/math.Sqrt(hidden), experts, 2*inter, hidden)
	down := random(kernels.BF16, 1/math.Sqrt(inter), experts, hidden, inter)
	x := random(kernels.BF16, 1, n, hidden)
	out := dev.Alloc(kernels.BF16, n, hidden)
	if os.Getenv("FUSELM_MOE_PROBE_TWO") == "1" {
		if err := o.UseVariant(kernels.OpMoEExperts, "tiling="+dynTiling, foldDynVariant); err != nil {
			t.Fatal(err)
		}
	}
	for _, routing := range []string{"shared", "distinct"} {
		idx, weight := routesOn(t, dev, rng, routing, n, k, experts)
		call := func() { o.MoEExperts(out, x, idx, weight, gateUp, down) }
		for range 20 {
			call()
		}
		for _, calls := range []int{1, 2} {
			for range calls - 1 {
				call()
			}
			dev.MemsetD8(ptr, 0, size)
			call()
			rec := readProbe()
			t.Logf("%s routing, %d call(s) back to back, the last probed:\n%s", routing, calls, moeProbeReport(rec))
		}
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// moeProbeReport is the probe's record as a table: for each kernel, the
// first, median and last of each stamp over the blocks that entered, in µs
// from the gate/up kernel's first entry; the tiles' GEMM durations; and
// the blocks' tile counts.
func moeProbeReport(rec [2][][moeProbeStamps]uint64) string {
	origin := ^uint64(0)
	for _, b := range rec[0] {
		if b[msEntry] != 0 {
			origin = min(origin, b[msEntry])
		}
	}
	us := func(v uint64) float64 { return float64(int64(v-origin)) / 1e3 }
	var sb strings.Builder
	names := []string{"gate/up", "down"}
	stamp := func(s int) string {
		switch {
		case s == msEntry:
			return "entry" // moe_one's down tiles: the first down ticket
		case s == msWaited:
			return "grid_wait done" // moe_one's down tiles: the first one's wait for its gate/up tiles
		case s == msCounted:
			return "tiles begin"
		case s >= msTile && s < msCombine:
			if (s-msTile)%2 == 0 {
				return fmt.Sprintf("tile %d ticket", (s-msTile)/2)
			}
			return fmt.Sprintf("tile %d done", (s-msTile)/2)
		case s == msCombine:
			return "combine begins"
		case s == msCombined:
			return "combine done"
		case s == msExit:
			return "exit"
		}
		return "?"
	}
	for kn := range 2 {
		var blocks [][moeProbeStamps]uint64
		for _, b := range rec[kn] {
			if b[msEntry] != 0 {
				blocks = append(blocks, b)
			}
		}
		fmt.Fprintf(&sb, "  %s: %d blocks entered\n", names[kn], len(blocks))
		for s := range msSMID {
			var v []float64
			for _, b := range blocks {
				if b[s] != 0 {
					v = append(v, us(b[s]))
				}
			}
			if len(v) == 0 {
				continue
			}
			lo, med, hi := spread(v)
			fmt.Fprintf(&sb, "    %-16s n=%4d  first %8.2f  median %8.2f  last %8.2f\n", stamp(s), len(v), lo, med, hi)
		}
		var dur []float64
		tiles := map[uint64]int{}
		sms := map[uint64]int{}
		for _, b := range blocks {
			tiles[b[msTiles]]++
			sms[b[msSMID]]++
			for i := range moeProbeTiles {
				if s, e := b[msTile+2*i], b[msTile+2*i+1]; s != 0 && e != 0 {
					dur = append(dur, float64(e-s)/1e3)
				}
			}
		}
		lo, med, hi := spread(dur)
		counts := []string{}
		for _, c := range slices.Sorted(maps.Keys(tiles)) {
			counts = append(counts, fmt.Sprintf("%d tiles: %d blocks", c, tiles[c]))
		}
		most := 0
		for _, c := range sms {
			most = max(most, c)
		}
		fmt.Fprintf(&sb, "    a tile's GEMM: n=%d  min %.2f  median %.2f  max %.2f µs; %s; %d SMs, at most %d blocks on one\n",
			len(dur), lo, med, hi, strings.Join(counts, ", "), len(sms), most)
	}
	return sb.String()
}
