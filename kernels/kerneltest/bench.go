package kerneltest

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// Bench is one op's benchmark, which kbench runs: the shapes it takes, its
// defaults, what a problem of a shape costs, and how to build one on a
// device.
type Bench struct {
	Op    kernels.Op
	Bound string   // "compute" (the table shows TFLOP/s) or "memory" (GB/s)
	Dims  []string // the shape's names, all required
	// Optional are switches (0 or 1, in flags) a shape may leave out:
	// then 0.
	Optional []string
	Doc      string // what the shape's names mean
	// DTypes are the element types a shape may name (kernels.ShapeDType,
	// "dt=f16") to run the op in besides the device's activation type; none:
	// a shape may not name one.
	DTypes []kernels.DType
	Shapes []kernels.Shape
	// FLOPs and Bytes count a problem: the arithmetic as TileGym's
	// benchmarks count it, and the fewest bytes it must move (every input
	// read once, every output written once).
	FLOPs func(s kernels.Shape) float64
	Bytes func(s kernels.Shape) float64
	// Build makes the problem of shape s on b's device (c is the bench
	// itself, whose Bytes size the rotating copies).
	Build func(b *Builder, c *Bench, s kernels.Shape) *Problem
	// Dense, when set, builds the problem the case is read against: a
	// dense GEMM of the same work, which kbench times with naive's cuBLAS
	// in a row of its own after the sets' rows.
	Dense func(b *Builder, s kernels.Shape) *Problem
}

// sh builds a Shape from name, value pairs.
func sh(kv ...any) kernels.Shape {
	s := kernels.Shape{}
	for i := 0; i < len(kv); i += 2 {
		s[kv[i].(string)] = kv[i+1].(int)
	}
	return s
}

const bf16 = 2 // bytes of an activation

// Benches lists every benchmark, in the op table's order (table's).
func Benches() []*Bench { return benches }

// BenchFor is the benchmark of op, or nil.
func BenchFor(op kernels.Op) *Bench {
	for _, c := range benches {
		if c.Op == op {
			return c
		}
	}
	return nil
}

// Check reports whether s gives every dimension c needs, and no other (but
// an element type c takes, and c's optional switches).
func (c *Bench) Check(s kernels.Shape) error {
	var missing, extra []string
	for _, d := range c.Dims {
		if _, ok := s[d]; !ok {
			missing = append(missing, d)
		}
	}
	for d := range s {
		if !slices.Contains(c.Dims, d) && !slices.Contains(c.Optional, d) && (d != kernels.ShapeDType || len(c.DTypes) == 0) {
			extra = append(extra, d)
		}
	}
	slices.Sort(extra)
	switch {
	case len(missing) > 0:
		return fmt.Errorf("%s: shape %s lacks %s (it takes %s: %s)", c.Op, s, strings.Join(missing, ", "), strings.Join(c.Dims, ","), c.Doc)
	case len(extra) > 0:
		return fmt.Errorf("%s: shape %s has %s, which it does not take (it takes %s: %s)", c.Op, s, strings.Join(extra, ", "), strings.Join(c.Dims, ","), c.Doc)
	}
	for _, d := range slices.Concat(c.Dims, c.Optional) {
		switch {
		case flags[d] && s[d] > 1:
			return fmt.Errorf("%s: shape %s: %s is 0 or 1", c.Op, s, d)
		case !flags[d] && s[d] == 0:
			return fmt.Errorf("%s: shape %s: %s must be at least 1", c.Op, s, d)
		}
	}
	if dt, ok := s[kernels.ShapeDType]; ok && !slices.Contains(c.DTypes, kernels.DType(dt)) {
		return fmt.Errorf("%s: shape %s: %s=%v: it runs in the device's activation type (no %s) or in %v",
			c.Op, s, kernels.ShapeDType, kernels.DType(dt), kernels.ShapeDType, c.DTypes)
	}
	return nil
}

// flags are the shape names that are switches, 0 or 1.
var flags = map[string]bool{"causal": true, "interleaved": true, "same": true}

func f(s kernels.Shape, names ...string) float64 {
	p := 1.0
	for _, n := range names {
		p *= float64(s[n])
	}
	return p
}

// causalHalf is 1/2 for a causal problem: TileGym counts the FLOPs of the
// unmasked half only.
func causalHalf(s kernels.Shape) float64 {
	if s["causal"] == 1 {
		return 0.5
	}
	return 1
}

// The benchmarks follow, op by op in the op table's order: each op's
// Bench, then the builder of its problems and its default shapes.

var linearBench = &Bench{
	Bound: "compute", Dims: []string{"M", "N", "K"},
	Doc: "out [M,N] = x [M,K] · w [N,K]ᵀ in bf16 (cuBLAS in naive; in fused linear_skinny for decode's few rows, " +
		"cuBLAS or, by choice on sm_90a, linear_wgmma beyond)",
	Shapes: append(append([]kernels.Shape{
		sh("M", 4096, "N", 4096, "K", 4096), sh("M", 8192, "N", 8192, "K", 8192),
	}, prefillLinearShapes()...), decodeLinearShapes()...),
	FLOPs: func(s kernels.Shape) float64 { return 2 * f(s, "M", "N", "K") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * (f(s, "M", "K") + f(s, "N", "K") + f(s, "M", "N")) },
	Build: buildLinear,
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

// prefillLinearShapes are Qwen2-7B's projections over a prefill's rows:
// qkv (N = 3,584 + 2·512), o, gate_up (N = 2·18,944) and down (K = 18,944)
// at 16,384 rows and 10,816 (one row of W1's: its prompt, a sixteenth of
// its prefill step), the GEMMs prefill spends most of its time in. The runs
// here have no bias (qkv's is one add per output).
func prefillLinearShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, m := range []int{16384, 10816} {
		for _, p := range [][2]int{{4608, 3584}, {3584, 3584}, {37888, 3584}, {3584, 18944}} {
			s = append(s, sh("M", m, "N", p[0], "K", p[1]))
		}
	}
	return s
}

