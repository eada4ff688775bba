package kerneltest

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/fuselm/fuselm/kernels"
)

// cases are the check cases Run walks, those of table's rows in order:
// every op at sizes that are multiples of no tile (rows 1, 3, 17, 129; head
// dims 64, 96, 128; cache lengths 1 to 300), with pitched views where the
// op allows them. Feature dims are multiples of
// 8, so a row of 16-bit values always starts on a 16-byte boundary; ops
// taking weights run once per weight dtype in wdts.
func cases(wdts []kernels.DType) []opCase {
	l := &caseList{wdts: wdts}
	for _, row := range table {
		l.op = row.op
		row.checks(l)
	}
	return l.cs
}

// caseList collects the check cases of table's rows, each row's checks
// adding the cases of its op.
type caseList struct {
	op   kernels.Op // the op whose cases are being added
	wdts []kernels.DType
	cs   []opCase
}

// add is a case of the op, its weights (if any) bf16.
func (l *caseList) add(name string, run func(e *env)) {
	l.addCase(opCase{name: name, wdt: kernels.BF16, run: run})
}

// addLong is a case of minutes on a cpu device: GPUs only.
func (l *caseList) addLong(name string, run func(e *env)) {
	l.addCase(opCase{name: name, wdt: kernels.BF16, run: run, long: true})
}

// addW is a case once per weight dtype, named for it.
func (l *caseList) addW(name string, run func(e *env)) {
	for _, w := range l.wdts {
		l.addCase(opCase{name: name + ",w=" + w.String(), wdt: w, run: run})
	}
}

// addWDeclinable is addW for a case a set may decline (opCase.declinable),
// long (GPUs only) where asked.
func (l *caseList) addWDeclinable(name string, long bool, run func(e *env)) {
	for _, w := range l.wdts {
		l.addCase(opCase{name: name + ",w=" + w.String(), wdt: w, long: long, declinable: true, run: run})
	}
}

// addCase is c, a case of the op.
func (l *caseList) addCase(c opCase) {
	c.op = l.op
	l.cs = append(l.cs, c)
}

// embeddingChecks are tables of 37 to 1000 rows, their first and last ids
// among those looked up.
func embeddingChecks(l *caseList) {
	for _, s := range []struct{ n, d, v int }{{1, 64, 37}, {3, 96, 1000}, {17, 200, 1000}, {129, 128, 50}} {
		l.addW(fmt.Sprintf("N=%d,D=%d,V=%d", s.n, s.d, s.v), func(e *env) { embedding(e, s.n, s.d, s.v) })
	}
}

// linearChecks are pitched inputs and outputs, bias and f32 out, then every
// row count of a decode step (decodeLinearCases) and prefill's projections
// (prefillLinearCases).
func linearChecks(l *caseList) {
	for _, s := range []linearCase{
		{n: 1, k: 64, m: 96},
		{n: 3, k: 128, m: 200, bias: true},
		{n: 17, k: 96, m: 72, pitchedX: true, pitchedOut: true},
		{n: 129, k: 200, m: 264, bias: true, pitchedX: true},
		{n: 64, k: 512, m: 136, pitchedOut: true},
		{n: 17, k: 128, m: 1000, f32Out: true},
		{n: 5, k: 64, m: 40, bias: true, pitchedX: true, pitchedOut: true, f32Out: true},
		{n: 4, k: 100, m: 50, bias: true}, // K a multiple of no 16-byte load: fused leaves it to cuBLAS
	} {
		l.addW(s.String(), func(e *env) { linear(e, s) })
	}
	for _, s := range decodeLinearCases() {
		for _, w := range l.wdts {
			l.addCase(opCase{name: s.String() + ",w=" + w.String(), wdt: w,
				run: func(e *env) { linear(e, s) }, long: s.n*s.k*s.m > 1<<24})
		}
	}
	for _, s := range prefillLinearCases() {
		for _, w := range l.wdts {
			l.addCase(opCase{name: s.String() + ",w=" + w.String(), wdt: w,
				run: func(e *env) { linear(e, s) }, long: s.n*s.k*s.m > 1<<30})
		}
	}
}

// rmsNormChecks are out of place, in place, into a column slice and in
// place on a column slice.
func rmsNormChecks(l *caseList) {
	for _, s := range []struct {
		n, d int
		mode string
	}{{1, 64, "out"}, {3, 96, "in-place"}, {17, 200, "pitched"}, {129, 128, "out"}, {33, 512, "pitched"}, {5, 3584, "out"}, {3, 2048, "in-place"},
		{1, 512, "in-place, pitched"}, {17, 32, "in-place, pitched"}} {
		l.addW(fmt.Sprintf("%s,N=%d,D=%d", s.mode, s.n, s.d), func(e *env) { rmsNorm(e, s.n, s.d, s.mode) })
	}
}

// addRMSNormChecks add into the residual, x whole or a column slice.
func addRMSNormChecks(l *caseList) {
	for _, s := range []struct {
		n, d int
		mode string
	}{{17, 96, "add"}, {1, 128, "add"}, {129, 200, "add"}, {5, 3584, "add"}, {33, 2048, "add"}, {17, 520, "add, pitched"}} {
		l.addW(fmt.Sprintf("%s,N=%d,D=%d", s.mode, s.n, s.d), func(e *env) { rmsNorm(e, s.n, s.d, s.mode) })
	}
}

// addChecks write a new tensor or either input.
func addChecks(l *caseList) {
	for _, s := range []struct {
		n, d int
		mode string
	}{{1, 64, "out"}, {3, 96, "out=a"}, {17, 200, "out=b"}, {129, 128, "out"}} {
		l.add(fmt.Sprintf("%s,N=%d,D=%d", s.mode, s.n, s.d), func(e *env) { addOp(e, s.n, s.d, s.mode) })
	}
}

// addAddRMSNormChecks are two addends summed into the residual and
// normalised, as the MoE's routed and shared experts' outputs join the
// next norm: DeepSeek-V2-Lite's hidden size at decode's 1, 9 and 16 rows,
// Qwen2-7B's at 16, small rows, rows of no 16-byte multiple, y a column
// slice; then x starting off a 16-byte boundary where out, w and resid
// start on one, which a set whose one pass reads them alike declines (the
// Dispatch then runs add and add_rms_norm).
func addAddRMSNormChecks(l *caseList) {
	for _, s := range []addAddCase{
		{n: 1, d: 2048}, {n: 9, d: 2048}, {n: 16, d: 2048}, {n: 16, d: 3584}, {n: 3, d: 96}, {n: 129, d: 200},
		{n: 5, d: 100}, {n: 17, d: 520, yCol: 8},
	} {
		l.addW(s.String(), func(e *env) { addAddRMSNorm(e, s) })
	}
	odd := addAddCase{n: 9, d: 2048, xCol: 1}
	l.addWDeclinable(odd.String(), false, func(e *env) { addAddRMSNorm(e, odd) })
}

// ropeChecks are the models' q and k heads as column slices of qkv,
// rotate_half and interleaved, whole and partial.
func ropeChecks(l *caseList) {
	for _, s := range []ropeCase{
		{name: "qwen2 q of qkv", t: 17, heads: 4, stride: 128, dim: 128, width: 8 * 128, col: 0},
		{name: "qwen2 k of qkv", t: 3, heads: 2, stride: 128, dim: 128, width: 8 * 128, col: 4 * 128},
		{name: "D=64", t: 1, heads: 3, stride: 64, dim: 64, width: 3 * 64},
		{name: "D=96 partial", t: 129, heads: 2, stride: 96, dim: 32, width: 2 * 96},
		{name: "interleaved D=64", t: 3, heads: 2, stride: 64, dim: 64, width: 2 * 64, interleaved: true},
		{name: "deepseek q_pe", t: 17, heads: 3, stride: 192, offset: 128, dim: 64, width: 3 * 192, interleaved: true},
		{name: "deepseek k_pe", t: 129, heads: 1, stride: 576, offset: 512, dim: 64, width: 576, interleaved: true},
		// DeepSeek-V2-Lite's q_kv_a row (q_proj's 16 heads of 192, then
		// kv_a_proj_with_mqa's 576): q_pe and k_pe rotated where they lie.
		{name: "v2-lite q_pe of q_kv_a", t: 17, heads: 16, stride: 192, offset: 128, dim: 64, width: 16*192 + 576, interleaved: true},
		{name: "v2-lite q_pe of q_kv_a", t: 1, heads: 16, stride: 192, offset: 128, dim: 64, width: 16*192 + 576, interleaved: true},
		{name: "v2-lite k_pe of q_kv_a", t: 129, heads: 1, stride: 576, offset: 512, dim: 64, width: 16*192 + 576, col: 16 * 192, interleaved: true},
		{name: "v2-lite k_pe of q_kv_a", t: 1, heads: 1, stride: 576, offset: 512, dim: 64, width: 16*192 + 576, col: 16 * 192, interleaved: true},
	} {
		l.add(fmt.Sprintf("%s,T=%d", s.name, s.t), func(e *env) { rope(e, s) })
	}
}

// swiGLUChecks are rows of gate and up of several widths.
func swiGLUChecks(l *caseList) {
	for _, s := range []struct{ n, i int }{{1, 64}, {3, 96}, {17, 200}, {129, 1408}} {
		l.add(fmt.Sprintf("N=%d,I=%d", s.n, s.i), func(e *env) { swiGLU(e, s.n, s.i) })
	}
}

