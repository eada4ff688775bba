package fused

import (
	"os"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// ahead is the tensor the layers named (kernels.Aheader) that the set's
// next kernel able to may ask the L2 for: p its device address, n its
// bytes, 0 for none.
type ahead struct {
	p uintptr
	n int64
}

// The kernels that take Ahead's hint: moe_one asks as its blocks leave,
// mla_decode_keys before its grid wait (mma.cuh's ask_ahead).
const (
	aheadMoE  = "moe"
	aheadKeys = "keys"
)

// aheadKernels are the kernels that ask for what Ahead names
// (FUSELM_XP_AHEAD=moe,keys: an experiment, none by default).
var aheadKernels = strings.Split(os.Getenv("FUSELM_XP_AHEAD"), ",")

// Ahead takes the hint (kernels.Aheader): the next kernel of aheadKernels
// launched asks the L2 for t. A tensor whose start or size is not a
// multiple of 16 bytes, the bulk prefetch's unit, is not asked for.
func (o *ops) Ahead(t *kernels.Tensor) {
	o.ahead = ahead{}
	if t == nil {
		return
	}
	p, n := o.D.Ptr(t), int64(t.Rows())*int64(t.Pitch)*int64(t.DType.Size())
	if p%16 != 0 || n%16 != 0 {
		return
	}
	o.ahead = ahead{p, n}
}

// takeAhead returns the hint's arguments for one launch of kernel (one of
// aheadMoE, aheadKeys): address and bytes, or 0, 0 where there is none or
// kernel does not ask; a kernel that asks spends it.
func (o *ops) takeAhead(kernel string) []any {
	for _, k := range aheadKernels {
		if k == kernel {
			a := o.ahead
			o.ahead = ahead{}
			return []any{a.p, a.n}
		}
	}
	return []any{uintptr(0), int64(0)}
}
