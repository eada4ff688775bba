// Package userset is a kernel set a user brings: a directory holding a
// manifest (fuselm.json) and the kernels it names, CUDA C++ sources
// compiled by NVRTC with fuselm's public header (fuselm.cuh), PTX, or
// cubins, each called through the kernel ABI of its op
// (docs/KERNEL_ABI.md). Load registers the directory as a kernel set named
// by its manifest, so that every command that takes sets takes it; the set
// owns the ops its manifest names and the registry's baseline runs the
// others. Building it on a device checks every one of its kernels against
// the cpu set (kerneltest.Check) before anything can time it.
package userset

import (
	"fmt"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// ABIVersion is the version of the kernel ABI this build calls kernels
// through: a manifest states the one its kernels were written for, and
// fuselm.cuh defines FUSELM_ABI_VERSION.
const ABIVersion = 1

// param is one parameter of an op's kernel, in order.
type param struct {
	C    string // its C declaration, as docs/KERNEL_ABI.md and fuselm.cuh write it
	size int    // bytes: 8 for a pointer, 4 for an int or a float
}

// opABI is the contract between fuselm and a user's kernel for one op: the
// kernel's parameters, the sizes its grid and shared memory expressions
// may name, and the grid and block it gets when the manifest gives none.
type opABI struct {
	op     kernels.Op
	params []param
	sizes  []string // names of the op's sizes, besides block and sms
	grid   string   // the default grid expression
	block  int      // the default block
	macro  string   // fuselm.cuh's macro declaring a kernel of this op
}

func ptr(c string) param { return param{C: c, size: 8} }
func i32(c string) param { return param{C: "int " + c, size: 4} }
func f32(c string) param { return param{C: "float " + c, size: 4} }

// abi lists the ops a user's kernel may replace, TileGym's patch points.
var abi = []opABI{
	{op: kernels.OpRMSNorm, macro: "FUSELM_RMS_NORM",
		params: []param{ptr("bf16* out"), i32("out_pitch"), ptr("const bf16* x"), i32("x_pitch"), ptr("const bf16* w"),
			i32("rows"), i32("cols"), f32("eps")},
		sizes: []string{"rows", "cols"}, grid: "rows", block: 256},
	{op: kernels.OpAddRMSNorm, macro: "FUSELM_ADD_RMS_NORM",
		params: []param{ptr("bf16* out"), i32("out_pitch"), ptr("bf16* resid"), i32("resid_pitch"), ptr("const bf16* x"),
			i32("x_pitch"), ptr("const bf16* w"), i32("rows"), i32("cols"), f32("eps")},
		sizes: []string{"rows", "cols"}, grid: "rows", block: 256},
	{op: kernels.OpRoPE, macro: "FUSELM_ROPE",
		params: []param{ptr("bf16* x"), i32("pitch"), i32("tokens"), i32("heads"), i32("head_stride"), i32("offset"),
			ptr("const int* pos"), ptr("const float* cos"), ptr("const float* sin"), i32("cs_pitch"), i32("max_pos"),
			i32("dim"), i32("interleaved")},
		sizes: []string{"tokens", "heads", "dim", "pairs"}, grid: "cdiv(pairs, block)", block: 256},
	{op: kernels.OpSwiGLU, macro: "FUSELM_SWIGLU",
		params: []param{ptr("bf16* out"), i32("out_pitch"), ptr("const bf16* gate_up"), i32("gate_up_pitch"),
			i32("rows"), i32("cols")},
		sizes: []string{"rows", "cols"}, grid: "cdiv(rows*cols, block)", block: 256},
	{op: kernels.OpAttnPrefill, macro: "FUSELM_ATTN_PREFILL",
		params: []param{ptr("bf16* out"), i32("out_pitch"), ptr("const bf16* q"), i32("q_pitch"), ptr("const bf16* k_cache"),
			ptr("const bf16* v_cache"), ptr("const int* start"), ptr("const int* past"), i32("batch"), i32("heads"),
			i32("kv_heads"), i32("head_dim"), i32("max_seq"), f32("scale"), i32("causal")},
		sizes: []string{"batch", "tokens", "heads", "kv_heads", "head_dim", "max_seq", "max_new", "max_keys"},
		grid:  "tokens, heads", block: 128},
	{op: kernels.OpAttnDecode, macro: "FUSELM_ATTN_DECODE",
		params: []param{ptr("bf16* out"), i32("out_pitch"), ptr("const bf16* q"), i32("q_pitch"), ptr("const bf16* k_cache"),
			ptr("const bf16* v_cache"), ptr("const int* past"), i32("batch"), i32("heads"), i32("kv_heads"),
			i32("head_dim"), i32("max_seq"), f32("scale")},
		sizes: []string{"batch", "heads", "kv_heads", "head_dim", "max_seq"}, grid: "batch, heads", block: 128},
}

// abiOf is op's ABI; false when a user's kernel cannot replace op.
func abiOf(op kernels.Op) (opABI, bool) {
	for _, a := range abi {
		if a.op == op {
			return a, true
		}
	}
	return opABI{}, false
}

// Ops lists the ops a user's kernel may replace, in the ABI's order.
func Ops() []kernels.Op {
	ops := make([]kernels.Op, len(abi))
	for i, a := range abi {
		ops[i] = a.op
	}
	return ops
}

// signature is the C declaration of a kernel named name for the op.
func (a opABI) signature(name string) string {
	ps := make([]string, len(a.params))
	for i, p := range a.params {
		ps[i] = p.C
	}
	return fmt.Sprintf(`extern "C" __global__ void %s(%s)`, name, strings.Join(ps, ", "))
}

// vars are the names a grid or shared expression of the op may use.
func (a opABI) vars() []string { return append(append([]string(nil), a.sizes...), "block", "sms") }