// linearSwiGLUChecks are decode's rows (1 to 64) and prefill's hundreds at
// sizes of no tile (K and I multiples of no GEMM tile, I of no 64-column
// output box), pitched x and out, an I and a K that are no multiple of 8
// (no 16-byte rows: fused leaves them to the unfused pair), Qwen2-7B's
// gate_up and DeepSeek-V2-Lite's shared experts with the model's dims
// divided by 8 (Qwen2's I by 16), and Qwen2-7B's whole at 1,000 rows (long:
// GPUs only). A set that fuses the pair for some shapes only declines the
// others (the Dispatch then runs linear and swiglu, whose own cases hold
// them): those cases are skipped for it.
func linearSwiGLUChecks(l *caseList) {
	for _, s := range []linearSwiGLUCase{
		{n: 1, k: 64, i: 48},
		{n: 3, k: 128, i: 100, pitchedX: true},
		{n: 16, k: 3584 / 8, i: 18944 / 16},
		{n: 17, k: 96, i: 200, pitchedOut: true},
		{n: 129, k: 200, i: 264, pitchedX: true, pitchedOut: true},
		{n: 5, k: 100, i: 52},
		{n: 129, k: 2048 / 8, i: 2 * 1408 / 8},
		{n: 13, k: 520, i: 300},                 // a decode batch, I of no 64-column tile
		{n: 33, k: 264, i: 200, pitchedX: true}, // 17 to 64 rows (fused's linear_swap: 64 token rows)
		{n: 64, k: 2048 / 8, i: 2 * 1408 / 8, pitchedOut: true},
		{n: 300, k: 520, i: 1000},
		{n: 677, k: 3584 / 8, i: 18944 / 16},
	} {
		l.addWDeclinable(s.String(), false, func(e *env) { linearSwiGLU(e, s) })
	}
	whole := linearSwiGLUCase{n: 1000, k: 3584, i: 18944}
	l.addWDeclinable(whole.String(), true, func(e *env) { linearSwiGLU(e, whole) })
}

// rmsNormRoPEChecks are MLA's norm and ropes at DeepSeek-V2-Lite's dims
// (16 heads, nope 128, rope 64, rank 512) over decode's and prefill's
// token counts, q and kv as the column slices of one q_kv_a row (the
// stacked projection without q LoRA) or each packed apart (with q LoRA),
// then rotate_half pairs at smaller dims and a latent of a width no
// 16-byte access divides, which a set that fuses the op for some shapes
// only may decline (the Dispatch then runs rms_norm and rope, whose own
// cases hold them).
func rmsNormRoPEChecks(l *caseList) {
	v2 := func(t int, stacked bool) normRopeCase {
		return normRopeCase{t: t, heads: 16, nope: 128, rope: 64, rank: 512, interleaved: true, stacked: stacked}
	}
	for _, s := range []normRopeCase{
		v2(1, true), v2(3, true), v2(16, true), v2(37, true), v2(2049, true),
		v2(1, false), v2(3, false), v2(16, false), v2(37, false),
		{t: 17, heads: 3, nope: 32, rope: 16, rank: 96, stacked: true},
	} {
		l.addW(s.String(), func(e *env) { rmsNormRoPE(e, s) })
	}
	odd := normRopeCase{t: 5, heads: 3, nope: 16, rope: 16, rank: 36, interleaved: true, stacked: true}
	l.addWDeclinable(odd.String(), false, func(e *env) { rmsNormRoPE(e, odd) })
}

// linearAddChecks are decode's rows (1, 3, 16) with and without bias, N
// of no tile, pitched x, pitched out (and addend, at another pitch), out
// aliasing addend (the MoE's out += shared experts, a column slice too),
// DeepSeek-V2-Lite's shared experts' down projection with the model's dims
// divided by 8, prefill's hundreds of rows, and a K that is no multiple of
// 32 (fused leaves it to its parts). A set that fuses the pair for some
// shapes only declines the others (the Dispatch then runs linear and add,
// whose own cases hold them): those cases are skipped for it.
func linearAddChecks(l *caseList) {
	for _, s := range []linearAddCase{
		{n: 1, k: 256, m: 200},
		{n: 1, k: 2816 / 8, m: 2048 / 8, bias: true, inPlace: true},
		{n: 3, k: 128, m: 1000, bias: true, pitchedX: true},
		{n: 3, k: 96, m: 72, inPlace: true, pitchedOut: true},
		{n: 16, k: 2816 / 8, m: 2048 / 8, inPlace: true},
		{n: 16, k: 512, m: 136, bias: true, pitchedX: true, pitchedOut: true},
		{n: 16, k: 64, m: 40, bias: true, inPlace: true, pitchedX: true, pitchedOut: true},
		{n: 5, k: 100, m: 52, bias: true},
		{n: 129, k: 200, m: 264, bias: true, inPlace: true},
	} {
		l.addWDeclinable(s.String(), false, func(e *env) { linearAdd(e, s) })
	}
}

// normLinearChecks are decode's rows (1, 3, 16) and prefill's hundreds,
// with and without bias, pitched out, rows whose norm a block of rms_norm
// takes in 64 to 1,024 threads (K = 96 to 8,192: fused's one-kernel
// version sums the squares as rms_norm's kernel does, whatever its own
// block), K a multiple of 32 but not of 64, Qwen2-7B's qkv whole at one
// row, and a K that is no multiple of 32 (fused leaves it to the parts).
// A set that fuses the op for some shapes only declines the others (the
// Dispatch then runs add_rms_norm and linear, whose own cases hold them):
// those cases are skipped for it.
func normLinearChecks(l *caseList) {
	for _, s := range []normLinearCase{
		{n: 1, k: 256, m: 200},
		{n: 1, k: 3584, m: 4608, bias: true},
		{n: 1, k: 2048, m: 300, pitchedOut: true},
		{n: 3, k: 96, m: 72, bias: true},
		{n: 16, k: 3584 / 8, m: 4608 / 8, bias: true},
		{n: 2, k: 5120, m: 64},
		{n: 1, k: 8192, m: 40, bias: true},
		{n: 5, k: 100, m: 52, bias: true},
		{n: 129, k: 200, m: 264, bias: true, pitchedOut: true},
	} {
		l.addWDeclinable(s.String(), false, func(e *env) { normLinear(e, s) })
	}
}

// addAddNormLinearChecks are add_add_rms_norm_linear's: DeepSeek-V2-Lite's
// q+kv_a after the MoE at 16 and 9 rows (whole, and with its outputs
// divided by 8), a row, rows a set may decline (more than 16, x off the
// norm's access width), and small dims of no tile.
func addAddNormLinearChecks(l *caseList) {
	for _, s := range []addAddNormLinearCase{
		{n: 16, k: 2048, m: 3648},
		{n: 9, k: 2048, m: 3648 / 8, bias: true},
		{n: 1, k: 2048, m: 576},
		{n: 16, k: 2048, m: 3648 / 8, pitchedOut: true},
		{n: 3, k: 96, m: 72, bias: true},
		{n: 5, k: 100, m: 52},
		{n: 17, k: 256, m: 200},
		{n: 16, k: 2048, m: 456, xCol: 1},
	} {
		l.addWDeclinable(s.String(), false, func(e *env) { addAddNormLinear(e, s) })
	}
}

// normSwiGLUChecks are add_rms_norm_linear_swiglu's: normLinearChecks'
// kinds of rows and K, m the output columns (w's gate and up rows 2m),
// Qwen2-7B's MLP with its dims divided by 8 and DeepSeek-V2-Lite's
// shared experts' at one and 16 rows, and Qwen2-7B's whole at one row
// (long: GPUs only).
func normSwiGLUChecks(l *caseList) {
	for _, s := range []normLinearCase{
		{n: 1, k: 256, m: 100},
		{n: 1, k: 3584 / 8, m: 18944 / 8, pitchedOut: true},
		{n: 3, k: 96, m: 40},
		{n: 16, k: 2048, m: 2816 / 8},
		{n: 1, k: 2048, m: 2816},
		{n: 2, k: 5120, m: 64},
		{n: 5, k: 100, m: 52},
		{n: 129, k: 200, m: 264, pitchedOut: true},
	} {
		s.swiglu = true
		l.addWDeclinable(s.String(), false, func(e *env) { normLinear(e, s) })
	}
	whole := normLinearCase{n: 1, k: 3584, m: 18944, swiglu: true}
	l.addWDeclinable(whole.String(), true, func(e *env) { normLinear(e, whole) })
}

// linearNormLinearChecks are linear_add_rms_norm_linear's: Qwen2-7B's
// down_proj and the next layer's qkv with the model's dims divided by 8 at
// 1, 3 and 16 rows (pitched out at 16), first projections with and without
// bias, a K0 and a K that are no multiple of 8 (rows of no 16-byte
// boundary), a K whose norm a block of rms_norm takes in 1,024 threads,
// prefill's hundreds of rows, and Qwen2-7B's whole at one row and at 16
// (long: GPUs only; at 16 rows the fused set's linear_swap pair). A set that fuses the op for some shapes only declines the others
// (the Dispatch then runs linear and add_rms_norm_linear, whose own cases
// hold them): those cases are skipped for it.
func linearNormLinearChecks(l *caseList) {
	const k0, k, m = 18944 / 8, 3584 / 8, 4608 / 8
	for _, s := range []normLinearCase{
		{n: 1, k0: k0, k: k, m: m, bias: true},
		{n: 3, k0: k0, k: k, m: m, bias: true},
		{n: 16, k0: k0, k: k, m: m, bias: true, pitchedOut: true},
		{n: 1, k0: 256, k: 256, m: 200, bias0: true},
		{n: 3, k0: 100, k: 96, m: 72, bias: true},
		{n: 5, k0: 264, k: 100, m: 52, bias0: true, bias: true},
		{n: 2, k0: 520, k: 5120, m: 64},
		{n: 129, k0: 200, k: 136, m: 264, bias: true, pitchedOut: true},
	} {
		l.addWDeclinable(s.String(), false, func(e *env) { normLinear(e, s) })
	}
	for _, whole := range []normLinearCase{{n: 1, k0: 18944, k: 3584, m: 4608, bias: true}, {n: 16, k0: 18944, k: 3584, m: 4608, bias: true}} {
		l.addWDeclinable(whole.String(), true, func(e *env) { normLinear(e, whole) })
	}
}

