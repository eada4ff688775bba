package fused

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// TestLinearSwapPlan checks linear_swap's plans without a GPU, on an H200's
// 132 SMs: the instance by rows, refusals past 64 rows or with K off the
// tensor copies' 16-byte rows, and the splits of the decode shapes of both
// models at 16 rows: whole tiles where they fill the waves (Qwen2-7B's
// lm_head, 1,188 tiles: nine waves), split where a wave would be short.
func TestLinearSwapPlan(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		m, cols, k   int
		swiglu       bool
		rows, splits int
		why          string
	}{
		{m: 16, cols: 37888, k: 3584, rows: 16, splits: 4},       // Qwen2-7B gate_up: 296 tiles, 4 splits of 14 k-steps, 9 waves
		{m: 16, cols: 18944, k: 3584, swiglu: true, splits: 4},   // the same with SwiGLU: 296 tiles of 64 columns
		{m: 16, cols: 152064, k: 3584, rows: 16, splits: 1},      // Qwen2-7B lm_head: 1,188 tiles, nine waves exactly
		{m: 16, cols: 3584, k: 18944, rows: 16, splits: 9},       // Qwen2-7B down: 28 tiles of 296 k-steps
		{m: 16, cols: 3584, k: 3584, rows: 16, splits: 4},        // Qwen2-7B o: 28 tiles, one wave of 112 units
		{m: 9, cols: 4608, k: 3584, rows: 16},                    // Qwen2-7B qkv, 9 rows: the 16-row instance
		{m: 17, cols: 3072, k: 2048, rows: 32},                   // DeepSeek-V2-Lite q
		{m: 64, cols: 2048, k: 2816, rows: 64},                   // the shared experts' down
		{m: 13, cols: 4600, k: 3576, rows: 16},                   // rows, outputs and K of no tile
		{m: 65, cols: 64, k: 64, why: "takes 1 to 64"},           // past wgmma's widest N here
		{m: 16, cols: 64, k: 100, why: "16-byte boundaries"},     // K off the tensor copies' rows
		{m: 16, cols: 576, k: 2048, rows: 16, splits: 16},        // kv_a alone: 5 tiles of 32 k-steps, two a split
		{m: 1, cols: 102400, k: 2048, rows: 16},                  // DeepSeek-V2-Lite lm_head at one row
		{m: 16, cols: 102400, k: 2048, rows: 16, splits: 2},      // and at 16: 800 tiles, two splits fill 13 waves
		{m: 64, cols: 37888, k: 3584, rows: 64},                  // partials of 64 rows cost 4 k-steps a unit
		{m: 16, cols: 5632 / 2, k: 2048, swiglu: true, rows: 16}, // DeepSeek-V2-Lite's shared experts' gate_up
	} {
		p, err := planSwap(c.m, c.cols, c.k, h200.SMs, h200.SharedPerBlock, c.swiglu)
		switch {
		case c.why != "":
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Errorf("M=%d cols=%d K=%d: %v, %v; want an error saying %q", c.m, c.cols, c.k, p, err, c.why)
			}
			continue
		case err != nil:
			t.Errorf("M=%d cols=%d K=%d: %v", c.m, c.cols, c.k, err)
			continue
		}
		t.Logf("M=%d cols=%d K=%d swiglu=%v: %v", c.m, c.cols, c.k, c.swiglu, p)
		units := p.tiles * p.splits
		switch {
		case c.rows != 0 && p.cfg.Rows != c.rows:
			t.Errorf("M=%d cols=%d K=%d: %v, want the %d-row instance", c.m, c.cols, c.k, p, c.rows)
		case c.splits != 0 && p.splits != c.splits:
			t.Errorf("M=%d cols=%d K=%d: %v, want %d splits", c.m, c.cols, c.k, p, c.splits)
		case p.cfg.shared() > h200.SharedPerBlock:
			t.Errorf("M=%d cols=%d K=%d: %v exceeds a block's %d bytes", c.m, c.cols, c.k, p, h200.SharedPerBlock)
		case (p.splits-1)*p.per >= p.ktiles || p.splits*p.per < p.ktiles:
			t.Errorf("M=%d cols=%d K=%d: %v: a split without k-steps, or k-steps without a split", c.m, c.cols, c.k, p)
		case p.blocks != min(units, h200.SMs):
			t.Errorf("M=%d cols=%d K=%d: %v, want min(units, SMs) blocks", c.m, c.cols, c.k, p)
		case p.splits > 1 && p.tiles > swCounters:
			t.Errorf("M=%d cols=%d K=%d: %v: more split tiles than counters", c.m, c.cols, c.k, p)
		}
	}
	// A problem of more tiles than counters runs unsplit.
	if s, per := swSplits(swCounters+1, 8, 16, 132); s != 1 || per != 8 {
		t.Errorf("%d tiles: %d splits of %d, want none", swCounters+1, s, per)
	}
}

