package kbench

import (
	"bytes"
	"encoding/json"
	"image/color"
	"image/png"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	_ "github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/kerneltest"
	_ "github.com/fuselm/fuselm/kernels/naive"
	"github.com/fuselm/fuselm/spread"
)

// TestCounts holds the FLOP and byte counts against values worked out by
// hand from TileGym's formulas and the operands each op reads and writes.
func TestCounts(t *testing.T) {
	for _, c := range []struct {
		op           kernels.Op
		shape        string
		flops, bytes float64
	}{
		{kernels.OpLinear, "M=2,N=3,K=4", 48, 2 * (8 + 12 + 6)},
		{kernels.OpAttnPrefill, "B=4,H=32,KVH=32,D=128,N=1024,causal=1", 34359738368, 2 * 4 * 1024 * 128 * (64 + 64)},
		{kernels.OpAttnPrefill, "B=4,H=32,KVH=32,D=128,N=1024,causal=0", 68719476736, 2 * 4 * 1024 * 128 * (64 + 64)},
		{kernels.OpAttnPrefill, "B=4,H=32,KVH=32,D=128,N=1024,causal=1,dt=f16", 34359738368, 2 * 4 * 1024 * 128 * (64 + 64)},
		{kernels.OpAttnDecode, "B=16,H=28,KVH=4,D=128,ctx=32768", 4 * 16 * 28 * 32768 * 128, 1073971200},
		{kernels.OpRMSNorm, "M=4096,N=1024", 4 * 4096 * 1024, 2 * (2*4096*1024 + 1024)},
		{kernels.OpAddRMSNorm, "M=4096,N=1024", 5 * 4096 * 1024, 33556480},
		// x, y and the residual read, the residual and out written, w read.
		{kernels.OpAddAddRMSNorm, "M=16,N=2048", 6 * 16 * 2048, 2 * (5*16*2048 + 2048)},
		{kernels.OpRoPE, "T=16384,H=32,D=128,R=128,interleaved=0", 3 * 16384 * 32 * 128, 268435456},
		{kernels.OpSwiGLU, "N=16384,I=18944", 6 * 16384 * 18944, 1862270976},
		// A first projection into mid [2,4], added into the residual and
		// normalised, then the second: qkv's (with bias), or gate/up's
		// with SwiGLU (N/2 outputs).
		{kernels.OpLinearNormLinear, "M=2,N=3,K=4,K0=5", 2*2*4*5 + 5*2*4 + 2*2*3*4, 2 * (2*5 + 4*5 + 3*2*4 + 4 + 3*4 + 3 + 2*3)},
		{kernels.OpLinearNormSwiGLU, "M=2,N=6,K=4,K0=5", 2*2*4*5 + 5*2*4 + 2*2*6*4 + 6*2*3, 2 * (2*5 + 4*5 + 3*2*4 + 4 + 6*4 + 2*3)},
		{kernels.OpMoEExperts, "N=1,H=2048,I=1408,E=64,topk=6", 6 * 6 * 2048 * 1408, 103817216},
		// 16 tokens routed alike (W4's rows): the six experts once.
		{kernels.OpMoEExperts, "N=16,H=2048,I=1408,E=64,topk=6,same=1", 6 * 16 * 6 * 2048 * 1408, 2 * (6*3*2048*1408 + 2*16*2048)},
		{kernels.OpMoEExperts, "N=16,H=2048,I=1408,E=64,topk=6,same=0", 6 * 16 * 6 * 2048 * 1408, 2 * (64*(1-math.Pow(1-6.0/64, 16))*3*2048*1408 + 2*16*2048)},
		// One token's 6 rows touch 6 of the 64 groups.
		{kernels.OpGroupGemm, "M=6,N=2048,K=1408,E=64", 2 * 6 * 2048 * 1408, 2 * (6*2048*1408 + 6*1408 + 6*2048)},
		// MLA: the attention as bench_mla counts it, plus kv_b_proj's product
		// (prefill: every latent decompressed; decode: q absorbed, o_lat
		// expanded).
		{kernels.OpMLAPrefill, "B=4,H=16,N=1024,Dn=128,Dr=64,Dv=128,R=512", 21474836480 + 2*4*1024*512*16*256, 2 * 4 * 1024 * (16*320 + 576)},
		{kernels.OpMLADecode, "B=1,H=16,ctx=4096,Dn=128,Dr=64,Dv=128,R=512", 2*16*4096*1088 + 2*16*512*256, 2 * (4096*576 + 16*256*512)},
	} {
		s, err := kernels.ParseShape(c.shape)
		if err != nil {
			t.Fatal(err)
		}
		k := CaseFor(c.op)
		if err := k.Check(s); err != nil {
			t.Fatal(err)
		}
		if got := k.FLOPs(s); !close(got, c.flops) {
			t.Errorf("%s %s: %g FLOPs, want %g", c.op, c.shape, got, c.flops)
		}
		if got := k.Bytes(s); !close(got, c.bytes) {
			t.Errorf("%s %s: %g bytes, want %g", c.op, c.shape, got, c.bytes)
		}
	}
}