// linearNormSwiGLUChecks are linear_add_rms_norm_linear_swiglu's:
// linearNormLinearChecks' kinds of rows and K, m the output columns (w's
// gate and up rows 2m), with Qwen2-7B's o_proj and the MLP after it
// divided by 8, and whole at one row and at 16 (long: GPUs only; at 16
// rows the fused set's linear_swap pair).
func linearNormSwiGLUChecks(l *caseList) {
	const k0, k, m = 3584 / 8, 3584 / 8, 18944 / 8
	for _, s := range []normLinearCase{
		{n: 1, k0: k0, k: k, m: m},
		{n: 3, k0: k0, k: k, m: m, pitchedOut: true},
		{n: 16, k0: k0, k: k, m: m},
		{n: 1, k0: 256, k: 256, m: 100, bias0: true},
		{n: 3, k0: 100, k: 96, m: 40},
		{n: 5, k0: 96, k: 100, m: 52, bias0: true},
		{n: 2, k0: 512, k: 5120, m: 64},
		{n: 129, k0: 200, k: 200, m: 264, pitchedOut: true},
	} {
		s.swiglu = true
		l.addWDeclinable(s.String(), false, func(e *env) { normLinear(e, s) })
	}
	for _, whole := range []normLinearCase{{n: 1, k0: 3584, k: 3584, m: 18944, swiglu: true}, {n: 16, k0: 3584, k: 3584, m: 18944, swiglu: true}} {
		l.addWDeclinable(whole.String(), true, func(e *env) { normLinear(e, whole) })
	}
}

// attnPrefillChecks are ragged batches over caches of NaN beyond each
// row, causal or not, in bf16 and in f16.
func attnPrefillChecks(l *caseList) {
	for _, s := range []attnCase{
		{name: "one token, cache 1", lens: []int{1}, past: []int{0}, heads: 2, kv: 2, d: 64, maxSeq: 1},
		{name: "gqa 2", lens: []int{5, 17, 1}, past: []int{0, 3, 130}, heads: 4, kv: 2, d: 128, maxSeq: 160, fused: true},
		{name: "gqa 7", lens: []int{129, 40}, past: []int{0, 260}, heads: 7, kv: 1, d: 96, maxSeq: 300, fused: true},
		{name: "qwen2-7b heads", lens: []int{33, 2}, past: []int{64, 298}, heads: 28, kv: 4, d: 128, maxSeq: 300, fused: true},
		{name: "row without new tokens", lens: []int{0, 9}, past: []int{12, 0}, heads: 4, kv: 4, d: 64, maxSeq: 24},
		{name: "tiles", lens: []int{300, 129, 1}, past: []int{0, 77, 511}, heads: 8, kv: 2, d: 128, maxSeq: 520, fused: true},
		{name: "D=64 past", lens: []int{200, 65}, past: []int{50, 0}, heads: 4, kv: 4, d: 64, maxSeq: 256},
		{name: "tiny heads", lens: []int{5, 17}, past: []int{3, 0}, heads: 4, kv: 2, d: 16, maxSeq: 24, fused: true},
		{name: "D=80", lens: []int{70}, past: []int{10}, heads: 2, kv: 1, d: 80, maxSeq: 90},
		{name: "all keys", lens: []int{5, 17, 1}, past: []int{0, 3, 130}, heads: 4, kv: 2, d: 128, maxSeq: 160, nonCausal: true},
		{name: "all keys, tiles", lens: []int{300, 129}, past: []int{0, 77}, heads: 8, kv: 2, d: 64, maxSeq: 520, fused: true, nonCausal: true},
	} {
		l.add(s.String(), func(e *env) { attention(e, s, false) })
	}
	for _, s := range []attnCase{
		{name: "long past", lens: []int{40, 3}, past: []int{16400, 70}, heads: 7, kv: 1, d: 128, maxSeq: 16440, fused: true},
		{name: "2K prompt", lens: []int{2049}, past: []int{0}, heads: 4, kv: 1, d: 128, maxSeq: 2100},
		// Over 16K keys with every row's keys seen, and at head dim 64 (the
		// Hopper kernel's other instance; its tiles are 128 queries and keys).
		{name: "long past, all keys", lens: []int{130, 7}, past: []int{16300, 0}, heads: 4, kv: 2, d: 128, maxSeq: 16500, nonCausal: true},
		{name: "D=64 long past", lens: []int{200}, past: []int{16390}, heads: 2, kv: 1, d: 64, maxSeq: 16600, fused: true},
	} {
		l.addLong(s.String(), func(e *env) { attention(e, s, false) })
	}
	// f16 operands (kbench's fp16 rows) against the cpu set's f32 on the
	// same values; a set whose kernels do not take them declines.
	for _, s := range []attnCase{
		{name: "gqa 2", lens: []int{5, 17, 1}, past: []int{0, 3, 130}, heads: 4, kv: 2, d: 128, maxSeq: 160, fused: true},
		{name: "tiles", lens: []int{300, 129, 1}, past: []int{0, 77, 511}, heads: 8, kv: 2, d: 128, maxSeq: 520, fused: true},
		{name: "all keys, tiles", lens: []int{300, 129}, past: []int{0, 77}, heads: 8, kv: 2, d: 64, maxSeq: 520, fused: true, nonCausal: true},
		{name: "D=64 past", lens: []int{200, 65}, past: []int{50, 0}, heads: 4, kv: 4, d: 64, maxSeq: 256},
		{name: "long past, all keys", lens: []int{130, 7}, past: []int{16300, 0}, heads: 4, kv: 2, d: 128, maxSeq: 16500, nonCausal: true, long: true},
		{name: "D=64 long past", lens: []int{200}, past: []int{16390}, heads: 2, kv: 1, d: 64, maxSeq: 16600, fused: true, long: true},
	} {
		s.f16 = true
		l.addCase(opCase{name: s.String(), wdt: kernels.BF16, long: s.long, declinable: true,
			run: func(e *env) { attention(e, s, false) }})
	}
}

// attnDecodeChecks are ragged batches of one token per row.
func attnDecodeChecks(l *caseList) {
	for _, s := range []attnCase{
		{name: "cache 1", past: []int{0}, heads: 2, kv: 2, d: 64, maxSeq: 1},
		{name: "gqa 2", past: []int{0, 7, 299}, heads: 4, kv: 2, d: 128, maxSeq: 300},
		{name: "gqa 7", past: []int{1, 150}, heads: 7, kv: 1, d: 96, maxSeq: 200, fused: true},
		{name: "qwen2-7b batch 16", past: spread(16, 300), heads: 28, kv: 4, d: 128, maxSeq: 300, fused: true},
		{name: "D=64 ragged", past: []int{1023, 4, 600, 1}, heads: 8, kv: 2, d: 64, maxSeq: 1030},
		{name: "D=32", past: []int{0, 9, 20}, heads: 4, kv: 2, d: 32, maxSeq: 24},
		{name: "D=80 group 5", past: []int{77, 130}, heads: 10, kv: 2, d: 80, maxSeq: 131},
	} {
		s.lens = ones(len(s.past))
		l.add(s.String(), func(e *env) { attention(e, s, true) })
	}
	for _, s := range []attnCase{
		{name: "qwen2-7b 16K", past: []int{16383, 9000, 1, 16500}, heads: 28, kv: 4, d: 128, maxSeq: 16501, fused: true},
		{name: "qwen2-7b 32K batch 1", past: []int{32760}, heads: 28, kv: 4, d: 128, maxSeq: 32768, fused: true},
	} {
		s.lens = ones(len(s.past))
		l.addLong(s.String(), func(e *env) { attention(e, s, true) })
	}
}

// ropeAttnDecodeChecks are Qwen2's decode step as its layer calls it: the
// q and k heads of the stacked qkv row unrotated, rotated over all their
// dims in rotate_half pairs and attended in one op, at 1, 3 and 16 rows
// over caches of 1 key to a few thousand, Qwen2-7B's heads and a small
// GQA; q, k and v packed apart (the parts then rotate q and k in two
// calls); then rotations fused declines (interleaved pairs, part of each
// head), which the Dispatch runs as rope and attn_decode.
func ropeAttnDecodeChecks(l *caseList) {
	q7 := func(name string, past ...int) attnCase {
		return attnCase{name: name, past: past, heads: 28, kv: 4, d: 128, maxSeq: slices.Max(past) + 1, fused: true, rope: 128}
	}
	for _, s := range []attnCase{
		q7("qwen2-7b cache 1", 0),
		q7("qwen2-7b batch 3", 299, 0, 150),
		q7("qwen2-7b batch 16", spread(16, 300)...),
		q7("qwen2-7b 3K", 3071),
		q7("qwen2-7b batch 3 3K", 3071, 1, 2500),
		{name: "gqa 2", past: []int{0, 7, 299}, heads: 4, kv: 2, d: 64, maxSeq: 300, fused: true, rope: 64},
		{name: "gqa 4 apart", past: []int{5, 40, 0}, heads: 8, kv: 2, d: 64, maxSeq: 41, rope: 64},
		{name: "D=80 group 5", past: []int{77, 130}, heads: 10, kv: 2, d: 80, maxSeq: 131, fused: true, rope: 80},
	} {
		s.lens = ones(len(s.past))
		l.add(s.String(), func(e *env) { attention(e, s, true) })
	}
	for _, s := range []attnCase{
		{name: "interleaved", past: []int{3, 60}, heads: 4, kv: 2, d: 64, maxSeq: 64, fused: true, rope: 64, interleaved: true},
		{name: "half the dims", past: []int{3, 60}, heads: 4, kv: 2, d: 64, maxSeq: 64, fused: true, rope: 32},
	} {
		s.lens = ones(len(s.past))
		l.addCase(opCase{name: s.String(), declinable: true, run: func(e *env) { attention(e, s, true) }})
	}
}

