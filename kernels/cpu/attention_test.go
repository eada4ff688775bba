package cpu_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// batch describes rows of lens new tokens after past cached ones, with the
// device mirrors filled in.
func (f *fixture) batch(lens, past []int, maxSeq int) *kernels.Batch {
	start := make([]int, len(lens)+1)
	for b, n := range lens {
		start[b+1] = start[b] + n
	}
	return &kernels.Batch{Rows: len(lens), Tokens: start[len(lens)], Start: start, Past: past, MaxSeq: maxSeq,
		StartDev: f.ints(int32s(start), len(start)), PastDev: f.ints(int32s(past), len(past))}
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// attend64 is softmax(q·kᵀ·scale)·v over the given keys and values.
func attend64(q []float64, keys, vals [][]float64, scale float64) []float64 {
	s := make([]float64, len(keys))
	for j, k := range keys {
		s[j] = dot64(q, k) * scale
	}
	p := softmax64(s)
	out := make([]float64, len(vals[0]))
	for j, v := range vals {
		for i := range out {
			out[i] += p[j] * v[i]
		}
	}
	return out
}

type attnShape struct {
	heads, kv, d int
	lens, past   []int
	maxSeq       int
}

func (s attnShape) String() string {
	return fmt.Sprintf("H=%d,KV=%d,D=%d,new=%v,past=%v,max=%d", s.heads, s.kv, s.d, s.lens, s.past, s.maxSeq)
}

// TestAttentionPrefill holds prefill against attention over explicit key and
// value sequences: the cached part is written into the cache first, the new
// part comes in as column slices of a fused qkv matrix.
func TestAttentionPrefill(t *testing.T) {
	for i, s := range []attnShape{
		{heads: 3, kv: 3, d: 8, lens: []int{4, 1, 7}, past: []int{0, 5, 2}, maxSeq: 16},
		{heads: 4, kv: 2, d: 13, lens: []int{13, 2}, past: []int{3, 0}, maxSeq: 20},
		{heads: 7, kv: 1, d: 16, lens: []int{1, 33, 0, 5}, past: []int{0, 7, 4, 27}, maxSeq: 40},
		{heads: 2, kv: 2, d: 4, lens: []int{1}, past: []int{0}, maxSeq: 1},
	} {
		t.Run(s.String(), func(t *testing.T) {
			f := newFixture(t, int64(20+i))
			nb, hq, hkv, d := len(s.lens), s.heads, s.kv, s.d
			// keys[b][g][p], vals[b][g][p]: every position of every row
			keys, vals := make([][][][]float64, nb), make([][][][]float64, nb)
			cacheK, cacheV := fill(nb*hkv*s.maxSeq*d, nan32), fill(nb*hkv*s.maxSeq*d, nan32)
			for b := range nb {
				keys[b], vals[b] = make([][][]float64, hkv), make([][][]float64, hkv)
				for g := range hkv {
					for p := range s.past[b] + s.lens[b] {
						k, v := f.normal(d, 1), f.normal(d, 1)
						keys[b][g] = append(keys[b][g], widen(k))
						vals[b][g] = append(vals[b][g], widen(v))
						if p < s.past[b] {
							copy(cacheK[((b*hkv+g)*s.maxSeq+p)*d:], k)
							copy(cacheV[((b*hkv+g)*s.maxSeq+p)*d:], v)
						}
					}
				}
			}
			bt := f.batch(s.lens, s.past, s.maxSeq)
			width := (hq+2*hkv)*d + 3
			qkv := make([]float32, 0, bt.Tokens*width)
			for b := range nb {
				for i := range s.lens[b] {
					qkv = append(qkv, f.normal(hq*d, 1)...)
					for _, seq := range [][][][]float64{keys[b], vals[b]} {
						for g := range hkv {
							qkv = append(qkv, narrow(seq[g][s.past[b]+i])...)
						}
					}
					qkv = append(qkv, 9, 9, 9)
				}
			}
			m := f.tensor(kernels.F32, qkv, bt.Tokens, width)
			a := &kernels.AttnArgs{
				Out: f.tensor(kernels.F32, fill(bt.Tokens*hq*d, nan32), bt.Tokens, hq*d),
				Q:   m.ColSlice(0, hq*d), K: m.ColSlice(hq*d, (hq+hkv)*d), V: m.ColSlice((hq+hkv)*d, (hq+2*hkv)*d),
				KCache: f.tensor(kernels.F32, cacheK, nb, hkv, s.maxSeq, d),
				VCache: f.tensor(kernels.F32, cacheV, nb, hkv, s.maxSeq, d),
				Batch:  bt, Heads: hq, KVHeads: hkv, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d))),
			}
			f.ops.AttentionPrefill(a)
			f.sync()

			qs := rowsOf(f.read(a.Q), hq*d)
			var want []float64
			for b := range nb {
				for i := range s.lens[b] {
					p := s.past[b] + i
					for h := range hq {
						g := h / (hq / hkv)
						want = append(want, attend64(qs[bt.Start[b]+i][h*d:(h+1)*d], keys[b][g][:p+1], vals[b][g][:p+1], float64(a.Scale))...)
					}
				}
			}
			assertClose(t, "out", f.read(a.Out), want, 1e-5)
			for c, seq := range map[*kernels.Tensor][][][][]float64{a.KCache: keys, a.VCache: vals} {
				var want []float64
				for b := range nb {
					for g := range hkv {
						for p := range s.maxSeq {
							if p < len(seq[b][g]) {
								want = append(want, seq[b][g][p]...)
							} else {
								want = append(want, widen(fill(d, nan32))...)
							}
						}
					}
				}
				assertClose(t, "cache", f.read(c), want, 0)
			}
		})
	}
}

