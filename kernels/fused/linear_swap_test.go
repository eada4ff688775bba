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

// TestLinearSwapPlan checks linear_swap's plans without a GPU, on an H200's
// 132 SMs: the instance by rows, refusals past 64 rows or with K off the
// tensor copies' 16-byte rows, and the cuts of the decode shapes of both
// models at 16 rows: whole tiles where they fill the waves (Qwen2-7B's
// lm_head, 1,188 tiles: nine waves), whole waves of them then the rest split
// in two (gate_up), and problems of fewer tiles than SMs in few long
// ranges (two of 28 k-steps or more for Qwen2-7B's).
func TestLinearSwapPlan(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		m, cols, k          int
		swiglu              bool
		rows, whole, splits int
		why                 string
	}{
		{m: 16, cols: 37888, k: 3584, rows: 16, whole: 264, splits: 4},     // Qwen2-7B gate_up: 296 tiles, two waves whole, 32 tiles in four of 14 k-steps
		{m: 16, cols: 18944, k: 3584, swiglu: true, whole: 264, splits: 4}, // the same with SwiGLU: 296 tiles of 64 columns
		{m: 16, cols: 152064, k: 3584, rows: 16, splits: 1},                // Qwen2-7B lm_head: 1,188 tiles, nine waves exactly
		{m: 16, cols: 3584, k: 18944, rows: 16, splits: 4},                 // Qwen2-7B down: 28 tiles of 296 k-steps, four of 74 each on 112 SMs
		{m: 16, cols: 3584, k: 3584, rows: 16, splits: 4},                  // Qwen2-7B o: 28 tiles, 112 units of 14 k-steps
		{m: 16, cols: 4608, k: 3584, rows: 16, splits: 3},                  // Qwen2-7B qkv: 36 tiles, 108 units of 19
		{m: 9, cols: 4608, k: 3584, rows: 16},                              // Qwen2-7B qkv, 9 rows: the 16-row instance
		{m: 17, cols: 3072, k: 2048, rows: 32},                             // DeepSeek-V2-Lite q
		{m: 64, cols: 2048, k: 2816, rows: 64},                             // the shared experts' down
		{m: 13, cols: 4600, k: 3576, rows: 16},                             // rows, outputs and K of no tile
		{m: 65, cols: 64, k: 64, why: "takes 1 to 64"},                     // past wgmma's widest N here
		{m: 16, cols: 64, k: 100, why: "16-byte boundaries"},               // K off the tensor copies' rows
		{m: 16, cols: 576, k: 2048, rows: 16, splits: 16},                  // kv_a alone: 5 tiles of 32 k-steps, two a split
		{m: 16, cols: 2048, k: 2048, rows: 16, splits: 8},                  // DeepSeek-V2-Lite o: 16 tiles, 128 units of 4
		{m: 1, cols: 102400, k: 2048, rows: 16},                            // DeepSeek-V2-Lite lm_head at one row
		{m: 16, cols: 102400, k: 2048, rows: 16, whole: 792, splits: 16},   // and at 16: 800 tiles, six waves whole, the last 8 tiles in 16
		{m: 64, cols: 37888, k: 3584, rows: 64},                            // partials of 64 rows cost 4 k-steps a unit
		{m: 16, cols: 5632 / 2, k: 2048, swiglu: true, rows: 16},           // DeepSeek-V2-Lite's shared experts' gate_up
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
		units := p.units()
		switch {
		case c.rows != 0 && p.cfg.Rows != c.rows:
			t.Errorf("M=%d cols=%d K=%d: %v, want the %d-row instance", c.m, c.cols, c.k, p, c.rows)
		case c.splits != 0 && (p.splits != c.splits || p.whole != c.whole):
			t.Errorf("M=%d cols=%d K=%d: %v, want %d whole and the rest in %d splits", c.m, c.cols, c.k, p, c.whole, c.splits)
		case p.whole%h200.SMs != 0 || (p.splits > 1 && p.whole >= p.tiles) || (p.splits == 1 && p.whole != 0):
			t.Errorf("M=%d cols=%d K=%d: %v: whole tiles not whole waves, or none left to split", c.m, c.cols, c.k, p)
		case p.cfg.shared() > h200.SharedPerBlock:
			t.Errorf("M=%d cols=%d K=%d: %v exceeds a block's %d bytes", c.m, c.cols, c.k, p, h200.SharedPerBlock)
		case (p.splits-1)*p.per >= p.ktiles || p.splits*p.per < p.ktiles:
			t.Errorf("M=%d cols=%d K=%d: %v: a split without k-steps, or k-steps without a split", c.m, c.cols, c.k, p)
		case p.blocks != min(units, h200.SMs):
			t.Errorf("M=%d cols=%d K=%d: %v, want min(units, SMs) blocks", c.m, c.cols, c.k, p)
		case p.splits > 1 && p.tiles-p.whole > swCounters:
			t.Errorf("M=%d cols=%d K=%d: %v: more split tiles than counters", c.m, c.cols, c.k, p)
		}
	}
	// Each instance has as many stages as an H200 block holds.
	for _, c := range swConfigs {
		more := swConfig{c.Rows, c.Stages + 1}
		if c.shared() > h200.SharedPerBlock || more.shared() <= h200.SharedPerBlock {
			t.Errorf("%+v: %d bytes, %d with a stage more; a block holds %d", c, c.shared(), more.shared(), h200.SharedPerBlock)
		}
	}
	// linear_swiglu's plan is linear's on the stacked rows (the same cut of
	// every row's k-steps: what holds them bit for bit).
	for _, inter := range []int{18944, 2816, 10944, 300} {
		for _, m := range swapRows {
			plain, _ := planSwap(m, 2*inter, 3584, h200.SMs, h200.SharedPerBlock, false)
			sw, _ := planSwap(m, inter, 3584, h200.SMs, h200.SharedPerBlock, true)
			if plain != sw {
				t.Errorf("M=%d I=%d: %v with SwiGLU, %v plain", m, inter, sw, plain)
			}
		}
	}
	// A problem of more tiles than counters runs unsplit.
	if w, s, per := swSplits(swCounters+1, 8, 16, 132); s != 1 || per != 8 {
		t.Errorf("%d tiles: %d whole, %d splits of %d, want none", swCounters+1, w, s, per)
	}
}

