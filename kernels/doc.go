// Package kernels defines what every kernel set implements: tensors, the op
// interface the layers call (Ops, with its contract checks and costs), and
// the registry of kernel sets with per-op selection, whose Dispatch routes
// each op to its set and tells an Observer (kernels/profile) of every call.
package kernels