// TestAttentionDecode checks that prefilling a row's tokens but the last,
// then decoding the last, gives what prefilling them all gives at the last
// position, with the host Past stale (decode reads PastDev).
func TestAttentionDecode(t *testing.T) {
	for i, s := range []attnShape{
		{heads: 4, kv: 2, d: 8, lens: []int{5, 1, 12}, maxSeq: 12},
		{heads: 7, kv: 1, d: 13, lens: []int{2, 30}, maxSeq: 31},
		{heads: 3, kv: 3, d: 16, lens: []int{1}, maxSeq: 1},
	} {
		t.Run(s.String(), func(t *testing.T) {
			f := newFixture(t, int64(30+i))
			nb, hq, hkv, d := len(s.lens), s.heads, s.kv, s.d
			whole := f.batch(s.lens, make([]int, nb), s.maxSeq)
			q, k, v := f.randn(kernels.F32, 1, whole.Tokens, hq*d), f.randn(kernels.F32, 1, whole.Tokens, hkv*d), f.randn(kernels.F32, 1, whole.Tokens, hkv*d)
			args := func(bt *kernels.Batch, q, k, v *kernels.Tensor) *kernels.AttnArgs {
				return &kernels.AttnArgs{Out: f.dev.Alloc(kernels.F32, q.Rows(), hq*d), Q: q, K: k, V: v,
					KCache: f.tensor(kernels.F32, fill(nb*hkv*s.maxSeq*d, nan32), nb, hkv, s.maxSeq, d),
					VCache: f.tensor(kernels.F32, fill(nb*hkv*s.maxSeq*d, nan32), nb, hkv, s.maxSeq, d),
					Batch:  bt, Heads: hq, KVHeads: hkv, HeadDim: d, Scale: 0.3}
			}
			full := args(whole, q, k, v)
			f.ops.AttentionPrefill(full)

			// All tokens but the last of each row, then the last ones.
			heads, lasts, past := []int{}, []int{}, []int{}
			for b, n := range s.lens {
				for t := whole.Start[b]; t < whole.Start[b+1]-1; t++ {
					heads = append(heads, t)
				}
				lasts = append(lasts, whole.Start[b+1]-1)
				past = append(past, n-1)
			}
			pre := args(f.batch(past, make([]int, nb), s.maxSeq), f.gather(q, heads), f.gather(k, heads), f.gather(v, heads))
			f.ops.AttentionPrefill(pre)
			bt := f.batch(ones(nb), past, s.maxSeq)
			bt.Past = make([]int, nb) // stale: decode must read PastDev
			dec := args(bt, f.gather(q, lasts), f.gather(k, lasts), f.gather(v, lasts))
			dec.KCache, dec.VCache = pre.KCache, pre.VCache
			f.ops.AttentionDecode(dec)
			f.sync()

			assertClose(t, "decode", f.read(dec.Out), f.read(f.gather(full.Out, lasts)), 1e-6)
			assertClose(t, "k cache", f.read(dec.KCache), f.read(full.KCache), 0)
			assertClose(t, "v cache", f.read(dec.VCache), f.read(full.VCache), 0)

			// A length the cache cannot take is a device error.
			f.dev.WriteI32(bt.PastDev, int32s(fillInt(nb, s.maxSeq)))
			f.ops.AttentionDecode(dec)
			if err := f.dev.Sync(); err == nil {
				t.Errorf("decode at a full cache: no error")
			}
		})
	}
}

