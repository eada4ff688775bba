package fused

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestMLAHopperInstances checks, without a GPU, that every mla_hopper
// instance the Go side asks for fits an H100/H200 block (TestInstancesHeader
// checks that mla_hopper.cu instantiates them), that the variant is offered
// on sm_90a only, and that choosing it follows what the device has.
func TestMLAHopperInstances(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range mlaHopperConfigs {
		if c.shared() > h200.SharedPerBlock {
			t.Errorf("%s: %d bytes of shared memory, an sm_90a block gets %d", c.kernel(), c.shared(), h200.SharedPerBlock)
		}
	}
	lite := mlaHeads{128, 64, 128}
	if v, ok := mlaHopperVariantOf(lite, h200); !ok || !v.Valid() || !strings.Contains(v.Params, "key_tile=128 stages=2") {
		t.Errorf("V2-Lite's heads on sm_90a: %+v", v)
	}
	small := h200
	small.SharedPerBlock = 180 << 10
	if v, _ := mlaHopperVariantOf(lite, small); !v.Valid() || !strings.Contains(v.Params, "key_tile=64 stages=3") {
		t.Errorf("V2-Lite's heads with 180 KiB a block: %+v, want the 3-stage instance", v)
	}
	if v, ok := mlaHopperVariantOf(mlaHeads{32, 16, 32}, h200); !ok || v.Valid() {
		t.Errorf("heads (32, 16, 32) on sm_90a: %+v, want refused", v)
	}
	if _, ok := mlaHopperVariantOf(lite, kernels.Targets["sm_80"]); ok {
		t.Errorf("mla_hopper offered on sm_80")
	}

	o := &ops{}
	key := "Dn=128,Dr=64,Dv=128"
	o.mlaHopper = &mlaHopperKit{err: fmt.Errorf("no Hopper here")}
	if err := o.UseVariant(kernels.OpMLAPrefill, key, mlaHopperVariant); err == nil || !strings.Contains(err.Error(), "no Hopper here") {
		t.Errorf("UseVariant wgmma without mla_hopper: %v, want its error", err)
	}
	o.mlaHopper = &mlaHopperKit{configs: map[mlaHeads]mlaHopperConfig{lite: mlaHopperConfigs[0]}}
	untuned := mlaPrefillConfig.String()
	if mlaPrefillHopper {
		untuned = mlaHopperVariant
	}
	if v := o.VariantFor(kernels.OpMLAPrefill, key); v != untuned {
		t.Errorf("untuned, mla_prefill runs %q, want %q", v, untuned)
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, key, mlaHopperVariant); err != nil || o.VariantFor(kernels.OpMLAPrefill, key) != mlaHopperVariant {
		t.Errorf("UseVariant wgmma: %v, now %q", err, o.VariantFor(kernels.OpMLAPrefill, key))
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, key, "w4_m1"); err != nil || o.VariantFor(kernels.OpMLAPrefill, key) != "w4_m1" {
		t.Errorf("UseVariant w4_m1 after wgmma: %v, now %q", err, o.VariantFor(kernels.OpMLAPrefill, key))
	}
	if err := o.UseVariant(kernels.OpMLAPrefill, "Dn=32,Dr=16,Dv=32", mlaHopperVariant); err == nil {
		t.Errorf("UseVariant wgmma accepted for head dims mla_hopper has no instance of")
	}
}

// openMLAHopper opens GPU 0 and builds the fused set on it, or skips where
// mla_hopper cannot exist (no GPU, not a 9.0 device, NVRTC too old).
func openMLAHopper(t *testing.T) (*cuda.Device, *ops) {
	t.Helper()
	return openHopperSet(t, "mla_hopper", func(o *ops) error { return o.mlaHopper.err })
}

// TestMLAHopperCompiles is TestHopperCompiles for mla_hopper.cu; with
// FUSELM_MLA_HOPPER_CUBIN=path it writes the cubin there.
func TestMLAHopperCompiles(t *testing.T) {
	hopperCompileReport(t, mlaHopperModule(), "FUSELM_MLA_HOPPER_CUBIN", false)
	_, o := openMLAHopper(t)
	for _, c := range mlaHopperConfigs {
		a, err := o.Func(c.kernel()).Attrs()
		t.Logf("%s: %+v, dynamic shared %d, err %v", c.kernel(), a, c.shared(), err)
	}
	t.Logf("instances run: %v", o.mlaHopper.configs)
}

// mlaHopperCase is an MLA prefill problem for the device-only comparisons,
// at DeepSeek-V2's head dims (nope 128, rope 64, v 128, rank 512).
type mlaHopperCase struct {
	lens, past []int
	heads      int
	maxSeq     int
}

