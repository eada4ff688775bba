package naive

import (
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestOpsEveryPath runs the harness again with the sizes that choose code
// paths shrunk or raised, so that its small shapes take the paths big ones
// take: attention in many query chunks, MLA decode one row per pass, and
// each MoE layout.
func TestOpsEveryPath(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
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