// TestLinearSwapDefault checks the rule without a GPU: linear_swap is no
// default while linSwapDefault is false (cuBLAS, skinny and stream as
// before), and with it on runs the problems of linSwapMinRows to 64 rows
// that linear_stream is not the default for, where it is built; the
// linear_swiglu rule follows linear's.
func TestLinearSwapDefault(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	o := &ops{ls: &lsKit{}, sw: &swKit{}}
	shapes := map[linearKey]string{
		{16, 37888, 3584}: linSkinny, {16, 3584, 3584}: linCuBLAS, {16, 2048, 2816}: linStream, {1, 3072, 2048}: linStream,
		{32, 37888, 3584}: linCuBLAS, {64, 4608, 3584}: linCuBLAS, {65, 4608, 3584}: linCuBLAS,
	}
	for k, want := range shapes {
		if got := linearDefaultOn(o, k, h200); got != want {
			t.Errorf("linSwapDefault off: %s runs %q, want %q", k, got, want)
		}
	}
	defer func(on bool, rows int) { linSwapDefault, linSwapMinRows = on, rows }(linSwapDefault, linSwapMinRows)
	linSwapDefault, linSwapMinRows = true, 9
	for k, want := range map[linearKey]string{
		{16, 37888, 3584}: linSwap, {16, 3584, 3584}: linSwap, {16, 2048, 2816}: linStream, {1, 3072, 2048}: linStream,
		{8, 37888, 3584}: linSkinny, {32, 37888, 3584}: linSwap, {64, 4608, 3584}: linSwap, {65, 4608, 3584}: linCuBLAS,
		{16, 64, 100}: linCuBLAS, // K off the tensor copies' rows
	} {
		if got := linearDefaultOn(o, k, h200); got != want {
			t.Errorf("linSwapDefault on: %s runs %q, want %q", k, got, want)
		}
	}
	saved := streamTarget
	defer func() { streamTarget = saved }()
	streamTarget = func(*ops) (int, int) { return h200.SMs, h200.SharedPerBlock }
	for k, want := range map[linearKey]string{
		{16, 37888, 3584}: linSwap, {16, 5632, 2048}: linSwap, {16, 37887, 3584}: linSwiGLUUnfused, {1, 5632, 2048}: linStream,
	} {
		if got := o.linearSwiGLUDefault(k); got != want {
			t.Errorf("linSwapDefault on: linear_swiglu %s runs %q, want %q", k, got, want)
		}
	}
	o.sw = &swKit{err: os.ErrNotExist}
	if got := o.linearDefault(linearKey{16, 37888, 3584}); got != linSkinny {
		t.Errorf("without linear_swap built, 16×37888×3584 runs %q", got)
	}
}

// TestLinearSwapVariants checks the variant table without a GPU: swap is
// offered for linear and linear_swiglu on sm_90a only, with its plan or
// why it cannot run the shape.
func TestLinearSwapVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	find := func(op kernels.Op, s kernels.Shape, tg kernels.Target) (kernels.Variant, bool) {
		for _, v := range variants(op, s, tg) {
			if v.Name == linSwap {
				return v, true
			}
		}
		return kernels.Variant{}, false
	}
	for _, c := range []struct {
		op  kernels.Op
		s   kernels.Shape
		why string
	}{
		{kernels.OpLinear, kernels.Shape{"M": 16, "N": 37888, "K": 3584}, ""},
		{kernels.OpLinear, kernels.Shape{"M": 80, "N": 37888, "K": 3584}, "takes 1 to 64"},
		{kernels.OpLinearSwiGLU, kernels.Shape{"M": 16, "N": 37888, "K": 3584}, ""},
		{kernels.OpLinearSwiGLU, kernels.Shape{"M": 16, "N": 37887, "K": 3584}, "gate and up"},
	} {
		v, ok := find(c.op, c.s, h200)
		switch {
		case !ok:
			t.Errorf("%s %v: no variant %q on %s", c.op, c.s, linSwap, h200.Arch)
		case c.why == "" && (v.Why != "" || !strings.Contains(v.Params, "splits=")):
			t.Errorf("%s %v: %+v, want it to run with its plan in the params", c.op, c.s, v)
		case c.why != "" && !strings.Contains(v.Why, c.why):
			t.Errorf("%s %v: why %q, want %q", c.op, c.s, v.Why, c.why)
		}
	}
	for arch, tg := range kernels.Targets {
		if arch == hopperArch {
			continue
		}
		if _, ok := find(kernels.OpLinear, kernels.Shape{"M": 16, "N": 4096, "K": 4096}, tg); ok {
			t.Errorf("%s: swap offered off %s", arch, hopperArch)
		}
	}
}

// TestLinearSwapCompiles compiles linear_swap.cu with the NVRTC library at
// $FUSELM_NVRTC for $FUSELM_NVRTC_ARCH (sm_90a when unset), without a GPU,
// with ptxas's report, and fails on a serialized wgmma pipeline (C75xx),
// spills or a kernel missing; it logs each kernel's registers and shared
// memory. Skipped when FUSELM_NVRTC is unset.
func TestLinearSwapCompiles(t *testing.T) {
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile without a GPU")
	}
	arch := os.Getenv("FUSELM_NVRTC_ARCH")
	if arch == "" {
		arch = hopperArch
	}
	c, err := cuda.NewCompiler(lib, arch)
	if err != nil {
		t.Fatal(err)
	}
	m := swModule()
	p, err := cudaset.Source(m)
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "fused_" + m.File
	_, log, err := c.Compile(p, append(slices.Clone(m.Opts), "--ptxas-options=-v")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	for _, f := range m.Funcs {
		if !strings.Contains(log, "Compiling entry function '"+f+"'") {
			t.Errorf("no kernel %s in ptxas's report", f)
		}
	}
	for _, bad := range slices.Compact(slices.Sorted(slices.Values(regexp.MustCompile(`C75\d\d`).FindAllString(log, -1)))) {
		t.Errorf("ptxas warns %s:\n%s", bad, log)
	}
	for _, s := range regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`).FindAllStringSubmatch(log, -1) {
		if s[1] != "0" || s[2] != "0" || s[3] != "0" {
			t.Errorf("ptxas: %s", s[0])
		}
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "Used") || strings.Contains(line, "Compiling entry") {
			t.Log(strings.TrimSpace(line))
		}
	}
}
