package naive

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// GroupGemm is the baseline grouped GEMM: it reads the offsets back on the
// host (a sync, so it cannot run inside a CUDA graph), then makes one cuBLAS
// call per non-empty group, as a loop over experts in eager PyTorch does.
// Offsets that are not ascending within [0, M] fail the call.
func (o *ops) GroupGemm(out, x, w, first *kernels.Tensor) {
	op := kernels.OpGroupGemm
	kernels.CheckGroupGemm(o.D.ActDType(), out, x, w, first)
	o.Need(cudaset.IsBF16(w), op, "weights %v (bf16, as x for cuBLAS)", w)
	groups, n, k, m := w.Shape[0], w.Shape[1], w.Shape[2], x.Rows()
	fs, err := o.D.ReadI32(first)
	if err != nil {
		o.D.Fail(err)
		return
	}
	for g := range groups {
		if fs[g] < 0 || fs[g] > fs[g+1] || int(fs[g+1]) > m {
			o.D.Fail(fmt.Errorf("naive: %s: group %d's rows [%d, %d) are not ascending within the %d rows of x", op, g, fs[g], fs[g+1], m))
			return
		}
	}
	o.GemmGroups(fs, o.Mat(x), o.Mat(w), o.Mat(out), n, k)
}
