package naive

import (
	"encoding/binary"
	"math"
	"math/rand"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// openDevice opens GPU 0 or skips the test when there is none.
func openDevice(t *testing.T) *cuda.Device {
	t.Helper()
	if err := cuda.Probe(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// TestOps holds every op of the naive set against the cpu reference.
func TestOps(t *testing.T) {
	kerneltest.Run(t, openDevice(t), "naive", kerneltest.DefaultTolerances())
}

// TestOpsEveryPath runs the harness again with the sizes that choose code
// paths shrunk or raised, so that its small shapes take the paths big ones
// take: attention in many query chunks, MLA decode one row per pass, and
// each MoE layout.
func TestOpsEveryPath(t *testing.T) {
	dev := openDevice(t)
	budget, graphTokens := chunkBudget, moeGraphTokens
	defer func() { chunkBudget, moeGraphTokens = budget, graphTokens }()
	chunkBudget = 64 << 10
	t.Run("small chunks, exact moe", func(t *testing.T) {
		moeGraphTokens = 0
		kerneltest.Run(t, dev, "naive", kerneltest.DefaultTolerances())
	})
	t.Run("small chunks, padded moe", func(t *testing.T) {
		moeGraphTokens = math.MaxInt32
		kerneltest.Run(t, dev, "naive", kerneltest.DefaultTolerances())
	})
}

// TestDecodeGraph captures the decode ops in a CUDA graph and replays it
// with new row lengths and routes: each replay must give what the ops give
// when called directly.
func TestDecodeGraph(t *testing.T) {
	dev := openDevice(t)
	info := setInfo(t)
	ops, err := info.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	bf := kernels.BF16
	random := func(dt kernels.DType, shape ...int) *kernels.Tensor {
		x := dev.Alloc(dt, shape...)
		v := make([]float32, x.Numel())
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		if err := dev.Upload(x, f32Bytes(v), kernels.F32); err != nil {
			t.Fatal(err)
		}
		return x
	}
	ints := func(v []int32) *kernels.Tensor {
		x := dev.Alloc(kernels.I32, len(v))
		if err := dev.WriteI32(x, v); err != nil {
			t.Fatal(err)
		}
		return x
	}

	const rows, seq = 3, 24
	b := &kernels.Batch{Rows: rows, Tokens: rows, Start: []int{0, 1, 2, 3}, Past: make([]int, rows), MaxSeq: seq,
		StartDev: ints([]int32{0, 1, 2, 3}), PastDev: ints([]int32{0, 5, 20})}

	const heads, kvHeads, dim = 4, 2, 64
	attn := &kernels.AttnArgs{Out: dev.Alloc(bf, rows, heads*dim), Q: random(bf, rows, heads*dim),
		K: random(bf, rows, kvHeads*dim), V: random(bf, rows, kvHeads*dim),
		KCache: random(bf, rows, kvHeads, seq, dim), VCache: random(bf, rows, kvHeads, seq, dim),
		Batch: b, Heads: heads, KVHeads: kvHeads, HeadDim: dim, Scale: 0.125}

	const mh, nope, ropeDim, vdim, rank = 2, 16, 8, 16, 32
	mla := &kernels.MLAArgs{Out: dev.Alloc(bf, rows, mh*vdim), Q: random(bf, rows, mh*(nope+ropeDim)),
		KV: random(bf, rows, rank+ropeDim), Cache: random(bf, rows, seq, rank+ropeDim),
		WKVB: random(bf, mh*(nope+vdim), rank), Batch: b, Heads: mh, NopeDim: nope, RopeDim: ropeDim,
		VDim: vdim, Rank: rank, Scale: 0.2}

	const tokens, hidden, inter, experts, topK = 5, 64, 32, 8, 2
	moeOut, moeX := dev.Alloc(bf, tokens, hidden), random(bf, tokens, hidden)
	moeIdx, moeW := dev.Alloc(kernels.I32, tokens, topK), random(kernels.F32, tokens, topK)
	gateUp, down := random(bf, experts, 2*inter, hidden), random(bf, experts, hidden, inter)
	route := func() {
		var v []int32
		for range tokens {
			for _, e := range rng.Perm(experts)[:topK] {
				v = append(v, int32(e))
			}
		}
		if err := dev.WriteI32(moeIdx, v); err != nil {
			t.Fatal(err)
		}
	}
	route()

	step := func() {
		ops.AttentionDecode(attn)
		ops.MLADecode(mla)
		ops.MoEExperts(moeOut, moeX, moeIdx, moeW, gateUp, down)
	}
	outs := []*kernels.Tensor{attn.Out, mla.Out, moeOut}
	read := func() [][]float32 {
		var r [][]float32
		for _, o := range outs {
			v, err := dev.ReadF32(o)
			if err != nil {
				t.Fatal(err)
			}
			r = append(r, v)
		}
		return r
	}

	step() // sizes the scratch slots before the capture
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := dev.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	step()
	g, err := dev.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	for i, past := range [][]int32{{1, 6, 21}, {23, 0, 12}} {
		if err := dev.WriteI32(b.PastDev, past); err != nil {
			t.Fatal(err)
		}
		route()
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
		replayed := read()
		step()
		direct := read()
		for j, name := range []string{"attention", "mla", "moe"} {
			if d := relDiff(replayed[j], direct[j]); !(d <= 1e-3) {
				t.Errorf("replay %d (lengths %v): %s output differs from a direct call by %.3g", i, past, name, d)
			}
		}
	}
}

func setInfo(t *testing.T) kernels.SetInfo {
	for _, s := range kernels.Sets() {
		if s.Name == "naive" {
			return s
		}
	}
	t.Fatal("naive set not registered")
	return kernels.SetInfo{}
}

// relDiff is ‖a − b‖/‖b‖ (NaN when either holds a NaN).
func relDiff(a, b []float32) float64 {
	var d2, b2 float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		d2 += d * d
		b2 += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d2) / math.Max(math.Sqrt(b2), 1e-30)
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// benchDevice is openDevice for benchmarks.
func benchDevice(b *testing.B) (*cuda.Device, kernels.Ops) {
	if err := cuda.Probe(); err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	dev, err := cuda.Open(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.Close() })
	ops, err := New(dev)
	if err != nil {
		b.Fatal(err)
	}
	return dev, ops
}

// benchBatch is rows of n new tokens after past cached ones. The tensors'
// contents are left as allocated: benchmarks time, they do not check.
func benchBatch(dev *cuda.Device, rows, n, past, maxSeq int) *kernels.Batch {
	b := &kernels.Batch{Rows: rows, Tokens: rows * n, MaxSeq: maxSeq}
	start, pasts := make([]int32, rows+1), make([]int32, rows)
	for r := range rows {
		b.Start = append(b.Start, r*n)
		b.Past = append(b.Past, past)
		start[r+1], pasts[r] = int32((r+1)*n), int32(past)
	}
	b.Start = append(b.Start, rows*n)
	b.StartDev, b.PastDev = dev.Alloc(kernels.I32, rows+1), dev.Alloc(kernels.I32, rows)
	dev.WriteI32(b.StartDev, start)
	dev.WriteI32(b.PastDev, pasts)
	return b
}

// benchAttention times one Qwen2-7B attention layer (28 heads over 4 kv
// heads of 128): W1's prefill of one 10,816-token row, or a decode step of
// 16 rows at that length.
func benchAttention(b *testing.B, rows, n, past int) {
	dev, ops := benchDevice(b)
	const heads, kv, dim = 28, 4, 128
	bt := benchBatch(dev, rows, n, past, past+n+50)
	bf := kernels.BF16
	a := &kernels.AttnArgs{Out: dev.Alloc(bf, bt.Tokens, heads*dim), Q: dev.Alloc(bf, bt.Tokens, heads*dim),
		K: dev.Alloc(bf, bt.Tokens, kv*dim), V: dev.Alloc(bf, bt.Tokens, kv*dim),
		KCache: dev.Alloc(bf, rows, kv, bt.MaxSeq, dim), VCache: dev.Alloc(bf, rows, kv, bt.MaxSeq, dim),
		Batch: bt, Heads: heads, KVHeads: kv, HeadDim: dim, Scale: 0.088}
	for _, t := range []*kernels.Tensor{a.Q, a.K, a.V, a.KCache, a.VCache} {
		dev.Zero(t)
	}
	run := ops.AttentionPrefill
	if n == 1 {
		run = ops.AttentionDecode
	}
	for b.Loop() {
		run(a)
		if err := dev.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAttnPrefillW1Row(b *testing.B) { benchAttention(b, 1, 10816, 0) }
func BenchmarkAttnDecodeW1(b *testing.B)     { benchAttention(b, 16, 1, 10816) }

// benchMLA times one DeepSeek-V2-Lite attention layer (16 heads, rank 512):
// W3's prefill of 11,041 tokens, or a decode step at that length.
func benchMLA(b *testing.B, rows, n, past int) {
	dev, ops := benchDevice(b)
	const heads, nope, rope, vdim, rank = 16, 128, 64, 128, 512
	bt := benchBatch(dev, rows, n, past, past+n+100)
	bf := kernels.BF16
	a := &kernels.MLAArgs{Out: dev.Alloc(bf, bt.Tokens, heads*vdim), Q: dev.Alloc(bf, bt.Tokens, heads*(nope+rope)),
		KV: dev.Alloc(bf, bt.Tokens, rank+rope), Cache: dev.Alloc(bf, rows, bt.MaxSeq, rank+rope),
		WKVB: dev.Alloc(bf, heads*(nope+vdim), rank), Batch: bt, Heads: heads, NopeDim: nope, RopeDim: rope,
		VDim: vdim, Rank: rank, Scale: 0.07}
	for _, t := range []*kernels.Tensor{a.Q, a.KV, a.Cache, a.WKVB} {
		dev.Zero(t)
	}
	run := ops.MLAPrefill
	if n == 1 {
		run = ops.MLADecode
	}
	for b.Loop() {
		run(a)
		if err := dev.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMLAPrefillW3(b *testing.B) { benchMLA(b, 1, 11041, 0) }
func BenchmarkMLADecodeW3(b *testing.B)  { benchMLA(b, 1, 1, 11041) }
