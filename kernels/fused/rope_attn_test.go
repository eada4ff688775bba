package fused

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestRoPEAttnDecodeHost checks rope_attn_decode's host side without a
// GPU: fused owns and fuses it, flash_decode_rope overlaps the kernel
// before it as flash_decode_keys does, the variant table lists it, and the
// spec runs it whole only where fused runs both rope and attn_decode or the
// spec names it ("attn=naive" names attn_decode alone, so the rope stays
// on fused).
func TestRoPEAttnDecodeHost(t *testing.T) {
	info, _ := kernels.Set("fused")
	if !info.Owns(kernels.OpRoPEAttnDecode) || !slices.Contains(info.Fuses, kernels.OpRoPEAttnDecode) {
		t.Errorf("fused owns rope_attn_decode: %v, fuses it: %v", info.Owns(kernels.OpRoPEAttnDecode), info.Fuses)
	}
	for _, d := range headDims {
		if !slices.Contains(overlapKernels(), decodeRopeKernel(d)) {
			t.Errorf("%s is not launched to overlap the kernel before it", decodeRopeKernel(d))
		}
	}
	if vs := variants(kernels.OpRoPEAttnDecode, kernels.Shape{"B": 1, "H": 28, "KVH": 4, "D": 128, "ctx": 4096},
		kernels.Targets["sm_90a"]); len(vs) != 1 || !vs[0].Valid() {
		t.Errorf("variants on sm_90a: %+v, want one, valid", vs)
	}
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true},
		{"fused,rope=naive", false},
		{"fused,attn=naive", false},
		{"fused,attn_decode=naive", false},
		{"naive", false},
		{"naive,rope_attn_decode=fused", true},
		{"fused,rope_attn_decode=naive", true},
	} {
		s, err := kernels.ParseSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Whole(kernels.OpRoPEAttnDecode); got != c.whole {
			t.Errorf("%s: rope_attn_decode whole %v, want %v", c.spec, got, c.whole)
		}
	}
	if s, _ := kernels.ParseSpec("fused,attn=naive"); s.Runner(kernels.OpRoPE) != "fused" {
		t.Errorf("fused,attn=naive runs rope on %s, want fused", s.Runner(kernels.OpRoPE))
	}
}

// ropeAttnCase is one problem of TestRoPEAttnDecodeExact: one new token a
// row after past[b] cached, q, k and v column slices of one qkv row as
// Qwen2's layer holds them.
type ropeAttnCase struct {
	past         []int
	heads, kv, d int
	interleaved  bool
}

func (c ropeAttnCase) String() string {
	return fmt.Sprintf("H=%d,KV=%d,D=%d,past=%v,interleaved=%v", c.heads, c.kv, c.d, c.past, c.interleaved)
}

// ropeAttnProblem is a case's operands on the device, twice (side 0 and
// 1 hold the same values), and the rotation both use.
type ropeAttnProblem struct {
	qkv   [2]*kernels.Tensor
	a     [2]*kernels.AttnArgs
	pos   *kernels.Tensor
	r     *kernels.Rope
	owned []*kernels.Tensor
}

func (p *ropeAttnProblem) free(dev kernels.Device) { freeAll(dev, p.owned) }

func newRoPEAttnProblem(t *testing.T, dev kernels.Device, c ropeAttnCase, rng *rand.Rand) *ropeAttnProblem {
	t.Helper()
	p := &ropeAttnProblem{}
	rows, maxSeq := len(c.past), slices.Max(c.past)+1
	normals := func(n int, scale float64) []float32 { return gaussians(rng, n, scale) }
	upload, ints := keeper(t, dev, &p.owned)
	// Qwen2's angles, with a factor on the tables as YaRN folds one in:
	// the kernel must read the tables, not recompute them.
	half := c.d / 2
	cos, sin := make([]float32, maxSeq*half), make([]float32, maxSeq*half)
	for q := range maxSeq {
		for i := range half {
			a := float64(q) * math.Pow(1e6, -2*float64(i)/float64(c.d))
			cos[q*half+i], sin[q*half+i] = float32(math.Cos(a)*1.07), float32(math.Sin(a)*1.07)
		}
	}
	p.r = &kernels.Rope{Dim: c.d, Interleaved: c.interleaved, Cos: upload(kernels.F32, cos, maxSeq, half),
		Sin: upload(kernels.F32, sin, maxSeq, half)}
	p.pos = ints(c.past) // the new token's position is its row's length before it
	start := make([]int, rows+1)
	for b := range rows {
		start[b+1] = b + 1
	}
	batch := &kernels.Batch{Rows: rows, Tokens: rows, Start: start, Past: c.past, MaxSeq: maxSeq,
		StartDev: ints(start), PastDev: ints(c.past)}
	qw, kw := c.heads*c.d, c.kv*c.d
	qkv := normals(rows*(qw+2*kw), 2)
	kc, vc := normals(rows*c.kv*maxSeq*c.d, 1), normals(rows*c.kv*maxSeq*c.d, 1)
	for s := range 2 {
		x := upload(kernels.BF16, qkv, rows, qw+2*kw)
		p.qkv[s] = x
		p.a[s] = &kernels.AttnArgs{Out: upload(kernels.BF16, make([]float32, rows*qw), rows, qw),
			Q: x.ColSlice(0, qw), K: x.ColSlice(qw, qw+kw), V: x.ColSlice(qw+kw, qw+2*kw),
			KCache: upload(kernels.BF16, kc, rows, c.kv, maxSeq, c.d), VCache: upload(kernels.BF16, vc, rows, c.kv, maxSeq, c.d),
			Batch: batch, Heads: c.heads, KVHeads: c.kv, HeadDim: c.d, Scale: float32(1 / math.Sqrt(float64(c.d)))}
	}
	return p
}