func close(a, b float64) bool { return a == b || (a-b)/b < 1e-9 && (b-a)/b < 1e-9 }

// Every default shape fits its case, and every case's shape check refuses
// a missing or a foreign dimension.
func TestShapes(t *testing.T) {
	for _, c := range Cases() {
		for _, s := range c.Shapes {
			if err := c.Check(s); err != nil {
				t.Errorf("default shape: %v", err)
			}
		}
		short := kernels.Shape{}
		for _, d := range c.Dims[1:] {
			short[d] = 1
		}
		if err := c.Check(short); err == nil || !strings.Contains(err.Error(), "lacks "+c.Dims[0]) {
			t.Errorf("%s without %s: %v", c.Op, c.Dims[0], err)
		}
		short[c.Dims[0]], short["warp"] = 1, 2
		if err := c.Check(short); err == nil || !strings.Contains(err.Error(), "has warp") {
			t.Errorf("%s with warp: %v", c.Op, err)
		}
	}
	if _, err := selectCases([]kernels.Op{"flash"}, nil); err == nil || !strings.Contains(err.Error(), "no benchmark") {
		t.Errorf("an unknown op: %v", err)
	}
	// An element type: attn_prefill takes f16, not the activations' own
	// spelled out, and no other case takes one.
	for shape, want := range map[string]string{
		"B=4,H=32,KVH=32,D=128,N=4096,causal=1,dt=f16":  "",
		"B=4,H=32,KVH=32,D=128,N=4096,causal=1,dt=bf16": "dt=bf16: it runs in the device's activation type (no dt) or in [f16]",
		"B=4,H=32,KVH=32,D=128,N=4096,causal=1,dt=f32":  "dt=f32",
	} {
		s, _ := kernels.ParseShape(shape)
		if err := CaseFor(kernels.OpAttnPrefill).Check(s); want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("attn_prefill %s: %v, want %q", shape, err, want)
		}
	}
	// moe_experts' switch same may be left out (0), and is 0 or 1.
	moe := CaseFor(kernels.OpMoEExperts)
	for shape, want := range map[string]string{
		"N=16,H=2048,I=1408,E=64,topk=6":        "",
		"N=16,H=2048,I=1408,E=64,topk=6,same=1": "",
		"N=16,H=2048,I=1408,E=64,topk=6,same=2": "same is 0 or 1",
		"N=16,H=2048,I=1408,E=64,same=1":        "lacks topk",
	} {
		s, _ := kernels.ParseShape(shape)
		if err := moe.Check(s); want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("moe_experts %s: %v, want %q", shape, err, want)
		}
	}
	s, _ := kernels.ParseShape("B=16,H=28,KVH=4,D=128,ctx=4096,dt=f16")
	if err := CaseFor(kernels.OpAttnDecode).Check(s); err == nil || !strings.Contains(err.Error(), "has dt") {
		t.Errorf("attn_decode with dt=f16: %v", err)
	}
	f16 := 0
	for _, s := range CaseFor(kernels.OpAttnPrefill).Shapes {
		if s.DType(kernels.BF16) == kernels.F16 {
			f16++
		}
	}
	if f16 != 10 {
		t.Errorf("attn_prefill's defaults have %d fp16 shapes, want TileGym's table of 10 (1K to 16K, causal and not)", f16)
	}
}