// mlaPrefillChecks are ragged batches at head dims fused has kernels for.
func mlaPrefillChecks(l *caseList) {
	// MLA head dims are ones fused has kernels for (multiples of 16, the
	// mma's k; see kernels/fused/mla.go), the sizes multiples of no tile.
	for _, s := range []mlaCase{
		{name: "small", lens: []int{3, 1}, past: []int{0, 5}, heads: 2, nope: 16, rope: 16, v: 16, rank: 32, maxSeq: 8},
		{name: "odd", lens: []int{17, 5, 1}, past: []int{0, 40, 130}, heads: 3, nope: 32, rope: 16, v: 32, rank: 96, maxSeq: 160, pitched: true},
		{name: "v2-lite dims", lens: []int{33, 2}, past: []int{0, 298}, heads: 2, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300},
		{name: "v2-lite heads", lens: []int{129}, past: []int{0}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 129, pitched: true},
		{name: "ragged past", lens: []int{70, 1, 129, 0}, past: []int{200, 0, 33, 9}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300, pitched: true},
		{name: "5 heads", lens: []int{40, 17}, past: []int{0, 77}, heads: 5, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 120},
		{name: "small", lens: []int{3, 1}, past: []int{0, 5}, heads: 2, nope: 16, rope: 16, v: 16, rank: 32, maxSeq: 8, stacked: true},
		{name: "odd", lens: []int{17, 5, 1}, past: []int{0, 40, 130}, heads: 3, nope: 32, rope: 16, v: 32, rank: 96, maxSeq: 160, stacked: true},
		{name: "v2-lite", lens: []int{129, 5}, past: []int{0, 200}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300, stacked: true},
		// Runs of rows with as many positions (one prompt repeated, as W4's
		// rows), which a set may decompress in one batched GEMM.
		{name: "equal rows", lens: []int{33, 33, 33, 7, 7}, past: []int{0, 0, 0, 20, 20}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 64, stacked: true},
		// Rows of close lengths (distinct prompts, as W5's), which a set may
		// decompress in one batched GEMM padded to the longest.
		{name: "close rows", lens: []int{30, 33, 28, 31}, past: []int{0, 0, 0, 0}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 40, stacked: true},
		{name: "close rows after a past", lens: []int{20, 17, 19}, past: []int{10, 15, 12}, heads: 3, nope: 32, rope: 16, v: 32, rank: 96, maxSeq: 50, pitched: true},
	} {
		l.addW(s.String(), func(e *env) { mla(e, s, false) })
	}
	for _, s := range []mlaCase{
		{name: "2K prompt after a past", lens: []int{2049, 130}, past: []int{0, 1500}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 2100},
	} {
		l.addLong(s.String(), func(e *env) { mla(e, s, false) })
	}
}

// mlaDecodeChecks are ragged batches of one token per row.
func mlaDecodeChecks(l *caseList) {
	for _, s := range []mlaCase{
		{name: "small", past: []int{0, 7}, heads: 2, nope: 16, rope: 16, v: 16, rank: 32, maxSeq: 8},
		{name: "odd", past: []int{0, 1, 159}, heads: 3, nope: 32, rope: 16, v: 32, rank: 96, maxSeq: 160, pitched: true},
		{name: "v2-lite batch 16", past: spread(16, 300), heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300},
		{name: "batch 16 ragged, 10 heads", past: []int{400, 3, 211, 0, 96, 350, 1, 257, 33, 312, 199, 64, 377, 128, 300, 15},
			heads: 10, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 401, pitched: true},
		{name: "small", past: []int{0, 1, 7}, heads: 2, nope: 16, rope: 16, v: 16, rank: 32, maxSeq: 8, stacked: true},
		{name: "v2-lite batch 1", past: []int{250}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300, stacked: true},
		{name: "v2-lite batch 16", past: spread(16, 300), heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 300, stacked: true},
	} {
		s.lens = ones(len(s.past))
		l.addW(s.String(), func(e *env) { mla(e, s, true) })
	}
	for _, s := range []mlaCase{
		{name: "v2-lite 16K", past: []int{16383, 9000, 1, 16500}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 16501},
		{name: "v2-lite 32K batch 1", past: []int{32760}, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 32768},
		{name: "batch 16 ragged 16K, 7 heads", past: []int{16383, 4097, 0, 12000, 64, 16000, 8191, 1, 9999, 333, 15000, 2048, 700, 16383, 5000, 11111},
			heads: 7, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: 16384, pitched: true},
	} {
		s.lens = ones(len(s.past))
		l.addLong(s.String(), func(e *env) { mla(e, s, true) })
	}
}

// mlaDecodeRoPEChecks are decode's few rows (1, 3, 7: where a set may run
// the norm, the ropes and the attention's first step in one launch) at
// DeepSeek-V2-Lite's dims, over caches of 1 to a few thousand positions,
// q and kv as the column slices of one q_kv_a row or packed apart; then
// 16 rows and smaller dims. A set that fuses the op for some calls only
// declines the others (the Dispatch then runs rms_norm_rope and
// mla_decode, whose own cases hold them).
func mlaDecodeRoPEChecks(l *caseList) {
	v2 := func(name string, past []int, maxSeq int, stacked bool) mlaCase {
		return mlaCase{name: name, past: past, heads: 16, nope: 128, rope: 64, v: 128, rank: 512, maxSeq: maxSeq,
			stacked: stacked, normRope: true}
	}
	for _, s := range []mlaCase{
		v2("v2-lite batch 1, cache 1", []int{0}, 8, true),
		v2("v2-lite batch 1", []int{250}, 300, true),
		v2("v2-lite batch 3", []int{0, 1, 299}, 300, true),
		v2("v2-lite batch 3", []int{7, 140, 33}, 300, false),
		v2("v2-lite batch 7", spread(7, 300), 300, true),
		v2("v2-lite batch 16", spread(16, 300), 300, true),
		{name: "odd", past: []int{0, 1, 159}, heads: 3, nope: 32, rope: 16, v: 32, rank: 96, maxSeq: 160, stacked: true, normRope: true},
	} {
		s.lens = ones(len(s.past))
		l.addWDeclinable(s.String(), false, func(e *env) { mla(e, s, true) })
	}
	for _, s := range []mlaCase{
		v2("v2-lite batch 1 4K", []int{4095}, 4096, true),
		v2("v2-lite batch 3 3K", []int{2999, 1, 1500}, 3000, true),
		v2("v2-lite batch 7 11K", []int{11041, 4096, 0, 9000, 77, 11000, 2048}, 11042, true),
	} {
		s.lens = ones(len(s.past))
		l.addCase(opCase{name: s.String(), wdt: kernels.BF16, long: true, declinable: true, run: func(e *env) { mla(e, s, true) }})
	}
}

// moeRouteChecks are greedy and group-limited routes, then routes with
// exact ties.
func moeRouteChecks(l *caseList) {
	for _, s := range []routeCase{
		{name: "greedy E=64 K=6", n: 17, e: 64, r: kernels.Routing{Method: kernels.RouteGreedy, TopK: 6, Scale: 1}},
		{name: "greedy norm E=8 K=2", n: 129, e: 8, r: kernels.Routing{Method: kernels.RouteGreedy, TopK: 2, NormTopK: true, Scale: 1}},
		{name: "greedy norm E=7 K=1", n: 3, e: 7, r: kernels.Routing{Method: kernels.RouteGreedy, TopK: 1, NormTopK: true, Scale: 1.5}},
		{name: "group-limited E=160 8 groups top 3 K=6", n: 17, e: 160, r: kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, Scale: 16}},
		{name: "group-limited norm E=12 4 groups top 2 K=4", n: 129, e: 12, r: kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 4, Groups: 4, TopKGroups: 2, NormTopK: true, Scale: 2.5}},
		{name: "group-limited E=64 8 groups top 3 K=6", n: 1, e: 64, r: kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, NormTopK: true, Scale: 1}},
	} {
		l.add(fmt.Sprintf("%s,N=%d", s.name, s.n), func(e *env) { moeRoute(e, s) })
	}
	tied := func(r kernels.Routing) routeCase { return routeCase{r: r} }
	for _, s := range []routeCase{
		tied(kernels.Routing{Method: kernels.RouteGreedy, TopK: 6, Scale: 1}),
		tied(kernels.Routing{Method: kernels.RouteGreedy, TopK: 2, NormTopK: true, Scale: 1}),
		tied(kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 6, Groups: 8, TopKGroups: 3, NormTopK: true, Scale: 1}),
		tied(kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 4, Groups: 4, TopKGroups: 2, Scale: 2.5}),
		tied(kernels.Routing{Method: kernels.RouteGroupLimited, TopK: 8, Groups: 8, TopKGroups: 1, Scale: 1}),
	} {
		s.n, s.e, s.ties = 33, 64, true
		if s.r.Groups == 4 {
			s.e = 12
		}
		s.name = fmt.Sprintf("ties %s E=%d K=%d", routeName(s.r), s.e, s.r.TopK)
		l.add(fmt.Sprintf("%s,N=%d", s.name, s.n), func(e *env) { moeRoute(e, s) })
	}
}

// moeExpertsChecks are random distinct routes, then DeepSeek-V2-Lite's
// own dims at decode and prefill batch sizes.
func moeExpertsChecks(l *caseList) {
	for _, s := range []expertsCase{
		{n: 1, h: 64, inter: 32, e: 4, k: 2},
		{n: 3, h: 96, inter: 72, e: 8, k: 2},
		{n: 17, h: 128, inter: 200, e: 16, k: 6},
		{n: 129, h: 200, inter: 96, e: 64, k: 6},
		{n: 9, h: 512, inter: 352, e: 8, k: 6},
	} {
		l.addW(fmt.Sprintf("N=%d,H=%d,I=%d,E=%d,K=%d", s.n, s.h, s.inter, s.e, s.k), func(e *env) { moeExperts(e, s) })
	}
	// DeepSeek-V2-Lite's routed experts: decode at batch 1 and 16, and a
	// prefill of a few hundred and of 2K tokens (1.1 GB of expert weights: GPUs only).
	for _, n := range []int{1, 16, 300, 2048} { // 2048 tokens: the prefill tiling (188 rows per expert)
		s := expertsCase{n: n, h: 2048, inter: 1408, e: 64, k: 6}
		l.addLong(fmt.Sprintf("v2-lite dims,N=%d", n), func(e *env) { moeExperts(e, s) })
	}
}

// argmaxChecks are rows of one largest value, ties and NaNs, the chosen
// value beside the index.
func argmaxChecks(l *caseList) {
	for _, s := range []struct {
		b, v      int
		k         kind
		ties, nan bool
	}{{1, 37, f32K, false, false}, {3, 1000, actK, false, false}, {16, 32003, f32K, false, false},
		{2, 151936, actK, false, false}, {5, 100, f32K, true, false}, {4, 1001, actK, true, false},
		{3, 500, f32K, false, true}, {2, 3000, actK, true, true},
		// rows of whole 4,096-column chunks, 16-byte aligned: fused's
		// argmax_split loads those by 16 bytes, the ties and NaNs among them
		{3, 40960, f32K, true, true}, {4, 20480, actK, true, false}} {
		dt := "f32"
		if s.k == actK {
			dt = "act"
		}
		name := fmt.Sprintf("B=%d,V=%d,%s", s.b, s.v, dt)
		if s.ties {
			name += ",ties"
		}
		if s.nan {
			name += ",nan"
		}
		l.add(name, func(e *env) { argmax(e, s.b, s.v, s.k, s.ties, s.nan, false) })
		if s.nan || s.v > 30000 || s.ties && s.k == actK {
			l.add(name+",value", func(e *env) { argmax(e, s.b, s.v, s.k, s.ties, s.nan, true) })
		}
	}
}