// decodeLinearShapes are the projections of one decode step at batch 16
// and batch 1: Qwen2-7B's, then DeepSeek-V2-Lite's (N features, K inputs),
// weight streams whose floor is their bytes over the copy rate.
func decodeLinearShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, m := range []int{16, 1} {
		for _, p := range [][2]int{
			{4608, 3584}, {3584, 3584}, {37888, 3584}, {3584, 18944}, {152064, 3584}, // qkv, o, gate_up, down, lm_head
			{3648, 2048}, {3072, 2048}, {576, 2048}, {2048, 2048}, // q_kv_a (q and kv_a stacked, as the model runs them), q, kv_a, o
			{21888, 2048}, {2048, 10944}, {5632, 2048}, {2048, 2816}, // dense gate_up, down; shared experts' gate_up, down
			{64, 2048}, {102400, 2048}, // router, lm_head
		} {
			s = append(s, sh("M", m, "N", p[0], "K", p[1]))
		}
	}
	return s
}

var rmsNormBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N"},
	Doc:    "M rows of N",
	Shapes: normShapes,
	FLOPs:  func(s kernels.Shape) float64 { return 4 * f(s, "M", "N") },
	Bytes:  func(s kernels.Shape) float64 { return bf16 * (2*f(s, "M", "N") + f(s, "N")) },
	Build:  func(b *Builder, c *Bench, s kernels.Shape) *Problem { return buildNorm(b, c, s, false) },
}

var addRMSNormBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N"},
	Doc:    "M rows of N; the residual add reads and writes the residual",
	Shapes: normShapes,
	FLOPs:  func(s kernels.Shape) float64 { return 5 * f(s, "M", "N") },
	Bytes:  func(s kernels.Shape) float64 { return bf16 * (4*f(s, "M", "N") + f(s, "N")) },
	Build:  func(b *Builder, c *Bench, s kernels.Shape) *Problem { return buildNorm(b, c, s, true) },
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

var addAddRMSNormBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N"},
	Doc: "M rows of N: x + y added into the residual, then normalised (the MoE's routed and shared experts' " +
		"outputs joining the next norm); naive runs add then add_rms_norm",
	Shapes: []kernels.Shape{
		sh("M", 9, "N", 2048), sh("M", 16, "N", 2048), // DeepSeek-V2-Lite decode, where the shared experts run aside
		sh("M", 16, "N", 3584),
		sh("M", 11041, "N", 2048), // DeepSeek-V2-Lite over W3's prompt
	},
	FLOPs: func(s kernels.Shape) float64 { return 6 * f(s, "M", "N") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * (5*f(s, "M", "N") + f(s, "N")) },
	Build: buildAddAddNorm,
}

// buildAddAddNorm adds into the residual in place, and the parts leave
// their sum in x: both are state the runner puts back before each check.
func buildAddAddNorm(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n := s["M"], s["N"]
	c := b.copiesFor(bc.Bytes(s))
	w := b.Random(b.Alloc(kernels.BF16, n), 0.2)
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 3) })
	ys := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 3) })
	rs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 1) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	return &Problem{Copies: c, Outs: []*kernels.Tensor{outs[0], rs[0]}, State: []*kernels.Tensor{rs[0], xs[0]},
		Run: func(o kernels.Ops, i int) { o.AddAddRMSNorm(outs[i], rs[i], xs[i], ys[i], w, 1e-6) }}
}

var normShapes = []kernels.Shape{
	sh("M", 4096, "N", 1024), sh("M", 4096, "N", 2048), sh("M", 4096, "N", 4096), sh("M", 4096, "N", 8192),
	sh("M", 4096, "N", 16384), // TileGym's bench_rmsnorm
	sh("M", 16, "N", 3584),    // Qwen2-7B decode, batch 16
	sh("M", 43264, "N", 3584), // a quarter of W1's prefill rows
	sh("M", 11041, "N", 2048), // DeepSeek-V2-Lite over W3's prompt
}

var ropeBench = &Bench{
	Bound: "memory", Dims: []string{"T", "H", "D", "R", "interleaved"},
	Doc: "T tokens of H heads of D dims, the first R of each rotated; interleaved 1 pairs (2i, 2i+1) as DeepSeek-V2, 0 rotate_half as Qwen2",
	Shapes: []kernels.Shape{
		sh("T", 16, "H", 32, "D", 128, "R", 128, "interleaved", 0),    // Qwen2-7B q and k, decode batch 16
		sh("T", 16384, "H", 32, "D", 128, "R", 128, "interleaved", 0), // a sixteenth of W1's prefill
		sh("T", 11041, "H", 16, "D", 192, "R", 64, "interleaved", 1),  // DeepSeek-V2-Lite q_pe over W3's prompt
	},
	FLOPs: func(s kernels.Shape) float64 { return 3 * f(s, "T", "H", "R") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * 2 * f(s, "T", "H", "R") },
	Build: buildRoPE,
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

var swiGLUBench = &Bench{
	Bound: "memory", Dims: []string{"N", "I"},
	Doc: "N rows of gate and up, I each",
	Shapes: []kernels.Shape{
		sh("N", 16, "I", 18944), sh("N", 16384, "I", 18944), // Qwen2-7B, decode batch 16 and a sixteenth of W1
		sh("N", 11041, "I", 10944), // DeepSeek-V2-Lite's dense layer over W3's prompt
	},
	FLOPs: func(s kernels.Shape) float64 { return 6 * f(s, "N", "I") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * 3 * f(s, "N", "I") },
	Build: buildSwiGLU,
}

func buildSwiGLU(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	n, inter := s["N"], s["I"]
	c := b.copiesFor(bc.Bytes(s))
	gus := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(n, 2*inter), 2) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(n, inter) })
	return &Problem{Copies: c, Outs: outs[:1],
		Run: func(o kernels.Ops, i int) { o.SwiGLU(outs[i], gus[i]) }}
}