// Shape labels of a plot name what differs, the element type included
// where only some shapes name one.
func TestShortLabels(t *testing.T) {
	got := shortLabels([]string{"B=4,N=1024,causal=1", "B=4,N=2048,causal=1", "B=4,N=1024,causal=1,dt=f16"})
	if want := []string{"N=1024", "N=2048", "N=1024 dt=f16"}; !slices.Equal(got, want) {
		t.Errorf("labels %q, want %q", got, want)
	}
}

// TestRunOnCPU runs small shapes of every case on the cpu device: every row
// measured, checked (the cpu set is its own reference) and counted.
func TestRunOnCPU(t *testing.T) {
	small := map[kernels.Op]string{
		kernels.OpLinear:           "M=5,N=24,K=40",
		kernels.OpRMSNorm:          "M=7,N=64",
		kernels.OpAddRMSNorm:       "M=7,N=64",
		kernels.OpAddAddRMSNorm:    "M=7,N=64",
		kernels.OpRoPE:             "T=5,H=3,D=32,R=16,interleaved=1",
		kernels.OpSwiGLU:           "N=3,I=40",
		kernels.OpLinearNormLinear: "M=3,N=24,K=40,K0=56",
		kernels.OpLinearNormSwiGLU: "M=3,N=48,K=40,K0=56",
		kernels.OpAttnPrefill:      "B=2,H=4,KVH=2,D=16,N=9,causal=1",
		kernels.OpAttnDecode:       "B=2,H=4,KVH=2,D=16,ctx=20",
		kernels.OpMLAPrefill:       "B=1,H=2,N=6,Dn=16,Dr=8,Dv=16,R=32",
		kernels.OpMLADecode:        "B=2,H=2,ctx=9,Dn=16,Dr=8,Dv=16,R=32",
		kernels.OpMoEExperts:       "N=3,H=32,I=24,E=8,topk=2",
		kernels.OpGroupGemm:        "M=37,N=24,K=40,E=4",
	}
	dev, err := cpu.NewDeviceAct(kernels.BF16)
	if err != nil {
		t.Fatal(err)
	}
	for op, shape := range small {
		s, _ := kernels.ParseShape(shape)
		rep, err := Run(dev, kernels.Target{}, Options{Ops: []kernels.Op{op}, Shapes: []kernels.Shape{s}, Sets: []string{"cpu"}})
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if len(rep.Rows) != 1 {
			t.Fatalf("%s: %d rows", op, len(rep.Rows))
		}
		r := rep.Rows[0]
		if r.Err != "" || !(r.Ms > 0) || r.Checked != "is the reference" || r.Variant != "default" || !(r.GBs > 0 && r.TFLOPS > 0) {
			t.Errorf("%s: %+v", op, r)
		}
		if r.FloorMs != 0 {
			t.Errorf("%s: a floor without measured rates: %+v", op, r)
		}
	}
}

