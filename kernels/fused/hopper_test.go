package fused

import (
	"fmt"
	"math"
	"math/rand"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestHopperInstances checks, without a GPU, that every instance the Go
// side asks for fits an H100/H200 block (TestInstancesHeader checks that
// hopper.cu instantiates them under those names).
func TestHopperInstances(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range hopperConfigs {
		if c.shared() > h200.SharedPerBlock {
			t.Errorf("%s: %d bytes of shared memory, an sm_90a block gets %d", c.kernel(), c.shared(), h200.SharedPerBlock)
		}
	}
	for _, dt := range hopperDTypes {
		for _, d := range hopperHeadDims {
			v, ok := hopperVariantOf(dt, d, h200)
			if !ok || !v.Valid() || !strings.Contains(v.Params, "k_stages=") {
				t.Errorf("%v D=%d on sm_90a: %+v", dt, d, v)
			}
		}
	}
	if len(hopperConfigs) != 2*4 {
		t.Errorf("%d instances, want each of 4 (head dim, rings) in bf16 and f16", len(hopperConfigs))
	}
}

// openHopper opens GPU 0 and builds the fused set on it, or skips where
// flash_hopper cannot exist (no GPU, not a 9.0 device, NVRTC too old).
func openHopper(t *testing.T) (*cuda.Device, *ops) {
	t.Helper()
	return openHopperSet(t, "flash_hopper", func(o *ops) error { return o.hopper.err })
}

// openSet opens the CUDA device (skipping t where none is found) and the
// fused set on it.
func openSet(t *testing.T) (*cuda.Device, *ops) {
	t.Helper()
	dev := kerneltest.OpenCUDA(t)
	return dev, newSet(t, dev)
}

// newSet is the fused set on dev, failing t where New fails.
func newSet(t *testing.T, dev kernels.Device) *ops {
	t.Helper()
	set, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	return set.(*ops)
}

// openHopperSet opens GPU 0 and builds the fused set on it, skipping off
// hopperArch devices, where the Hopper kernel named cannot exist; absent
// (kitErr, its kit's error) it fails.
func openHopperSet(t *testing.T, kernel string, kitErr func(*ops) error) (*cuda.Device, *ops) {
	t.Helper()
	dev := kerneltest.OpenCUDA(t)
	if p := dev.Props(); p.Arch != hopperArch {
		t.Skipf("%s runs on %s only; %s (compute capability %d.%d) is %s", kernel, hopperArch, p.Name, p.CCMajor, p.CCMinor, p.Arch)
	}
	o := newSet(t, dev)
	if err := kitErr(o); err != nil {
		t.Fatalf("%s is absent: %v", kernel, err)
	}
	return dev, o
}

// TestHopperCompiles compiles hopper.cu as the set does, with ptxas's
// report, and prints NVRTC's whole log: every error of a broken build at
// once, or each kernel's registers, spills and wgmma warnings. A wgmma
// pipeline serialized by the compiler (C7514 and its kin), setmaxnreg
// ignored (C7508), spills or a stack frame fail it: each defeats the design.
// With FUSELM_HOPPER_CUBIN=path it writes the cubin there, for
// `cuobjdump -sass path`.
func TestHopperCompiles(t *testing.T) {
	hopperCompileReport(t, hopperModule(), "FUSELM_HOPPER_CUBIN", false)
	_, o := openHopper(t)
	for _, c := range hopperConfigs {
		a, err := o.Func(c.kernel()).Attrs()
		t.Logf("%s: %+v, dynamic shared %d, err %v", c.kernel(), a, c.shared(), err)
	}
	t.Logf("instances run: %v", o.hopper.configs)
}

// hopperCompileReport compiles module m as the set does, with ptxas's
// report, logs NVRTC's whole log and fails on what defeats the Hopper
// design: a wgmma pipeline serialized by the compiler (C7514 and its kin),
// setmaxnreg ignored (C7508), any other C75xx, and spills or a stack frame
// unless spills says they are only logged. With the environment variable
// cubinEnv set to a path it writes the cubin there. It skips off hopperArch
// devices.
func hopperCompileReport(t *testing.T, m cudaset.Module, cubinEnv string, spills bool) {
	t.Helper()
	dev := kerneltest.OpenCUDA(t)
	p := dev.Props()
	if p.Arch != hopperArch {
		t.Skipf("%s compiles for %s only; %s is %s", m.File, hopperArch, p.Name, p.Arch)
	}
	src, err := cudaset.Source(m)
	if err != nil {
		t.Fatal(err)
	}
	src.Name = "fused_" + m.File
	log, img, err := dev.CompileLog(src, "--ptxas-options=-v")
	t.Logf("NVRTC %d.%d, %v, --ptxas-options=-v; log:\n%s", p.NVRTCVersion/1000, p.NVRTCVersion%1000/10, dev.CompileOptions(), log)
	if err != nil {
		log2, _, err2 := dev.CompileLog(src)
		t.Fatalf("compile with -v: %v\nwithout it: %v\n%s", err, err2, log2)
	}
	if path := os.Getenv(cubinEnv); path != "" {
		if err := os.WriteFile(path, img, 0o644); err != nil {
			t.Error(err)
		}
		t.Logf("cubin (%d bytes) written to %s", len(img), path)
	}
	for _, bad := range slices.Compact(slices.Sorted(slices.Values(regexp.MustCompile(`C75\d\d`).FindAllString(log, -1)))) {
		t.Errorf("ptxas warns %s (see the log above)", bad)
	}
	for _, m := range regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`).FindAllStringSubmatch(log, -1) {
		if !spills && (m[1] != "0" || m[2] != "0" || m[3] != "0") {
			t.Errorf("ptxas: %s", m[0])
		}
	}
}

// hopperCase is a prefill problem for the device-only comparisons.
type hopperCase struct {
	lens, past   []int
	heads, kv, d int
	maxSeq       int
	causal       bool
	f16          bool // f16 operands (flash_hopper's f16 instances), else bf16
	// outPad is elements between out's rows beyond heads·d: 4 puts them
	// off the 16-byte boundaries a tensor store needs, so that the kernel
	// stores directly.
	outPad int
}

func (c hopperCase) String() string {
	s := fmt.Sprintf("new=%v,past=%v,H=%d,KV=%d,D=%d,max=%d,causal=%v,%v", c.lens, c.past, c.heads, c.kv, c.d, c.maxSeq, c.causal, c.dtype())
	if c.outPad > 0 {
		s += fmt.Sprintf(",out pitch +%d", c.outPad)
	}
	return s
}

// dtype is the element type of the case's operands.
func (c hopperCase) dtype() kernels.DType {
	if c.f16 {
		return kernels.F16
	}
	return kernels.BF16
}

// hopperProblem is a hopperCase's operands on the device: q, the new k and
// v, caches whose positions past each row's end hold NaN, and the batch.
type hopperProblem struct {
	c            hopperCase
	q, k, v      *kernels.Tensor
	kc, vc, out  *kernels.Tensor
	batch        *kernels.Batch
	tokens, rows int
}

func newHopperProblem(t *testing.T, dev *cuda.Device, c hopperCase, seed int64) *hopperProblem {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	p := &hopperProblem{c: c, rows: len(c.lens)}
	start := make([]int, len(c.lens)+1)
	for b, n := range c.lens {
		start[b+1] = start[b] + n
	}
	p.tokens = start[len(c.lens)]
	upload := func(vals []float32, shape ...int) *kernels.Tensor { return tensorOn(t, dev, c.dtype(), vals, shape...) }
	normal := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	cache := func() []float32 {
		v := normal(p.rows * c.kv * c.maxSeq * c.d)
		for b := range p.rows {
			for g := range c.kv {
				for pos := c.past[b]; pos < c.maxSeq; pos++ {
					row := (b*c.kv+g)*c.maxSeq + pos
					for j := range c.d {
						v[row*c.d+j] = float32(math.NaN())
					}
				}
			}
		}
		return v
	}
	p.q = upload(normal(p.tokens*c.heads*c.d), p.tokens, c.heads*c.d)
	p.k = upload(normal(p.tokens*c.kv*c.d), p.tokens, c.kv*c.d)
	p.v = upload(normal(p.tokens*c.kv*c.d), p.tokens, c.kv*c.d)
	p.kc = upload(cache(), p.rows, c.kv, c.maxSeq, c.d)
	p.vc = upload(cache(), p.rows, c.kv, c.maxSeq, c.d)
	p.out = dev.Alloc(c.dtype(), p.tokens, c.heads*c.d+c.outPad)
	p.out.Shape = []int{p.tokens, c.heads * c.d} // the first heads·d columns, rows still Pitch apart
	p.batch = &kernels.Batch{Rows: p.rows, Tokens: p.tokens, Start: start, Past: c.past, MaxSeq: c.maxSeq,
		StartDev: intsOn(t, dev, start), PastDev: intsOn(t, dev, c.past)}
	return p
}

// tensorOn is a packed tensor of dt on dev holding vals (rounded to dt).
func tensorOn(t *testing.T, dev kernels.Device, dt kernels.DType, vals []float32, shape ...int) *kernels.Tensor {
	t.Helper()
	x := dev.Alloc(dt, shape...)
	if err := dev.Upload(x, f32Bytes(vals), kernels.F32); err != nil {
		t.Fatal(err)
	}
	return x
}

// normalOn returns a maker of packed tensors of dt on dev, each of the
// given shape, holding normal samples of rng scaled by scale (rounded to dt).
func normalOn(t *testing.T, dev kernels.Device, rng *rand.Rand) func(dt kernels.DType, scale float64, shape ...int) *kernels.Tensor {
	return func(dt kernels.DType, scale float64, shape ...int) *kernels.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return tensorOn(t, dev, dt, gaussians(rng, n, scale), shape...)
	}
}

// intsOn is an i32 tensor on dev holding v.
func intsOn(t *testing.T, dev kernels.Device, v []int) *kernels.Tensor {
	t.Helper()
	x := dev.Alloc(kernels.I32, len(v))
	w := make([]int32, len(v))
	for i, n := range v {
		w[i] = int32(n)
	}
	if err := dev.WriteI32(x, w); err != nil {
		t.Fatal(err)
	}
	return x
}

// keeper returns tensorOn and intsOn on dev that also add each tensor to
// owned, for a problem to free them together (freeAll).
func keeper(t *testing.T, dev kernels.Device, owned *[]*kernels.Tensor) (
	upload func(dt kernels.DType, vals []float32, shape ...int) *kernels.Tensor, ints func(v []int) *kernels.Tensor) {
	upload = func(dt kernels.DType, vals []float32, shape ...int) *kernels.Tensor {
		x := tensorOn(t, dev, dt, vals, shape...)
		*owned = append(*owned, x)
		return x
	}
	ints = func(v []int) *kernels.Tensor {
		x := intsOn(t, dev, v)
		*owned = append(*owned, x)
		return x
	}
	return upload, ints
}

// freeAll frees every tensor of owned on dev.
func freeAll(dev kernels.Device, owned []*kernels.Tensor) {
	for _, x := range owned {
		dev.Free(x)
	}
}

// gaussians are n draws of rng's normal distribution times scale.
func gaussians(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// run is AttentionPrefill of the problem with flash_hopper (hopper) or
// flash_prefill's default tiling; it returns the output.
func (p *hopperProblem) run(t *testing.T, dev *cuda.Device, o *ops, hopper bool) []float32 {
	t.Helper()
	o.choice[choiceKey{kernels.OpAttnPrefill, prefillKey(p.c.d, p.c.dtype())}] = hopperChoice(hopper, prefillConfig)
	dev.MemsetD8(dev.Ptr(p.out), 0xff, p.out.Rows()*p.out.Pitch*2) // NaN: a row the kernel does not write shows
	o.AttentionPrefill(p.args())
	out, err := dev.ReadF32(p.out)
	if err != nil {
		t.Fatalf("hopper=%v: %v", hopper, err)
	}
	if err := o.hopperWaits(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (p *hopperProblem) args() *kernels.AttnArgs {
	c := p.c
	return &kernels.AttnArgs{Out: p.out, Q: p.q, K: p.k, V: p.v, KCache: p.kc, VCache: p.vc, Batch: p.batch,
		Heads: c.heads, KVHeads: c.kv, HeadDim: c.d, Scale: float32(1 / math.Sqrt(float64(c.d))), NonCausal: !c.causal}
}

// hopperTol bounds |flash_hopper − flash_prefill| per element: both round
// p to bf16 and the output once, but rescale at different key-tile
// boundaries (128 against 64 keys), so they differ by a few bf16 units of
// outputs of magnitude below 1; a layout or masking bug gives O(1) errors.
const hopperTol = 2e-2

// hopperF16Tol bounds |flash_hopper f16 − the f32 reference| per element:
// p rounded to f16 (2⁻¹² of each weight at most) and the output rounded to
// f16 once (at most 2⁻¹⁰ for outputs below 4, the largest a mean of N(0,
// 1) values reaches here by far).
const hopperF16Tol = 5e-3

// compareHopper holds got (flash_hopper) against want (flash_prefill) and,
// on a mismatch, says where: the first mismatches with their token, row,
// head and dim, and the mismatch counts by the kernel's own coordinates
// (warpgroup, warp, row of 16, 8-column chunk), so that a wrong fragment
// or descriptor layout shows as a pattern.
func compareHopper(t *testing.T, p *hopperProblem, got, want []float32) {
	t.Helper()
	compareRows(t, p.c.String(), p.batch, p.c.heads, p.c.d, got, want, hopperTol)
}

// compareRows is compareHopper's check of got against want within tol per
// element, outputs [tokens, heads·d] of batch (as f32), described by desc.
func compareRows(t *testing.T, desc string, batch *kernels.Batch, heads, d int, got, want []float32, tol float64) {
	t.Helper()
	width := heads * d
	tokens := batch.Tokens
	bad, nan := 0, 0
	var first []string
	byWG, byWarp, byRow16, byChunk := map[int]int{}, map[int]int{}, map[int]int{}, map[int]int{}
	byTile := map[int]int{}
	maxErr := 0.0
	for tok := range tokens {
		b := 0
		for batch.Start[b+1] <= tok {
			b++
		}
		i := tok - batch.Start[b] // the token's index among its row's new ones
		for col := range width {
			g, w := got[tok*width+col], want[tok*width+col]
			e := math.Abs(float64(g - w))
			isNaN := math.IsNaN(float64(g)) || math.IsInf(float64(g), 0)
			if isNaN {
				nan++
			}
			if !isNaN && e <= tol {
				maxErr = math.Max(maxErr, e)
				continue
			}
			bad++
			h, dim := col/d, col%d
			r := i % hopperRows
			byWG[r/64]++
			byWarp[(r%64)/16]++
			byRow16[r%16]++
			byChunk[dim/8]++
			byTile[i/hopperRows]++
			if len(first) < 12 {
				first = append(first, fmt.Sprintf("token %d (row %d, new token %d, position %d), head %d, dim %d: wgmma %g, reference %g",
					tok, b, i, batch.Past[b]+i, h, dim, g, w))
			}
		}
	}
	t.Logf("%s: largest difference within tolerance %.3g", desc, maxErr)
	if bad > 0 {
		t.Errorf("%s: %d of %d elements differ by more than %g (%d NaN or Inf)\n  %s\n  by warpgroup %v\n  by warp of the warpgroup %v\n  by row of 16 %v\n  by 8-dim chunk %v\n  by block of %d queries %v",
			desc, bad, len(got), tol, nan, strings.Join(first, "\n  "), byWG, byWarp, byRow16, byChunk, hopperRows, byTile)
	}
}

// hopperTinyCases are small problems of sizes that are multiples of no
// tile: one block and one tile, the diagonal, ragged rows with past > 0,
// GQA, head dims 128 and 64, causal and not.
var hopperTinyCases = []hopperCase{
	{lens: []int{64}, past: []int{0}, heads: 1, kv: 1, d: 128, maxSeq: 64, causal: false},  // one block, one tile, no tail
	{lens: []int{128}, past: []int{0}, heads: 1, kv: 1, d: 128, maxSeq: 128, causal: true}, // the diagonal
	{lens: []int{300}, past: []int{0}, heads: 2, kv: 1, d: 128, maxSeq: 320, causal: true},
	{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 4, kv: 2, d: 128, maxSeq: 400, causal: true},
	{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 4, kv: 2, d: 128, maxSeq: 400, causal: false},
	{lens: []int{129, 70}, past: []int{0, 77}, heads: 4, kv: 4, d: 64, maxSeq: 300, causal: true},
	{lens: []int{129, 70}, past: []int{0, 77}, heads: 4, kv: 4, d: 64, maxSeq: 300, causal: false},
	// out's rows off 16-byte boundaries: every warpgroup stores directly
	{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 4, kv: 2, d: 128, maxSeq: 400, causal: true, outPad: 4},
	{lens: []int{129, 70}, past: []int{0, 77}, heads: 4, kv: 4, d: 64, maxSeq: 300, causal: false, outPad: 4},
}

// eachInstance runs f with each flash_hopper instance of element type dt
// in turn as the one AttentionPrefill launches for its head dim, skipping
// those that do not fit the device.
func eachInstance(t *testing.T, o *ops, dt kernels.DType, f func(t *testing.T, inst hopperConfig)) {
	for _, inst := range hopperConfigs {
		if inst.DT != dt {
			continue
		}
		t.Run(inst.kernel(), func(t *testing.T) {
			saved := o.hopper.configs[inst.hopperHead]
			o.hopper.configs[inst.hopperHead] = inst
			defer func() { o.hopper.configs[inst.hopperHead] = saved }()
			if err := o.Func(inst.kernel()).SetMaxDynamicShared(inst.shared()); err != nil {
				t.Skipf("%s does not fit here: %v", inst.kernel(), err)
			}
			f(t, inst)
		})
	}
}

// TestHopperTiny runs flash_hopper on small problems against flash_prefill
// on the same device and inputs, each bf16 instance in turn: the first
// check to read when the kernel is wrong (TestHopperF16 runs the f16 ones).
func TestHopperTiny(t *testing.T) {
	dev, o := openHopper(t)
	eachInstance(t, o, kernels.BF16, func(t *testing.T, inst hopperConfig) {
		for i, c := range hopperTinyCases {
			if c.d != inst.D {
				continue
			}
			p := newHopperProblem(t, dev, c, int64(i))
			want := p.run(t, dev, o, false)
			got := p.run(t, dev, o, true)
			compareHopper(t, p, got, want)
		}
	})
}

// TestHopperGridCap runs flash_hopper with its grid capped to 1, 2 and 3
// blocks, so that each block takes many items one after the other (the K,
// V and Q rings running on across items, the turns and the output stores
// of one item overlapping the next), on hopperTinyCases and two with more
// items than blocks of either kind, against flash_prefill.
func TestHopperGridCap(t *testing.T) {
	dev, o := openHopper(t)
	cases := append(slices.Clone(hopperTinyCases),
		hopperCase{lens: []int{1000, 515, 3}, past: []int{0, 700, 90}, heads: 4, kv: 2, d: 128, maxSeq: 1300, causal: true},
		hopperCase{lens: []int{700, 260}, past: []int{0, 0}, heads: 3, kv: 3, d: 64, maxSeq: 700, causal: false})
	defer func(c int) { hopperGridCap = c }(hopperGridCap)
	eachInstance(t, o, kernels.BF16, func(t *testing.T, inst hopperConfig) {
		for _, grid := range []int{1, 2, 3} {
			hopperGridCap = grid
			for i, c := range cases {
				if c.d != inst.D {
					continue
				}
				p := newHopperProblem(t, dev, c, int64(200+i))
				want := p.run(t, dev, o, false)
				got := p.run(t, dev, o, true)
				compareRows(t, fmt.Sprintf("grid %d, %v", grid, c), p.batch, c.heads, c.d, got, want, hopperTol)
			}
		}
	})
}

// flops is the problem's attention FLOPs: 4·d per (query head, key seen).
func (p *hopperProblem) flops() float64 {
	c, f := p.c, 0.0
	for b, n := range c.lens {
		keys := float64(c.past[b]) * float64(n)
		if c.causal {
			keys += float64(n) * float64(n+1) / 2
		} else {
			keys += float64(n) * float64(n)
		}
		f += 4 * keys * float64(c.heads*c.d)
	}
	return f
}

// time is the mean ms of AttentionPrefill of the problem (kv_append
// included) with flash_hopper (hopper) or flash_prefill's default tiling,
// and the kernel's name.
func (p *hopperProblem) time(t *testing.T, dev *cuda.Device, o *ops, hopper bool) (float64, string) {
	t.Helper()
	dt := p.c.dtype()
	o.choice[choiceKey{kernels.OpAttnPrefill, prefillKey(p.c.d, dt)}] = hopperChoice(hopper, prefillConfig)
	ms := msPerCall(t, dev, func() { o.AttentionPrefill(p.args()) })
	if err := o.hopperWaits(); err != nil {
		t.Fatal(err)
	}
	if !hopper {
		return ms, prefillConfig.String()
	}
	return ms, hopperVariant + " " + o.hopper.configs[hopperHead{dt, p.c.d}].kernel()
}

// TestHopperLong runs flash_hopper over 16K keys and more (sizes that are
// multiples of no tile, GQA, past > 0, causal and not) against
// flash_prefill on the device, and logs the time of each: a first
// performance reading before kbench's.
func TestHopperLong(t *testing.T) {
	dev, o := openHopper(t)
	for i, c := range []hopperCase{
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 2, d: 128, maxSeq: 16411, causal: true},
		{lens: []int{5000, 300}, past: []int{11500, 16000}, heads: 8, kv: 2, d: 128, maxSeq: 16500, causal: true},
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 2, d: 128, maxSeq: 16411, causal: false},
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 8, d: 64, maxSeq: 16411, causal: true},
	} {
		p := newHopperProblem(t, dev, c, int64(100+i))
		want := p.run(t, dev, o, false)
		got := p.run(t, dev, o, true)
		compareHopper(t, p, got, want)
		for _, hopper := range []bool{false, true} {
			ms, name := p.time(t, dev, o, hopper)
			t.Logf("%v %s: %.3f ms, %.0f TFLOP/s (kv_append included)", c, name, ms, p.flops()/ms/1e9)
		}
	}
}

// msPerCall is call's device time in ms, the mean of 5 calls after one to
// warm up, timed by events.
func msPerCall(t *testing.T, dev *cuda.Device, call func()) float64 {
	t.Helper()
	const reps = 5
	call()
	m0 := dev.Mark()
	for range reps {
		call()
	}
	ms, err := dev.Elapsed(m0, dev.Mark())
	if err != nil {
		t.Fatal(err)
	}
	return ms / reps
}

// read is t's values on the device, widened to f32.
func read(t *testing.T, dev kernels.Device, x *kernels.Tensor) []float32 {
	t.Helper()
	v, err := dev.ReadF32(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// hostReference is what a cpu-set reference of a device problem starts
// from: an f32 host device, the cpu set on it, a copy to it of a device
// tensor (widened to f32), and batch with its tables on the host.
func hostReference(t *testing.T, dev *cuda.Device, batch *kernels.Batch) (host kernels.Device, ref kernels.Ops,
	onHost func(*kernels.Tensor) *kernels.Tensor, hb kernels.Batch) {
	t.Helper()
	host = cpu.NewDevice()
	ref, err := cpu.New(host)
	if err != nil {
		t.Fatal(err)
	}
	onHost = func(x *kernels.Tensor) *kernels.Tensor {
		return tensorOn(t, host, kernels.F32, read(t, dev, x), x.Shape...)
	}
	hb = *batch
	hb.StartDev, hb.PastDev = intsOn(t, host, hb.Start), intsOn(t, host, hb.Past)
	return host, ref, onHost, hb
}

// cpuReference is the problem's output by the cpu set on an f32 host
// device, from the values the device holds (widened): f32 throughout, p
// unrounded, the reference f16 results are held against.
func (p *hopperProblem) cpuReference(t *testing.T, dev *cuda.Device) []float32 {
	t.Helper()
	host, ref, onHost, hb := hostReference(t, dev, p.batch)
	c := p.c
	a := &kernels.AttnArgs{Out: host.Alloc(kernels.F32, p.tokens, c.heads*c.d), Q: onHost(p.q), K: onHost(p.k), V: onHost(p.v),
		KCache: onHost(p.kc), VCache: onHost(p.vc), Batch: &hb, Heads: c.heads, KVHeads: c.kv, HeadDim: c.d,
		Scale: float32(1 / math.Sqrt(float64(c.d))), NonCausal: !c.causal}
	ref.AttentionPrefill(a)
	if err := host.Sync(); err != nil {
		t.Fatal(err)
	}
	return read(t, host, a.Out)
}

// TestHopperF16 runs each f16 instance of flash_hopper against the cpu set
// (f32, on the values the device holds): hopperTinyCases, and two with more
// than 16K keys (a long past, few queries: cheap for the cpu), D=128 and 64.
func TestHopperF16(t *testing.T) {
	dev, o := openHopper(t)
	cases := append(slices.Clone(hopperTinyCases),
		hopperCase{lens: []int{130, 7}, past: []int{16300, 0}, heads: 4, kv: 2, d: 128, maxSeq: 16500, causal: false},
		hopperCase{lens: []int{200}, past: []int{16390}, heads: 2, kv: 1, d: 64, maxSeq: 16600, causal: true})
	eachInstance(t, o, kernels.F16, func(t *testing.T, inst hopperConfig) {
		for i, c := range cases {
			if c.d != inst.D {
				continue
			}
			c.f16 = true
			p := newHopperProblem(t, dev, c, int64(i))
			got := p.run(t, dev, o, true)
			compareRows(t, c.String(), p.batch, c.heads, c.d, got, p.cpuReference(t, dev), hopperF16Tol)
		}
	})
	// Without an f16 instance the call is declined (the dispatch then runs
	// naive's): flash_prefill cannot take f16.
	p := newHopperProblem(t, dev, hopperCase{lens: []int{5}, past: []int{0}, heads: 1, kv: 1, d: 128, maxSeq: 5, f16: true}, 1)
	f16 := choiceKey{kernels.OpAttnPrefill, prefillKey(128, kernels.F16)}
	o.choice[f16] = prefillConfig.String()
	defer delete(o.choice, f16)
	func() {
		defer func() {
			r := recover()
			if u, ok := r.(kernels.Unsupported); !ok || !strings.Contains(u.Why, "take bf16 only") {
				t.Errorf("f16 with flash_hopper off: %v, want it declined", r)
			}
		}()
		o.AttentionPrefill(p.args())
	}()
}

// TestHopperF16Long times flash_hopper's f16 instances beside the bf16 ones
// on 16K-token rows (causal and not, D=128 and 64; the same f32 values
// rounded to each type), and holds the f16 outputs at sampled (token,
// head) pairs against float64 attention over the values the device holds
// (the cpu set would take minutes here).
func TestHopperF16Long(t *testing.T) {
	dev, o := openHopper(t)
	for i, c := range []hopperCase{
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 2, d: 128, maxSeq: 16411, causal: true},
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 2, d: 128, maxSeq: 16411, causal: false},
		{lens: []int{5000, 300}, past: []int{11500, 16000}, heads: 8, kv: 2, d: 128, maxSeq: 16500, causal: true},
		{lens: []int{16411}, past: []int{0}, heads: 8, kv: 8, d: 64, maxSeq: 16411, causal: true},
	} {
		c.f16 = true
		p := newHopperProblem(t, dev, c, int64(200+i))
		got := p.run(t, dev, o, true)
		p.checkSampled(t, dev, got, 512, rand.New(rand.NewSource(int64(i))))
		ms16, name16 := p.time(t, dev, o, true)
		c.f16 = false
		ms, name := newHopperProblem(t, dev, c, int64(200+i)).time(t, dev, o, true)
		t.Logf("%v: %s %.3f ms, %.0f TFLOP/s; %s %.3f ms, %.0f TFLOP/s (kv_append included)",
			p.c, name16, ms16, p.flops()/ms16/1e9, name, ms, p.flops()/ms/1e9)
	}
}

// checkSampled holds got, the problem's output, at n (token, head) pairs
// drawn by rng (the first and last token of each row among them) against
// attention in float64 over the values the device holds.
func (p *hopperProblem) checkSampled(t *testing.T, dev *cuda.Device, got []float32, n int, rng *rand.Rand) {
	t.Helper()
	c, b := p.c, p.batch
	q, k, v := read(t, dev, p.q), read(t, dev, p.k), read(t, dev, p.v)
	kc, vc := read(t, dev, p.kc), read(t, dev, p.vc)
	width, group := c.heads*c.d, c.heads/c.kv
	var toks []int
	for r := range p.rows {
		toks = append(toks, b.Start[r], b.Start[r+1]-1)
	}
	for len(toks) < n {
		toks = append(toks, rng.Intn(p.tokens))
	}
	worst, bad := 0.0, 0
	for _, tok := range toks {
		r := 0
		for b.Start[r+1] <= tok {
			r++
		}
		i, h := tok-b.Start[r], rng.Intn(c.heads)
		g, keys := h/group, b.Past[r]+c.lens[r]
		if c.causal {
			keys = b.Past[r] + i + 1
		}
		// key j of the row: cached below past, else the new token's
		key := func(j int, cache, fresh []float32) []float32 {
			if j < b.Past[r] {
				at := ((r*c.kv+g)*c.maxSeq + j) * c.d
				return cache[at : at+c.d]
			}
			at := (b.Start[r]+j-b.Past[r])*c.kv*c.d + g*c.d
			return fresh[at : at+c.d]
		}
		qh := q[tok*width+h*c.d : tok*width+(h+1)*c.d]
		s, m := make([]float64, keys), math.Inf(-1)
		for j := range s {
			for x, kx := range key(j, kc, k) {
				s[j] += float64(qh[x]) * float64(kx)
			}
			s[j] /= math.Sqrt(float64(c.d))
			m = math.Max(m, s[j])
		}
		sum, o := 0.0, make([]float64, c.d)
		for j := range s {
			e := math.Exp(s[j] - m)
			sum += e
			for x, vx := range key(j, vc, v) {
				o[x] += e * float64(vx)
			}
		}
		for x := range o {
			e := math.Abs(float64(got[tok*width+h*c.d+x]) - o[x]/sum)
			if !(e <= hopperF16Tol) {
				if bad < 8 {
					t.Errorf("%v: token %d (row %d, new token %d), head %d, dim %d: %g, want %g",
						c, tok, r, i, h, x, got[tok*width+h*c.d+x], o[x]/sum)
				}
				bad++
			}
			worst = math.Max(worst, e)
		}
	}
	t.Logf("%v: %d sampled (token, head) pairs, largest difference %.3g, %d beyond %g", c, len(toks), worst, bad, hopperF16Tol)
}

// TestHopperKernelTest runs the shared kernel test's attn_prefill cases with
// flash_hopper as attn_prefill's kernel for its head dims (64 and 128; the
// others run flash_prefill), long cases included, with the instances New
// picks for this device (TestHopperTiny runs every instance).
func TestHopperKernelTest(t *testing.T) {
	dev, o := openHopper(t)
	t.Logf("instances: %v", o.hopper.configs)
	saved := prefillHopper
	defer func() { prefillHopper = saved }()
	prefillHopper = true
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpAttnPrefill)
}

// hopperChoice is the tuning choice of attn_prefill or mla_prefill that
// runs its Hopper kernel (hopper) or the tiling t.
func hopperChoice(hopper bool, t flashConfig) string {
	if hopper {
		return hopperVariant
	}
	return t.String()
}
