package fused

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestHopperInstances checks, without a GPU, that every instance the Go
// side asks for is instantiated in hopper.cu and fits an H100/H200 block.
func TestHopperInstances(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range hopperConfigs {
		if !strings.Contains(hopperSrc, fmt.Sprintf("FLASH_HOPPER(%d, %d)", c.D, c.Stages)) {
			t.Errorf("%s: no FLASH_HOPPER(%d, %d) in hopper.cu", c.kernel(), c.D, c.Stages)
		}
		if c.shared() > h200.SharedPerBlock {
			t.Errorf("%s: %d bytes of shared memory, an sm_90a block gets %d", c.kernel(), c.shared(), h200.SharedPerBlock)
		}
	}
	for _, d := range hopperHeadDims {
		v, ok := hopperVariantOf(d, h200)
		if !ok || !v.Valid() || !strings.Contains(v.Params, "stages=") {
			t.Errorf("D=%d on sm_90a: %+v", d, v)
		}
	}
}

// openHopper opens GPU 0 and builds the fused set on it, or skips where
// flash_hopper cannot exist (no GPU, not a 9.0 device, NVRTC too old).
func openHopper(t *testing.T) (*cuda.Device, *ops) {
	t.Helper()
	return openHopperSet(t, "flash_hopper", func(o *ops) error { return o.hopper.err })
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
	set, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	o := set.(*ops)
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
	src := cudaset.Source(m)
	log, img, err := dev.CompileLog("fused_"+m.File, src, "--ptxas-options=-v")
	t.Logf("NVRTC %d.%d, %v, --ptxas-options=-v; log:\n%s", p.NVRTCVersion/1000, p.NVRTCVersion%1000/10, dev.CompileOptions(), log)
	if err != nil {
		log2, _, err2 := dev.CompileLog("fused_"+m.File, src)
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
}

func (c hopperCase) String() string {
	return fmt.Sprintf("new=%v,past=%v,H=%d,KV=%d,D=%d,max=%d,causal=%v", c.lens, c.past, c.heads, c.kv, c.d, c.maxSeq, c.causal)
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
	upload := func(vals []float32, shape ...int) *kernels.Tensor {
		tt := dev.Alloc(kernels.BF16, shape...)
		b := make([]byte, 4*len(vals))
		for i, f := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
		}
		if err := dev.Upload(tt, b, kernels.F32); err != nil {
			t.Fatal(err)
		}
		return tt
	}
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
	p.out = dev.Alloc(kernels.BF16, p.tokens, c.heads*c.d)
	ints := func(v []int) *kernels.Tensor {
		tt := dev.Alloc(kernels.I32, len(v))
		w := make([]int32, len(v))
		for i, x := range v {
			w[i] = int32(x)
		}
		if err := dev.WriteI32(tt, w); err != nil {
			t.Fatal(err)
		}
		return tt
	}
	p.batch = &kernels.Batch{Rows: p.rows, Tokens: p.tokens, Start: start, Past: c.past, MaxSeq: c.maxSeq,
		StartDev: ints(start), PastDev: ints(c.past)}
	return p
}