// An fp16 attn_prefill shape is built in f16 on the set and on the cpu
// reference alike (f16 operands, f32 arithmetic) and held to the f16
// tolerance.
func TestPrefillF16OnCPU(t *testing.T) {
	r, dev, ops := cpuRunner()
	c := CaseFor(kernels.OpAttnPrefill)
	s, _ := kernels.ParseShape("B=2,H=4,KVH=2,D=16,N=9,causal=1,dt=f16")
	p, err := build(kerneltest.NewBuilder(dev, 0, 0), c, s)
	if err != nil {
		t.Fatal(err)
	}
	if dt := p.Outs[0].DType; dt != kernels.F16 {
		t.Fatalf("out is %v, want f16", dt)
	}
	row := Row{}
	r.measure(&row, c, s, p, ops, "other", &reference{})
	if row.Err != "" || row.Checked != "cpu 0.0e+00" || !(row.Ms > 0) {
		t.Errorf("f16 prefill against the cpu reference: %+v", row)
	}
	row = Row{}
	r.measure(&row, c, s, p, scaled{ops}, "scaled", &reference{})
	if !strings.Contains(row.Err, "tolerance 0.005") {
		t.Errorf("f16 prefill 3%% off: %+v, want it refused at f16's tolerance", row)
	}
}

// scaled is the cpu set with attention's scale 3% off: within bf16's
// tolerance, beyond f16's.
type scaled struct{ kernels.Ops }

func (s scaled) AttentionPrefill(a *kernels.AttnArgs) {
	c := *a
	c.Scale *= 1.03
	s.Ops.AttentionPrefill(&c)
}

// broken is the cpu set with RMSNorm off by 10%.
type broken struct{ kernels.Ops }

func (b broken) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	b.Ops.RMSNorm(out, x, w, eps*1e6)
}

// A result away from the reference is reported and not timed.
func TestCheckCatchesAWrongResult(t *testing.T) {
	r, dev, ops := cpuRunner()
	c := CaseFor(kernels.OpRMSNorm)
	s, _ := kernels.ParseShape("M=4,N=32")
	b := kerneltest.NewBuilder(dev, 0, 0)
	p, err := build(b, c, s)
	if err != nil {
		t.Fatal(err)
	}
	row := Row{}
	r.measure(&row, c, s, p, broken{ops}, "broken", &reference{})
	if !strings.Contains(row.Err, "not timed") || row.Ms != 0 || !strings.HasPrefix(row.Checked, "cpu ") {
		t.Errorf("broken rms_norm: %+v", row)
	}
	row = Row{}
	r.measure(&row, c, s, p, ops, "other", &reference{})
	if row.Err != "" || !strings.HasPrefix(row.Checked, "cpu 0.0e+00") {
		t.Errorf("the cpu set under another name: %+v", row)
	}
}