// decodeAdvanceChecks are one row, a few and a decode batch of 16.
func decodeAdvanceChecks(l *caseList) {
	for _, b := range []int{1, 3, 16} {
		l.add(fmt.Sprintf("B=%d", b), func(e *env) { decodeAdvance(e, b) })
	}
}

func embedding(e *env, n, d, v int) {
	table := e.random(weightK, 1, v, d)
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(e.rng.Intn(v))
	}
	ids[0] = int32(v - 1)
	if n > 1 {
		ids[1] = 0
	}
	id := e.ints(ids, n)
	out := e.poisoned(actK, n, d)
	e.run(func(o kernels.Ops, s int) { o.Embedding(out[s], table[s], id[s]) })
	e.check("out", out, all)
}

type linearCase struct {
	n, k, m                    int
	bias, pitchedX, pitchedOut bool
	f32Out                     bool // out is f32 whatever the activation dtype (the lm_head's logits)
}

func (c linearCase) String() string {
	return linearName(c.n, c.k, c.m, c.bias, c.pitchedX, c.pitchedOut, c.f32Out, "f32 out")
}

// linearName names a linear case: its dims, then the flags it sets of
// bias, pitched x, pitched out and the case's own flag (last, called
// lastName), in that order.
func linearName(n, k, m int, bias, pitchedX, pitchedOut, last bool, lastName string) string {
	s := fmt.Sprintf("N=%d,K=%d,M=%d", n, k, m)
	for _, f := range []struct {
		on   bool
		name string
	}{{bias, "bias"}, {pitchedX, "pitched x"}, {pitchedOut, "pitched out"}, {last, lastName}} {
		if f.on {
			s += "," + f.name
		}
	}
	return s
}

// decodeLinearCases are the projections of a decode step, 1 to 16 rows: K
// a multiple of 8 but not of 32, N of no tile, with and without bias, f32
// out, pitched x and out, and the shapes that make a weight-streaming
// kernel (fused's linear_skinny, on a GPU of 132 SMs) run whole columns,
// split every column over K, and do both in one launch; then batches of 13
// to 64 rows. Those of more than 2²⁴ multiply-adds are long cases (GPUs
// only).
func decodeLinearCases() []linearCase {
	var cs []linearCase
	for n := 1; n <= 16; n++ {
		cs = append(cs, linearCase{n: n, k: 8 * (17 + 5*n), m: 131 + 37*n, bias: n%2 == 1, f32Out: n%4 == 0,
			pitchedX: n%3 == 0, pitchedOut: n%5 == 0})
	}
	return append(cs,
		linearCase{n: 16, k: 1032, m: 1000, bias: true},                  // 8 columns of 128, split over K
		linearCase{n: 3, k: 2056, m: 520, bias: true, pitchedX: true},    // split, the last split short
		linearCase{n: 9, k: 264, m: 17000, bias: true, pitchedOut: true}, // more columns than SMs, whole K
		linearCase{n: 13, k: 520, m: 34000, f32Out: true},                // waves of whole columns, the rest split
		linearCase{n: 1, k: 3584, m: 640, bias: true, f32Out: true},      // a 1-row lm_head-like f32 out
		// Batches of 17 to 64 rows (a swapped-operand kernel's, the token
		// rows wgmma's N: fused's linear_swap), and 13 rows over Qwen2-7B's
		// qkv-like dims off every tile (128 features, 64 k).
		linearCase{n: 24, k: 520, m: 1000, bias: true, pitchedX: true},
		linearCase{n: 33, k: 264, m: 300, pitchedOut: true, f32Out: true},
		linearCase{n: 64, k: 1032, m: 131, bias: true},
		linearCase{n: 13, k: 3576, m: 4600, bias: true},
		linearCase{n: 40, k: 2056, m: 3000, f32Out: true},
	)
}

// prefillLinearCases are the projections of a prefill, hundreds of rows:
// M, N and K multiples of no GEMM tile (300 rows, 1,000 features, 520
// inputs: 2.3 m-tiles of 128, 3.9 n-tiles of 256, 8.1 k-steps of 64), then
// Qwen2-7B's qkv (with its bias), o, gate_up and down with the model's
// features and inputs divided by 8 (gate_up's by 16) over 677 rows, and its
// qkv and down whole at 1,000 rows (long: GPUs only). The cpu set takes
// a fraction of a second over the others.
func prefillLinearCases() []linearCase {
	return []linearCase{
		{n: 300, k: 520, m: 1000, bias: true},
		{n: 677, k: 3584 / 8, m: (3584 + 2*512) / 8, bias: true},             // qkv
		{n: 677, k: 3584 / 8, m: 3584 / 8, pitchedX: true, pitchedOut: true}, // o_proj, x a column slice
		{n: 677, k: 3584 / 8, m: 2 * 18944 / 16},                             // gate_up
		{n: 677, k: 18944 / 16, m: 3584 / 8, pitchedOut: true},               // down
		{n: 1000, k: 3584, m: 3584 + 2*512, bias: true},                      // qkv whole
		{n: 1000, k: 18944, m: 3584},                                         // down whole
	}
}

// Column slices are taken at these offsets of wider matrices.
const (
	xCol   = 8
	outCol = 16
)

// outOperand is an op's output [n, m] of kind k, poisoned: packed, or with
// pitched the columns [outCol, outCol+m) of a wider matrix. whole is what
// a check reads, out what the op writes, written which elements of whole
// those are.
func outOperand(e *env, k kind, n, m int, pitched bool) (whole, out pair, written func(r, col int) bool) {
	whole = e.poisoned(k, n, m)
	if !pitched {
		return whole, whole, all
	}
	whole = e.poisoned(k, n, m+32)
	return whole, whole.cols(outCol, outCol+m), func(r, col int) bool { return col >= outCol && col < outCol+m }
}

// linearInputs are a linear case's x [n, k] (columns of a wider matrix
// where pitchedX), w [m, k] and, where bias, bias [m].
func linearInputs(e *env, n, k, m int, bias, pitchedX bool) (x, w, b pair) {
	x = e.random(actK, 1, n, k)
	if pitchedX {
		x = e.random(actK, 1, n, k+24).cols(xCol, xCol+k)
	}
	w = e.random(weightK, 1/math.Sqrt(float64(k)), m, k)
	if bias {
		b = e.random(weightK, 0.5, m)
	}
	return x, w, b
}

func linear(e *env, c linearCase) {
	x, w, b := linearInputs(e, c.n, c.k, c.m, c.bias, c.pitchedX)
	ok := actK
	if c.f32Out {
		ok = f32K
	}
	whole, out, written := outOperand(e, ok, c.n, c.m, c.pitchedOut)
	e.run(func(o kernels.Ops, s int) { o.Linear(out[s], x[s], w[s], b[s]) })
	e.check("out", whole, written)
}

func rmsNorm(e *env, n, d int, mode string) {
	const eps = 1e-6
	w := e.normWeight(d)
	x := e.random(actK, 3, n, d)
	switch mode {
	case "out":
		out := e.poisoned(actK, n, d)
		e.run(func(o kernels.Ops, s int) { o.RMSNorm(out[s], x[s], w[s], eps) })
		e.check("out", out, all)
		e.check("x", x, all)
	case "in-place":
		e.run(func(o kernels.Ops, s int) { o.RMSNorm(x[s], x[s], w[s], eps) })
		e.check("x", x, all)
	case "pitched": // the latent part of a [N, d+64] kv_a output, into a column slice
		xs := e.random(actK, 3, n, d+64)
		whole := e.poisoned(actK, n, d+32)
		out := whole.cols(outCol, outCol+d)
		e.run(func(o kernels.Ops, s int) { o.RMSNorm(out[s], xs.cols(0, d)[s], w[s], eps) })
		e.check("out", whole, func(r, c int) bool { return c >= outCol && c < outCol+d })
		e.check("x", xs, all)
	case "in-place, pitched": // MLA's latent in its q_kv_a row: q (3 heads of 192) before it, k_pe after
		const q = 3 * 192
		xs := e.random(actK, 3, n, q+d+64)
		x := xs.cols(q, q+d)
		e.run(func(o kernels.Ops, s int) { o.RMSNorm(x[s], x[s], w[s], eps) })
		e.check("x", xs, all)
	case "add":
		resid := e.random(actK, 1, n, d)
		out := e.poisoned(actK, n, d)
		e.run(func(o kernels.Ops, s int) { o.AddRMSNorm(out[s], resid[s], x[s], w[s], eps) })
		e.check("out", out, all)
		e.check("resid", resid, all)
	case "add, pitched": // x a column slice of a wider matrix, as the attention output may be
		xs := e.random(actK, 3, n, d+24)
		resid := e.random(actK, 1, n, d)
		out := e.poisoned(actK, n, d)
		e.run(func(o kernels.Ops, s int) { o.AddRMSNorm(out[s], resid[s], xs.cols(8, 8+d)[s], w[s], eps) })
		e.check("out", out, all)
		e.check("resid", resid, all)
	default:
		panic(mode)
	}
}

func addOp(e *env, n, d int, mode string) {
	a, b := e.random(actK, 1, n, d), e.random(actK, 1, n, d)
	out := e.poisoned(actK, n, d)
	switch mode {
	case "out=a":
		out = a
	case "out=b":
		out = b
	}
	e.run(func(o kernels.Ops, s int) { o.Add(out[s], a[s], b[s]) })
	e.check("out", out, all)
}

// addAddCase is one add_add_rms_norm case: n rows of d, x and y packed, or
// columns [xCol, xCol+d) or [yCol, yCol+d) of a wider matrix where those
// are set.
type addAddCase struct{ n, d, xCol, yCol int }

func (c addAddCase) String() string {
	s := fmt.Sprintf("N=%d,D=%d", c.n, c.d)
	if c.xCol > 0 {
		s += fmt.Sprintf(",x at column %d", c.xCol)
	}
	if c.yCol > 0 {
		s += fmt.Sprintf(",y at column %d", c.yCol)
	}
	return s
}

