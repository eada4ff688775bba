package fused

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// The keys variant's timestamp probe (mla_probe.cuh): where
// mla_decode_keys's time goes at 16 rows, block by block.

// TestMLAKeysProbe builds the fused set with mla_keys.cu's probe and runs
// mla_decode's keys variant (mla_absorb, mla_decode_keys, attn_merge,
// mla_absorb) at 16 rows on DeepSeek-V2-Lite's dims (16 heads, rank 512,
// rope 64, nope 128, v 128): at W4's lengths (every row 151 keys of a
// capacity of 186), W5's (121 to 166 keys, ragged), and 1,024 and 4,096
// keys a row: warm calls, then one probed call, then two probed calls back
// to back, and logs where each block's time went (keysReport). It fails
// where the stamps are missing. Skipped unless FUSELM_MLF_PROBE=1.
func TestMLAKeysProbe(t *testing.T) {
	if os.Getenv(mlaProbeEnv) != "1" {
		t.Skipf("%s is not 1: the probe is a measurement, run on demand", mlaProbeEnv)
	}
	saved, savedDefault := mlaKeysOpts, mlaDecodeDefault
	defer func() { mlaKeysOpts, mlaDecodeDefault = saved, savedDefault }()
	mlaKeysOpts = []string{mlaProbeOpt}
	mlaDecodeDefault = mlaKeysVariant
	dev, o := openHopperSet(t, "mla_decode_keys", func(*ops) error { return nil })
	d := mlaHopperDims
	lat := mlaLatent{d.rank, d.rope}
	kernel, _, wave := o.mlaKeysLaunch(lat)
	const heads, rows = 16, 16
	p := newMLAProbe(t, dev, o.Func(kernel).Module())
	p.kernel, p.keyBytes = kernel, (d.rank+d.rope)*2
	t.Logf("%s, %s, wave %d blocks; FUSELM_PDL=%q", dev.Props().Name, kernel, wave, os.Getenv("FUSELM_PDL"))

	cases := []struct {
		name   string
		past   func(b int) int
		maxSeq int
	}{
		{"W4's lengths", func(int) int { return 150 }, 186},
		{"W5's lengths", func(b int) int { return 120 + 3*b }, 186},
		{"1,024 keys", func(int) int { return 1023 }, 1024},
		{"4,096 keys", func(int) int { return 4095 }, 4096},
	}
	for i, c := range cases {
		lens, past := make([]int, rows), make([]int, rows)
		for b := range rows {
			lens[b], past[b] = 1, c.past(b)
		}
		splits, _ := decodeSplitsAt(rows, c.maxSeq, wave, mlkTile)
		p.grid = [probeKernels]int{probeKeys: splits * rows}
		if p.grid[probeKeys] > probeBlocks {
			t.Fatalf("%s: %d blocks; the probe records %d", c.name, p.grid[probeKeys], probeBlocks)
		}
		prob := newMLAHopperProblem(t, dev, mlaHopperCase{lens: lens, past: past, heads: heads, maxSeq: c.maxSeq}, int64(400+i))
		a := prob.args()
		for range 10 {
			o.MLADecode(a)
		}
		for _, calls := range []int{1, 2} {
			p.reset()
			for range calls {
				o.MLADecode(a)
			}
			rec := p.read(t)
			for _, e := range p.problems(rec, calls) {
				t.Errorf("%s, %d calls: %s", c.name, calls, e)
			}
			t.Logf("%s, %d splits a row, %d call(s)\n%s", c.name, splits, calls, p.keysReport(rec, calls))
		}
		if err := dev.Err(); err != nil {
			t.Fatal(err)
		}
		for _, x := range []*kernels.Tensor{prob.q, prob.kv, prob.wkvb, prob.cache, prob.o} {
			dev.Free(x)
		}
	}
}

// keysReport is the calls' mla_decode_keys stamps as tables: times are µs
// from call 0's first entry (globaltimer), durations ns across the blocks
// (clock64 at the SM clock the blocks show).
func (p *mlaProbe) keysReport(rec [probeCalls]probeCall, calls int) string {
	var sb strings.Builder
	n := p.grid[probeKeys]
	origin := ^uint64(0)
	for _, blk := range rec[0][probeKeys][:n] {
		origin = min(origin, blk.t[stEntry])
	}
	us := func(t uint64) float64 { return float64(int64(t-origin)) / 1e3 }
	for c := range calls {
		blocks := rec[c][probeKeys][:n]
		var bytes float64
		var entry, waited, exit, tiles []float64
		for _, blk := range blocks {
			bytes += float64(blk.t[stKeys]) * float64(p.keyBytes)
			entry = append(entry, us(blk.t[stEntry]))
			waited = append(waited, us(blk.t[stWaited]))
			exit = append(exit, us(blk.t[stExit]))
			tiles = append(tiles, float64(blk.t[stTiles]))
		}
		ghz, sms, most := clockAndSMs(blocks)
		e0, _, e1 := spread(entry)
		w0, wm, w1 := spread(waited)
		x0, xm, x1 := spread(exit)
		t0, tm, t1 := spread(tiles)
		fmt.Fprintf(&sb, "call %d: %s, %d blocks on %d SMs (at most %d a SM), key tiles a block %.0f/%.0f/%.0f, %.2f MB of keys; SM clock %.3f GHz\n",
			c, p.kernel, n, sms, most, t0, tm, t1, bytes/1e6, ghz)
		fmt.Fprintf(&sb, "  µs: entries %.2f to %.2f; grid_wait passed %.2f / %.2f / %.2f (first, median, last); exits %.2f / %.2f / %.2f; last exit %.2f after the first wait passed\n",
			e0, e1, w0, wm, w1, x0, xm, x1, x1-w0)
		tw, phase := loopPhases(&sb, "mla_decode_keys", blocks, ghz, us)
		at := probeAt
		phase("partial stores issued", at(stSums), at(stExit))
		phase("waited -> exit", at(stWaited), at(stExit))
		phase("entry -> exit", at(stEntry), at(stExit))
		tw.Flush()
	}
	if calls == 2 {
		var last uint64
		for _, blk := range rec[0][probeKeys][:n] {
			last = max(last, blk.t[stExit])
		}
		first, firstWait := ^uint64(0), ^uint64(0)
		for _, blk := range rec[1][probeKeys][:n] {
			first, firstWait = min(first, blk.t[stEntry]), min(firstWait, blk.t[stWaited])
		}
		fmt.Fprintf(&sb, "call 1 after call 0: its first entry %.2f µs, its first grid_wait passed %.2f µs after call 0's last exit (attn_merge, the out and the q projections between)\n",
			float64(int64(first-last))/1e3, float64(int64(firstWait-last))/1e3)
	}
	return sb.String()
}