// TestDryRun lists what naive and fused offer on sm_90a and sm_80, without
// a GPU.
func TestDryRun(t *testing.T) {
	prefill, _ := kernels.ParseShape("B=4,H=32,KVH=32,D=128,N=4096,causal=1")
	offers, err := DryRun(kernels.Targets["sm_90a"], []string{"naive", "fused"},
		Options{Ops: []kernels.Op{kernels.OpAttnPrefill, kernels.OpLinear}, Shapes: nil})
	if err != nil {
		t.Fatal(err)
	}
	var fusedPrefill, fusedLinear *Offer
	for i, o := range offers {
		if o.Set == "fused" && o.Op == kernels.OpAttnPrefill && o.Shape == prefill.String() {
			fusedPrefill = &offers[i]
		}
		if o.Set == "fused" && o.Op == kernels.OpLinear && fusedLinear == nil {
			fusedLinear = &offers[i]
		}
	}
	if fusedPrefill == nil || len(fusedPrefill.Variants) != 5 { // 4 flash_prefill tilings and flash_hopper
		t.Fatalf("fused attn_prefill offer: %+v", fusedPrefill)
	}
	for _, v := range fusedPrefill.Variants {
		if !v.Valid() || !strings.Contains(v.Params, "shared=") {
			t.Errorf("fused %s on sm_90a: %+v", v.Name, v)
		}
	}
	// The same shape in fp16: flash_hopper only; naive takes it too.
	f16 := maps.Clone(prefill)
	f16[kernels.ShapeDType] = int(kernels.F16)
	seen := 0
	for _, o := range offers {
		if o.Op != kernels.OpAttnPrefill || o.Shape != f16.String() {
			continue
		}
		seen++
		var valid []string
		for _, v := range o.Variants {
			if v.Valid() {
				valid = append(valid, v.Name)
			}
		}
		if want := map[string]string{"fused": "wgmma", "naive": "default"}[o.Set]; strings.Join(valid, ",") != want {
			t.Errorf("%s on %s: valid %v, want %s: %+v", o.Set, o.Shape, valid, want, o.Variants)
		}
	}
	if seen != 2 {
		t.Errorf("%d offers for %s among the defaults, want naive's and fused's", seen, f16)
	}
	// linear's first shape is 4096 rows: not skinny's, stream's nor swap's; cuBLAS
	// and linear_wgmma's six instances on sm_90a.
	if fusedLinear == nil || fusedLinear.Fallback != "" {
		t.Errorf("fused linear offer: %+v", fusedLinear)
	} else {
		var valid []string
		for _, v := range fusedLinear.Variants {
			if v.Valid() {
				valid = append(valid, v.Name)
			}
		}
		if want := "cublas,wgmma,wgmma_n128,wgmma_mc2,wgmma_n128_mc2,wgmma_hold,wgmma_hold_mc2"; len(fusedLinear.Variants) != 10 || strings.Join(valid, ",") != want {
			t.Errorf("fused linear offer at 4096 rows: valid %v of %+v, want %s of 10", valid, fusedLinear.Variants, want)
		}
	}
	a100 := kernels.Targets["sm_80"]
	a100.SharedPerBlock = 100 << 10
	offers, _ = DryRun(a100, []string{"fused"}, Options{Ops: []kernels.Op{kernels.OpAttnPrefill}, Shapes: []kernels.Shape{prefill}})
	invalid := 0
	for _, v := range offers[0].Variants {
		if !v.Valid() {
			invalid++
			if !strings.Contains(v.Why, "shared memory") {
				t.Errorf("%s refused for %q", v.Name, v.Why)
			}
		}
	}
	if invalid != 1 {
		t.Errorf("with 100 KiB a block, %d tilings refused, want 1 (w8_m2)", invalid)
	}
}

// TestVariants: Options.Variants narrows a set's choice of variants to the
// names given, leaves a set with one variant alone, and CheckVariants
// refuses a name no set offers among several.
func TestVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	prefill, _ := kernels.ParseShape("B=4,H=32,KVH=32,D=128,N=4096,causal=1")
	opt := Options{Ops: []kernels.Op{kernels.OpAttnPrefill}, Shapes: []kernels.Shape{prefill}, Variants: []string{"wgmma", "w4_m2"}}
	offers, err := DryRun(h200, []string{"naive", "fused"}, opt)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, o := range offers {
		for _, v := range o.Variants {
			got[o.Set] = append(got[o.Set], v.Name)
		}
	}
	if strings.Join(got["fused"], ",") != "w4_m2,wgmma" || strings.Join(got["naive"], ",") != "default" {
		t.Errorf("variants offered under %v: %v", opt.Variants, got)
	}
	if err := CheckVariants(h200, []string{"naive", "fused"}, opt); err != nil {
		t.Errorf("CheckVariants %v: %v", opt.Variants, err)
	}
	opt.Variants = []string{"wgmma", "w9_m9"}
	if err := CheckVariants(h200, []string{"naive", "fused"}, opt); err == nil || !strings.Contains(err.Error(), `"w9_m9"`) ||
		!strings.Contains(err.Error(), "offered: w4_m1, w4_m2, w8_m1, w8_m2, wgmma") {
		t.Errorf("CheckVariants %v: %v", opt.Variants, err)
	}
	opt.Variants = []string{"default"} // naive's only variant is no choice to make
	if err := CheckVariants(h200, []string{"naive"}, opt); err == nil {
		t.Errorf("CheckVariants %v on naive alone: no error", opt.Variants)
	}
}

