package model

import (
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// normOps counts the norm calls of a forward step: the residual adds and
// norms alone, and those a block's first projection takes with it.
type normOps struct {
	kernels.Ops
	n map[kernels.Op]int
}

func (o *normOps) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	o.n[kernels.OpRMSNorm]++
	o.Ops.RMSNorm(out, x, w, eps)
}
func (o *normOps) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	o.n[kernels.OpAddRMSNorm]++
	o.Ops.AddRMSNorm(out, resid, x, w, eps)
}
func (o *normOps) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.n[kernels.OpNormLinear]++
	o.Ops.AddRMSNormLinear(out, h, resid, x, norm, eps, w, bias)
}
func (o *normOps) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	o.n[kernels.OpNormSwiGLU]++
	o.Ops.AddRMSNormLinearSwiGLU(out, h, resid, x, norm, eps, w)
}

// Qwen2's attention and MLP, and DeepSeek-V2's dense MLPs, take the
// residual add and the norm before them with their first projection
// (add_rms_norm_linear, add_rms_norm_linear_swiglu); the first layer's
// attention (no add before it), MLA and the MoE take the norm alone, and
// the last norm stays add_rms_norm. The logits are those of the calls
// made one by one.
func TestNormFirst(t *testing.T) {
	for _, name := range []string{"qwen2-tiny", "deepseek-v2-tiny"} {
		cfg, w, _ := openFixture(t, name)
		opt := LoadOptions{MaxRows: 4, MaxSeq: 32}
		want := prefillLogits(t, loadCPU(t, cfg, w, opt), testPrompts)
		dev, ops := cpuOps(t)
		no := &normOps{Ops: ops, n: map[kernels.Op]int{}}
		got := prefillLogits(t, loadOn(t, dev, no, cfg, w, opt), testPrompts)
		for r := range want {
			if !slices.Equal(got[r], want[r]) {
				t.Fatalf("%s: row %d's logits differ from those of the cpu set's own calls", name, r)
			}
		}
		layers, dense := cfg.NumLayers, cfg.NumLayers
		wantN := map[kernels.Op]int{kernels.OpRMSNorm: 1, kernels.OpNormLinear: layers - 1, kernels.OpNormSwiGLU: layers, kernels.OpAddRMSNorm: 1}
		if cfg.DeepSeek != nil {
			dense = cfg.DeepSeek.FirstKDenseReplace
			// MLA takes its input whole (layers − 1 adds), the MoE layers too.
			wantN = map[kernels.Op]int{kernels.OpRMSNorm: 1, kernels.OpNormSwiGLU: dense, kernels.OpAddRMSNorm: layers - 1 + layers - dense + 1}
		}
		// MLA's own norms (q_a's, kv_a's) are RMSNorm calls of its own: count
		// the layer norms only where the model has none.
		if cfg.DeepSeek != nil {
			delete(no.n, kernels.OpRMSNorm)
			delete(wantN, kernels.OpRMSNorm)
		}
		for op, n := range wantN {
			if no.n[op] != n {
				t.Errorf("%s (%d layers, %d dense): %s called %d times a step, want %d (all: %v)", name, layers, dense, op, no.n[op], n, no.n)
			}
		}
		if n := no.n[kernels.OpNormLinear]; cfg.DeepSeek != nil && n != 0 {
			t.Errorf("%s: add_rms_norm_linear called %d times; MLA takes its input whole", name, n)
		}
	}
}