// TestLinearSwapDefault checks the rule without a GPU: while
// linSwapDefault is false linear_swap runs the problems of 9 to 16 rows
// whose K is at least linSwapMinK (Qwen2-7B's linears; not
// DeepSeek-V2-Lite's lm_head, skinny, nor its q+kv_a, cuBLAS), cuBLAS,
// skinny and stream the rest as before; with it on it runs the problems of
// linSwapMinRows to 64 rows that linear_stream is not the default for,
// where it is built; the linear_swiglu rule follows linear's.
func TestLinearSwapDefault(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	o := &ops{ls: &lsKit{}, sw: &swKit{}}
	shapes := map[linearKey]string{
		{16, 37888, 3584}: linSwap, {16, 152064, 3584}: linSwap, {9, 37888, 3584}: linSwap, {8, 37888, 3584}: linSkinny,
		{16, 102400, 2048}: linSkinny, {1, 152064, 3584}: linSkinny, {16, 3648, 2048}: linCuBLAS,
		{16, 3584, 3584}: linSwap, {16, 4608, 3584}: linSwap, {16, 3584, 18944}: linSwap, {8, 3584, 18944}: linCuBLAS,
		{16, 2048, 2816}: linStream, {1, 3072, 2048}: linStream, {16, 2048, 10944}: linCuBLAS, // narrow: stream's where it plans, here not
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
	linSwapDefault = false
	if got := o.linearSwiGLUDefault(linearKey{16, 37888, 3584}); got != linSwap {
		t.Errorf("linear_swiglu 16×37888×3584 runs %q by default, want %q", got, linSwap)
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
func TestLinearSwapCompiles(t *testing.T) { nvrtcReport(t, swModule()) }

// nvrtcReport compiles module m by NVRTC without a GPU (nvrtcCompiler's
// library and target), with ptxas's report, and fails on a compile error, a
// serialized wgmma pipeline (C75xx), spills or a kernel missing; it logs
// each kernel's registers and shared memory, and with $FUSELM_NVRTC_OUT
// set writes the cubin there (for `cuobjdump -sass`).
func nvrtcReport(t *testing.T, m cudaset.Module) {
	t.Helper()
	_, log := compileReport(t, nvrtcCompiler(t, m.File), m, "")
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

// compileReport compiles module m with c as the set names it, with
// ptxas's report, and returns the cubin and the log; a compile error fails
// the test. With $FUSELM_NVRTC_OUT set it writes the cubin there, as
// fused_FILE.cubin, or fused_FILE.build.cubin where build names one of
// several builds of m.
func compileReport(t *testing.T, c *cuda.Compiler, m cudaset.Module, build string) (img []byte, log string) {
	t.Helper()
	p, err := cudaset.Source(m)
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "fused_" + m.File
	img, log, err = c.Compile(p, append(slices.Clone(m.Opts), "--ptxas-options=-v")...)
	if err != nil {
		t.Fatalf("%s %s, options %q: %v\n%s", m.File, build, m.Opts, err, log)
	}
	if dir := os.Getenv("FUSELM_NVRTC_OUT"); dir != "" {
		name := p.Name
		if build != "" {
			name += "." + build
		}
		if err := os.WriteFile(fmt.Sprintf("%s/%s.cubin", dir, name), img, 0o644); err != nil {
			t.Error(err)
		}
	}
	return img, log
}

// TestLinearSwapKernels runs the shared kerneltest's linear and
// linear_swiglu cases with linear_swap the default for every problem it
// takes (1 to 64 rows with K a multiple of 8: bias, f32 out, pitched x and
// out, N, I and K of no tile, 13 to 64 rows among them; linear_stream's
// defaults turned off, so that swap runs its narrow ones too), then the
// decode graph with it the default, so that its prefetch before the grid
// wait and its split counters are replayed overlapped.
func TestLinearSwapKernels(t *testing.T) {
	dev, _ := openHopperSet(t, "linear_swap", func(o *ops) error { return o.sw.err })
	defer func(on bool, from, rows, narrow int) {
		linSwapDefault, linSwapMinRows, linStreamRows, linStreamNarrow = on, from, rows, narrow
	}(linSwapDefault, linSwapMinRows, linStreamRows, linStreamNarrow)
	linSwapDefault, linSwapMinRows, linStreamRows, linStreamNarrow = true, 1, 0, 0
	kerneltest.RunOps(t, dev, "fused", kerneltest.DefaultTolerances(), kernels.OpLinear, kernels.OpLinearSwiGLU)
	kerneltest.RunDecodeGraph(t, dev, "fused")
}

// swapShape is a decode projection linear_swap is held to: features n
// (w's rows) of k inputs, with a bias or not, out bf16 or f32 (logits).
type swapShape struct {
	name string
	n, k int
	bias bool
	out  kernels.DType
}

// swapShapes are both models' decode projections (Qwen2-7B's qkv with its
// bias, DeepSeek-V2-Lite's q and kv_a apart and stacked, the lm_heads with
// f32 logits), then shapes of no tile (N of no 128 rows, K of no 64-k
// step) and a tiny one.
var swapShapes = []swapShape{
	{"qwen qkv", 4608, 3584, true, kernels.BF16}, {"qwen o", 3584, 3584, false, kernels.BF16},
	{"qwen gate_up", 37888, 3584, false, kernels.BF16}, {"qwen down", 3584, 18944, false, kernels.BF16},
	{"qwen lm_head", 152064, 3584, false, kernels.F32},
	{"v2-lite q+kv_a", 3648, 2048, false, kernels.BF16}, {"v2-lite q", 3072, 2048, false, kernels.BF16},
	{"v2-lite kv_a", 576, 2048, false, kernels.BF16}, {"v2-lite o", 2048, 2048, false, kernels.BF16},
	{"v2-lite shared gate_up", 5632, 2048, false, kernels.BF16}, {"v2-lite shared down", 2048, 2816, false, kernels.BF16},
	{"v2-lite lm_head", 102400, 2048, false, kernels.F32},
	{"odd", 4600, 3576, true, kernels.BF16}, {"odd f32", 129, 520, true, kernels.F32}, {"tiny", 5, 64, true, kernels.BF16},
}

// copyRate is the H200's measured copy rate in bytes a second, over which
// a weight stream's bytes are its floor.
const copyRate = 4.23e12

// swapRows are the batches TestLinearSwapExact runs each shape at: each
// instance's (16, 32, 64 token rows), short of it (9, 13) and one row.
var swapRows = []int{1, 9, 13, 16, 32, 64}

// TestLinearSwapExact holds linear_swap against the f32 product (cuBLAS's
// GEMM into f32) plus the bias, rounded once, to 1e-3 as
// TestLinearStreamExact holds linear_stream (the kerneltest's tolerance is
// 2%), at swapRows over swapShapes; checks that three launches back to back
// and two replays of a captured graph give the first launch's outputs bit
// for bit and leave every split counter at zero; and logs its rate against
// cuBLAS (cudaset.Addmm, naive's) and linear_stream where it runs the
// problem: median µs of CUDA events around each of 21 calls after 3 to
// warm up (infer bench linear is the measurement).
func TestLinearSwapExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_swap", func(o *ops) error { return o.sw.err })
	random := normalOn(t, dev, rand.New(rand.NewSource(29)))
	for _, s := range swapShapes {
		w := random(kernels.BF16, 1/math.Sqrt(float64(s.k)), s.n, s.k)
		var b *kernels.Tensor
		var bv []float32
		if s.bias {
			b = random(kernels.BF16, 0.5, s.n)
			bv = read(t, dev, b)
		}
		for _, m := range swapRows {
			name := fmt.Sprintf("%s M=%d N=%d K=%d out=%v", s.name, m, s.n, s.k, s.out)
			x := random(kernels.BF16, 1, m, s.k)
			acc := dev.Alloc(kernels.F32, m, s.n)
			o.Gemm(true, m, s.n, s.k, 1, o.Mat(x), o.Mat(w), 0, o.Mat(acc))
			ref := read(t, dev, acc)
			for i := range ref {
				if bv != nil {
					ref[i] += bv[i%s.n]
				}
				if s.out == kernels.BF16 {
					ref[i] = roundBF16(ref[i])
				}
			}
			cublas := dev.Alloc(s.out, m, s.n)
			o.Addmm(cublas, x, w, b)
			got := dev.Alloc(s.out, m, s.n)
			poison := func() { dev.MemsetD8(dev.Ptr(got), 0xff, m*s.n*s.out.Size()) } // NaN: an element left unwritten shows
			call := func() {
				if !o.swap(got, x, w, b) {
					t.Fatalf("%s: linear_swap refuses it", name)
				}
			}
			p, err := o.swapPlan(m, s.n, s.k, false)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			poison()
			call()
			first := read(t, dev, got)
			if err := o.linearSwapWaits(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			d := kernels.Compare(first, ref)
			if d.Unwritten > 0 || d.Rel > 1e-3 {
				t.Errorf("%s %v: against the f32 product rounded once %+v", name, p, d)
			}
			same := func(what string) {
				if bad, at := bitsDiffer(first, read(t, dev, got)); bad > 0 {
					t.Errorf("%s %v, %s: %d of %d outputs differ from the first launch's, first at %d", name, p, what, bad, len(first), at)
				}
				checkSwapCounters(t, o, name+", "+what)
			}
			for rep := range 3 {
				poison()
				call()
				same(fmt.Sprintf("launch %d back to back", rep+2))
			}
			poison()
			replayTwice(t, dev, name, call, poison, same)
			dc := kernels.Compare(first, read(t, dev, cublas))
			us := medianUs(t, dev, call)
			cuUs := medianUs(t, dev, func() { o.Addmm(cublas, x, w, b) })
			stream := "-"
			if sms, shared := streamTarget(o); m <= linMaxRows && o.streamTakes(cublas, x, w) && planStreamOK(linearKey{m, s.n, s.k}, sms, shared) {
				stream = fmt.Sprintf("%.2f µs", medianUs(t, dev, func() { o.stream(cublas, x, w, b) }))
			}
			floor := float64(s.n) * float64(s.k) * 2 / copyRate * 1e6
			t.Logf("%s %v: rel %.2e (cuBLAS's outputs: rel %.2e); %.2f µs (%.0f%% of the %.1f µs floor), cuBLAS %.2f µs (%.0f%%), linear_stream %s",
				name, p, d.Rel, dc.Rel, us, floor/us*100, floor, cuUs, floor/cuUs*100, stream)
			for _, a := range []*kernels.Tensor{x, acc, cublas, got} {
				dev.Free(a)
			}
		}
		dev.Free(w)
		if b != nil {
			dev.Free(b)
		}
	}
}

// TestLinearSwapSwiGLUExact holds linear_swap with SwiGLU in its epilogue
// against the plain kernel then fused's swiglu, bit for bit: both cut the
// k-steps alike (2I/128 tiles of rows or I/64 of columns, so the same
// plan), and a row's sum does not depend on where in a tile it lies, nor on
// whether its tile is split (a whole tile of a split plan sums its ranges
// as the splits are summed: Qwen2-7B's gate_up has its gate column 3000 in
// a split tile of the plain kernel's and a whole one of SwiGLU's); over
// Qwen2-7B's gate_up, DeepSeek-V2-Lite's shared experts' and dense MLP's,
// and an I and K of no tile, at swapRows; checks replays as
// TestLinearSwapExact does, and logs its time against cuBLAS's GEMM then
// swiglu.
func TestLinearSwapSwiGLUExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_swap", func(o *ops) error { return o.sw.err })
	random := normalOn(t, dev, rand.New(rand.NewSource(31)))
	for _, s := range []struct {
		name     string
		inter, k int
	}{{"qwen gate_up", 18944, 3584}, {"v2-lite shared gate_up", 2816, 2048}, {"v2-lite dense gate_up", 10944, 2048}, {"odd", 300, 520}} {
		w := random(kernels.BF16, 1/math.Sqrt(float64(s.k)), 2*s.inter, s.k)
		for _, m := range swapRows {
			name := fmt.Sprintf("%s M=%d I=%d K=%d", s.name, m, s.inter, s.k)
			x := random(kernels.BF16, 1, m, s.k)
			gu := dev.Alloc(kernels.BF16, m, 2*s.inter)
			want := dev.Alloc(kernels.BF16, m, s.inter)
			if !o.swap(gu, x, w, nil) {
				t.Fatalf("%s: linear_swap refuses the stacked product", name)
			}
			o.SwiGLU(want, gu)
			ref := read(t, dev, want)
			got := dev.Alloc(kernels.BF16, m, s.inter)
			poison := func() { dev.MemsetD8(dev.Ptr(got), 0xff, m*s.inter*2) }
			call := func() {
				if !o.swapSwiGLU(got, x, w) {
					t.Fatalf("%s: linear_swap with SwiGLU refuses it", name)
				}
			}
			plain, _ := o.swapPlan(m, 2*s.inter, s.k, false)
			p, _ := o.swapPlan(m, s.inter, s.k, true)
			poison()
			call()
			first := read(t, dev, got)
			if err := o.linearSwapWaits(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			d := kernels.Compare(first, ref)
			bad, at := bitsDiffer(ref, first)
			if plain.tiles != p.tiles || plain.whole != p.whole || plain.splits != p.splits || plain.per != p.per {
				t.Errorf("%s: %v with SwiGLU, %v plain: the k-steps cut otherwise", name, p, plain)
			}
			if d.Unwritten > 0 || bad > 0 {
				t.Errorf("%s %v (plain %v): against swap then swiglu %+v, %d differ in bits, first at %d", name, p, plain, d, bad, at)
			}
			for rep := range 2 {
				poison()
				call()
				if n, at := bitsDiffer(first, read(t, dev, got)); n > 0 {
					t.Errorf("%s, launch %d: %d outputs differ from the first launch's, first at %d", name, rep+2, n, at)
				}
				checkSwapCounters(t, o, name)
			}
			poison()
			replayTwice(t, dev, name, call, poison, func(what string) {
				if n, at := bitsDiffer(first, read(t, dev, got)); n > 0 {
					t.Errorf("%s, %s: %d outputs differ from the first launch's, first at %d", name, what, n, at)
				}
				checkSwapCounters(t, o, name)
			})
			us := medianUs(t, dev, call)
			pairUs := medianUs(t, dev, func() { o.Addmm(gu, x, w, nil); o.SwiGLU(want, gu) })
			floor := float64(2*s.inter) * float64(s.k) * 2 / copyRate * 1e6
			t.Logf("%s %v: rel %.2e, %d differ in bits; %.2f µs (%.0f%% of the %.1f µs floor), cuBLAS then swiglu %.2f µs",
				name, p, d.Rel, bad, us, floor/us*100, floor, pairUs)
			for _, a := range []*kernels.Tensor{x, gu, want, got} {
				dev.Free(a)
			}
		}
		dev.Free(w)
	}
}

// checkSwapCounters fails the test where a split counter of linear_swap is
// not back at zero.
func checkSwapCounters(t *testing.T, o *ops, what string) {
	t.Helper()
	c, err := o.D.ReadI32(o.sw.counters)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(c, func(v int32) bool { return v != 0 }); i >= 0 {
		t.Fatalf("%s: split counter %d is %d after the launch, want 0", what, i, c[i])
	}
}

// replayTwice captures call in a CUDA graph on dev and replays it twice,
// each replay after before (which poisons the outputs) and followed by
// check, told which replay it follows.
func replayTwice(t *testing.T, dev *cuda.Device, name string, call, before func(), check func(what string)) {
	t.Helper()
	if err := dev.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	call()
	g, err := dev.EndCapture()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer g.Close()
	for rep := range 2 {
		before()
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("graph replay %d", rep))
	}
}

// medianUs is call's median device time in µs: CUDA events around each of
// 21 calls queued back to back (read after the last), after 3 calls to
// warm up.
func medianUs(t *testing.T, dev *cuda.Device, call func()) float64 {
	t.Helper()
	const warm, reps = 3, 21
	for range warm {
		call()
	}
	marks := []kernels.Mark{dev.Mark()}
	for range reps {
		call()
		marks = append(marks, dev.Mark())
	}
	us := make([]float64, reps)
	for i := range reps {
		ms, err := dev.Elapsed(marks[i], marks[i+1])
		if err != nil {
			t.Fatal(err)
		}
		us[i] = ms * 1e3
	}
	slices.Sort(us)
	return us[reps/2]
}

// nvrtcCompiler is the NVRTC library at $FUSELM_NVRTC compiling for
// $FUSELM_NVRTC_ARCH (hopperArch when unset), for the tests that compile
// without a GPU; it skips t, saying it would have compiled what, when
// FUSELM_NVRTC is unset.
func nvrtcCompiler(t *testing.T, what string) *cuda.Compiler {
	t.Helper()
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skipf("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile %s without a GPU", what)
	}
	arch := os.Getenv("FUSELM_NVRTC_ARCH")
	if arch == "" {
		arch = hopperArch
	}
	c, err := cuda.NewCompiler(lib, arch)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLinearSwapChainExact holds linear_add_rms_norm_linear's two
// linear_swap launches (swapChain) to what they promise, over Qwen2-7B's
// down then qkv (a bias) and o_proj then gate/up (SwiGLU), and shapes of no
// tile, at 16, 13 and 1 rows: mid as the plain kernel writes it and resid
// as add_rms_norm adds it, bit for bit; h = bf16(norm·resid), bit for bit;
// out against cuBLAS's f32 product of h, each row scaled by its 1/rms (from
// resid, in float64) and rounded as the epilogue rounds (bias or SwiGLU),
// to 1e-3, and against the parts (add_rms_norm, then linear or
// linear_swiglu) to the kerneltest's 2e-2; every output the same bits on a
// second launch and with the splits summed by the counters instead of in a
// cluster (swClusterOn), and the split counters back at zero. Logs the
// pair's time, with and without the clusters, against the parts'.
func TestLinearSwapChainExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_swap", func(o *ops) error { return o.sw.err })
	t.Cleanup(func() { swClusterOn = true })
	t.Logf("clusters of the cluster instances that run at once: %v", o.sw.clusters)
	rng := rand.New(rand.NewSource(37))
	random := normalOn(t, dev, rng)
	const eps = 1e-6
	for _, s := range []struct {
		name       string
		k0, n0, n  int // first projection [n0, k0], second [n, n0] (with SwiGLU 2I rows, n = 2I)
		bias, swig bool
	}{
		{name: "qwen down, qkv", k0: 18944, n0: 3584, n: 4608, bias: true},
		{name: "qwen o, gate_up", k0: 3584, n0: 3584, n: 2 * 18944, swig: true},
		{name: "odd", k0: 1000, n0: 520, n: 2 * 300, swig: true},
		{name: "odd bias", k0: 1000, n0: 520, n: 700, bias: true},
	} {
		w0 := random(kernels.BF16, 1/math.Sqrt(float64(s.k0)), s.n0, s.k0)
		w := random(kernels.BF16, 1/math.Sqrt(float64(s.n0)), s.n, s.n0)
		norm := random(kernels.BF16, 1, s.n0)
		gv := read(t, dev, norm)
		var b *kernels.Tensor
		var bv []float32
		if s.bias {
			b = random(kernels.BF16, 0.5, s.n)
			bv = read(t, dev, b)
		}
		cols := s.n
		if s.swig {
			cols = s.n / 2
		}
		for _, m := range []int{16, 13, 1} {
			name := fmt.Sprintf("%s M=%d", s.name, m)
			x := random(kernels.BF16, 1, m, s.k0)
			resid0 := gaussians(rng, m*s.n0, 4)
			for i := range resid0 {
				resid0[i] = roundBF16(resid0[i])
			}
			resid := tensorOn(t, dev, kernels.BF16, resid0, m, s.n0)
			mid, h := dev.Alloc(kernels.BF16, m, s.n0), dev.Alloc(kernels.BF16, m, s.n0)
			out := dev.Alloc(kernels.BF16, m, cols)
			call := func() {
				if err := dev.Upload(resid, f32Bytes(resid0), kernels.F32); err != nil {
					t.Fatal(err)
				}
				for _, a := range []*kernels.Tensor{mid, h, out} {
					dev.MemsetD8(dev.Ptr(a), 0xff, a.Numel()*2)
				}
				if !o.swapChain(mid, x, w0, nil, out, h, resid, norm, eps, w, b, s.swig) {
					t.Fatalf("%s: swapChain refuses it", name)
				}
			}
			call()
			got := [4][]float32{read(t, dev, mid), read(t, dev, resid), read(t, dev, h), read(t, dev, out)}
			if err := o.linearSwapWaits(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkSwapCounters(t, o, name)

			// mid, resid and h against the plain kernel and the host.
			plain := dev.Alloc(kernels.BF16, m, s.n0)
			if !o.swap(plain, x, w0, nil) {
				t.Fatalf("%s: linear_swap refuses the first projection", name)
			}
			wantMid := read(t, dev, plain)
			wantResid, wantH := make([]float32, m*s.n0), make([]float32, m*s.n0)
			rstd := make([]float64, m)
			for r := range m {
				ss := 0.0
				for c := range s.n0 {
					i := r*s.n0 + c
					wantResid[i] = roundBF16(wantMid[i] + resid0[i])
					wantH[i] = roundBF16(gv[c] * wantResid[i])
					ss += float64(wantResid[i]) * float64(wantResid[i])
				}
				rstd[r] = 1 / math.Sqrt(ss/float64(s.n0)+eps)
			}
			for i, want := range [][]float32{wantMid, wantResid, wantH} {
				if n, at := bitsDiffer(want, got[i]); n > 0 {
					t.Errorf("%s: %s: %d of %d differ in bits, first at %d (%g, want %g)", name, []string{"mid", "resid", "h"}[i], n, len(want), at, got[i][at], want[at])
				}
			}

			// out against cuBLAS's f32 product of h, scaled and rounded here.
			acc := dev.Alloc(kernels.F32, m, s.n)
			o.Gemm(true, m, s.n, s.n0, 1, o.Mat(h), o.Mat(w), 0, o.Mat(acc))
			av := read(t, dev, acc)
			ref := make([]float32, m*cols)
			for r := range m {
				for c := range cols {
					if s.swig {
						gate, up := roundBF16(float32(float64(av[r*s.n+c])*rstd[r])), roundBF16(float32(float64(av[r*s.n+cols+c])*rstd[r]))
						ref[r*cols+c] = roundBF16(roundBF16(gate/(1+float32(math.Exp(float64(-gate))))) * up)
						continue
					}
					v := float32(float64(av[r*s.n+c]) * rstd[r])
					if bv != nil {
						v += bv[c]
					}
					ref[r*cols+c] = roundBF16(v)
				}
			}
			if d := kernels.Compare(got[3], ref); d.Unwritten > 0 || d.Rel > 1e-3 {
				t.Errorf("%s: out against the scaled f32 product %+v", name, d)
			}

			// out against the parts, from the same resid.
			partsResid := tensorOn(t, dev, kernels.BF16, resid0, m, s.n0)
			normed, partsOut := dev.Alloc(kernels.BF16, m, s.n0), dev.Alloc(kernels.BF16, m, cols)
			parts := func() {
				if !o.swap(plain, x, w0, nil) {
					t.Fatal("linear_swap refuses the first projection")
				}
				o.AddRMSNorm(normed, partsResid, plain, norm, eps)
				if s.swig {
					if !o.swapSwiGLU(partsOut, normed, w) {
						t.Fatal("linear_swap refuses the second projection")
					}
				} else if !o.swap(partsOut, normed, w, b) {
					t.Fatal("linear_swap refuses the second projection")
				}
			}
			parts()
			d := kernels.Compare(got[3], read(t, dev, partsOut))
			if d.Unwritten > 0 || d.Rel > 2e-2 {
				t.Errorf("%s: out against the parts' %+v", name, d)
			}

			call()
			for i, a := range []*kernels.Tensor{mid, resid, h, out} {
				if n, at := bitsDiffer(got[i], read(t, dev, a)); n > 0 {
					t.Errorf("%s, second launch: %s: %d differ from the first's, first at %d", name, []string{"mid", "resid", "h", "out"}[i], n, at)
				}
			}
			checkSwapCounters(t, o, name+", second launch")
			chain := func() {
				if !o.swapChain(mid, x, w0, nil, out, h, resid, norm, eps, w, b, s.swig) {
					t.Fatal("swapChain refuses it")
				}
			}
			us := medianUs(t, dev, chain)
			// The splits summed by the counters instead of in a cluster
			// (where the plans took the cluster instances): the same bits.
			swClusterOn = false
			call()
			for i, a := range []*kernels.Tensor{mid, resid, h, out} {
				if n, at := bitsDiffer(got[i], read(t, dev, a)); n > 0 {
					t.Errorf("%s, the splits summed by the counters: %s: %d differ from the first launch's, first at %d", name, []string{"mid", "resid", "h", "out"}[i], n, at)
				}
			}
			checkSwapCounters(t, o, name+", the counters")
			countersUs := medianUs(t, dev, chain)
			swClusterOn = true
			partsUs := medianUs(t, dev, parts)
			p0, _ := o.swapPlan(m, s.n0, s.k0, false)
			p1, _ := o.swapPlan(m, cols, s.n0, s.swig)
			t.Logf("%s (%v; %v): out rel %.2e to the scaled product, %.2e to the parts; %.2f µs (the splits summed by the counters %.2f), the parts %.2f µs",
				name, p0, p1, kernels.Compare(got[3], ref).Rel, d.Rel, us, countersUs, partsUs)
			for _, a := range []*kernels.Tensor{x, resid, mid, h, out, plain, acc, partsResid, normed, partsOut} {
				dev.Free(a)
			}
		}
		for _, a := range []*kernels.Tensor{w0, w, norm, b} {
			if a != nil {
				dev.Free(a)
			}
		}
	}
}

// f32Bytes is v as the little-endian f32 bytes Upload takes.
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// TestLinearSwapChainPlan checks swapChain's plans without a GPU, on an
// H200's 132 SMs: Qwen2-7B's two chains at 16 rows and fewer (down then
// qkv, o then gate/up with SwiGLU, each projection as linear_swap plans it
// alone), and the refusals: rows past the 16-row instance, a first
// projection of more tiles than the second sums squares of, gate and up
// rows of unequal count, and what planSwap refuses.
func TestLinearSwapChainPlan(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	for _, c := range []struct {
		m, k0, n0, n int
		swiglu       bool
		why          string
	}{
		{m: 16, k0: 18944, n0: 3584, n: 4608},                   // down, then qkv
		{m: 16, k0: 3584, n0: 3584, n: 37888, swiglu: true},     // o_proj, then gate/up
		{m: 9, k0: 3584, n0: 3584, n: 37888, swiglu: true},      // 9 rows: the 16-row instance
		{m: 1, k0: 1000, n0: 520, n: 700},                       // K, N of no tile
		{m: 17, k0: 3584, n0: 3584, n: 4608, why: "built for"},  // the 32-row instance has no halves
		{m: 16, k0: 3584, n0: 8320, n: 4608, why: "at most 64"}, // 65 tiles of squares
		{m: 16, k0: 3584, n0: 3584, n: 301, swiglu: true, why: "equal count"},
		{m: 16, k0: 100, n0: 3584, n: 4608, why: "16-byte"},
	} {
		p0, p1, err := planSwapChain(c.m, c.k0, c.n0, c.n, c.swiglu, h200.SMs, h200.SharedPerBlock)
		if c.why != "" {
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Errorf("%+v: %v, %v, %v; want an error saying %q", c, p0, p1, err, c.why)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c, err)
			continue
		}
		alone0, _ := planSwap(c.m, c.n0, c.k0, h200.SMs, h200.SharedPerBlock, false)
		alone1, _ := planSwap(c.m, p1.cols(c.n, c.swiglu), c.n0, h200.SMs, h200.SharedPerBlock, c.swiglu)
		if p0 != alone0 || p1 != alone1 || p0.cfg.Rows != 16 {
			t.Errorf("%+v: %v then %v, want linear_swap's own plans %v then %v on the 16-row instance", c, p0, p1, alone0, alone1)
		}
		t.Logf("M=%d %dx%d then %dx%d swiglu=%v: %v; %v (cluster instances: %v, %v)", c.m, c.n0, c.k0, c.n, c.n0, c.swiglu, p0, p1, p0.clusterable(), p1.clusterable())
		// Qwen2-7B's o, down (4 splits) and qkv (3) sum their splits in a
		// cluster; gate/up (whole tiles beside split ones) cannot.
		if c.k0 >= 3584 && (!p0.clusterable() || p1.clusterable() == c.swiglu) {
			t.Errorf("%+v: cluster instances %v then %v, want the first and, without SwiGLU, the second", c, p0.clusterable(), p1.clusterable())
		}
	}
}

// TestLinearSwapWTiled checks w's tensor map layouts without a GPU:
// Qwen2-7B's qkv [4608, 3584] as 128-row boxes of 64 k, and its gate/up
// [37888, 3584] as [2][18944][3584] (the up rows a plane 18944 rows on),
// boxes of 8 gate rows and their 8 up rows; both 128-byte swizzled.
func TestLinearSwapWTiled(t *testing.T) {
	for _, c := range []struct {
		n, k, pitch int
		swiglu      bool
		dims        []uint64
		strides     []uint64
		box         []uint32
	}{
		{n: 4608, k: 3584, pitch: 3584, dims: []uint64{3584, 4608}, strides: []uint64{7168}, box: []uint32{64, 128}},
		{n: 37888, k: 3584, pitch: 3584, swiglu: true, dims: []uint64{3584, 18944, 2}, strides: []uint64{7168, 18944 * 7168}, box: []uint32{64, 8, 2}},
		{n: 600, k: 520, pitch: 528, swiglu: true, dims: []uint64{520, 300, 2}, strides: []uint64{1056, 300 * 1056}, box: []uint32{64, 8, 2}},
	} {
		got := swapWTiled(0x1000, c.pitch, c.n, c.k, c.swiglu)
		if got.Addr != 0x1000 || got.Elem != 2 || !slices.Equal(got.Dims, c.dims) || !slices.Equal(got.Strides, c.strides) ||
			!slices.Equal(got.Box, c.box) || got.Swizzle != hopperSwizzle {
			t.Errorf("w [%d, %d] pitch %d swiglu=%v: %+v, want dims %v strides %v box %v", c.n, c.k, c.pitch, c.swiglu, got, c.dims, c.strides, c.box)
		}
	}
}