// TestCache writes choices, reads them back for the same device and
// compiler, and refuses a file of another device, compiler or version.
func TestCache(t *testing.T) {
	dir := t.TempDir()
	path := CachePath(dir, "NVIDIA H200", "sm_90a", 13000)
	if path != filepath.Join(dir, "tuning", "NVIDIA-H200_sm_90a_nvrtc13000.json") {
		t.Errorf("path %s", path)
	}
	c, stale, err := ReadCache(path, "NVIDIA H200", "sm_90a", 13000)
	if err != nil || stale != "" || len(c.Entries) != 0 {
		t.Fatalf("no file: %+v, %q, %v", c, stale, err)
	}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	c.Put([]kernels.Tuned{{Set: "fused", Op: kernels.OpAttnPrefill, Key: "D=128", Variant: "w4_m2"}}, "N=1024..16384", now)
	c.Put([]kernels.Tuned{{Set: "fused", Op: kernels.OpAttnPrefill, Key: "D=128", Variant: "w8_m2"},
		{Set: "fused", Op: kernels.OpAttnPrefill, Key: "D=64", Variant: "w4_m1"}}, "N=16384", now)
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	back, stale, err := ReadCache(path, "NVIDIA H200", "sm_90a", 13000)
	if err != nil || stale != "" {
		t.Fatal(stale, err)
	}
	ch := back.Choices()
	if len(ch) != 2 || ch[0].Variant != "w8_m2" || ch[1].Key != "D=64" || back.Entries[0].Shapes != "N=16384" {
		t.Errorf("read back %+v", back)
	}
	for _, c := range []struct {
		device, arch string
		nvrtc        int
		want         string
	}{{"NVIDIA H100", "sm_90a", 13000, "measured on NVIDIA H200"}, {"NVIDIA H200", "sm_90a", 12080, "NVRTC 13000"}} {
		got, stale, _ := ReadCache(path, c.device, c.arch, c.nvrtc)
		if !strings.Contains(stale, c.want) || len(got.Entries) != 0 {
			t.Errorf("%s NVRTC %d: stale %q, entries %d", c.device, c.nvrtc, stale, len(got.Entries))
		}
	}
	os.WriteFile(path, []byte(`{"version": 0}`), 0o644)
	if _, stale, _ := ReadCache(path, "NVIDIA H200", "sm_90a", 13000); !strings.Contains(stale, "version 0") {
		t.Errorf("an old version: %q", stale)
	}
	os.WriteFile(path, []byte(`not json`), 0o644)
	if _, stale, _ := ReadCache(path, "NVIDIA H200", "sm_90a", 13000); !strings.Contains(stale, "not a tuning cache") {
		t.Errorf("garbage: %q", stale)
	}
}

// best picks, per key, the variant of least total time over the shapes all
// variants ran.
func TestBest(t *testing.T) {
	rows := []Row{
		{Set: "fused", Op: kernels.OpAttnPrefill, Variant: "a", Ms: 1},
		{Set: "fused", Op: kernels.OpAttnPrefill, Variant: "b", Ms: 2},
		{Set: "fused", Op: kernels.OpAttnPrefill, Variant: "a", Ms: 10},
		{Set: "fused", Op: kernels.OpAttnPrefill, Variant: "b", Ms: 5},
		{Set: "fused", Op: kernels.OpAttnPrefill, Variant: "c", Ms: 0.1}, // ran one shape only
	}
	keys := map[int]string{0: "D=128", 1: "D=128", 2: "D=128", 3: "D=128", 4: "D=128"}
	got := best(rows, keys)
	if len(got) != 1 || got[0].Variant != "b" || got[0].Key != "D=128" {
		t.Errorf("best = %+v, want b (7 ms over 2 shapes against a's 11)", got)
	}
}

