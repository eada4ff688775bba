package fused

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	_ "github.com/fuselm/fuselm/kernels/naive" // the specs below put ops on naive, and fused falls back to it
)

// TestRMSNormRoPEHost checks rms_norm_rope's host side without a GPU: the
// fused set fuses the op, its instances are rms_norm's shape for
// DeepSeek's latent of 512 (the shape the set's rms_norm launches for it),
// and the variant table lists its one kernel.
func TestRMSNormRoPEHost(t *testing.T) {
	info, _ := kernels.Set("fused")
	if !info.Owns(kernels.OpRMSNormRoPE) || !slices.Contains(info.Fuses, kernels.OpRMSNormRoPE) {
		t.Errorf("fused owns rms_norm_rope: %v, fuses it: %v", info.Owns(kernels.OpRMSNormRoPE), info.Fuses)
	}
	aligned := cudaset.Mat{P: 1 << 20, Pitch: 3648, DT: kernels.BF16}
	if got := normShapeOf(512, aligned, aligned, cudaset.Mat{P: 1 << 21, Pitch: 512, DT: kernels.BF16}); got != (normShape{vec: 8, items: 1, threads: 64}) {
		t.Errorf("rms_norm's shape for a latent of 512: %+v, want 8-wide accesses, one a thread, 64 threads", got)
	}
	if got := normShapeOf(512, aligned, aligned, cudaset.Mat{P: 1<<21 + 2, Pitch: 512, DT: kernels.BF16}); got.vec == rmsNormRopeShape.vec {
		t.Errorf("a latent whose weights start off 16 bytes: %+v, want 1-wide accesses (rms_norm_rope declines it)", got)
	}
	if got := rmsNormRopeKernel(true, kernels.BF16); got != "rms_norm_rope_interleaved_bf16" {
		t.Errorf("kernel %q", got)
	}
	if vs := variants(kernels.OpRMSNormRoPE, nil, kernels.Targets["sm_90a"]); len(vs) != 1 || !vs[0].Valid() {
		t.Errorf("variants on sm_90a: %+v, want one, valid", vs)
	}
	if !slices.Contains(overlapKernels(), rmsNormRopeKernel(true, kernels.BF16)) {
		t.Errorf("rms_norm_rope is not launched to overlap the kernel before it")
	}
}

// TestElementwiseCompiles compiles elementwise.cu (the norms, ropes,
// swiglu, add and argmax) by NVRTC without a GPU, where its library is
// found: no spills, every kernel there.
func TestElementwiseCompiles(t *testing.T) { nvrtcReport(t, elementwiseModule()) }

// normRopeCase is one problem of TestRMSNormRoPEExact: tokens of MLA's q
// and new latent, at DeepSeek-V2-Lite's dims unless the case says.
type normRopeCase struct {
	t, heads, nope, rope, rank int
	interleaved, stacked       bool // stacked: q and kv column slices of one q_kv_a row
	w                          kernels.DType
}

func (c normRopeCase) String() string {
	return fmt.Sprintf("T=%d,H=%d,nope=%d,rope=%d,rank=%d,interleaved=%v,stacked=%v,w=%v",
		c.t, c.heads, c.nope, c.rope, c.rank, c.interleaved, c.stacked, c.w)
}

// normRopeProblem is a case's operands on the device, twice: a and b hold
// the same q and kv values, one for each of the two paths compared.
type normRopeProblem struct {
	q, kv [2]*kernels.Tensor
	w     *kernels.Tensor
	pos   *kernels.Tensor
	r     *kernels.Rope
	owned []*kernels.Tensor // every tensor it allocated
}

func (p *normRopeProblem) free(dev kernels.Device) { freeAll(dev, p.owned) }