// residAddend is an addend [n, d] of the residual, random: packed where col is
// 0, else the columns [col, col+d) of a wider matrix (whole).
func residAddend(e *env, n, d, col int) (whole, view pair) {
	if col == 0 {
		whole = e.random(actK, 3, n, d)
		return whole, whole
	}
	whole = e.random(actK, 3, n, d+16)
	return whole, whole.cols(col, col+d)
}

// addAddRMSNorm adds x + y into the residual and normalises it: out and
// resid are its results, y must stay as it was, and x is not checked (the
// parts leave the sum there, a set's one pass may not).
func addAddRMSNorm(e *env, c addAddCase) {
	const eps = 1e-6
	w := e.normWeight(c.d)
	_, x := residAddend(e, c.n, c.d, c.xCol)
	ys, y := residAddend(e, c.n, c.d, c.yCol)
	resid := e.random(actK, 1, c.n, c.d)
	out := e.poisoned(actK, c.n, c.d)
	e.run(func(o kernels.Ops, s int) { o.AddAddRMSNorm(out[s], resid[s], x[s], y[s], w[s], eps) })
	e.check("out", out, all)
	e.check("resid", resid, all)
	e.check("y", ys, all)
}

type normRopeCase struct {
	t, heads, nope, rope, rank int
	interleaved                bool
	// stacked: q and kv are the column slices of one [T, q+kv] matrix, as
	// the model's stacked q_proj and kv_a_proj_with_mqa write them.
	stacked bool
}

func (c normRopeCase) String() string {
	s := fmt.Sprintf("H=%d,nope=%d,rope=%d,rank=%d,T=%d", c.heads, c.nope, c.rope, c.rank, c.t)
	if !c.interleaved {
		s += ",rotate_half"
	}
	if c.stacked {
		s += ",q and kv of q_kv_a"
	}
	return s
}

// rmsNormRoPE normalises kv's latent and rotates q's rope dims and k_pe in
// place; everything else of q and kv must stay as it was.
func rmsNormRoPE(e *env, c normRopeCase) {
	const eps = 1e-6
	w := e.normWeight(c.rank)
	r, ps := e.ropeOperands(c.t, c.rope, c.interleaved)
	qw, kvw := c.heads*(c.nope+c.rope), c.rank+c.rope
	var q, kv, qkva pair
	if c.stacked {
		qkva = e.random(actK, 3, c.t, qw+kvw)
		q, kv = qkva.cols(0, qw), qkva.cols(qw, qw+kvw)
	} else {
		q, kv = e.random(actK, 1, c.t, qw), e.random(actK, 3, c.t, kvw)
	}
	e.run(func(o kernels.Ops, s int) {
		o.RMSNormRoPE(q[s], kv[s], w[s], eps, c.heads, c.nope+c.rope, c.nope, ps[s], r[s])
	})
	// Each piece alone, so that an error in the few rotated columns is not
	// lost in the whole's norm.
	e.check("q", q, all)
	e.check("latent", kv.cols(0, c.rank), all)
	e.check("k_pe", kv.cols(c.rank, kvw), all)
	if c.stacked {
		e.check("q_kv_a", qkva, all)
	}
}

type ropeCase struct {
	name                          string
	t, heads, stride, offset, dim int
	width, col                    int // x is columns [col, col+heads·stride) of a [t, width] matrix
	interleaved                   bool
}

// ropePositions is the size of the angle tables.
const ropePositions = 4096

// ropeOperands are the rotary tables of dim dims over ropePositions, on
// both sides, and t positions in them, the first the table's last.
func (e *env) ropeOperands(t, dim int, interleaved bool) ([2]*kernels.Rope, pair) {
	half := dim / 2
	cos, sin := make([]float32, ropePositions*half), make([]float32, ropePositions*half)
	// An attention factor (as YaRN folds into the tables): kernels must use
	// the tables, not recompute the angles.
	const factor = 1.07
	for p := range ropePositions {
		for i := range half {
			a := float64(p) * math.Pow(10000, -2*float64(i)/float64(dim))
			cos[p*half+i] = float32(math.Cos(a) * factor)
			sin[p*half+i] = float32(math.Sin(a) * factor)
		}
	}
	r := [2]*kernels.Rope{}
	ct, st := e.tensor(f32K, cos, ropePositions, half), e.tensor(f32K, sin, ropePositions, half)
	for s := range 2 {
		r[s] = &kernels.Rope{Dim: dim, Interleaved: interleaved, Cos: ct[s], Sin: st[s]}
	}
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(e.rng.Intn(ropePositions))
	}
	pos[0] = ropePositions - 1
	return r, e.ints(pos, t)
}

func rope(e *env, c ropeCase) {
	r, ps := e.ropeOperands(c.t, c.dim, c.interleaved)
	whole := e.random(actK, 1, c.t, c.width)
	x := whole.cols(c.col, c.col+c.heads*c.stride)
	e.run(func(o kernels.Ops, s int) { o.RoPE(x[s], c.heads, c.stride, c.offset, ps[s], r[s]) })
	e.check("x", whole, all)
}

func swiGLU(e *env, n, i int) {
	gu := e.random(actK, 2, n, 2*i)
	out := e.poisoned(actK, n, i)
	e.run(func(o kernels.Ops, s int) { o.SwiGLU(out[s], gu[s]) })
	e.check("out", out, all)
}

type linearSwiGLUCase struct {
	n, k, i              int // rows, inputs, outputs (w has 2i rows)
	pitchedX, pitchedOut bool
}

func (c linearSwiGLUCase) String() string {
	s := fmt.Sprintf("N=%d,K=%d,I=%d", c.n, c.k, c.i)
	if c.pitchedX {
		s += ",pitched x"
	}
	if c.pitchedOut {
		s += ",pitched out"
	}
	return s
}

// linearSwiGLU is out = swiglu(x·wᵀ) with w's gate rows then its up rows,
// x scaled so that gate spans silu's bend.
func linearSwiGLU(e *env, c linearSwiGLUCase) {
	x := e.random(actK, 2, c.n, c.k)
	if c.pitchedX {
		x = e.random(actK, 2, c.n, c.k+24).cols(xCol, xCol+c.k)
	}
	w := e.random(weightK, 1/math.Sqrt(float64(c.k)), 2*c.i, c.k)
	whole, out, written := outOperand(e, actK, c.n, c.i, c.pitchedOut)
	e.run(func(o kernels.Ops, s int) { o.LinearSwiGLU(out[s], x[s], w[s]) })
	e.check("out", whole, written)
}

type linearAddCase struct {
	n, k, m                    int // rows, inputs, outputs
	bias, pitchedX, pitchedOut bool
	inPlace                    bool // out is addend
}

func (c linearAddCase) String() string {
	return linearName(c.n, c.k, c.m, c.bias, c.pitchedX, c.pitchedOut, c.inPlace, "out=addend")
}

// linearAdd is out = (x·wᵀ + bias) + addend, out either addend or a tensor
// of its own (poisoned); pitched out takes columns of a wider matrix, and
// a separate addend columns of another.
func linearAdd(e *env, c linearAddCase) {
	x, w, b := linearInputs(e, c.n, c.k, c.m, c.bias, c.pitchedX)
	if c.inPlace {
		whole := e.random(actK, 1, c.n, c.m)
		out := whole
		if c.pitchedOut {
			whole = e.random(actK, 1, c.n, c.m+32)
			out = whole.cols(outCol, outCol+c.m)
		}
		e.run(func(o kernels.Ops, s int) { o.LinearAdd(out[s], x[s], w[s], b[s], out[s]) })
		e.check("out", whole, all)
		return
	}
	addends, addend := e.random(actK, 1, c.n, c.m), pair{}
	whole, out, written := outOperand(e, actK, c.n, c.m, c.pitchedOut)
	addend = addends
	if c.pitchedOut {
		addends = e.random(actK, 1, c.n, c.m+16)
		addend = addends.cols(xCol, xCol+c.m)
	}
	e.run(func(o kernels.Ops, s int) { o.LinearAdd(out[s], x[s], w[s], b[s], addend[s]) })
	e.check("out", whole, written)
	e.check("addend", addends, all)
}

type normLinearCase struct {
	n, k, m          int // rows, inputs, outputs (with swiglu: output columns, w's 2m rows)
	bias, pitchedOut bool
	swiglu           bool // add_rms_norm_linear_swiglu (no bias)
	// k0 > 0 makes it linear_add_rms_norm_linear (with swiglu, its SwiGLU
	// twin): the norm's input is then mid, which the op writes from a
	// first projection of x [n,k0] (with bias0).
	k0    int
	bias0 bool
}

func (c normLinearCase) String() string {
	s := linearName(c.n, c.k, c.m, c.bias, false, c.pitchedOut, false, "")
	if c.k0 > 0 {
		s += fmt.Sprintf(",K0=%d", c.k0)
	}
	if c.bias0 {
		s += ",bias0"
	}
	return s
}