var linearSwiGLUBench = &Bench{
	Bound: "compute", Dims: []string{"M", "N", "K"},
	Doc: "out [M,N/2] = swiglu(x [M,K] · w [N,K]ᵀ), w the gate rows then the up rows (N = 2I, the stacked GEMM's N, " +
		"as linear's gate_up rows name it); in fused the pair unfused, on sm_90a linear_stream with SwiGLU in its epilogue " +
		"where linear runs linear_stream (decode's few rows), or by choice linear_wgmma with it; the dense row is cuBLAS's " +
		"gate_up GEMM alone",
	Shapes: []kernels.Shape{
		// Qwen2-7B (H = 3,584, I = 18,944) at 16,384 rows, at one W1
		// row's prompt (10,816), at W1's whole prefill step (16 rows of
		// 10,816), then at decode batch 16
		sh("M", 16384, "N", 2*18944, "K", 3584), sh("M", 10816, "N", 2*18944, "K", 3584),
		sh("M", 16*10816, "N", 2*18944, "K", 3584), sh("M", 16, "N", 2*18944, "K", 3584),
		// DeepSeek-V2-Lite's dense layer (I = 10,944, H = 2,048) over W3's prompt
		sh("M", 11041, "N", 2*10944, "K", 2048),
		// its shared experts (I = 2 · 1,408) at decode batch 1 and 16
		sh("M", 1, "N", 2*2816, "K", 2048), sh("M", 16, "N", 2*2816, "K", 2048),
	},
	FLOPs: func(s kernels.Shape) float64 { return 2*f(s, "M", "N", "K") + 3*f(s, "M", "N") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * (f(s, "M", "K") + f(s, "N", "K") + f(s, "M", "N")/2) },
	Build: buildLinearSwiGLU,
	Dense: buildDenseOfGroups,
}

func buildLinearSwiGLU(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	c := b.copiesFor(bc.Bytes(s))
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 2) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n/2) })
	return &Problem{Copies: c, Outs: outs[:1],
		Run: func(o kernels.Ops, i int) { o.LinearSwiGLU(outs[i], xs[i], ws[i]) }}
}

var rmsNormRoPEBench = &Bench{
	Bound: "memory", Dims: []string{"T", "H", "Dn", "Dr", "R"},
	Doc: "T tokens of MLA's q (H heads of Dn+Dr, the last Dr rotated) and new latent (R normalised, then Dr rotated), " +
		"interleaved pairs, as column slices of one q_kv_a row; naive runs its rms_norm then rope twice",
	Shapes: []kernels.Shape{
		// DeepSeek-V2-Lite at decode batch 1 and 16, over a 2K prompt and over W3's
		sh("T", 1, "H", 16, "Dn", 128, "Dr", 64, "R", 512), sh("T", 16, "H", 16, "Dn", 128, "Dr", 64, "R", 512),
		sh("T", 2048, "H", 16, "Dn", 128, "Dr", 64, "R", 512), sh("T", 11041, "H", 16, "Dn", 128, "Dr", 64, "R", 512),
	},
	FLOPs: func(s kernels.Shape) float64 { return 4*f(s, "T", "R") + 3*f(s, "T", "Dr")*(f(s, "H")+1) },
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (2*f(s, "T", "R") + f(s, "R") + 2*f(s, "T", "Dr")*(f(s, "H")+1))
	},
	Build: buildRMSNormRoPE,
}

func buildRMSNormRoPE(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	t, h, dn, dr, rank := s["T"], s["H"], s["Dn"], s["Dr"], s["R"]
	qw, kvw := h*(dn+dr), rank+dr
	// The rows hold q's nope dims too, which the op leaves: the copies
	// rotate over their whole bytes.
	c := b.copiesFor(float64(bf16 * t * (qw + kvw)))
	cos, sin := b.ropeTables(t, dr)
	rope := &kernels.Rope{Dim: dr, Interleaved: true, Cos: cos, Sin: sin}
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(i)
	}
	p := b.ints(pos, t)
	w := b.Random(b.Alloc(kernels.BF16, rank), 0.2)
	rows := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(t, qw+kvw), 1) })
	return &Problem{Copies: c, Outs: rows[:1], State: rows[:1],
		Run: func(o kernels.Ops, i int) {
			o.RMSNormRoPE(rows[i].ColSlice(0, qw), rows[i].ColSlice(qw, qw+kvw), w, 1e-6, h, dn+dr, dn, p, rope)
		}}
}

var linearAddBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N", "K"},
	Doc: "out [M,N] += x [M,K] · w [N,K]ᵀ in bf16, the projection rounded before the sum (the MoE's shared experts' " +
		"down projection added to the routed experts' output); in fused linear_stream with the add in its epilogue " +
		"where linear runs linear_stream (decode's few rows), else the pair unfused",
	Shapes: []kernels.Shape{
		// DeepSeek-V2-Lite's shared experts' down (H = 2,048, I = 2 · 1,408)
		// at decode batch 1 and 16
		sh("M", 1, "N", 2048, "K", 2816), sh("M", 16, "N", 2048, "K", 2816),
	},
	FLOPs: func(s kernels.Shape) float64 { return 2*f(s, "M", "N", "K") + f(s, "M", "N") },
	Bytes: func(s kernels.Shape) float64 { return bf16 * (f(s, "M", "K") + f(s, "N", "K") + 2*f(s, "M", "N")) },
	Build: buildLinearAdd,
}

// buildLinearAdd adds into out in place, as the MoE does: out is state
// the runner puts back before each check.
func buildLinearAdd(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	c := b.copiesFor(bc.Bytes(s))
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	outs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, n), 1) })
	return &Problem{Copies: c, Outs: outs[:1], State: outs[:1],
		Run: func(o kernels.Ops, i int) { o.LinearAdd(outs[i], xs[i], ws[i], nil, outs[i]) }}
}

var normLinearBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N", "K"},
	Doc: "resid [M,K] += x; out [M,N] = RMSNorm(resid) · w [N,K]ᵀ + bias, bf16 (a layer's residual add and norm " +
		"and the next block's first projection: Qwen2-7B's qkv); in fused one linear_stream normalising x as it loads " +
		"it where linear runs linear_stream (decode's one row), else add_rms_norm then linear",
	Shapes: []kernels.Shape{
		// Qwen2-7B's qkv at decode batch 1 and 16
		sh("M", 1, "N", 4608, "K", 3584), sh("M", 16, "N", 4608, "K", 3584),
	},
	FLOPs: func(s kernels.Shape) float64 { return 2*f(s, "M", "N", "K") + 5*f(s, "M", "K") },
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (3*f(s, "M", "K") + f(s, "K") + f(s, "N", "K") + f(s, "N") + f(s, "M", "N"))
	},
	Build: func(b *Builder, bc *Bench, s kernels.Shape) *Problem { return buildNormLinear(b, bc, s, false) },
}

var normSwiGLUBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N", "K"},
	Doc: "resid [M,K] += x; out [M,N/2] = swiglu(RMSNorm(resid) · w [N,K]ᵀ), w the gate rows then the up rows, " +
		"bf16 (the residual add and norm before an MLP and its gate/up projection); in fused one linear_stream " +
		"normalising x as it loads it, SwiGLU in its epilogue, where linear_swiglu runs linear_stream, else the parts",
	Shapes: []kernels.Shape{
		// Qwen2-7B's gate/up at decode batch 1 and 16; DeepSeek-V2-Lite's
		// dense layer at batch 1
		sh("M", 1, "N", 2*18944, "K", 3584), sh("M", 16, "N", 2*18944, "K", 3584), sh("M", 1, "N", 2*10944, "K", 2048),
	},
	FLOPs: func(s kernels.Shape) float64 { return 2*f(s, "M", "N", "K") + 3*f(s, "M", "N") + 5*f(s, "M", "K") },
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (3*f(s, "M", "K") + f(s, "K") + f(s, "N", "K") + f(s, "M", "N")/2)
	},
	Build: func(b *Builder, bc *Bench, s kernels.Shape) *Problem { return buildNormLinear(b, bc, s, true) },
}

var linearNormLinearBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N", "K", "K0"},
	Doc: "mid [M,K] = x [M,K0] · w0 [K,K0]ᵀ; resid [M,K] += mid; out [M,N] = RMSNorm(resid) · w [N,K]ᵀ + bias, " +
		"bf16 (a block's last projection, the residual add and norm after it, and the next block's first " +
		"projection: Qwen2-7B's down_proj, then qkv); one kernel across the block boundary where a set fuses it, " +
		"else linear then add_rms_norm_linear",
	Shapes: []kernels.Shape{
		// Qwen2-7B's down_proj and the next layer's qkv at decode batch 1
		// and 16
		sh("M", 1, "N", 4608, "K", 3584, "K0", 18944), sh("M", 16, "N", 4608, "K", 3584, "K0", 18944),
	},
	FLOPs: func(s kernels.Shape) float64 {
		return 2*f(s, "M", "K", "K0") + 5*f(s, "M", "K") + 2*f(s, "M", "N", "K")
	},
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (f(s, "M", "K0") + f(s, "K", "K0") + 3*f(s, "M", "K") + f(s, "K") + f(s, "N", "K") + f(s, "N") + f(s, "M", "N"))
	},
	Build: func(b *Builder, bc *Bench, s kernels.Shape) *Problem { return buildNormLinear(b, bc, s, false) },
}

var linearNormSwiGLUBench = &Bench{
	Bound: "memory", Dims: []string{"M", "N", "K", "K0"},
	Doc: "mid [M,K] = x [M,K0] · w0 [K,K0]ᵀ; resid [M,K] += mid; out [M,N/2] = swiglu(RMSNorm(resid) · w [N,K]ᵀ), " +
		"w the gate rows then the up rows, bf16 (attention's last projection, the residual add and norm before the " +
		"MLP, and its gate/up projection: Qwen2-7B's o_proj, then gate/up); one kernel across the block boundary " +
		"where a set fuses it, else linear then add_rms_norm_linear_swiglu",
	Shapes: []kernels.Shape{
		// Qwen2-7B's o_proj and gate/up at decode batch 1 and 16
		sh("M", 1, "N", 2*18944, "K", 3584, "K0", 3584), sh("M", 16, "N", 2*18944, "K", 3584, "K0", 3584),
	},
	FLOPs: func(s kernels.Shape) float64 {
		return 2*f(s, "M", "K", "K0") + 5*f(s, "M", "K") + 2*f(s, "M", "N", "K") + 3*f(s, "M", "N")
	},
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (f(s, "M", "K0") + f(s, "K", "K0") + 3*f(s, "M", "K") + f(s, "K") + f(s, "N", "K") + f(s, "M", "N")/2)
	},
	Build: func(b *Builder, bc *Bench, s kernels.Shape) *Problem { return buildNormLinear(b, bc, s, true) },
}

