package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// linear_route (router.cu): linear_route's op in one launch on sm_90a, a
// cluster of rtCluster blocks a token, each a quarter of the router's rows
// in its threads' registers (loaded before its grid_wait), rank 0 routing
// the token once every block's logits are in its shared memory. A module
// of its own (clusters are sm_90's); where it cannot be built New still
// succeeds and LinearRoute declines, the Dispatch running linear then
// moe_route.

// The layout of linear_route, named as in router.cu.
const (
	rtThreads = 256 // RT_THREADS
	rtCluster = 4   // RT_CL: blocks of a token's cluster
	rtQ       = 16  // RT_Q: experts a block at most
)

// rtKit is linear_route on one device.
type rtKit struct {
	err error // why it cannot run here; nil when it can
}

func routerModule() cudaset.Module { return module("router.cu", []string{"linear_route"}) }

// newRouter compiles linear_route into k where the device allows it
// (sm_90a) and launches it overlapped. It never fails: what went wrong is
// kept in the kit's err.
func newRouter(k *cudaset.Kit) *rtKit {
	c := &rtKit{}
	if c.err = addHopperModule(k, "linear_route", "linear_route", routerModule()); c.err != nil {
		return c
	}
	k.Overlap("linear_route")
	return c
}

// LinearRoute is linear_route: the router's f32 logits and the routes in
// one launch, a cluster of rtCluster blocks a token. It declines where the
// kernel cannot take the problem (more than rtCluster·rtQ experts, more
// than a chunk of 8 inputs a thread, rows of x or w not on 16-byte
// boundaries), and the Dispatch runs linear then moe_route.
func (o *ops) LinearRoute(idx, weight, logits, x, w *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpLinearRoute
	kernels.CheckLinearRoute(o.D.ActDType(), idx, weight, logits, x, w, r)
	n, experts, h := x.Rows(), w.Shape[0], w.Shape[1]
	o.Need(o.rt != nil && o.rt.err == nil, op, "%v", o.rtErr())
	o.needRoute(op, experts, r)
	o.Need(experts <= rtCluster*rtQ, op, "%d experts, at most %d", experts, rtCluster*rtQ)
	o.Need(cudaset.IsBF16(w) && cudaset.IsBF16(x), op, "x %v and w %v: the kernel reads bf16", x, w)
	o.Need(h%8 == 0 && h <= rtThreads*8, op, "H=%d inputs: a multiple of 8, at most %d", h, rtThreads*8)
	o.Need(o.rowsAligned(x) && o.D.Ptr(w)%16 == 0, op, "rows of x %v or w %v do not start on 16-byte boundaries", x, w)
	args := []any{o.D.Ptr(idx), int32(idx.Pitch), o.D.Ptr(weight), int32(weight.Pitch), o.D.Ptr(logits), int32(logits.Pitch),
		o.D.Ptr(x), int32(x.Pitch), o.D.Ptr(w), int32(experts), int32(h), int32(r.TopK), b32(r.Method == kernels.RouteGroupLimited),
		int32(r.Groups), int32(r.TopKGroups), b32(r.NormTopK), r.Scale}
	o.LaunchGrid("linear_route", cuda.Dim3{X: uint32(rtCluster * n)}, cuda.Dim3{X: rtThreads}, 0, args...)
}

func (o *ops) rtErr() error {
	if o.rt == nil {
		return fmt.Errorf("fused: linear_route not built")
	}
	return o.rt.err
}
