package kerneltest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/fuselm/fuselm/kernels"
)

// Problem is one shape of a bench built on a device: copies of its inputs
// (memory-bound problems rotate over copies that together exceed the L2
// several times, so that a repeated call does not measure the cache), and
// the call of the op on copy k.
type Problem struct {
	Copies int
	Run    func(o kernels.Ops, k int)
	Outs   []*kernels.Tensor // copy 0's outputs, held against the reference
	State  []*kernels.Tensor // copy 0's inputs the op changes in place (timing changes them too)
	Built  [][]float32       // State's values as built, which the runner reads back to put back before every check
	Bytes  float64           // when > 0, the bytes the problem moves (the bench's count is an expectation)
}

// A Builder makes a problem's tensors on one device, each filled from its own
// seeded stream, named by the copy it belongs to (-1 for the tensors all
// copies share) and its order within it: built twice with the same seed,
// on two devices, a problem's copy 0 holds the same values on both
// (rounded alike where both hold bf16), however many copies each makes.
type Builder struct {
	dev   kernels.Device
	seed  uint64
	l2    int // bytes of the device's L2, 0 when it has none to defeat
	copy  int // the copy being built (see each), -1 outside
	draws map[int]uint64
	mem   kernels.Allocs // every tensor of the problem
}

// maxCopies bounds the rotating copies of a memory-bound problem.
const maxCopies = 16

// copier is implemented by devices that copy between device addresses
// (kernels/cuda): large random tensors are filled by repeating a random
// block on the device instead of uploading every byte.
type copier interface {
	Memcpy(dst, src uintptr, n int)
	Ptr(t *kernels.Tensor) uintptr
}

// randomBlock is the most elements generated on the host for one tensor.
const randomBlock = 4 << 20

// NewBuilder is a Builder on dev whose streams derive from seed, making
// copies of a problem to exceed l2 bytes of cache (0: one copy).
func NewBuilder(dev kernels.Device, seed uint64, l2 int) *Builder {
	return &Builder{dev: dev, seed: seed, l2: l2, copy: -1, draws: map[int]uint64{}, mem: kernels.Allocs{Dev: dev}}
}

// stream is the random stream of the next tensor of the current copy.
func (b *Builder) stream() *rand.Rand {
	n := b.draws[b.copy]
	b.draws[b.copy]++
	return rand.New(rand.NewPCG(b.seed, uint64(b.copy+1)<<32|n))
}

// copiesFor is how many copies of a problem moving bytes per call make the
// calls rotate over at least four times the L2.
func (b *Builder) copiesFor(bytes float64) int {
	if b.l2 == 0 || bytes <= 0 {
		return 1
	}
	return max(1, min(maxCopies, int(math.Ceil(4*float64(b.l2)/bytes))))
}

// Alloc is a tensor of dt, freed with the problem (Free).
func (b *Builder) Alloc(dt kernels.DType, shape ...int) *kernels.Tensor {
	return b.mem.Alloc(dt, shape...)
}

// Free frees every tensor b made.
func (b *Builder) Free() { b.mem.Free() }

// Act is a tensor of the device's activation type.
func (b *Builder) Act(shape ...int) *kernels.Tensor { return b.Alloc(b.dev.ActDType(), shape...) }

// Random fills t with N(0, scale²) values, none within scale/1000 of 0 (no
// zeros to flatter a kernel): a block of at most randomBlock values
// repeated over the tensor.
func (b *Builder) Random(t *kernels.Tensor, scale float64) *kernels.Tensor {
	n := t.Numel()
	block := min(n, randomBlock)
	vals := make([]float32, block)
	rng := b.stream()
	for i := range vals {
		x := rng.NormFloat64()
		for math.Abs(x) < 1e-3 {
			x = rng.NormFloat64()
		}
		vals[i] = float32(x * scale)
	}
	b.fill(t, vals)
	return t
}

// fill sets t to vals repeated.
func (b *Builder) fill(t *kernels.Tensor, vals []float32) {
	n, block := t.Numel(), len(vals)
	if c, ok := b.dev.(copier); ok && n > block {
		b.Upload(kernels.NewTensor(t.Buf, t.DType, t.Offset, block), vals)
		es, p := t.DType.Size(), c.Ptr(t)
		for at := block; at < n; at += block {
			c.Memcpy(p+uintptr(at*es), p, min(block, n-at)*es)
		}
		return
	}
	all := make([]float32, n)
	for at := 0; at < n; at += block {
		copy(all[at:], vals)
	}
	b.Upload(t, all)
}

// Upload sets t to vals (a device error panics with a BuildError).
func (b *Builder) Upload(t *kernels.Tensor, vals []float32) {
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	if err := b.dev.Upload(t, raw, kernels.F32); err != nil {
		panic(BuildError{err})
	}
}