// buildNormLinear adds into resid, as the layers do: resid is state the
// runner puts back before each check. Where s has K0 the norm's input is
// mid, which the op writes from a first projection of [M,K0] rows
// (linear_add_rms_norm_linear and its SwiGLU twin): a result, held
// against the reference beside out.
func buildNormLinear(b *Builder, bc *Bench, s kernels.Shape, swiglu bool) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	k0, first := s["K0"]
	c := b.copiesFor(bc.Bytes(s))
	norm := b.Random(b.Alloc(kernels.BF16, k), 1)
	var xs []*kernels.Tensor
	if first {
		xs = each(b, c, func() *kernels.Tensor { return b.Act(m, k) })
	} else {
		xs = each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	}
	resids := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	hs := each(b, c, func() *kernels.Tensor { return b.Act(m, k) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	var bias *kernels.Tensor
	var outs []*kernels.Tensor
	if swiglu {
		outs = each(b, c, func() *kernels.Tensor { return b.Act(m, n/2) })
	} else {
		bias = b.Random(b.Alloc(kernels.BF16, n), 0.5)
		outs = each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	}
	p := &Problem{Copies: c, Outs: outs[:1], State: resids[:1]}
	if !first {
		p.Run = func(o kernels.Ops, i int) {
			if swiglu {
				o.AddRMSNormLinearSwiGLU(outs[i], hs[i], resids[i], xs[i], norm, 1e-6, ws[i])
			} else {
				o.AddRMSNormLinear(outs[i], hs[i], resids[i], xs[i], norm, 1e-6, ws[i], bias)
			}
		}
		return p
	}
	x0s := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k0), 1) })
	w0s := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, k, k0), 1/math.Sqrt(float64(k0))) })
	p.Outs = append(p.Outs, xs[0])
	p.Run = func(o kernels.Ops, i int) {
		if swiglu {
			o.LinearAddRMSNormLinearSwiGLU(xs[i], x0s[i], w0s[i], nil, outs[i], hs[i], resids[i], norm, 1e-6, ws[i])
		} else {
			o.LinearAddRMSNormLinear(xs[i], x0s[i], w0s[i], nil, outs[i], hs[i], resids[i], norm, 1e-6, ws[i], bias)
		}
	}
	return p
}

var attnPrefillBench = &Bench{
	Bound: "compute", Dims: []string{"B", "H", "KVH", "D", "N", "causal"},
	Doc: "B rows of N new tokens (an empty cache), H query heads over KVH kv heads of D dims; " +
		"dt=f16 runs it on f16 operands (a benchmark type: the models' activations stay bf16)",
	DTypes: []kernels.DType{kernels.F16},
	Shapes: prefillShapes(),
	FLOPs:  func(s kernels.Shape) float64 { return 4 * f(s, "B", "H", "N", "N", "D") * causalHalf(s) },
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * f(s, "B", "N", "D") * (2*f(s, "H") + 2*f(s, "KVH"))
	},
	Build: buildPrefill,
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

// prefillShapes are TileGym's bench_fused_attention table in bf16 (the
// activations) and in fp16, then one W1 layer.
func prefillShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, f16 := range []bool{false, true} {
		for _, causal := range []int{1, 0} {
			for _, n := range []int{1024, 2048, 4096, 8192, 16384} {
				x := sh("B", 4, "H", 32, "KVH", 32, "D", 128, "N", n, "causal", causal)
				if f16 {
					x[kernels.ShapeDType] = int(kernels.F16)
				}
				s = append(s, x)
			}
		}
	}
	return append(s, sh("B", 16, "H", 28, "KVH", 4, "D", 128, "N", 10816, "causal", 1)) // one W1 layer
}

var attnDecodeBench = &Bench{
	Bound: "memory", Dims: []string{"B", "H", "KVH", "D", "ctx"},
	Doc:    "B rows of one new token after ctx-1 cached, H query heads over KVH kv heads of D dims",
	Shapes: decodeShapes(),
	FLOPs:  func(s kernels.Shape) float64 { return 4 * f(s, "B", "H", "ctx", "D") },
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (2*f(s, "B", "KVH", "ctx", "D") + 2*f(s, "B", "H", "D"))
	},
	Build: buildDecode,
}

func buildDecode(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	ctx := s["ctx"]
	c := b.copiesFor(bc.Bytes(s))
	as := each(b, c, func() *kernels.AttnArgs { return b.attnArgs(s, 1, ctx-1, ctx) })
	return &Problem{Copies: c, Outs: []*kernels.Tensor{as[0].Out},
		Run: func(o kernels.Ops, i int) { o.AttentionDecode(as[i]) }}
}

func decodeShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, b := range []int{1, 16} {
		for _, ctx := range []int{1024, 4096, 8192, 16384, 32768} {
			s = append(s, sh("B", b, "H", 28, "KVH", 4, "D", 128, "ctx", ctx)) // Qwen2-7B's heads
		}
	}
	return s
}

var ropeAttnDecodeBench = &Bench{
	Bound: "memory", Dims: []string{"B", "H", "KVH", "D", "ctx"},
	Doc: "attn_decode's problem with q and the new k unrotated, rotated over all D dims in rotate_half pairs (Qwen2's rope) " +
		"and attended; naive runs its rope then its attn_decode",
	Shapes: func() []kernels.Shape {
		var s []kernels.Shape
		for _, b := range []int{1, 16} {
			for _, ctx := range []int{128, 4096} {
				s = append(s, sh("B", b, "H", 28, "KVH", 4, "D", 128, "ctx", ctx)) // Qwen2-7B's heads
			}
		}
		return s
	}(),
	// attn_decode's count: the rotation's arithmetic is a few FLOPs a q or
	// k element, and its bytes are ones the attention reads anyway.
	FLOPs: attnDecodeBench.FLOPs,
	Bytes: attnDecodeBench.Bytes,
	Build: buildRoPEDecode,
}

func buildRoPEDecode(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	ctx, d := s["ctx"], s["D"]
	c := b.copiesFor(bc.Bytes(s))
	cos, sin := b.ropeTables(ctx, d)
	rope := &kernels.Rope{Dim: d, Cos: cos, Sin: sin}
	pos := make([]int32, s["B"])
	for i := range pos {
		pos[i] = int32(ctx - 1)
	}
	p := b.ints(pos, len(pos))
	as := each(b, c, func() *kernels.AttnArgs { return b.attnArgs(s, 1, ctx-1, ctx) })
	// The parts rotate q and k in place: the runner puts them back before
	// a check.
	qkv := func(a *kernels.AttnArgs) *kernels.Tensor {
		return kernels.NewTensor(a.Q.Buf, a.Q.DType, a.Q.Offset, a.Q.Rows(), a.Q.Pitch)
	}
	return &Problem{Copies: c, Outs: []*kernels.Tensor{as[0].Out}, State: []*kernels.Tensor{qkv(as[0])},
		Run: func(o kernels.Ops, i int) { o.RoPEAttentionDecode(as[i], p, rope) }}
}