// Copy 0 of a problem holds the same inputs however many copies the device
// makes: the cpu reference is built with none (found on the H200, where
// rotating copies put add_rms_norm's residual 45% from the reference).
func TestCopyZeroIndependentOfCopies(t *testing.T) {
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	for _, op := range []kernels.Op{kernels.OpAddRMSNorm, kernels.OpRoPE} {
		c := CaseFor(op)
		s := map[kernels.Op]string{kernels.OpAddRMSNorm: "M=8,N=64", kernels.OpRoPE: "T=4,H=2,D=32,R=32,interleaved=0"}[op]
		sh, _ := kernels.ParseShape(s)
		one, err := build(kerneltest.NewBuilder(dev, 7, 0), c, sh)
		if err != nil {
			t.Fatal(err)
		}
		many, err := build(kerneltest.NewBuilder(dev, 7, 1<<20), c, sh)
		if err != nil {
			t.Fatal(err)
		}
		if one.Copies != 1 || many.Copies < 2 {
			t.Fatalf("%s: %d and %d copies", op, one.Copies, many.Copies)
		}
		if e := kernels.RelErr(widened(many.built[0]), widened(one.built[0])); e != 0 {
			t.Errorf("%s: copy 0's state differs by %g with more copies", op, e)
		}
	}
}

// An op that changes its inputs in place (rope, add_rms_norm's residual) is
// checked on its inputs as built, also after another set was timed on them
// (found on the H200: naive's rope was held against a reference after
// fused's timing had rotated copy 0 many times).
func TestCheckAfterTiming(t *testing.T) {
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	ops, _ := kernels.Spec{Base: "cpu"}.Build(dev, nil)
	r := &runner{dev: dev, built: map[string]setOps{"cpu": ops}, rep: &Report{}, opt: Options{Seed: 3}}
	c := CaseFor(kernels.OpRoPE)
	s, _ := kernels.ParseShape("T=6,H=2,D=32,R=32,interleaved=0")
	p, err := build(kerneltest.NewBuilder(dev, 3, 1<<16), c, s)
	if err != nil {
		t.Fatal(err)
	}
	ref := &reference{}
	for _, set := range []string{"first", "second"} {
		row := Row{}
		r.measure(&row, c, s, p, ops, set, ref)
		if row.Err != "" || row.Ms <= 0 {
			t.Errorf("%s: %+v", set, row)
		}
	}
}

// A problem is bound by the larger of its floors.
func TestBound(t *testing.T) {
	if b, f := bound(2*1*4096*4096, 2*4096*4096, 800e12, 4e12); b != "memory" || !close(f, 2*4096*4096/4e12*1e3) {
		t.Errorf("a GEMV: %s, %g", b, f)
	}
	if b, f := bound(2*8192*8192*8192, 3*2*8192*8192, 800e12, 4e12); b != "compute" || !close(f, 2*8192*8192*8192/800e12*1e3) {
		t.Errorf("a large GEMM: %s, %g", b, f)
	}
	if b, f := bound(1e12, 1, 0, 0); b != "compute" || f != 0 {
		t.Errorf("no measured rates: %s, %g", b, f)
	}
}

// A row writes null for what was not measured, and reads back as it was.
func TestRowJSON(t *testing.T) {
	failed := Row{Op: kernels.OpRMSNorm, Shape: "M=4,N=8", Set: "fused", Variant: "default", Bound: "memory", Err: "not valid here"}
	b, err := json.Marshal(failed)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"ms", "ms_spread", "tflop_s", "gb_s", "floor_ms", "share_of_floor", "note", "kernels", "ms_without_kv_append"} {
		if v, ok := m[k]; !ok || v != nil {
			t.Errorf("%s: %v (present %v), want null", k, v, ok)
		}
	}
	if m["error"] != "not valid here" || m["op"] != "rms_norm" {
		t.Errorf("%s", b)
	}
	timed := Row{Op: kernels.OpRMSNorm, Shape: "M=4,N=8", Set: "cpu", Ms: 0.5, Spread: spread.Of([]float64{0.4, 0.5, 0.7}), GBs: 12, FloorMs: 0.1, OfFloor: 0.2}
	b, _ = json.Marshal(timed)
	var back Row
	if err := json.Unmarshal(b, &back); err != nil || back.Ms != 0.5 || back.Spread.N != 3 || back.Spread.Max != 0.7 || back.GBs != 12 || back.OfFloor != 0.2 {
		t.Errorf("round trip: %v, %+v from %s", err, back, b)
	}
}