func (b *Builder) ints(vals []int32, shape ...int) *kernels.Tensor {
	t := b.Alloc(kernels.I32, shape...)
	if err := b.dev.WriteI32(t, vals); err != nil {
		panic(BuildError{err})
	}
	return t
}

// BuildError carries a device error out of a builder (recovered by the
// runner, which reports it on the row).
type BuildError struct{ err error }

func (e BuildError) Error() string { return e.err.Error() }

// Unwrap is the device's error.
func (e BuildError) Unwrap() error { return e.err }

// Dev is the device b builds on.
func (b *Builder) Dev() kernels.Device { return b.dev }

// batch is B rows of n new tokens after past cached ones each, in caches of
// maxSeq positions.
func (b *Builder) batch(rows, n, past, maxSeq int) *kernels.Batch {
	bt := &kernels.Batch{Rows: rows, Tokens: rows * n, MaxSeq: maxSeq}
	start, pasts := make([]int32, rows+1), make([]int32, rows)
	for r := range rows {
		bt.Start = append(bt.Start, r*n)
		bt.Past = append(bt.Past, past)
		start[r+1], pasts[r] = int32((r+1)*n), int32(past)
	}
	bt.Start = append(bt.Start, rows*n)
	bt.StartDev, bt.PastDev = b.ints(start, rows+1), b.ints(pasts, rows)
	return bt
}

// each makes k copies of what mk makes, each from streams of its own.
func each[T any](b *Builder, k int, mk func() T) []T {
	out := make([]T, k)
	for i := range out {
		b.copy = i
		out[i] = mk()
	}
	b.copy = -1
	return out
}

func buildLinear(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	c := b.copiesFor(bc.Bytes(s))
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	return &Problem{Copies: c, Outs: outs[:1],
		Run: func(o kernels.Ops, i int) { o.Linear(outs[i], xs[i], ws[i], nil) }}
}

func buildNorm(b *Builder, bc *Bench, s kernels.Shape, add bool) *Problem {
	m, n := s["M"], s["N"]
	c := b.copiesFor(bc.Bytes(s))
	w := b.Random(b.Alloc(kernels.BF16, n), 0.2)
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 3) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	if !add {
		return &Problem{Copies: c, Outs: outs[:1],
			Run: func(o kernels.Ops, i int) { o.RMSNorm(outs[i], xs[i], w, 1e-6) }}
	}
	rs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 1) })
	return &Problem{Copies: c, Outs: []*kernels.Tensor{outs[0], rs[0]}, State: rs[:1],
		Run: func(o kernels.Ops, i int) { o.AddRMSNorm(outs[i], rs[i], xs[i], w, 1e-6) }}
}

// ropeTables are HF's default rotary tables for dim dims at positions
// [0, n): cos and sin of p·10000^(-2i/dim).
func (b *Builder) ropeTables(n, dim int) (cos, sin *kernels.Tensor) {
	c, s := make([]float32, n*dim/2), make([]float32, n*dim/2)
	for p := range n {
		for i := range dim / 2 {
			a := float64(p) * math.Pow(10000, -2*float64(i)/float64(dim))
			c[p*dim/2+i], s[p*dim/2+i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	cos, sin = b.Alloc(kernels.F32, n, dim/2), b.Alloc(kernels.F32, n, dim/2)
	b.Upload(cos, c)
	b.Upload(sin, s)
	return cos, sin
}

func buildRoPE(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	t, h, d, r := s["T"], s["H"], s["D"], s["R"]
	c := b.copiesFor(bc.Bytes(s) * float64(d) / float64(r))
	cos, sin := b.ropeTables(t, r)
	rope := &kernels.Rope{Dim: r, Interleaved: s["interleaved"] == 1, Cos: cos, Sin: sin}
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(i)
	}
	p := b.ints(pos, t)
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(t, h*d), 1) })
	return &Problem{Copies: c, Outs: xs[:1], State: xs[:1],
		Run: func(o kernels.Ops, i int) { o.RoPE(xs[i], h, d, d-r, p, rope) }}
}

func buildSwiGLU(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	n, inter := s["N"], s["I"]
	c := b.copiesFor(bc.Bytes(s))
	gus := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(n, 2*inter), 2) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(n, inter) })
	return &Problem{Copies: c, Outs: outs[:1],
		Run: func(o kernels.Ops, i int) { o.SwiGLU(outs[i], gus[i]) }}
}

