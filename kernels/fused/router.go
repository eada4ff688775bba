package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// linear_route (router.cu): linear_route's op in one launch on sm_90a, a
// cluster of two blocks a token, each block half the router's rows in its
// shared memory (requested before its grid_wait), rank 0 routing the
// token once both halves' logits are in its shared memory. A module of its
// own (bulk copies, mbarriers and clusters are sm_90's); where it cannot be
// built New still succeeds and LinearRoute declines, the Dispatch running
// linear then moe_route.

// The layout of linear_route, named as in router.cu.
const (
	rtThreads = 256 // RT_THREADS
	rtLanes   = 32  // RT_LANES: experts a block at most
	rtXV      = 2   // RT_XV: 8-element chunks of x a thread at most
	rtHead    = 128 + 8*rtLanes*4 + 2*rtLanes*4 + 32*routePerLane*4
)

// rtKit is linear_route on one device.
type rtKit struct {
	err    error // why it cannot run here; nil when it can
	fitted int   // the dynamic shared memory the kernel is readied for (FitShared)
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

// routerShared is linear_route's dynamic shared memory for a router of
// experts rows of h inputs: the head, then a block's ⌈experts/2⌉ rows.
func routerShared(experts, h int) int { return rtHead + (experts+1)/2*h*2 }

// LinearRoute is linear_route: the router's f32 logits and the routes in
// one launch, a cluster of two blocks a token. It declines where the
// kernel cannot take the problem (more than 2·rtLanes experts, rows of x
// or w not whole 16-byte chunks, a block's weight rows beyond the shared
// memory), and the Dispatch runs linear then moe_route.
func (o *ops) LinearRoute(idx, weight, logits, x, w *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpLinearRoute
	kernels.CheckLinearRoute(o.D.ActDType(), idx, weight, logits, x, w, r)
	n, experts, h := x.Rows(), w.Shape[0], w.Shape[1]
	o.Need(o.rt != nil && o.rt.err == nil, op, "%v", o.rtErr())
	o.needRoute(op, experts, r)
	o.Need(experts <= 2*rtLanes, op, "%d experts, at most %d", experts, 2*rtLanes)
	o.Need(cudaset.IsBF16(w) && cudaset.IsBF16(x), op, "x %v and w %v: the kernel reads bf16", x, w)
	o.Need(h%8 == 0 && h <= rtXV*rtThreads*8, op, "H=%d inputs: a multiple of 8, at most %d", h, rtXV*rtThreads*8)
	o.Need(o.rowsAligned(x) && o.D.Ptr(w)%16 == 0, op, "rows of x %v or w %v do not start on 16-byte boundaries", x, w)
	shared := routerShared(experts, h)
	if shared > o.rt.fitted {
		err := o.FitShared("linear_route", shared)
		o.Need(err == nil, op, "%d experts of %d inputs: %v", experts, h, err)
		o.rt.fitted = shared
	}
	args := []any{o.D.Ptr(idx), int32(idx.Pitch), o.D.Ptr(weight), int32(weight.Pitch), o.D.Ptr(logits), int32(logits.Pitch),
		o.D.Ptr(x), int32(x.Pitch), o.D.Ptr(w), int32(experts), int32(h), int32(r.TopK), b32(r.Method == kernels.RouteGroupLimited),
		int32(r.Groups), int32(r.TopKGroups), b32(r.NormTopK), r.Scale}
	o.LaunchGrid("linear_route", cuda.Dim3{X: uint32(2 * n)}, cuda.Dim3{X: rtThreads}, shared, args...)
}

func (o *ops) rtErr() error {
	if o.rt == nil {
		return fmt.Errorf("fused: linear_route not built")
	}
	return o.rt.err
}
