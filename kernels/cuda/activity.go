package cuda

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/fuselm/fuselm/kernels/profile"
)

// CUPTI's activity records, as cupti_activity.h lays them out (packed,
// 8-byte aligned, little-endian on every platform fuselm runs on).
//
// A kernel record (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) is a versioned
// struct: CUpti_ActivityKernel8 (CUDA 11.8, 200 bytes), CUpti_ActivityKernel9
// (CUDA 12, 208 bytes), CUpti_ActivityKernel10 (CUDA 13.0 and 13.1, 216
// bytes); the library writes the newest one it knows. Each version adds
// fields at the end: the fields read here sit in the prefix they all share,
// read at the offsets below (checked against the 11.8 header with
// offsetof, and against the CUDA 13.0 header's field list). Records are
// walked with cuptiActivityGetNextRecord, so their sizes are CUPTI's own;
// the walk checks every kernel record is at least the prefix long.
const (
	actKindKernel           = 3  // CUPTI_ACTIVITY_KIND_KERNEL
	actKindDriver           = 4  // CUPTI_ACTIVITY_KIND_DRIVER
	actKindRuntime          = 5  // CUPTI_ACTIVITY_KIND_RUNTIME
	actKindConcurrentKernel = 10 // CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
	actKindExternal         = 39 // CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION

	// CUpti_ActivityKernel8/9/10: offsets of the fields read.
	kOffStart       = 16  // uint64 start, ns
	kOffEnd         = 24  // uint64 end, ns
	kOffStream      = 48  // uint32 streamId
	kOffGrid        = 52  // int32 gridX, gridY, gridZ
	kOffBlock       = 64  // int32 blockX, blockY, blockZ
	kOffCorrelation = 92  // uint32 correlationId of the launching API call
	kOffName        = 104 // const char *name
	kOffGraphNode   = 144 // uint64 graphNodeId, 0 when not launched by a graph
	kOffGraphID     = 156 // uint32 graphId
	kPrefix         = 160 // the bytes read

	// CUpti_ActivityExternalCorrelation (24 bytes).
	extOffKind        = 4  // CUpti_ExternalCorrelationKind externalKind
	extOffID          = 8  // uint64 externalId
	extOffCorrelation = 16 // uint32 correlationId
	extSize           = 24

	// CUpti_ExternalCorrelationKind: fuselm's trace ids go on CUSTOM0, the
	// cuBLAS tag on CUSTOM1.
	extKindTraceID = 3 // CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0
	extKindLibrary = 4 // CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1
)

// rawKernel is what a kernel record says that fuselm uses.
type rawKernel struct {
	name        string
	start, end  uint64 // CUPTI timestamps, ns
	grid, block [3]uint32
	stream      uint32
	correlation uint32
	graphNode   uint64
	graphID     uint32
}

// decodeKernel reads a kernel record; name turns the record's name pointer
// into the name.
func decodeKernel(rec []byte, name func(uintptr) string) (rawKernel, error) {
	if len(rec) < kPrefix {
		return rawKernel{}, fmt.Errorf("cupti: a kernel record of %d bytes, shorter than the %d this build reads", len(rec), kPrefix)
	}
	le := binary.LittleEndian
	k := rawKernel{
		start:       le.Uint64(rec[kOffStart:]),
		end:         le.Uint64(rec[kOffEnd:]),
		stream:      le.Uint32(rec[kOffStream:]),
		correlation: le.Uint32(rec[kOffCorrelation:]),
		graphNode:   le.Uint64(rec[kOffGraphNode:]),
		graphID:     le.Uint32(rec[kOffGraphID:]),
	}
	for i := range 3 {
		k.grid[i] = le.Uint32(rec[kOffGrid+4*i:])
		k.block[i] = le.Uint32(rec[kOffBlock+4*i:])
	}
	k.name = name(uintptr(le.Uint64(rec[kOffName:])))
	if k.end < k.start || k.block[0] == 0 || k.grid[0] == 0 {
		return k, fmt.Errorf("cupti: a kernel record that does not read as one (%q: start %d, end %d, grid %v, block %v): "+
			"this CUPTI's record layout is not the one this build reads", k.name, k.start, k.end, k.grid, k.block)
	}
	return k, nil
}

// extIDs is what the external correlation records of one API call said.
type extIDs struct {
	id   uint64 // fuselm's trace id (0: none)
	blas bool   // the call was made by cuBLAS
}

// decodeExternal reads an external correlation record into ext, keyed by
// the API call's correlation id.
func decodeExternal(rec []byte, ext map[uint32]extIDs) error {
	if len(rec) < extSize {
		return fmt.Errorf("cupti: an external correlation record of %d bytes, want %d", len(rec), extSize)
	}
	le := binary.LittleEndian
	corr := le.Uint32(rec[extOffCorrelation:])
	e := ext[corr]
	switch le.Uint32(rec[extOffKind:]) {
	case extKindTraceID:
		e.id = le.Uint64(rec[extOffID:])
	case extKindLibrary:
		e.blas = true
	default:
		return nil
	}
	ext[corr] = e
	return nil
}

// nodeInfo is what was known when a graph node was captured.
type nodeInfo struct {
	id   uint64 // the trace id set then
	blas bool   // captured inside a cuBLAS call
}

// cublasNameParts are what cuBLAS's kernel names hold: its GEMM and GEMV
// kernels, the Hopper "nvjet" ones, CUTLASS's and split-K reductions. They
// classify a kernel whose launch carried no cuBLAS tag.
var cublasNameParts = []string{"gemm", "gemv", "nvjet", "cutlass", "xmma", "splitkreduce", "cublas"}

// kernelSource is where a kernel named name comes from: one of fuselm's
// own (own), launched inside a cuBLAS call (blas), or by its name.
func kernelSource(name string, own func(string) bool, blas bool) string {
	switch {
	case own(name):
		return profile.SourceOwn
	case blas:
		return profile.SourceCUBLAS
	}
	lower := strings.ToLower(name)
	for _, p := range cublasNameParts {
		if strings.Contains(lower, p) {
			return profile.SourceCUBLAS
		}
	}
	return profile.SourceOther
}

// joinKernels turns raw kernel records into the profile's, tying each to
// the trace id its launch carried (ext, by correlation id) and, for a
// kernel of a graph replay, to the trace id its node was captured under
// (nodes); offset moves CUPTI's timestamps onto the host's wall clock.
func joinKernels(raw []rawKernel, ext map[uint32]extIDs, nodes map[uint64]nodeInfo, own func(string) bool, offset int64) []profile.KernelRecord {
	out := make([]profile.KernelRecord, len(raw))
	for i, k := range raw {
		e := ext[k.correlation]
		n := nodes[k.graphNode]
		out[i] = profile.KernelRecord{
			Name:      k.name,
			Start:     int64(k.start) + offset,
			End:       int64(k.end) + offset,
			Grid:      k.grid,
			Block:     k.block,
			Stream:    k.stream,
			Source:    kernelSource(k.name, own, e.blas || n.blas),
			ID:        e.id,
			GraphNode: k.graphNode,
		}
		if k.graphNode != 0 {
			out[i].Node = n.id
		}
	}
	return out
}