// run is AttentionPrefill of the problem with flash_hopper (hopper) or
// flash_prefill's default tiling; it returns the output.
func (p *hopperProblem) run(t *testing.T, dev *cuda.Device, o *ops, hopper bool) []float32 {
	t.Helper()
	key := fmt.Sprintf("D=%d", p.c.d)
	o.hopperOn[key] = hopper
	dev.MemsetD8(dev.Ptr(p.out), 0xff, p.out.Numel()*2) // NaN: a row the kernel does not write shows
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

// compareHopper holds got (flash_hopper) against want (flash_prefill) and,
// on a mismatch, says where: the first mismatches with their token, row,
// head and dim, and the mismatch counts by the kernel's own coordinates
// (warpgroup, warp, row of 16, 8-column chunk), so that a wrong fragment
// or descriptor layout shows as a pattern.
func compareHopper(t *testing.T, p *hopperProblem, got, want []float32) {
	t.Helper()
	compareRows(t, p.c.String(), p.batch, p.c.heads, p.c.d, got, want)
}

// compareRows is compareHopper's check of got against want, outputs bf16
// [tokens, heads·d] of batch (as f32), described by desc.
func compareRows(t *testing.T, desc string, batch *kernels.Batch, heads, d int, got, want []float32) {
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
			if !isNaN && e <= hopperTol {
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
				first = append(first, fmt.Sprintf("token %d (row %d, new token %d, position %d), head %d, dim %d: wgmma %g, mma.sync %g",
					tok, b, i, batch.Past[b]+i, h, dim, g, w))
			}
		}
	}
	t.Logf("%s: largest difference within tolerance %.3g", desc, maxErr)
	if bad > 0 {
		t.Errorf("%s: %d of %d elements differ by more than %g (%d NaN or Inf)\n  %s\n  by warpgroup %v\n  by warp of the warpgroup %v\n  by row of 16 %v\n  by 8-dim chunk %v\n  by block of %d queries %v",
			desc, bad, len(got), hopperTol, nan, strings.Join(first, "\n  "), byWG, byWarp, byRow16, byChunk, hopperRows, byTile)
	}
}

// TestHopperTiny runs flash_hopper on small problems against flash_prefill
// on the same device and inputs, each instance in turn: the first check to
// read when the kernel is wrong.
func TestHopperTiny(t *testing.T) {
	dev, o := openHopper(t)
	cases := []hopperCase{
		{lens: []int{64}, past: []int{0}, heads: 1, kv: 1, d: 128, maxSeq: 64, causal: false},  // one block, one tile, no tail
		{lens: []int{128}, past: []int{0}, heads: 1, kv: 1, d: 128, maxSeq: 128, causal: true}, // the diagonal
		{lens: []int{300}, past: []int{0}, heads: 2, kv: 1, d: 128, maxSeq: 320, causal: true},
		{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 4, kv: 2, d: 128, maxSeq: 400, causal: true},
		{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 4, kv: 2, d: 128, maxSeq: 400, causal: false},
		{lens: []int{129, 70}, past: []int{0, 77}, heads: 4, kv: 4, d: 64, maxSeq: 300, causal: true},
		{lens: []int{129, 70}, past: []int{0, 77}, heads: 4, kv: 4, d: 64, maxSeq: 300, causal: false},
	}
	for _, inst := range hopperConfigs {
		t.Run(inst.kernel(), func(t *testing.T) {
			saved := o.hopper.configs[inst.D]
			o.hopper.configs[inst.D] = inst
			defer func() { o.hopper.configs[inst.D] = saved }()
			if err := o.Func(inst.kernel()).SetMaxDynamicShared(inst.shared()); err != nil {
				t.Skipf("%s does not fit here: %v", inst.kernel(), err)
			}
			for i, c := range cases {
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
		flops := 0.0
		for b, n := range c.lens {
			keys := float64(c.past[b]) * float64(n)
			if c.causal {
				keys += float64(n) * float64(n+1) / 2
			} else {
				keys += float64(n) * float64(n)
			}
			flops += 4 * keys * float64(c.heads*c.d)
		}
		for _, hopper := range []bool{false, true} {
			o.hopperOn[fmt.Sprintf("D=%d", c.d)] = hopper
			ms := msPerCall(t, dev, func() { o.AttentionPrefill(p.args()) })
			name := prefillConfig.String()
			if hopper {
				name = hopperVariant + " " + o.hopper.configs[c.d].kernel()
			}
			t.Logf("%v %s: %.3f ms, %.0f TFLOP/s (kv_append included)", c, name, ms, flops/ms/1e9)
		}
		if err := o.hopperWaits(); err != nil {
			t.Fatal(err)
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

// TestHopperKernelTest runs the shared kernel test with flash_hopper as
// attn_prefill's kernel for its head dims (64 and 128; the others run
// flash_prefill), long cases included, with the instances New picks for
// this device (TestHopperTiny runs every instance).
func TestHopperKernelTest(t *testing.T) {
	dev, o := openHopper(t)
	t.Logf("instances: %v", o.hopper.configs)
	saved := prefillHopper
	defer func() { prefillHopper = saved }()
	prefillHopper = true
	kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances())
}