func (c mlaHopperCase) String() string {
	return fmt.Sprintf("new=%v,past=%v,H=%d,max=%d", c.lens, c.past, c.heads, c.maxSeq)
}

// mlaHopperDims are the head dims of the device-only cases.
var mlaHopperDims = struct{ nope, rope, v, rank int }{128, 64, 128, 512}

// mlaHopperProblem is an mlaHopperCase's operands on the device: q, the new
// latents, kv_b_proj, a latent cache whose positions past each row's end
// hold NaN, and the batch. Each run appends the new latents again (the
// same values to the same positions).
type mlaHopperProblem struct {
	c                     mlaHopperCase
	q, kv, wkvb, cache, o *kernels.Tensor
	batch                 *kernels.Batch
}

func newMLAHopperProblem(t *testing.T, dev *cuda.Device, c mlaHopperCase, seed int64) *mlaHopperProblem {
	t.Helper()
	d := mlaHopperDims
	rng := rand.New(rand.NewSource(seed))
	p := &mlaHopperProblem{c: c}
	rows := len(c.lens)
	start := make([]int, rows+1)
	for b, n := range c.lens {
		start[b+1] = start[b] + n
	}
	tokens := start[rows]
	upload := func(vals []float32, shape ...int) *kernels.Tensor {
		return tensorOn(t, dev, kernels.BF16, vals, shape...)
	}
	normal := func(n int, sd float64) []float32 { return gaussians(rng, n, sd) }
	width := d.rank + d.rope
	p.q = upload(normal(tokens*c.heads*(d.nope+d.rope), 1), tokens, c.heads*(d.nope+d.rope))
	p.kv = upload(normal(tokens*width, 1), tokens, width)
	p.wkvb = upload(normal(c.heads*(d.nope+d.v)*d.rank, 1/math.Sqrt(float64(d.rank))), c.heads*(d.nope+d.v), d.rank)
	cache := normal(rows*c.maxSeq*width, 1)
	for b := range rows {
		for i := c.past[b] * width; i < c.maxSeq*width; i++ {
			cache[b*c.maxSeq*width+i] = float32(math.NaN())
		}
	}
	p.cache = upload(cache, rows, c.maxSeq, width)
	p.o = dev.Alloc(kernels.BF16, tokens, c.heads*d.v)
	p.batch = &kernels.Batch{Rows: rows, Tokens: tokens, Start: start, Past: c.past, MaxSeq: c.maxSeq,
		StartDev: intsOn(t, dev, start), PastDev: intsOn(t, dev, c.past)}
	return p
}

func (p *mlaHopperProblem) args() *kernels.MLAArgs {
	d := mlaHopperDims
	return &kernels.MLAArgs{Out: p.o, Q: p.q, KV: p.kv, Cache: p.cache, WKVB: p.wkvb, Batch: p.batch,
		Heads: p.c.heads, NopeDim: d.nope, RopeDim: d.rope, VDim: d.v, Rank: d.rank,
		Scale: float32(1 / math.Sqrt(float64(d.nope+d.rope)))}
}

// mlaHopperKey is the tuning key of the problems' head dims.
const mlaHopperKey = "Dn=128,Dr=64,Dv=128"

