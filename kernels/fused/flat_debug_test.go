package fused

import (
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

func TestMLAFlatDebug(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	set, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	o := set.(*ops)
	for _, c := range []struct {
		heads, nope, rope, v, rank, maxSeq int
		past                               []int
	}{
		{3, 32, 16, 32, 96, 160, []int{0, 1, 159}},
		{16, 128, 64, 128, 512, 300, []int{0, 19, 39, 59, 79, 99, 119, 139, 159, 179, 199, 219, 239, 259, 279, 299}},
	} {
		nb := len(c.past)
		bld := kerneltest.NewBuilder(dev, 1, 0)
		width := c.rank + c.rope
		q := bld.Random(bld.Act(nb, c.heads*(c.nope+c.rope)), 1)
		kv := bld.Random(bld.Act(nb, width), 1)
		w := bld.Random(bld.Alloc(kernels.BF16, c.heads*(c.nope+c.v), c.rank), 1/math.Sqrt(float64(c.rank)))
		vals := make([]float32, nb*c.maxSeq*width)
		for b := range nb {
			for i := range c.maxSeq * width {
				if i < c.past[b]*width {
					vals[b*c.maxSeq*width+i] = float32(math.Sin(float64(i)))
				} else {
					vals[b*c.maxSeq*width+i] = float32(math.NaN())
				}
			}
		}
		cache := bld.Act(nb, c.maxSeq, width)
		bld.Upload(cache, vals)
		out := bld.Act(nb, c.heads*c.v)
		start, pasts := make([]int32, nb+1), make([]int32, nb)
		bt := &kernels.Batch{Rows: nb, Tokens: nb, MaxSeq: c.maxSeq}
		for r := range nb {
			start[r+1], pasts[r] = int32(r+1), int32(c.past[r])
			bt.Start = append(bt.Start, r)
			bt.Past = append(bt.Past, c.past[r])
		}
		bt.Start = append(bt.Start, nb)
		bt.StartDev, bt.PastDev = bld.Alloc(kernels.I32, nb+1), bld.Alloc(kernels.I32, nb)
		dev.WriteI32(bt.StartDev, start)
		dev.WriteI32(bt.PastDev, pasts)
		a := &kernels.MLAArgs{Out: out, Q: q, KV: kv, Cache: cache, WKVB: w, Batch: bt, Heads: c.heads, NopeDim: c.nope,
			RopeDim: c.rope, VDim: c.v, Rank: c.rank, Scale: 0.1}
		d := mlaLatent{c.rank, c.rope}
		stages := mlaFlatStages(d, dev.Props().MaxSharedPerSM)
		kernel, shared := mlaFlatKernel(d, stages), mlaFlatShared(d, stages)
		perRow := max(1, o.mlaFlat.clusters[kernel]/nb)
		qlat := bld.Alloc(kernels.BF16, nb, c.heads*c.rank)
		part := bld.Alloc(kernels.F32, nb*c.heads*perRow, c.rank)
		stats := bld.Alloc(kernels.F32, nb*c.heads*perRow, 2)
		m := func(t *kernels.Tensor, cols int, dt kernels.DType) cudaset.Mat {
			return cudaset.Mat{P: dev.Ptr(t), Pitch: cols, DT: dt}
		}
		o.mlaFlatLaunch(a, kernel, shared, perRow, m(qlat, c.heads*c.rank, kernels.BF16), m(part, c.rank, kernels.F32), m(stats, 2, kernels.F32))
		if err := dev.Sync(); err != nil {
			t.Fatal(err)
		}
		ql, _ := dev.ReadF32(qlat)
		pt, _ := dev.ReadF32(part)
		st, _ := dev.ReadF32(stats)
		ou, _ := dev.ReadF32(out)
		nan := func(v []float32) int {
			n := 0
			for _, x := range v {
				if x != x || math.IsInf(float64(x), 0) {
					n++
				}
			}
			return n
		}
		t.Logf("case heads %d rank %d: perRow %d, qlat NaN %d, part NaN %d, out NaN %d", c.heads, c.rank, perRow, nan(ql), nan(pt), nan(ou))
		for b := range nb {
			for h := range c.heads {
				for cl := range perRow {
					i := (b*c.heads+h)*perRow + cl
					pn := nan(pt[i*c.rank : (i+1)*c.rank])
					chunk := (c.past[b] + 1 + 8*perRow - 1) / (8 * perRow)
					if cl*8*chunk >= c.past[b]+1 {
						continue // an empty cluster
					}
					if pn > 0 || st[2*i+1] == 0 || st[2*i+1] != st[2*i+1] {
						t.Logf("b %d h %d cl %d: M %g L %g part NaN %d (len %d, chunk %d)", b, h, cl, st[2*i], st[2*i+1], pn, c.past[b]+1, (c.past[b]+1+8*perRow-1)/(8*perRow))
					}
				}
			}
			t.Logf("row %d: out NaN %d", b, nan(ou[b*c.heads*c.v:(b+1)*c.heads*c.v]))
		}
		_ = cuda.Dim3{}
	}
}