var mlaPrefillBench = &Bench{
	Bound: "compute", Dims: []string{"B", "H", "N", "Dn", "Dr", "Dv", "R"},
	Doc:    "B rows of N new tokens, H heads: q·k over Dn+Dr dims, v of Dv, latents of rank R",
	Shapes: mlaPrefillShapes(),
	// The least work of the two forms, the decompressed one at these
	// sizes: TileGym's bench_mla count of the attention, 2·B·H·S²·(Dqk +
	// Dv) halved for causal, plus the decompression of every latent by
	// kv_b_proj, 2·B·S·R·H·(Dn+Dv), which bench_mla leaves out. (The
	// absorbed form skips the decompression but pays 2·(2R+Dr) per head
	// and key instead of 2·(Dqk+Dv): 3.4× the attention at V2-Lite's
	// dims.)
	FLOPs: func(s kernels.Shape) float64 {
		attn := 2 * f(s, "B", "H", "N", "N") * (f(s, "Dn") + f(s, "Dr") + f(s, "Dv")) * 0.5
		return attn + 2*f(s, "B", "N", "R", "H")*(f(s, "Dn")+f(s, "Dv"))
	},
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * f(s, "B", "N") * (f(s, "H")*(f(s, "Dn")+f(s, "Dr")+f(s, "Dv")) + f(s, "R") + f(s, "Dr"))
	},
	Build: func(b *Builder, c *Bench, s kernels.Shape) *Problem { return buildMLA(b, c, s, false) },
}

var mlaDecodeBench = &Bench{
	Bound: "memory", Dims: []string{"B", "H", "ctx", "Dn", "Dr", "Dv", "R"},
	Doc:    "B rows of one new token after ctx-1 cached latents of rank R (+Dr), H heads",
	Shapes: mlaDecodeShapes(),
	// The absorbed form, the least work for one query: per head and key
	// q_lat·c + q_pe·k_pe and p·c (2·(2R+Dr)), plus W_UK folded into q
	// and W_UV applied to o_lat (2·R·(Dn+Dv) per head and row). The
	// bytes, the floor: the latent cache and kv_b_proj, read once.
	FLOPs: func(s kernels.Shape) float64 {
		return 2 * f(s, "B", "H") * (f(s, "ctx")*(2*f(s, "R")+f(s, "Dr")) + f(s, "R")*(f(s, "Dn")+f(s, "Dv")))
	},
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (f(s, "B", "ctx")*(f(s, "R")+f(s, "Dr")) + f(s, "H")*(f(s, "Dn")+f(s, "Dv"))*f(s, "R"))
	},
	Build: func(b *Builder, c *Bench, s kernels.Shape) *Problem { return buildMLA(b, c, s, true) },
}

var mlaDecodeRoPEBench = &Bench{
	Bound: "memory", Dims: []string{"B", "H", "ctx", "Dn", "Dr", "Dv", "R"},
	Doc: "mla_decode's problem from the projection on: q and the new latent as column slices of one q_kv_a row, " +
		"the latent normalised and q's and k's rope dims rotated (interleaved) first; naive runs rms_norm, rope twice, then mla_decode",
	Shapes: []kernels.Shape{
		// DeepSeek-V2-Lite at decode batch 1: an empty cache, 4K, W3's length
		sh("B", 1, "H", 16, "ctx", 1, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512),
		sh("B", 1, "H", 16, "ctx", 4096, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512),
		sh("B", 1, "H", 16, "ctx", 11042, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512),
	},
	// mla_decode's, and rms_norm_rope's on the B new tokens.
	FLOPs: func(s kernels.Shape) float64 {
		return mlaDecodeBench.FLOPs(s) + 4*f(s, "B", "R") + 3*f(s, "B", "Dr")*(f(s, "H")+1)
	},
	Bytes: func(s kernels.Shape) float64 {
		return mlaDecodeBench.Bytes(s) + bf16*(2*f(s, "B", "R")+f(s, "R")+2*f(s, "B", "Dr")*(f(s, "H")+1))
	},
	Build: buildMLADecodeRoPE,
}

func buildMLADecodeRoPE(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	rows, h, dn, dr, dv, r := s["B"], s["H"], s["Dn"], s["Dr"], s["Dv"], s["R"]
	past := s["ctx"] - 1
	qw, kvw := h*(dn+dr), r+dr
	c := b.copiesFor(bc.Bytes(s))
	wkvb := b.Random(b.Alloc(kernels.BF16, h*(dn+dv), r), 1/math.Sqrt(float64(r)))
	norm := b.Random(b.Alloc(kernels.BF16, r), 0.2)
	cos, sin := b.ropeTables(past+1, dr)
	rope := &kernels.Rope{Dim: dr, Interleaved: true, Cos: cos, Sin: sin}
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(past)
	}
	p := b.ints(pos, rows)
	as := each(b, c, func() *kernels.MLAArgs {
		qkva := b.Random(b.Act(rows, qw+kvw), 1)
		a := &kernels.MLAArgs{Out: b.Act(rows, h*dv), Q: qkva.ColSlice(0, qw), KV: qkva.ColSlice(qw, qw+kvw),
			Cache: b.Act(rows, past+1, kvw), WKVB: wkvb, Batch: b.batch(rows, 1, past, past+1),
			Heads: h, NopeDim: dn, RopeDim: dr, VDim: dv, Rank: r, Scale: float32(1 / math.Sqrt(float64(dn+dr)))}
		if past > 0 {
			b.Random(a.Cache, 1)
		}
		return a
	})
	return &Problem{Copies: c, Outs: []*kernels.Tensor{as[0].Out},
		Run: func(o kernels.Ops, i int) { o.MLADecodeRoPE(as[i], norm, 1e-6, p, rope) }}
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

func mlaPrefillShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, n := range []int{1024, 2048, 4096, 8192} { // TileGym's bench_mla
		s = append(s, sh("B", 4, "H", 16, "N", n, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512))
	}
	return append(s, sh("B", 1, "H", 16, "N", 11041, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512)) // W3's prefill
}

func mlaDecodeShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, ctx := range []int{256, 1024, 4096, 11043, 16384} { // TileGym's bench_mla_decoding, and W3's length
		s = append(s, sh("B", 1, "H", 16, "ctx", ctx, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512))
	}
	for _, ctx := range []int{1024, 4096, 16384} { // issue 8's target: batch 16 at 4K and more
		s = append(s, sh("B", 16, "H", 16, "ctx", ctx, "Dn", 128, "Dr", 64, "Dv", 128, "R", 512))
	}
	return s
}

var moeExpertsBench = &Bench{
	Bound: "memory", Dims: []string{"N", "H", "I", "E", "topk"}, Optional: []string{"same"},
	Doc: "N tokens of H routed to topk of E experts of width I (random distinct routes; same=1: every token to the same topk)",
	Shapes: []kernels.Shape{
		sh("N", 1, "H", 2048, "I", 1408, "E", 64, "topk", 6),             // DeepSeek-V2-Lite decode, batch 1
		sh("N", 16, "H", 2048, "I", 1408, "E", 64, "topk", 6),            // batch 16
		sh("N", 16, "H", 2048, "I", 1408, "E", 64, "topk", 6, "same", 1), // batch 16 of one prompt (W4): six experts
		sh("N", 300, "H", 2048, "I", 1408, "E", 64, "topk", 6),           // a few hundred tokens: a short prompt
		sh("N", 2048, "H", 2048, "I", 1408, "E", 64, "topk", 6),          // W4's and W5's prefills: 16 rows of ~128 tokens
		sh("N", 11041, "H", 2048, "I", 1408, "E", 64, "topk", 6),         // W3's prefill
	},
	FLOPs: moeFLOPs,
	Bytes: moeBytes,
	Build: buildMoE,
}

func moeFLOPs(s kernels.Shape) float64 { return 6 * f(s, "N", "topk", "H", "I") }

