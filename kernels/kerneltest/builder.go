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
	State  []*kernels.Tensor // copy 0's inputs the op changes in place (timing changes them too): the runner puts them back as built around each check
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