// The plot keeps its legend off the data, under the shapes' labels, and
// its slanted labels inside the image; a shape a series did not run breaks
// its line.
func TestPlotLayout(t *testing.T) {
	rep := &Report{Device: "cuda:0 test", CopyRate: 4e12}
	shapes := []string{"M=4096,N=16384", "M=4096,N=1024", "M=16,N=3584", "M=43264,N=3584"}
	for i, s := range shapes {
		rep.Rows = append(rep.Rows, Row{Op: kernels.OpRMSNorm, Shape: s, Set: "fused", Variant: "default", Ms: 1, GBs: 3900})
		if i != 2 {
			rep.Rows = append(rep.Rows, Row{Op: kernels.OpRMSNorm, Shape: s, Set: "naive", Variant: "default", Ms: 1, GBs: 3000})
		}
	}
	b, err := Plot(rep)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	blue := palette[0].(color.RGBA) // fused: its line near the top of the data
	top, bottom := -1, -1
	bd := img.Bounds()
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			near := func(a uint32, b uint8) bool { d := int(a>>8) - int(b); return d > -24 && d < 24 }
			if near(r, blue.R) && near(g, blue.G) && near(bl, blue.B) {
				if top < 0 {
					top = y
				}
				bottom = y
			}
		}
	}
	h := bd.Dy()
	if top < 0 || top > h/4 || bottom < h*8/10 {
		t.Errorf("fused's pixels run from row %d to %d of %d: want its line near the top and its legend entry at the bottom", top, bottom, h)
	}
	// No ink at the left or right edge: no label runs off the image.
	for _, x := range []int{bd.Min.X, bd.Min.X + 1, bd.Max.X - 2, bd.Max.X - 1} {
		for y := bd.Min.Y; y < bd.Max.Y; y++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r < 0xe000 || g < 0xe000 || bl < 0xe000 {
				t.Fatalf("ink at the image's edge, column %d row %d", x, y)
			}
		}
	}
	// The naive series skips shape 2: two segments.
	if segs := segments([]float64{3000, 3000, nan, 3000}); len(segs) != 2 || len(segs[0]) != 2 || segs[1][0].X != 3 {
		t.Errorf("segments %v", segs)
	}
	p, legend, err := panel(rep, kernels.OpRMSNorm)
	if err != nil {
		t.Fatal(err)
	}
	if len(legend) != 3 { // fused, naive, the floor
		t.Errorf("%d legend entries", len(legend))
	}
	boxes := labelRoom{}.GlyphBoxes(p)
	if len(boxes) != len(shapes) {
		t.Errorf("%d label boxes for %d shapes", len(boxes), len(shapes))
	}
	for _, b := range boxes {
		if !(b.Rectangle.Min.X < 0) || b.Rectangle.Min.Y != 0 || b.Rectangle.Max.Y != 0 {
			t.Errorf("label box %+v: want room to the left only", b.Rectangle)
		}
	}
}

// cpuRunner is a runner on a bf16 cpu device with the cpu set built, for
// the checks' tests: the runner, its device and the set's ops.
func cpuRunner() (r *runner, dev kernels.Device, ops *kernels.Dispatch) {
	dev, _ = cpu.NewDeviceAct(kernels.BF16)
	ops, _ = kernels.Spec{Base: "cpu"}.Build(dev, nil)
	return &runner{dev: dev, built: map[string]setOps{"cpu": ops}, rep: &Report{}}, dev, ops
}