// moeBytes are the experts some token chose, each read once, and the
// tokens in and out: the count of chosen experts is the expected one for
// random routes, E·(1 − (1 − topk/E)^N), or topk where every token routes
// to the same (same=1).
func moeBytes(s kernels.Shape) float64 {
	e, k, n := f(s, "E"), f(s, "topk"), f(s, "N")
	touched := e * (1 - math.Pow(1-k/e, n))
	if s["same"] == 1 {
		touched = k
	}
	return bf16 * (touched*3*f(s, "H", "I") + 2*n*f(s, "H"))
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
		var one []int // every token's experts where same=1
		if s["same"] == 1 {
			one = rng.Perm(e)[:k]
		}
		for t := range n {
			experts := one
			if experts == nil {
				experts = rng.Perm(e)[:k]
			}
			for j, ex := range experts {
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

var moeRoutedBench = &Bench{
	Bound: "memory", Dims: []string{"N", "H", "I", "E", "topk"},
	Doc: "moe_experts' problem routed from router logits [N,E] f32 as DeepSeek-V2-Lite routes (softmax, greedy top-topk, " +
		"scores apart): moe_route then moe_experts, or in fused, up to 8 tokens, one chain whose gate/up kernel routes",
	Shapes: []kernels.Shape{
		sh("N", 1, "H", 2048, "I", 1408, "E", 64, "topk", 6), // DeepSeek-V2-Lite decode, batch 1
		sh("N", 8, "H", 2048, "I", 1408, "E", 64, "topk", 6), // batch 8: the most tokens fused's chain takes
	},
	FLOPs: moeFLOPs,
	// moe_experts' bytes, the logits read and the routes written.
	Bytes: func(s kernels.Shape) float64 { return moeBytes(s) + 4*f(s, "N", "E") + 8*f(s, "N", "topk") },
	Build: buildMoERouted,
}

func buildMoERouted(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	n, h, inter, e, k := s["N"], s["H"], s["I"], s["E"], s["topk"]
	gateUp := b.Random(b.Alloc(kernels.BF16, e, 2*inter, h), 1/math.Sqrt(float64(h)))
	down := b.Random(b.Alloc(kernels.BF16, e, h, inter), 1/math.Sqrt(float64(inter)))
	r := &kernels.Routing{Method: kernels.RouteGreedy, TopK: k, Groups: 1, TopKGroups: 1, Scale: 1}
	// Each copy's logits route its tokens anew (each token's scores
	// routeGap apart, so that every set makes the same choice), so that
	// rotating over the copies reads other experts' weights.
	c := b.copiesFor(bc.Bytes(s))
	type routed struct{ x, logits, idx, w, out *kernels.Tensor }
	var touched float64
	rs := each(b, c, func() routed {
		logits := make([]float32, n*e)
		chosen := map[int]bool{}
		rng := b.stream()
		for t := range n {
			for j, rank := range rng.Perm(e) {
				logits[t*e+j] = float32(float64(rank-e/2) * routeGap)
				if rank >= e-k {
					chosen[j] = true
				}
			}
		}
		touched += float64(len(chosen))
		lg := b.Alloc(kernels.F32, n, e)
		b.Upload(lg, logits)
		return routed{x: b.Random(b.Act(n, h), 1), logits: lg, idx: b.Alloc(kernels.I32, n, k),
			w: b.Alloc(kernels.F32, n, k), out: b.Act(n, h)}
	})
	bytes := float64(bf16)*(touched/float64(c)*3*float64(h*inter)+2*float64(n*h)) + float64(4*n*e+8*n*k)
	return &Problem{Copies: c, Outs: []*kernels.Tensor{rs[0].out}, Bytes: bytes,
		Run: func(o kernels.Ops, i int) {
			o.MoERouted(rs[i].out, rs[i].idx, rs[i].w, rs[i].x, rs[i].logits, gateUp, down, r)
		}}
}

var groupGemmBench = &Bench{
	Bound: "compute", Dims: []string{"M", "N", "K", "E"},
	Doc: "out [M,N] = x [M,K] · w[g] [N,K]ᵀ over E groups of rows, sized by routing M/6 tokens to 6 experts of uneven popularity; " +
		"a row of naive's dense cuBLAS GEMM of the same M, N, K follows",
	Shapes: groupGemmShapes(),
	FLOPs:  func(s kernels.Shape) float64 { return 2 * f(s, "M", "N", "K") },
	// x, out, and the weights of the groups some row uses, at their
	// expected number for uniform routes (each problem counts its own).
	Bytes: func(s kernels.Shape) float64 {
		return bf16 * (touchedGroups(s)*f(s, "N", "K") + f(s, "M", "K") + f(s, "M", "N"))
	},
	Build: buildGroupGemm,
	Dense: buildDenseOfGroups,
}

// groupTopK is the choices per token of the routing that sizes a
// group_gemm benchmark's groups: DeepSeek-V2-Lite's top-6.
const groupTopK = 6

// groupGemmShapes are DeepSeek-V2-Lite's expert GEMMs (E = 64; gate/up
// N = 2·1408, K = 2048; down N = 2048, K = 1408) at W3's prefill (11,041
// tokens × 6 choices) and at decode batch 16 and 1.
func groupGemmShapes() []kernels.Shape {
	var s []kernels.Shape
	for _, m := range []int{11041 * groupTopK, 16 * groupTopK, groupTopK} {
		s = append(s, sh("M", m, "N", 2816, "K", 2048, "E", 64), sh("M", m, "N", 2048, "K", 1408, "E", 64))
	}
	return s
}

// touchedGroups is the expected number of the E groups that M rows of
// tokens choosing groupTopK distinct ones at random leave non-empty.
func touchedGroups(s kernels.Shape) float64 {
	e, tokens := f(s, "E"), math.Ceil(f(s, "M")/groupTopK)
	return e * (1 - math.Pow(1-math.Min(groupTopK, e)/e, tokens))
}

// groupSizes routes ceil(M/groupTopK) tokens to groupTopK distinct of e
// experts each (fewer for the last token, so that the choices are m), with
// uneven popularity, as a trained router's: expert j is drawn with weight
// exp(0.5·z_j), z_j standard normal, by the Gumbel top-k trick. It returns
// each expert's count.
func (b *Builder) groupSizes(m, e int) []int {
	rng := b.stream()
	logw := make([]float64, e)
	for j := range logw {
		logw[j] = 0.5 * rng.NormFloat64()
	}
	sizes := make([]int, e)
	keys := make([]float64, e)
	order := make([]int, e)
	for left := m; left > 0; left -= groupTopK {
		for j := range keys {
			keys[j] = logw[j] - math.Log(-math.Log(rng.Float64()))
			order[j] = j
		}
		slices.SortFunc(order, func(a, c int) int {
			if keys[a] > keys[c] {
				return -1
			}
			return 1
		})
		for _, j := range order[:min(groupTopK, e, left)] {
			sizes[j]++
		}
	}
	return sizes
}

// buildGroupGemm is a grouped GEMM whose copies share the weights and
// route their rows anew, so that rotating over the copies reads other
// groups' weights than the L2 holds; the bytes count the weights of the
// groups the copies actually use.
func buildGroupGemm(b *Builder, bc *Bench, s kernels.Shape) *Problem {
	m, n, k, e := s["M"], s["N"], s["K"], s["E"]
	w := b.Random(b.Alloc(kernels.BF16, e, n, k), 1/math.Sqrt(float64(k)))
	c := b.copiesFor(bc.Bytes(s))
	type rows struct{ x, first, out *kernels.Tensor }
	var touched float64
	rs := each(b, c, func() rows {
		sizes := b.groupSizes(m, e)
		first := make([]int32, e+1)
		for g, n := range sizes {
			first[g+1] = first[g] + int32(n)
			if n > 0 {
				touched++
			}
		}
		return rows{x: b.Random(b.Act(m, k), 1), first: b.ints(first, e+1), out: b.Act(m, n)}
	})
	bytes := float64(bf16) * (touched/float64(c)*float64(n*k) + float64(m*k+m*n))
	return &Problem{Copies: c, Outs: []*kernels.Tensor{rs[0].out}, Bytes: bytes,
		Run: func(o kernels.Ops, i int) { o.GroupGemm(rs[i].out, rs[i].x, w, rs[i].first) }}
}

// buildDenseOfGroups is the dense GEMM of a group_gemm shape's total M, N,
// K: x [M,K] · w [N,K]ᵀ, what cuBLAS does with the same work in one piece.
func buildDenseOfGroups(b *Builder, s kernels.Shape) *Problem {
	m, n, k := s["M"], s["N"], s["K"]
	c := b.copiesFor(float64(bf16) * float64(m*k+n*k+m*n))
	xs := each(b, c, func() *kernels.Tensor { return b.Random(b.Act(m, k), 1) })
	ws := each(b, c, func() *kernels.Tensor { return b.Random(b.Alloc(kernels.BF16, n, k), 1/math.Sqrt(float64(k))) })
	outs := each(b, c, func() *kernels.Tensor { return b.Act(m, n) })
	return &Problem{Copies: c, Outs: outs[:1], Bytes: float64(bf16) * float64(m*k+n*k+m*n),
		Run: func(o kernels.Ops, i int) { o.Linear(outs[i], xs[i], ws[i], nil) }}
}