// normLinear is resid += x; out = RMSNorm(resid)·wᵀ + bias (with swiglu,
// out = swiglu(RMSNorm(resid)·wᵀ)); with k0, x is mid = x0·w0ᵀ + bias0,
// poisoned before the op writes it. h, where the parts leave the norm, is
// poisoned and not checked (a set that runs the op whole may leave it);
// out (poisoned, pitched: columns of a wider matrix), resid and mid are.
func normLinear(e *env, c normLinearCase) {
	const eps = 1e-6
	norm := e.normWeight(c.k)
	var x, x0, w0, b0 pair
	xName := "x"
	if c.k0 > 0 {
		x, xName = e.poisoned(actK, c.n, c.k), "mid"
		x0, w0, b0 = linearInputs(e, c.n, c.k0, c.k, c.bias0, false)
	} else {
		x = e.random(actK, 3, c.n, c.k)
	}
	resid := e.random(actK, 1, c.n, c.k)
	h := e.poisoned(actK, c.n, c.k)
	rows := c.m
	if c.swiglu {
		rows = 2 * c.m
	}
	w := e.random(weightK, 1/math.Sqrt(float64(c.k)), rows, c.k)
	var b pair
	if c.bias {
		b = e.random(weightK, 0.5, rows)
	}
	whole, out, written := outOperand(e, actK, c.n, c.m, c.pitchedOut)
	switch {
	case c.k0 > 0 && c.swiglu:
		e.run(func(o kernels.Ops, s int) {
			o.LinearAddRMSNormLinearSwiGLU(x[s], x0[s], w0[s], b0[s], out[s], h[s], resid[s], norm[s], eps, w[s])
		})
	case c.k0 > 0:
		e.run(func(o kernels.Ops, s int) {
			o.LinearAddRMSNormLinear(x[s], x0[s], w0[s], b0[s], out[s], h[s], resid[s], norm[s], eps, w[s], b[s])
		})
	case c.swiglu:
		e.run(func(o kernels.Ops, s int) { o.AddRMSNormLinearSwiGLU(out[s], h[s], resid[s], x[s], norm[s], eps, w[s]) })
	default:
		e.run(func(o kernels.Ops, s int) { o.AddRMSNormLinear(out[s], h[s], resid[s], x[s], norm[s], eps, w[s], b[s]) })
	}
	e.check("out", whole, written)
	e.check("resid", resid, all)
	e.check(xName, x, all)
	if c.k0 > 0 {
		e.check("x", x0, all)
	}
}

type addAddNormLinearCase struct {
	n, k, m          int // rows, inputs, outputs
	bias, pitchedOut bool
	xCol             int // x's first column in a wider matrix (0: x packed)
}

func (c addAddNormLinearCase) String() string {
	s := linearName(c.n, c.k, c.m, c.bias, false, c.pitchedOut, false, "")
	if c.xCol > 0 {
		s += fmt.Sprintf(",x at column %d", c.xCol)
	}
	return s
}

// addAddNormLinear holds add_add_rms_norm_linear to the cpu set: out, resid
// and h (the norm's output, which the parts write), y unchanged. x is not
// checked: the parts leave x + y in it, a set's one pass may leave x.
func addAddNormLinear(e *env, c addAddNormLinearCase) {
	const eps = 1e-6
	norm := e.normWeight(c.k)
	_, x := residAddend(e, c.n, c.k, c.xCol)
	ys, y := residAddend(e, c.n, c.k, 0)
	resid := e.random(actK, 1, c.n, c.k)
	h := e.poisoned(actK, c.n, c.k)
	w := e.random(weightK, 1/math.Sqrt(float64(c.k)), c.m, c.k)
	var b pair
	if c.bias {
		b = e.random(weightK, 0.5, c.m)
	}
	whole, out, written := outOperand(e, actK, c.n, c.m, c.pitchedOut)
	e.run(func(o kernels.Ops, s int) {
		o.AddAddRMSNormLinear(out[s], h[s], resid[s], x[s], y[s], norm[s], eps, w[s], b[s])
	})
	e.check("out", whole, written)
	e.check("resid", resid, all)
	e.check("h", h, all)
	e.check("y", ys, all)
}

type attnCase struct {
	name         string
	lens, past   []int // new tokens and cached tokens of each row
	heads, kv, d int
	maxSeq       int
	fused        bool // q, k, v are column slices of one qkv matrix
	nonCausal    bool // every new token attends to all of its row's keys
	f16          bool // f16 operands on the set under test (a prefill's)
	long         bool // an f16 case over 16K keys and more: GPUs only
	// rope_attn_decode: the dims of each q and k head rotated from 0 (0:
	// attn_decode), interleaved or rotate_half pairs.
	rope        int
	interleaved bool
}

func (c attnCase) String() string {
	s := fmt.Sprintf("%s,H=%d,KV=%d,D=%d,past=%v", c.name, c.heads, c.kv, c.d, clip(c.past))
	if slices.Max(c.lens) > 1 {
		s += fmt.Sprintf(",new=%v", clip(c.lens))
	}
	if c.fused {
		s += ",qkv"
	}
	if c.nonCausal {
		s += ",non-causal"
	}
	if c.f16 {
		s += ",f16"
	}
	if c.rope > 0 {
		s += fmt.Sprintf(",rope=%d", c.rope)
		if c.interleaved {
			s += " interleaved"
		}
	}
	return s
}

func attention(e *env, c attnCase, decode bool) {
	nb, t := len(c.lens), sum(c.lens)
	hq, hkv, d := c.heads, c.kv, c.d
	act := actK
	if c.f16 {
		act, e.tol = f16K, e.tols.F16
	}
	var q, k, v pair
	if c.fused {
		qkv := e.random(act, 1, t, (hq+2*hkv)*d)
		q, k, v = qkv.cols(0, hq*d), qkv.cols(hq*d, (hq+hkv)*d), qkv.cols((hq+hkv)*d, (hq+2*hkv)*d)
	} else {
		q, k, v = e.random(act, 1, t, hq*d), e.random(act, 1, t, hkv*d), e.random(act, 1, t, hkv*d)
	}
	// Cached positions hold numbers, the rest NaN: a kernel that lets a
	// position beyond a row's length into its result, or writes one, shows.
	cacheVals := func() []float32 {
		vals := e.normal(nb*hkv*c.maxSeq*d, 1)
		for b := range nb {
			for g := range hkv {
				for p := c.past[b]; p < c.maxSeq; p++ {
					row := (b*hkv+g)*c.maxSeq + p
					for j := range d {
						vals[row*d+j] = nan
					}
				}
			}
		}
		return vals
	}
	kc := e.tensor(act, cacheVals(), nb, hkv, c.maxSeq, d)
	vc := e.tensor(act, cacheVals(), nb, hkv, c.maxSeq, d)
	out := e.poisoned(act, t, hq*d)
	bt := e.batch(c.lens, c.past, c.maxSeq, decode)
	var rope [2]*kernels.Rope
	var pos pair
	if c.rope > 0 {
		rope, pos = e.ropeOperands(t, c.rope, c.interleaved)
	}
	e.run(func(o kernels.Ops, s int) {
		a := &kernels.AttnArgs{Out: out[s], Q: q[s], K: k[s], V: v[s], KCache: kc[s], VCache: vc[s],
			Batch: bt[s], Heads: hq, KVHeads: hkv, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d))), NonCausal: c.nonCausal}
		if c.rope > 0 {
			o.RoPEAttentionDecode(a, pos[s], rope[s])
		} else if decode {
			o.AttentionDecode(a)
		} else {
			o.AttentionPrefill(a)
		}
	})
	e.check("out", out, all)
	written := func(r, _ int) bool {
		b, p := r/(hkv*c.maxSeq), r%c.maxSeq
		return p < c.past[b]+c.lens[b]
	}
	e.check("k cache", kc, written)
	e.check("v cache", vc, written)
}

// batch describes rows of lens new tokens after past cached ones, on both
// sides. For decode the host Past is stale (as in a replayed CUDA graph):
// decode kernels must read PastDev.
func (e *env) batch(lens, past []int, maxSeq int, decode bool) [2]*kernels.Batch {
	start := make([]int, len(lens)+1)
	for b, n := range lens {
		start[b+1] = start[b] + n
	}
	hostPast := slices.Clone(past)
	if decode {
		for b := range hostPast {
			hostPast[b] = max(0, hostPast[b]-3)
		}
	}
	sd, pd := e.ints(int32s(start), len(start)), e.ints(int32s(past), len(past))
	var bt [2]*kernels.Batch
	for s := range 2 {
		bt[s] = &kernels.Batch{Rows: len(lens), Tokens: start[len(lens)], Start: start, Past: hostPast,
			MaxSeq: maxSeq, StartDev: sd[s], PastDev: pd[s]}
	}
	return bt
}

type mlaCase struct {
	name                       string
	lens, past                 []int
	heads, nope, rope, v, rank int
	maxSeq                     int
	pitched                    bool // KV is a column slice of a wider matrix
	// stacked: Q and KV are the column slices of one [T, Q+KV] matrix, as
	// the model's q_proj and kv_a_proj_with_mqa stacked write them.
	stacked bool
	// normRope: a decode through MLADecodeRoPE, q and kv as the projection
	// wrote them (the latent not yet normalised, nothing rotated).
	normRope bool
}

func (c mlaCase) String() string {
	s := fmt.Sprintf("%s,H=%d,nope=%d,rope=%d,v=%d,rank=%d,past=%v", c.name, c.heads, c.nope, c.rope, c.v, c.rank, clip(c.past))
	if slices.Max(c.lens) > 1 {
		s += fmt.Sprintf(",new=%v", clip(c.lens))
	}
	if c.pitched {
		s += ",pitched kv"
	}
	if c.stacked {
		s += ",q and kv of q_kv_a"
	}
	if c.normRope {
		s += ",with rms_norm_rope"
	}
	return s
}

func mla(e *env, c mlaCase, decode bool) {
	nb, t := len(c.lens), sum(c.lens)
	width, qw := c.rank+c.rope, c.heads*(c.nope+c.rope)
	var q, kv, qkva pair
	if c.stacked {
		qkva = e.random(actK, 1, t, qw+width)
		q, kv = qkva.cols(0, qw), qkva.cols(qw, qw+width)
	} else {
		q = e.random(actK, 1, t, qw)
		kv = e.random(actK, 1, t, width)
		if c.pitched {
			kv = e.random(actK, 1, t, width+16).cols(xCol, xCol+width)
		}
	}
	wkvb := e.random(weightK, 1/math.Sqrt(float64(c.rank)), c.heads*(c.nope+c.v), c.rank)
	vals := e.normal(nb*c.maxSeq*width, 1)
	for b := range nb {
		for i := c.past[b] * width; i < c.maxSeq*width; i++ {
			vals[b*c.maxSeq*width+i] = nan
		}
	}
	cache := e.tensor(actK, vals, nb, c.maxSeq, width)
	out := e.poisoned(actK, t, c.heads*c.v)
	bt := e.batch(c.lens, c.past, c.maxSeq, decode)
	var norm, pos pair
	var rope [2]*kernels.Rope
	if c.normRope {
		norm = e.normWeight(c.rank)
		rope, pos = e.ropeOperands(t, c.rope, true)
	}
	e.run(func(o kernels.Ops, s int) {
		a := &kernels.MLAArgs{Out: out[s], Q: q[s], KV: kv[s], Cache: cache[s], WKVB: wkvb[s], Batch: bt[s],
			Heads: c.heads, NopeDim: c.nope, RopeDim: c.rope, VDim: c.v, Rank: c.rank,
			Scale: float32(1 / math.Sqrt(float64(c.nope+c.rope)))}
		switch {
		case c.normRope:
			o.MLADecodeRoPE(a, norm[s], 1e-6, pos[s], rope[s])
		case decode:
			o.MLADecode(a)
		default:
			o.MLAPrefill(a)
		}
	})
	if c.normRope {
		// Normalised and rotated in place, each piece on its own, so that
		// an error in the few rotated columns is not lost in the whole's.
		e.check("q", q, all)
		e.check("latent", kv.cols(0, c.rank), all)
		e.check("k_pe", kv.cols(c.rank, width), all)
	}
	e.check("out", out, all)
	e.check("cache", cache, func(r, _ int) bool {
		b, p := r/c.maxSeq, r%c.maxSeq
		return p < c.past[b]+c.lens[b]
	})
	if c.stacked {
		e.check("q_kv_a", qkva, all) // read only but for the norm and ropes
	}
}