func newNormRopeProblem(t *testing.T, dev kernels.Device, c normRopeCase, rng *rand.Rand) *normRopeProblem {
	t.Helper()
	p := &normRopeProblem{}
	qw, kvw := c.heads*(c.nope+c.rope), c.rank+c.rope
	normals := func(n int, scale float64) []float32 { return gaussians(rng, n, scale) }
	upload, ints := keeper(t, dev, &p.owned)
	const positions = 4096
	half := c.rope / 2
	cos, sin := make([]float32, positions*half), make([]float32, positions*half)
	for i := range cos {
		a := rng.Float64() * 2 * math.Pi
		cos[i], sin[i] = float32(math.Cos(a)), float32(math.Sin(a))
	}
	p.r = &kernels.Rope{Dim: c.rope, Interleaved: c.interleaved, Cos: upload(kernels.F32, cos, positions, half),
		Sin: upload(kernels.F32, sin, positions, half)}
	pos := make([]int, c.t)
	for i := range pos {
		pos[i] = rng.Intn(positions)
	}
	p.pos = ints(pos)
	g := normals(c.rank, 0.2)
	for i := range g {
		g[i]++
	}
	p.w = upload(c.w, g, c.rank)
	if c.stacked {
		vals := normals(c.t*(qw+kvw), 2)
		for s := range 2 {
			qkva := upload(kernels.BF16, vals, c.t, qw+kvw)
			p.q[s], p.kv[s] = qkva.ColSlice(0, qw), qkva.ColSlice(qw, qw+kvw)
		}
	} else {
		qv, kvv := normals(c.t*qw, 1), normals(c.t*kvw, 3)
		for s := range 2 {
			p.q[s], p.kv[s] = upload(kernels.BF16, qv, c.t, qw), upload(kernels.BF16, kvv, c.t, kvw)
		}
	}
	return p
}

// call is RMSNormRoPE of side s's operands, run by run: the set's own
// method, or kernels.RMSNormRoPEParts on it.
func (p *normRopeProblem) call(c normRopeCase, s int, run func(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope)) {
	run(p.q[s], p.kv[s], p.w, 1e-6, c.heads, c.nope+c.rope, c.nope, p.pos, p.r)
}