// gather is a packed copy of rows idx of an f32 tensor.
func (f *fixture) gather(x *kernels.Tensor, idx []int) *kernels.Tensor {
	rows := rowsOf(f.read(x), x.Cols())
	var v []float32
	for _, i := range idx {
		v = append(v, narrow(rows[i])...)
	}
	return f.tensor(kernels.F32, v, len(idx), x.Cols())
}

type mlaShape struct {
	heads, nope, rope, v, rank int
	lens, past                 []int
	maxSeq                     int
}

func (s mlaShape) String() string {
	return fmt.Sprintf("H=%d,nope=%d,rope=%d,v=%d,rank=%d,new=%v,past=%v", s.heads, s.nope, s.rope, s.v, s.rank, s.lens, s.past)
}

// TestMLA holds MLA prefill against attention over explicitly decompressed
// keys k_h[s] = (W_UK[h]·c[s], kr[s]) and values v_h[s] = W_UV[h]·c[s], then
// checks that decoding each row's last token after prefilling the rest gives
// the same.
func TestMLA(t *testing.T) {
	for i, s := range []mlaShape{
		{heads: 2, nope: 4, rope: 2, v: 3, rank: 5, lens: []int{3, 1}, past: []int{0, 4}, maxSeq: 8},
		{heads: 3, nope: 8, rope: 4, v: 8, rank: 13, lens: []int{7, 0, 13}, past: []int{2, 5, 0}, maxSeq: 20},
		{heads: 1, nope: 16, rope: 8, v: 16, rank: 33, lens: []int{1}, past: []int{0}, maxSeq: 1},
	} {
		for _, wdt := range weightTypes {
			t.Run(s.String()+","+wdt.String(), func(t *testing.T) {
				f := newFixture(t, int64(40+i))
				testMLA(t, f, s, wdt)
			})
		}
	}
}