// sidesAgree reports where side 0's output or either cache differs bit for
// bit from side 1's, which ran the reference (named by ref).
func (p *ropeAttnProblem) sidesAgree(t *testing.T, dev kernels.Device, what, ref string) {
	t.Helper()
	for _, piece := range []struct {
		name string
		x    [2]*kernels.Tensor
	}{{"out", [2]*kernels.Tensor{p.a[0].Out, p.a[1].Out}}, {"k cache", [2]*kernels.Tensor{p.a[0].KCache, p.a[1].KCache}},
		{"v cache", [2]*kernels.Tensor{p.a[0].VCache, p.a[1].VCache}}} {
		if n, first := bitsDiffer(read(t, dev, piece.x[1]), read(t, dev, piece.x[0])); n > 0 {
			t.Errorf("%s: %s differs from %s in %d elements, the first at %d", what, piece.name, ref, n, first)
		}
	}
}

// spreadPast is n cached lengths from 0 to last, evenly apart.
func spreadPast(n, last int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = i * last / (n - 1)
	}
	return v
}

// TestRoPEAttnDecodeExact holds rope_attn_decode, flash_decode_rope and
// attn_merge, to the fused set's rope then attn_decode (rope_half and
// flash_decode_keys) bit for bit: the output, the k cache (the new key
// rotated) and the v cache, at 1, 3 and 16 rows over caches of 1 key to a
// few thousand, Qwen2-7B's heads, a small GQA and a head dim of 80; and
// q, k and v must be left as they were. Interleaved pairs are declined. It
// also times both, for a first look (infer bench rope_attn_decode is the
// measurement). Skipped where no GPU is found.
func TestRoPEAttnDecodeExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(31))
	q7 := func(past ...int) ropeAttnCase { return ropeAttnCase{past: past, heads: 28, kv: 4, d: 128} }
	for _, c := range []ropeAttnCase{
		q7(0), q7(127), q7(300), q7(4095),
		q7(0, 150, 299), q7(4095, 1, 2500),
		q7(spreadPast(16, 300)...), q7(spreadPast(16, 4095)...),
		{past: []int{0, 7, 299}, heads: 8, kv: 2, d: 64},
		{past: []int{77, 130}, heads: 10, kv: 2, d: 80},
		{past: []int{5, 63, 64}, heads: 4, kv: 4, d: 16},
	} {
		p := newRoPEAttnProblem(t, dev, c, rng)
		before := read(t, dev, p.qkv[0])
		if u, declined := kernels.Declined(func() { o.RoPEAttentionDecode(p.a[0], p.pos, p.r) }); declined {
			t.Errorf("%s: declined: %v", c, u)
			p.free(dev)
			continue
		}
		kernels.RoPEAttentionDecodeParts(o, p.a[1], p.pos, p.r)
		p.sidesAgree(t, dev, c.String(), "rope then attn_decode")
		if n, first := bitsDiffer(before, read(t, dev, p.qkv[0])); n > 0 {
			t.Errorf("%s: qkv changed in %d elements, the first at %d: the op reads q and k unrotated and leaves them", c, n, first)
		}
		one := msPerCall(t, dev, func() { o.RoPEAttentionDecode(p.a[0], p.pos, p.r) })
		two := msPerCall(t, dev, func() { o.RoPE(p.qkv[1], c.heads+c.kv, c.d, 0, p.pos, p.r); o.AttentionDecode(p.a[1]) })
		t.Logf("%s: flash_decode_rope %.2f µs, rope then flash_decode_keys %.2f µs (launches back to back, not a step's chain)", c, one*1e3, two*1e3)
		p.free(dev)
	}
	il := ropeAttnCase{past: []int{3, 60}, heads: 8, kv: 2, d: 64, interleaved: true}
	p := newRoPEAttnProblem(t, dev, il, rng)
	defer p.free(dev)
	if _, declined := kernels.Declined(func() { o.RoPEAttentionDecode(p.a[0], p.pos, p.r) }); !declined {
		t.Errorf("%s: taken; flash_decode_rope rotates rotate_half pairs only", il)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeFoldExact holds flash_decode's merge by the last split to
// finish (merge_last) to attn_merge's launch bit for bit, for both kernels
// (flash_decode_rope through rope_attn_decode, flash_decode_keys through
// attn_decode): the output and both caches, over caches of one key (one
// split: no merge) to a few thousand (dozens of splits, some of them past
// a row's length and empty) at 1, 3 and 16 rows and several head shapes;
// the counters must be back at zero after every launch (a captured step
// replays them). Skipped where no GPU is found.
func TestDecodeFoldExact(t *testing.T) {
	dev, o := openSet(t)
	defer func(rows, splits int) { decodeFoldRows, decodeFoldSplits = rows, splits }(decodeFoldRows, decodeFoldSplits)
	const every = 1 << 20 // rows and splits: the fold taken at any count
	decodeFoldSplits = every
	rng := rand.New(rand.NewSource(37))
	q7 := func(past ...int) ropeAttnCase { return ropeAttnCase{past: past, heads: 28, kv: 4, d: 128} }
	merged := 0
	for _, c := range []ropeAttnCase{
		q7(0), q7(127), q7(227), q7(4095), q7(0, 150, 299), q7(4095, 1, 2500),
		q7(20, 40, 60, 80, 100, 120, 140, 160, 180, 200, 220, 240, 260, 280, 300, 320),
		{past: []int{0, 7, 299}, heads: 8, kv: 2, d: 64},
		{past: []int{77, 1030}, heads: 10, kv: 2, d: 80},
		{past: []int{5, 63, 64}, heads: 4, kv: 4, d: 16},
	} {
		p := newRoPEAttnProblem(t, dev, c, rng)
		wave := max(1, o.D.Props().MaxSharedPerSM/decodeShared(c.d)) * o.SMs
		splits, _ := decodeSplits(len(c.past)*c.kv, p.a[0].Batch.MaxSeq, wave)
		if splits > 1 {
			merged++
		}
		for _, call := range []struct {
			name string
			run  func(a *kernels.AttnArgs)
		}{
			{"flash_decode_rope", func(a *kernels.AttnArgs) { o.RoPEAttentionDecode(a, p.pos, p.r) }},
			{"flash_decode_keys", func(a *kernels.AttnArgs) { o.AttentionDecode(a) }},
		} {
			decodeFoldRows = 0
			call.run(p.a[1])
			decodeFoldRows = every
			call.run(p.a[0])
			call.run(p.a[0]) // again: the counters must have been left at zero
			p.sidesAgree(t, dev, fmt.Sprintf("%s, %s (%d splits)", c, call.name, splits), "attn_merge's")
			cs, err := dev.ReadI32(o.decodeCounters)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range cs {
				if v != 0 {
					t.Fatalf("%s, %s: counter %d is %d after the launch, want 0", c, call.name, i, v)
				}
			}
		}
		fold := msPerCall(t, dev, func() { o.RoPEAttentionDecode(p.a[0], p.pos, p.r) })
		decodeFoldRows = 0
		two := msPerCall(t, dev, func() { o.RoPEAttentionDecode(p.a[1], p.pos, p.r) })
		decodeFoldRows = every
		t.Logf("%s: %d splits, flash_decode_rope merging %.2f µs, with attn_merge %.2f µs (back to back, not a step's chain)",
			c, splits, fold*1e3, two*1e3)
		p.free(dev)
	}
	if merged < 5 {
		t.Errorf("%d cases merge splits: the test holds too few", merged)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeClusterCompiles compiles attention_cluster.cu by NVRTC without
// a GPU, where its library is found: no spills, every kernel there.
func TestDecodeClusterCompiles(t *testing.T) { nvrtcReport(t, decodeClusterModule()) }

// TestDecodeClusterExact holds flash_decode_rope's cluster kernels (the
// splits merged in the cluster's shared memory) to flash_decode_rope then
// attn_merge bit for bit: the output and both caches, where a case's splits
// are a cluster's, 2 to 4 (short caches at one row, 16 rows of Qwen2-7B's
// heads up to 4,096 keys, rows short enough to leave splits empty, other
// head dims, one that 3 blocks cannot slice evenly).
// Skipped where no GPU is found or the device runs no clusters (the kernel
// is then never taken).
func TestDecodeClusterExact(t *testing.T) {
	dev, o := openSet(t)
	if o.dc.err != nil {
		t.Skip(o.dc.err)
	}
	defer func(rows int, on bool) { decodeFoldRows, decodeClusterOn = rows, on }(decodeFoldRows, decodeClusterOn)
	rng := rand.New(rand.NewSource(41))
	q7 := func(past ...int) ropeAttnCase { return ropeAttnCase{past: past, heads: 28, kv: 4, d: 128} }
	for _, c := range []ropeAttnCase{
		q7(227), q7(200), q7(spreadPast(16, 255)...), q7(spreadPast(16, 4095)...),
		{past: spreadPast(16, 250), heads: 8, kv: 2, d: 64},
		q7(100), q7(150), q7(0, 90, 120), // 2, 3 and 2 splits
		{past: []int{130}, heads: 10, kv: 2, d: 80}, // 3 splits of 80 dims: slices of 27, 27 and 26
	} {
		p := newRoPEAttnProblem(t, dev, c, rng)
		wave := max(1, o.D.Props().MaxSharedPerSM/decodeShared(c.d)) * o.SMs
		if splits, _ := decodeSplits(len(c.past)*c.kv, p.a[0].Batch.MaxSeq, wave); splits < 2 || splits > decodeMaxCluster {
			t.Errorf("%s: %d splits, want 2 to %d (a cluster's): the case holds nothing", c, splits, decodeMaxCluster)
		}
		decodeFoldRows, decodeClusterOn = 0, false
		o.RoPEAttentionDecode(p.a[1], p.pos, p.r)
		decodeClusterOn = true
		o.RoPEAttentionDecode(p.a[0], p.pos, p.r)
		p.sidesAgree(t, dev, c.String(), "attn_merge's")
		cl := msPerCall(t, dev, func() { o.RoPEAttentionDecode(p.a[0], p.pos, p.r) })
		decodeClusterOn = false
		two := msPerCall(t, dev, func() { o.RoPEAttentionDecode(p.a[1], p.pos, p.r) })
		t.Logf("%s: the cluster kernel %.2f µs, flash_decode_rope then attn_merge %.2f µs (back to back, not a step's chain)",
			c, cl*1e3, two*1e3)
		p.free(dev)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestRoPEAttnDecodeDispatch: under "fused" Qwen2's rope and decode
// attention are one call of fused's (flash_decode_rope); where the spec
// puts rope or attn_decode (or the attn group) on naive they are the two
// calls, each on its set, rope over the q and k heads at once as the layer
// called it; naming the op runs it whole on that set; a rotation fused
// declines runs as the parts on fused. Skipped where no GPU is found.
func TestRoPEAttnDecodeDispatch(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	rng := rand.New(rand.NewSource(37))
	c := ropeAttnCase{past: []int{5, 300, 0}, heads: 28, kv: 4, d: 128}
	p := newRoPEAttnProblem(t, dev, c, rng)
	defer p.free(dev)
	il := ropeAttnCase{past: []int{3, 60}, heads: 8, kv: 2, d: 64, interleaved: true}
	pi := newRoPEAttnProblem(t, dev, il, rng)
	defer pi.free(dev)
	for _, s := range []struct {
		spec  string
		p     *ropeAttnProblem
		calls []string
	}{
		{"fused", p, []string{"rope_attn_decode@fused"}},
		{"fused,rope=naive", p, []string{"rope@naive", "attn_decode@fused"}},
		{"fused,attn=naive", p, []string{"rope@fused", "attn_decode@naive"}},
		{"naive", p, []string{"rope@naive", "attn_decode@naive"}},
		{"naive,rope_attn_decode=fused", p, []string{"rope_attn_decode@fused"}},
		{"fused", pi, []string{"rope@fused", "attn_decode@fused"}},
	} {
		d, obs := observed(t, dev, s.spec)
		d.RoPEAttentionDecode(s.p.a[0], s.p.pos, s.p.r)
		if !slices.Equal(obs.calls, s.calls) {
			t.Errorf("%s (interleaved %v): calls %v, want %v", s.spec, s.p.r.Interleaved, obs.calls, s.calls)
		}
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}