// TestRMSNormRoPEExact holds rms_norm_rope, one launch, to the fused set's
// unfused path, rms_norm then rope twice (three launches), bit for bit: at
// DeepSeek-V2-Lite's dims over decode's and prefill's token counts, q and
// kv column slices of one q_kv_a row or packed apart, interleaved pairs and
// rotate_half, bf16 and f32 norm weights; a latent no 16-byte access
// divides is declined. It also times both, for a first look (infer bench
// rms_norm_rope is the measurement). Skipped where no GPU is found.
func TestRMSNormRoPEExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(23))
	v2 := func(tokens int, stacked bool) normRopeCase {
		return normRopeCase{t: tokens, heads: 16, nope: 128, rope: 64, rank: 512, interleaved: true, stacked: stacked, w: kernels.BF16}
	}
	var cs []normRopeCase
	for _, tokens := range []int{1, 3, 16, 37, 2049, 11041} {
		cs = append(cs, v2(tokens, true), v2(tokens, false))
	}
	f32w, half := v2(37, true), v2(16, true)
	f32w.w, half.interleaved = kernels.F32, false
	cs = append(cs, f32w, half, normRopeCase{t: 17, heads: 3, nope: 32, rope: 16, rank: 96, interleaved: true, stacked: true, w: kernels.BF16})
	for _, c := range cs {
		p := newNormRopeProblem(t, dev, c, rng)
		if u, declined := kernels.Declined(func() { p.call(c, 0, o.RMSNormRoPE) }); declined {
			t.Errorf("%s: declined: %v", c, u)
			p.free(dev)
			continue
		}
		p.call(c, 1, func(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
			kernels.RMSNormRoPEParts(o, q, kv, w, eps, heads, headStride, offset, pos, r)
		})
		for _, piece := range []struct {
			name string
			x    [2]*kernels.Tensor
		}{{"q", p.q}, {"kv", p.kv}} {
			got, want := read(t, dev, piece.x[0]), read(t, dev, piece.x[1])
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					cols := piece.x[0].Cols()
					t.Errorf("%s: %s[%d,%d] is %g, rms_norm and rope give %g", c, piece.name, i/cols, i%cols, got[i], want[i])
					break
				}
			}
		}
		one := msPerCall(t, dev, func() { p.call(c, 0, o.RMSNormRoPE) })
		three := msPerCall(t, dev, func() {
			p.call(c, 1, func(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
				kernels.RMSNormRoPEParts(o, q, kv, w, eps, heads, headStride, offset, pos, r)
			})
		})
		t.Logf("%s: one launch %.2f µs, rms_norm and rope twice %.2f µs", c, one*1e3, three*1e3)
		p.free(dev)
	}
	odd := normRopeCase{t: 5, heads: 3, nope: 16, rope: 16, rank: 36, interleaved: true, stacked: true, w: kernels.BF16}
	p := newNormRopeProblem(t, dev, odd, rng)
	defer p.free(dev)
	if _, declined := kernels.Declined(func() { p.call(odd, 0, o.RMSNormRoPE) }); !declined {
		t.Errorf("%s: a latent of 36 taken; rms_norm reads it 1 element at a time, which rms_norm_rope has no instance of", odd)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// opCalls is an Observer that lists the op calls of a Dispatch with the
// set that ran each.
type opCalls struct{ calls []string }

func (c *opCalls) BeginOp(op kernels.Op, set string) kernels.OpEnd { return opEnd{c, op} }
func (c *opCalls) SetLayer(int)                                    {}

type opEnd struct {
	c  *opCalls
	op kernels.Op
}

func (e opEnd) EndOp(set string, _ kernels.Cost) { e.c.calls = append(e.c.calls, string(e.op)+"@"+set) }

// observed is spec's Dispatch on dev, with the observer that records its
// calls as "op@set".
func observed(t *testing.T, dev kernels.Device, spec string) (*kernels.Dispatch, *opCalls) {
	t.Helper()
	sp, err := kernels.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	obs := &opCalls{}
	d, err := sp.Build(dev, obs)
	if err != nil {
		t.Fatal(err)
	}
	return d, obs
}

// TestRMSNormRoPEDispatch: under "fused" MLA's norm and ropes are one call
// of fused's (one launch); where the spec puts rms_norm or rope on naive
// they are the three calls, each on its set, as before the op; naming the
// op runs it whole on that set. Skipped where no GPU is found.
func TestRMSNormRoPEDispatch(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	c := normRopeCase{t: 3, heads: 16, nope: 128, rope: 64, rank: 512, interleaved: true, stacked: true, w: kernels.BF16}
	p := newNormRopeProblem(t, dev, c, rand.New(rand.NewSource(29)))
	defer p.free(dev)
	for _, s := range []struct {
		spec  string
		calls []string
	}{
		{"fused", []string{"rms_norm_rope@fused"}},
		{"fused,rope=naive", []string{"rms_norm@fused", "rope@naive", "rope@naive"}},
		{"fused,rms_norm=naive", []string{"rms_norm@naive", "rope@fused", "rope@fused"}},
		{"naive", []string{"rms_norm@naive", "rope@naive", "rope@naive"}},
		{"naive,rms_norm_rope=fused", []string{"rms_norm_rope@fused"}},
	} {
		d, obs := observed(t, dev, s.spec)
		p.call(c, 0, d.RMSNormRoPE)
		if !slices.Equal(obs.calls, s.calls) {
			t.Errorf("%s: calls %v, want %v", s.spec, obs.calls, s.calls)
		}
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestAddAddRMSNormHost checks add_add_rms_norm's host side without a GPU:
// the fused set owns and fuses the op, its instances are rms_norm's shapes
// in elementwise.cu, launched to overlap the kernel before them, and the
// variant table lists its one kernel.
func TestAddAddRMSNormHost(t *testing.T) {
	info, _ := kernels.Set("fused")
	if !info.Owns(kernels.OpAddAddRMSNorm) || !slices.Contains(info.Fuses, kernels.OpAddAddRMSNorm) {
		t.Errorf("fused owns add_add_rms_norm: %v, fuses it: %v", info.Owns(kernels.OpAddAddRMSNorm), info.Fuses)
	}
	for _, v := range []int{1, cudaset.VecWidth} {
		for _, n := range normItems {
			k := normKernel("add_add_rms_norm", kernels.BF16, v, n)
			if !slices.Contains(elementwiseModule().Funcs, k) || !slices.Contains(overlapKernels(), k) {
				t.Errorf("%s: not among elementwise.cu's kernels launched overlapped", k)
			}
		}
	}
	if vs := variants(kernels.OpAddAddRMSNorm, nil, kernels.Targets["sm_90a"]); len(vs) != 1 || !vs[0].Valid() {
		t.Errorf("variants on sm_90a: %+v, want one, valid", vs)
	}
}

// addAddProblem is add_add_rms_norm's operands on the device, twice: side
// 0 for the op, side 1 for its parts, holding the same values; y and w
// are shared. x is columns [xCol, xCol+d) of rows of d+8.
type addAddProblem struct {
	out, resid, x [2]*kernels.Tensor
	y, w          *kernels.Tensor
	owned         []*kernels.Tensor
}

func newAddAddProblem(t *testing.T, dev kernels.Device, n, d, xCol int, wdt kernels.DType, rng *rand.Rand) *addAddProblem {
	t.Helper()
	p := &addAddProblem{}
	upload, _ := keeper(t, dev, &p.owned)
	xv, rv := gaussians(rng, n*(d+8), 3), gaussians(rng, n*d, 1)
	g := gaussians(rng, d, 0.2)
	for i := range g {
		g[i]++
	}
	p.y, p.w = upload(kernels.BF16, gaussians(rng, n*d, 3), n, d), upload(wdt, g, d)
	for s := range 2 {
		p.x[s] = upload(kernels.BF16, xv, n, d+8).ColSlice(xCol, xCol+d)
		p.resid[s] = upload(kernels.BF16, rv, n, d)
		p.out[s] = upload(kernels.BF16, make([]float32, n*d), n, d)
	}
	return p
}

func (p *addAddProblem) free(dev kernels.Device) { freeAll(dev, p.owned) }

// whole is AddAddRMSNorm of side s on o; parts is its parts on o.
func (p *addAddProblem) whole(o kernels.Ops, s int) {
	o.AddAddRMSNorm(p.out[s], p.resid[s], p.x[s], p.y, p.w, 1e-6)
}
func (p *addAddProblem) parts(o kernels.Ops, s int) {
	kernels.AddAddRMSNormParts(o, p.out[s], p.resid[s], p.x[s], p.y, p.w, 1e-6)
}

// differ is where side 0's out or residual first differs from side 1's in
// its bits, "" where neither does.
func (p *addAddProblem) differ(t *testing.T, dev kernels.Device) string {
	t.Helper()
	for _, r := range []struct {
		name string
		x    [2]*kernels.Tensor
	}{{"out", p.out}, {"resid", p.resid}} {
		got, want := read(t, dev, r.x[0]), read(t, dev, r.x[1])
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				cols := r.x[0].Cols()
				return fmt.Sprintf("%s[%d,%d] is %g, add and add_rms_norm give %g", r.name, i/cols, i%cols, got[i], want[i])
			}
		}
	}
	return ""
}

// TestAddAddRMSNormExact holds add_add_rms_norm, one launch, to the fused
// set's add then add_rms_norm (two launches) bit for bit, out and the
// residual: DeepSeek-V2-Lite's hidden size (2,048) and Qwen2-7B's (3,584)
// at decode's 1, 9 and 16 rows, x a column slice of wider rows, bf16 and
// f32 norm weights; x is left as it was. An x that starts 2 bytes off the
// 16-byte boundary where out, w and resid start on one is declined, and a
// Dispatch runs it as add and add_rms_norm, the same bits as the fused
// set's parts. It also times both, for a first look (infer bench
// add_add_rms_norm is the measurement). Skipped where no GPU is found.
func TestAddAddRMSNormExact(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(41))
	for _, d := range []int{2048, 3584} {
		for _, n := range []int{1, 9, 16} {
			for _, wdt := range []kernels.DType{kernels.BF16, kernels.F32} {
				name := fmt.Sprintf("N=%d,D=%d,w=%v", n, d, wdt)
				p := newAddAddProblem(t, dev, n, d, 0, wdt, rng)
				x := read(t, dev, p.x[0])
				if u, declined := kernels.Declined(func() { p.whole(o, 0) }); declined {
					t.Errorf("%s: declined: %v", name, u)
					p.free(dev)
					continue
				}
				p.parts(o, 1)
				if bad := p.differ(t, dev); bad != "" {
					t.Errorf("%s: %s", name, bad)
				}
				if !slices.Equal(read(t, dev, p.x[0]), x) {
					t.Errorf("%s: x changed", name)
				}
				one := msPerCall(t, dev, func() { p.whole(o, 0) })
				two := msPerCall(t, dev, func() { p.parts(o, 1) })
				t.Logf("%s: one launch %.2f µs, add and add_rms_norm %.2f µs", name, one*1e3, two*1e3)
				p.free(dev)
			}
		}
	}
	p := newAddAddProblem(t, dev, 9, 2048, 1, kernels.BF16, rng)
	defer p.free(dev)
	if _, declined := kernels.Declined(func() { p.whole(o, 0) }); !declined {
		t.Errorf("x 2 bytes off a 16-byte boundary taken; add_rms_norm reads the parts' sum there 1 element at a time")
	}
	d, obs := observed(t, dev, "fused")
	p.whole(d, 0)
	p.parts(o, 1)
	if want := []string{"add@fused", "add_rms_norm@fused"}; !slices.Equal(obs.calls, want) {
		t.Errorf("x off 16 bytes: calls %v, want %v", obs.calls, want)
	}
	if bad := p.differ(t, dev); bad != "" {
		t.Errorf("x off 16 bytes, through the Dispatch: %s", bad)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestAddAddRMSNormDispatch: under "fused" the MoE's two outputs join the
// next norm in one call of fused's; where the spec puts add or
// add_rms_norm on naive they are the two calls, each on its set, as before
// the op (the same bits where add_rms_norm stays on fused: naive's add
// rounds as fused's does); naming the op runs it whole on that set.
// Skipped where no GPU is found.
func TestAddAddRMSNormDispatch(t *testing.T) {
	dev, o := openSet(t)
	rng := rand.New(rand.NewSource(43))
	for _, s := range []struct {
		spec  string
		calls []string
		exact bool // the fused set's parts' bits
	}{
		{"fused", []string{"add_add_rms_norm@fused"}, true},
		{"fused,add=naive", []string{"add@naive", "add_rms_norm@fused"}, true},
		{"fused,add_rms_norm=naive", []string{"add@fused", "add_rms_norm@naive"}, false},
		{"naive", []string{"add@naive", "add_rms_norm@naive"}, false},
		{"naive,add_add_rms_norm=fused", []string{"add_add_rms_norm@fused"}, true},
	} {
		p := newAddAddProblem(t, dev, 16, 2048, 0, kernels.BF16, rng)
		d, obs := observed(t, dev, s.spec)
		p.whole(d, 0)
		p.parts(o, 1)
		if !slices.Equal(obs.calls, s.calls) {
			t.Errorf("%s: calls %v, want %v", s.spec, obs.calls, s.calls)
		}
		if bad := p.differ(t, dev); s.exact && bad != "" {
			t.Errorf("%s: %s", s.spec, bad)
		}
		p.free(dev)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}