// attnArgs are the operands of attention over B rows of n new tokens after
// past cached ones: q, k, v as column slices of one qkv matrix, as the
// model's fused projection writes them, and caches of maxSeq positions; all
// of the shape's element type (the device's activations unless it names
// one).
func (b *Builder) attnArgs(s kernels.Shape, n, past, maxSeq int) *kernels.AttnArgs {
	rows, h, kvh, d := s["B"], s["H"], s["KVH"], s["D"]
	dt := s.DType(b.dev.ActDType())
	qkv := b.Random(b.Alloc(dt, rows*n, (h+2*kvh)*d), 1)
	a := &kernels.AttnArgs{Out: b.Alloc(dt, rows*n, h*d), Q: qkv.ColSlice(0, h*d), K: qkv.ColSlice(h*d, (h+kvh)*d),
		V: qkv.ColSlice((h+kvh)*d, (h+2*kvh)*d), Batch: b.batch(rows, n, past, maxSeq),
		Heads: h, KVHeads: kvh, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d)))}
	a.KCache, a.VCache = b.Alloc(dt, rows, kvh, maxSeq, d), b.Alloc(dt, rows, kvh, maxSeq, d)
	if past > 0 {
		b.Random(a.KCache, 1)
		b.Random(a.VCache, 1)
	}
	return a
}

func buildPrefill(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	a := b.attnArgs(s, s["N"], 0, s["N"])
	a.NonCausal = s["causal"] == 0
	return &Problem{Copies: 1, Outs: []*kernels.Tensor{a.Out},
		Run: func(o kernels.Ops, _ int) { o.AttentionPrefill(a) }}
}

func buildDecode(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	ctx := s["ctx"]
	c := b.copiesFor(bc.Bytes(s))
	as := each(b, c, func() *kernels.AttnArgs { return b.attnArgs(s, 1, ctx-1, ctx) })
	return &Problem{Copies: c, Outs: []*kernels.Tensor{as[0].Out},
		Run: func(o kernels.Ops, i int) { o.AttentionDecode(as[i]) }}
}

func buildMLA(b *Builder, bc *Bench, s kernels.Shape, decode bool) *Problem {
	rows, h, dn, dr, dv, r := s["B"], s["H"], s["Dn"], s["Dr"], s["Dv"], s["R"]
	n, past := s["N"], 0
	if decode {
		n, past = 1, s["ctx"]-1
	}
	c := 1
	if decode {
		c = b.copiesFor(bc.Bytes(s))
	}
	wkvb := b.Random(b.Alloc(kernels.BF16, h*(dn+dv), r), 1/math.Sqrt(float64(r)))
	as := each(b, c, func() *kernels.MLAArgs {
		a := &kernels.MLAArgs{Out: b.Act(rows*n, h*dv), Q: b.Random(b.Act(rows*n, h*(dn+dr)), 1),
			KV: b.Random(b.Act(rows*n, r+dr), 1), Cache: b.Act(rows, past+n, r+dr), WKVB: wkvb,
			Batch: b.batch(rows, n, past, past+n), Heads: h, NopeDim: dn, RopeDim: dr, VDim: dv, Rank: r,
			Scale: float32(1 / math.Sqrt(float64(dn+dr)))}
		if past > 0 {
			b.Random(a.Cache, 1)
		}
		return a
	})
	return &Problem{Copies: c, Outs: []*kernels.Tensor{as[0].Out}, Run: func(o kernels.Ops, i int) {
		if decode {
			o.MLADecode(as[i])
		} else {
			o.MLAPrefill(as[i])
		}
	}}
}

func buildMoE(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	n, h, inter, e, k := s["N"], s["H"], s["I"], s["E"], s["topk"]
	gateUp := b.Random(b.Alloc(kernels.BF16, e, 2*inter, h), 1/math.Sqrt(float64(h)))
	down := b.Random(b.Alloc(kernels.BF16, e, h, inter), 1/math.Sqrt(float64(inter)))
	// Each copy routes its tokens anew, so that rotating over the copies
	// reads other experts' weights rather than the ones the L2 holds.
	c := b.copiesFor(bc.Bytes(s))
	type route struct{ x, idx, w, out *kernels.Tensor }
	var touched float64
	rs := each(b, c, func() route {
		idx, w := make([]int32, n*k), make([]float32, n*k)
		chosen := map[int]bool{}
		rng := b.stream()
		for t := range n {
			for j, ex := range rng.Perm(e)[:k] {
				idx[t*k+j], w[t*k+j] = int32(ex), float32(0.5+rng.Float64())/float32(k)
				chosen[ex] = true
			}
		}
		touched += float64(len(chosen))
		wt := b.Alloc(kernels.F32, n, k)
		b.Upload(wt, w)
		return route{x: b.Random(b.Act(n, h), 1), idx: b.ints(idx, n, k), w: wt, out: b.Act(n, h)}
	})
	bytes := float64(bf16) * (touched/float64(c)*3*float64(h*inter) + 2*float64(n*h))
	return &Problem{Copies: c, Outs: []*kernels.Tensor{rs[0].out}, Bytes: bytes,
		Run: func(o kernels.Ops, i int) { o.MoEExperts(rs[i].out, rs[i].x, rs[i].idx, rs[i].w, gateUp, down) }}
}