// run is MLAPrefill of the problem with mla_hopper (hopper) or mla_prefill's
// default tiling; it returns the output.
func (p *mlaHopperProblem) run(t *testing.T, dev *cuda.Device, o *ops, hopper bool) []float32 {
	t.Helper()
	o.choice[choiceKey{kernels.OpMLAPrefill, mlaHopperKey}] = hopperChoice(hopper, mlaPrefillConfig)
	dev.MemsetD8(dev.Ptr(p.o), 0xff, p.o.Numel()*2) // NaN: a row the kernel does not write shows
	o.MLAPrefill(p.args())
	out, err := dev.ReadF32(p.o)
	if err != nil {
		t.Fatalf("hopper=%v: %v", hopper, err)
	}
	if err := o.mlaHopperWaits(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMLAHopperTiny runs mla_hopper on small problems against mla_prefill
// (mma.sync, its default tiling) on the same device and inputs, each
// instance in turn, and says where they differ (compareRows): the first
// check to read when the kernel is wrong.
func TestMLAHopperTiny(t *testing.T) {
	dev, o := openMLAHopper(t)
	cases := []mlaHopperCase{
		{lens: []int{64}, past: []int{0}, heads: 1, maxSeq: 64},                            // one block, one tile
		{lens: []int{128}, past: []int{0}, heads: 1, maxSeq: 128},                          // the diagonal of both warpgroups
		{lens: []int{300}, past: []int{0}, heads: 2, maxSeq: 320},                          // a tail block, the cache's end inside a tile
		{lens: []int{200, 37, 1}, past: []int{37, 300, 5}, heads: 16, maxSeq: 400},         // ragged, past > 0, V2-Lite's heads
		{lens: []int{70, 0, 129}, past: []int{200, 9, 33}, heads: 3, maxSeq: 300},          // a row with no new tokens between two
		{lens: []int{121, 136, 128, 130}, past: []int{0, 0, 0, 0}, heads: 16, maxSeq: 190}, // W5's: padded to the longest (mlaPadded), NaN past each row's end
		{lens: []int{40, 45, 38}, past: []int{5, 0, 9}, heads: 2, maxSeq: 60},              // padded, past > 0
	}
	for _, inst := range mlaHopperConfigs {
		t.Run(inst.kernel(), func(t *testing.T) {
			saved := o.mlaHopper.configs[inst.Heads]
			o.mlaHopper.configs[inst.Heads] = inst
			defer func() { o.mlaHopper.configs[inst.Heads] = saved }()
			if err := o.Func(inst.kernel()).SetMaxDynamicShared(inst.shared()); err != nil {
				t.Skipf("%s does not fit here: %v", inst.kernel(), err)
			}
			for i, c := range cases {
				p := newMLAHopperProblem(t, dev, c, int64(i))
				want := p.run(t, dev, o, false)
				got := p.run(t, dev, o, true)
				compareRows(t, c.String(), p.batch, c.heads, mlaHopperDims.v, got, want, hopperTol)
			}
		})
	}
}

// TestMLAHopperLong runs mla_hopper over 16K keys and more (sizes that are
// multiples of no tile, past > 0, several rows in one launch and, with a
// small budget, one launch per row) against mla_prefill on the device, and
// logs the time of each whole op (kv_append and the decompression GEMM
// included) and of the attention FLOPs: a first reading before kbench's.
func TestMLAHopperLong(t *testing.T) {
	dev, o := openMLAHopper(t)
	d := mlaHopperDims
	for i, c := range []mlaHopperCase{
		{lens: []int{16411}, past: []int{0}, heads: 16, maxSeq: 16411},
		{lens: []int{5000, 300}, past: []int{11500, 16000}, heads: 16, maxSeq: 16500},
		{lens: []int{4096, 4096, 4096, 4096}, past: []int{0, 0, 0, 0}, heads: 16, maxSeq: 4096}, // kbench's B=4 N=4K
	} {
		p := newMLAHopperProblem(t, dev, c, int64(100+i))
		want := p.run(t, dev, o, false)
		got := p.run(t, dev, o, true)
		compareRows(t, c.String(), p.batch, c.heads, d.v, got, want, hopperTol)
		flops := 0.0 // attention's: q·k over nope+rope, p·v over v
		for b, n := range c.lens {
			keys := float64(c.past[b])*float64(n) + float64(n)*float64(n+1)/2
			flops += 2 * keys * float64(c.heads*(d.nope+d.rope+d.v))
		}
		for _, hopper := range []bool{false, true} {
			o.choice[choiceKey{kernels.OpMLAPrefill, mlaHopperKey}] = hopperChoice(hopper, mlaPrefillConfig)
			ms := msPerCall(t, dev, func() { o.MLAPrefill(p.args()) })
			name := mlaPrefillConfig.String()
			if hopper {
				name = mlaHopperVariant + " " + o.mlaHopper.configs[mlaHeads{d.nope, d.rope, d.v}].kernel()
			}
			t.Logf("%v %s: %.3f ms, %.0f TFLOP/s of attention (kv_append and kv_b_proj included in the time)", c, name, ms, flops/ms/1e9)
		}
		if err := o.mlaHopperWaits(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMLAHopperKernelTest runs the shared kernel test's mla_prefill cases
// with mla_hopper as mla_prefill's kernel for DeepSeek-V2's head dims (the
// kernel tests' small dims run mla_prefill), long cases included, with the
// instance New picks for this device (TestMLAHopperTiny runs every instance).
func TestMLAHopperKernelTest(t *testing.T) {
	dev, o := openMLAHopper(t)
	t.Logf("instances: %v", o.mlaHopper.configs)
	saved := mlaPrefillHopper
	defer func() { mlaPrefillHopper = saved }()
	mlaPrefillHopper = true
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpMLAPrefill)
}