func testMLA(t *testing.T, f *fixture, s mlaShape, wdt kernels.DType) {
	nb, nh, w := len(s.lens), s.heads, s.rank+s.rope
	dq := s.nope + s.rope
	// lat[b][p]: every row's latent and rotated key at every position.
	lat := make([][][]float64, nb)
	cache := fill(nb*s.maxSeq*w, nan32)
	for b := range nb {
		for p := range s.past[b] + s.lens[b] {
			c := f.normal(w, 1)
			lat[b] = append(lat[b], widen(c))
			if p < s.past[b] {
				copy(cache[(b*s.maxSeq+p)*w:], c)
			}
		}
	}
	bt := f.batch(s.lens, s.past, s.maxSeq)
	var kv []float32
	for b := range nb {
		for i := range s.lens[b] {
			kv = append(kv, 7)
			kv = append(kv, narrow(lat[b][s.past[b]+i])...)
		}
	}
	args := &kernels.MLAArgs{
		Out:   f.tensor(kernels.F32, fill(bt.Tokens*nh*s.v, nan32), bt.Tokens, nh*s.v),
		Q:     f.randn(kernels.F32, 1, bt.Tokens, nh*dq+2).ColSlice(2, 2+nh*dq),
		KV:    f.tensor(kernels.F32, kv, bt.Tokens, 1+w).ColSlice(1, 1+w),
		Cache: f.tensor(kernels.F32, cache, nb, s.maxSeq, w),
		WKVB:  f.randn(wdt, 1/math.Sqrt(float64(s.rank)), nh*(s.nope+s.v), s.rank),
		Batch: bt, Heads: nh, NopeDim: s.nope, RopeDim: s.rope, VDim: s.v, Rank: s.rank,
		Scale: float32(1 / math.Sqrt(float64(dq))),
	}
	f.ops.MLAPrefill(args)
	f.sync()

	wkvb, qs := rowsOf(f.read(args.WKVB), s.rank), rowsOf(f.read(args.Q), nh*dq)
	var want []float64
	for b := range nb {
		for i := range s.lens[b] {
			q := qs[bt.Start[b]+i]
			for h := range nh {
				wuk, wuv := wkvb[h*(s.nope+s.v):h*(s.nope+s.v)+s.nope], wkvb[h*(s.nope+s.v)+s.nope:(h+1)*(s.nope+s.v)]
				var keys, vals [][]float64
				for _, l := range lat[b][:s.past[b]+i+1] {
					k := make([]float64, 0, dq)
					for _, r := range wuk {
						k = append(k, dot64(r, l[:s.rank]))
					}
					keys = append(keys, append(k, l[s.rank:]...))
					v := make([]float64, 0, s.v)
					for _, r := range wuv {
						v = append(v, dot64(r, l[:s.rank]))
					}
					vals = append(vals, v)
				}
				want = append(want, attend64(q[h*dq:(h+1)*dq], keys, vals, float64(args.Scale))...)
			}
		}
	}
	assertClose(t, "out", f.read(args.Out), want, 1e-5)
	var wantCache []float64
	for b := range nb {
		for p := range s.maxSeq {
			if p < len(lat[b]) {
				wantCache = append(wantCache, lat[b][p]...)
			} else {
				wantCache = append(wantCache, widen(fill(w, nan32))...)
			}
		}
	}
	assertClose(t, "cache", f.read(args.Cache), wantCache, 0)

	// Decode the last token of every row that has one, on a cache holding
	// the tokens before it, with the host Past stale.
	var rows, lasts, past []int
	for b := range nb {
		if s.lens[b] > 0 {
			rows, lasts, past = append(rows, b), append(lasts, bt.Start[b+1]-1), append(past, s.past[b]+s.lens[b]-1)
		}
	}
	var c2 []float32
	for _, b := range rows {
		c := widen(fill(s.maxSeq*w, nan32))
		for p := range past[len(c2)/(s.maxSeq*w)] {
			copy(c[p*w:], lat[b][p])
		}
		c2 = append(c2, narrow(c)...)
	}
	dbt := f.batch(ones(len(rows)), past, s.maxSeq)
	dbt.Past = make([]int, len(rows))
	dec := *args
	dec.Batch, dec.Out = dbt, f.dev.Alloc(kernels.F32, len(rows), nh*s.v)
	dec.Q, dec.KV = f.gather(args.Q, lasts), f.gather(args.KV, lasts)
	dec.Cache = f.tensor(kernels.F32, c2, len(rows), s.maxSeq, w)
	f.ops.MLADecode(&dec)
	f.sync()
	assertClose(t, "decode", f.read(dec.Out), f.read(f.gather(args.Out, lasts)), 1e-6)
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func narrow(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

func ones(n int) []int { return fillInt(n, 1) }

func fillInt(n, x int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = x
	}
	return v
}