type routeCase struct {
	name string
	n, e int
	r    kernels.Routing
	ties bool // logits with exact ties (see tiedLogits), the choice held to wantRoute
}

// routeGap is the spacing of a token's router logits: neighbouring scores
// differ by about 10%, far beyond any rounding, so the choice is exact.
const routeGap = 0.1

func moeRoute(e *env, c routeCase) {
	logits := routeLogits(e, c)
	lg := e.tensor(f32K, logits, c.n, c.e)
	k := c.r.TopK
	idx := e.ints(filled(c.n*k, -1), c.n, k)
	w := e.poisoned(f32K, c.n, k)
	e.run(func(o kernels.Ops, s int) { o.MoERoute(idx[s], w[s], lg[s], &c.r) })
	checkRoutes(e, c, logits, idx, w)
}

// routeLogits are the router logits of c's tokens: each token's a
// permutation of scores routeGap apart, so that the choice is exact, or
// with c.ties tiedLogits.
func routeLogits(e *env, c routeCase) []float32 {
	if c.ties {
		return tiedLogits(e, c.n, c.e)
	}
	logits := make([]float32, c.n*c.e)
	for t := range c.n {
		for j, rank := range e.rng.Perm(c.e) {
			logits[t*c.e+j] = float32((float64(rank)-float64(c.e)/2)*routeGap + (e.rng.Float64()-0.5)*routeGap/5)
		}
	}
	return logits
}

// checkRoutes holds the routes idx and w of logits (c's) to the
// reference's: the experts exactly, the weights within the tolerance.
func checkRoutes(e *env, c routeCase, logits []float32, idx, w pair) {
	k := c.r.TopK
	ids := e.readInts(idx)
	var ws [2][]float32
	for s := range 2 {
		v, err := e.devs[s].ReadF32(w[s])
		if err != nil {
			e.t.Fatalf("%s: reading weights: %v", sideName[s], err)
		}
		ws[s] = v
	}
	// The order of a token's K entries is free: compare them sorted by expert.
	for t := range c.n {
		for s := range 2 {
			sortByExpert(ids[s][t*k:(t+1)*k], ws[s][t*k:(t+1)*k])
		}
		if want := wantRoute(logits[t*c.e:(t+1)*c.e], c.r); c.ties && !slices.Equal(ids[ref][t*k:(t+1)*k], want) {
			e.t.Fatalf("token %d: the reference chose %v, want %v (ties to the lower index)", t, ids[ref][t*k:(t+1)*k], want)
		}
		if !slices.Equal(ids[dut][t*k:(t+1)*k], ids[ref][t*k:(t+1)*k]) {
			e.t.Errorf("token %d: experts %v, want %v", t, ids[dut][t*k:(t+1)*k], ids[ref][t*k:(t+1)*k])
		}
	}
	e.compare("weight", ws[ref], ws[dut], k, all)
}

func sortByExpert(idx []int32, w []float32) {
	sort.Sort(byExpert{idx, w})
}

type byExpert struct {
	idx []int32
	w   []float32
}

func (b byExpert) Len() int           { return len(b.idx) }
func (b byExpert) Less(i, j int) bool { return b.idx[i] < b.idx[j] }
func (b byExpert) Swap(i, j int) {
	b.idx[i], b.idx[j] = b.idx[j], b.idx[i]
	b.w[i], b.w[j] = b.w[j], b.w[i]
}

type expertsCase struct{ n, h, inter, e, k int }

func moeExperts(e *env, c expertsCase) {
	x := e.random(actK, 1, c.n, c.h)
	ids := make([]int32, 0, c.n*c.k)
	ws := make([]float32, 0, c.n*c.k)
	for range c.n {
		for _, ex := range e.rng.Perm(c.e)[:c.k] {
			ids = append(ids, int32(ex))
			ws = append(ws, float32(0.05+0.95*e.rng.Float64()))
		}
	}
	idx, w := e.ints(ids, c.n, c.k), e.tensor(f32K, ws, c.n, c.k)
	gateUp := e.patterned(weightK, 1/math.Sqrt(float64(c.h)), c.e, 2*c.inter, c.h)
	down := e.patterned(weightK, 1/math.Sqrt(float64(c.inter)), c.e, c.h, c.inter)
	out := e.poisoned(actK, c.n, c.h)
	e.run(func(o kernels.Ops, s int) { o.MoEExperts(out[s], x[s], idx[s], w[s], gateUp[s], down[s]) })
	e.check("out", out, all)
}

// argmax checks rows whose largest element is 1 above the next (so that
// rounding to the device's dtype keeps it), or, with ties, rows of quarter
// steps (exact in every dtype) whose largest value appears 2 or 3 times.
// argmax checks rows with one largest value, or several tied (ties), and
// with NaNs, which count as the largest, the first of them chosen (nan);
// with value, out is [B,2] and holds the chosen logit beside its index.
func argmax(e *env, b, v int, k kind, ties, nan, value bool) {
	vals := e.normal(b*v, 1)
	want := make([]int32, b)
	for r := range b {
		row := vals[r*v : (r+1)*v]
		if ties {
			for j := range row {
				row[j] = float32(math.Round(float64(row[j])*4) / 4)
			}
		}
		top := slices.Max(row) + 1
		if nan {
			top = float32(math.Inf(1)) // NaN still ranks above it, as in torch.argmax
		}
		at := e.rng.Perm(v)[:1+e.rng.Intn(3)]
		if !ties {
			at = at[:1]
		}
		for _, j := range at {
			row[j] = top
		}
		want[r] = int32(slices.Min(at))
		if nan {
			ns := e.rng.Perm(v)[:1+e.rng.Intn(2)]
			for _, j := range ns {
				row[j] = float32(math.NaN())
			}
			want[r] = int32(slices.Min(ns))
		}
	}
	logits := e.tensor(k, vals, b, v)
	cols := 1
	if value {
		cols = 2
	}
	out := e.ints(filled(b*cols, -7), b, cols)
	e.run(func(o kernels.Ops, s int) { o.Argmax(out[s], logits[s]) })
	got := e.readInts(out)
	var idx, val [2][]int32
	for side := range 2 {
		for r := range b {
			idx[side] = append(idx[side], got[side][r*cols])
			if value {
				val[side] = append(val[side], got[side][r*cols+1])
			}
		}
	}
	if !slices.Equal(idx[ref], want) {
		e.t.Fatalf("the reference chose %v, want %v", idx[ref], want)
	}
	if !slices.Equal(idx[dut], want) {
		e.t.Errorf("argmax %v, want %v", idx[dut], want)
	}
	// Both sides hold the same logits, so the chosen values agree to the
	// bit (NaN with NaN).
	for r := range val[dut] {
		g, w := math.Float32frombits(uint32(val[dut][r])), math.Float32frombits(uint32(val[ref][r]))
		if g != w && !(g != g && w != w) {
			e.t.Errorf("row %d: the chosen logit is %v, the reference's %v", r, g, w)
		}
	}
}

// decodeAdvance checks ids, pos and past as views into one buffer, as a
// decode step's inputs are: ids and pos poisoned, past random lengths, and
// choice random tokens beside random logit bits. Both sides must leave the
// buffer exactly as DecodeAdvance says (it is integer work) and choice as
// it was.
func decodeAdvance(e *env, b int) {
	const vocab, maxLen = 151936, 1 << 20
	choice, in, want := make([]int32, 2*b), make([]int32, 3*b), make([]int32, 3*b)
	for r := range b {
		choice[2*r], choice[2*r+1] = int32(e.rng.Intn(vocab)), int32(e.rng.Uint32())
		past := int32(e.rng.Intn(maxLen))
		in[r], in[b+r], in[2*b+r] = -7, -7, past
		want[r], want[b+r], want[2*b+r] = choice[2*r], past+1, past+1
	}
	buf, ch := e.ints(in, 3*b), e.ints(choice, b, 2)
	view := func(s, i int) *kernels.Tensor {
		return kernels.NewTensor(buf[s].Buf, kernels.I32, buf[s].Offset+i*b, b)
	}
	e.run(func(o kernels.Ops, s int) { o.DecodeAdvance(view(s, 0), view(s, 1), view(s, 2), ch[s]) })
	got, chose := e.readInts(buf), e.readInts(ch)
	if !slices.Equal(got[ref], want) {
		e.t.Fatalf("the reference left ids, pos, past %v, want %v", got[ref], want)
	}
	if !slices.Equal(got[dut], want) {
		e.t.Errorf("ids, pos, past %v, want %v", got[dut], want)
	}
	if !slices.Equal(chose[dut], choice) {
		e.t.Errorf("choice %v after the call, was %v", chose[dut], choice)
	}
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

func ones(n int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// spread is n cache lengths from 0 to maxSeq-1, evenly apart.
func spread(n, maxSeq int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = i * (maxSeq - 1) / (n - 1)
	}
	return v
}

func filled(n int, x int32) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = x
	}
	return v
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// clip shortens a long list for a case name.
func clip(v []int) string {
	if len(v) <= 4 {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("[%d %d ... %d](%d)", v[0], v[1], v[len(v)-1], len(v))
}
