// Package kernels defines what every kernel set implements: tensors, the op
// interface the layers call (Ops), each op's contract and cost, and the
// registry of kernel sets with per-op selection, whose Dispatch routes each
// op to its set and tells an Observer (kernels/profile) of every call.
//
// The files, each using only those before it: dtype.go and half.go
// (element types), shape.go (an op's problem size), tensor.go (tensors,
// Device), ops.go (the op table and Ops), variant.go (targets, variants,
// Tunable), cost.go and contract.go (what each op takes and costs),
// compare.go (the one comparison of a set's output with a reference),
// registry.go (sets, specs, fallbacks), dispatch.go and notowned.go, and
// ops_gen.go, written by go generate.
//
// # Adding an op
//
// An op is added in these places, as ggml adds one to its op table, its CPU
// backend, each other backend and test-backend-ops:
//
//  1. ops.go: its Op constant, its opTable row (name, the Ops method that
//     runs it, group, what it does) and its Ops method, documented with
//     the layout of every argument; then go generate ./kernels writes its
//     Dispatch and NotOwned methods (ops_gen.go). A composite op, one that
//     does the work of others in one call (linear_swiglu: linear, then
//     swiglu; rms_norm_rope: rms_norm, then rope twice; mla_decode_rope:
//     rms_norm_rope's parts, then mla_decode), names them as its
//     Parts, and dispatch.go holds the method that runs them instead
//     (linearSwiGLUParts, rmsNormRoPEParts), which the Dispatch calls
//     where the spec puts the parts on other sets, the set does not fuse
//     the op (SetInfo.Fuses), or the set declines the call.
//  2. contract.go: its Check function, which every set calls first, and
//     its cost (costOf's method: the FLOPs and bytes the profile reads).
//  3. kernels/cpu: the plain reference, in the file named for the op.
//  4. Each CUDA set (kernels/naive, kernels/fused): its kernel and launcher
//     in the file named for the op, and, for a set that owns only some ops
//     (SetInfo.Own), the op in that list; a set that has no kernel for it
//     runs its fallback's.
//  5. kernels/kerneltest/table.go: its row, which names its check cases
//     (a function in cases.go that adds them: shapes, pitched views,
//     poisoned outputs), which hold every set against the cpu set, and its
//     benchmark, if it is worth timing alone (a Bench in bench.go: shape
//     names, default shapes, FLOP and byte counts, and the builder of its
//     operands and call for a shape), which kernels/kbench times every set
//     on. One row serves both modes, as one test case does in
//     test-backend-ops; TestTable fails on an op without its row.
//
// A kernel set is registered (Register) from its package's init; its name
// is then one that specs, and the command line, take.
package kernels
