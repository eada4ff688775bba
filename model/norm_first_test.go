package model

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
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
func (o *normOps) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	o.n[kernels.OpAddAddRMSNorm]++
	o.Ops.AddAddRMSNorm(out, resid, x, y, w, eps)
}
func (o *normOps) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.n[kernels.OpAddAddNormLinear]++
	o.Ops.AddAddRMSNormLinear(out, h, resid, x, y, norm, eps, w, bias)
}
func (o *normOps) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.n[kernels.OpNormLinear]++
	o.Ops.AddRMSNormLinear(out, h, resid, x, norm, eps, w, bias)
}
func (o *normOps) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	o.n[kernels.OpNormSwiGLU]++
	o.Ops.AddRMSNormLinearSwiGLU(out, h, resid, x, norm, eps, w)
}
func (o *normOps) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	o.n[kernels.OpLinearNormLinear]++
	o.Ops.LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
}
func (o *normOps) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	o.n[kernels.OpLinearNormSwiGLU]++
	o.Ops.LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm, eps, w)
}

// Qwen2's attention and MLP take the residual add and the norm before them
// with their first projection, and the block before's last projection too
// (linear_add_rms_norm_linear, linear_add_rms_norm_linear_swiglu);
// DeepSeek-V2's dense MLPs take the add and the norm (after MLA, which
// leaves no projection pending: add_rms_norm_linear_swiglu); the first
// layer's attention (no add before it), MLA and the MoE take the norm
// alone (a dense MLP's down projection first, where one is pending), and
// the last norm stays add_rms_norm; after a DeepSeek-V2 MoE layer whose
// shared experts ran aside (a prefill of more than asideMinTokens tokens),
// the next norm adds its two outputs (add_add_rms_norm). The logits are
// those of the calls made one by one.
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
		wantN := map[kernels.Op]int{kernels.OpRMSNorm: 1, kernels.OpLinearNormLinear: layers - 1, kernels.OpLinearNormSwiGLU: layers,
			kernels.OpNormLinear: 0, kernels.OpNormSwiGLU: 0, kernels.OpAddRMSNorm: 1, kernels.OpAddAddRMSNorm: 0}
		if cfg.DeepSeek != nil {
			dense = cfg.DeepSeek.FirstKDenseReplace
			// MLA takes its input whole (layers − 1 adds), the MoE layers
			// too; the norm after each MoE layer adds both its outputs: the
			// next MLA's with its q+kv_a projection, the final one alone.
			moe := layers - dense
			wantN = map[kernels.Op]int{kernels.OpRMSNorm: 1, kernels.OpNormSwiGLU: dense, kernels.OpAddRMSNorm: layers - 1 + moe + 1 - moe,
				kernels.OpAddAddRMSNorm: 1, kernels.OpAddAddNormLinear: moe - 1, kernels.OpNormLinear: 0, kernels.OpLinearNormLinear: 0, kernels.OpLinearNormSwiGLU: 0}
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
	}
}

// opLog is an observer of a Dispatch: the ops it ran, in order, each with
// the layer the profile counts it under.
type opLog struct {
	layer int
	ops   []string
}

func (l *opLog) SetLayer(layer int) { l.layer = layer }

func (l *opLog) BeginOp(op kernels.Op, _ string) kernels.OpEnd {
	return opEnd(func() { l.ops = append(l.ops, fmt.Sprintf("%s@%d", op, l.layer)) })
}

// opEnd is told that an op's call was queued.
type opEnd func()

func (f opEnd) EndOp(string, kernels.Cost) { f() }

// A Qwen2 decode step runs a block's last projection with the next block's
// first (and the residual add and norm between) as one call of a set that
// fuses linear_add_rms_norm_linear and its SwiGLU twin, counted under the
// layer whose block it starts: o_proj's under its own, down_proj's under
// the next (the last layer's down_proj runs alone, before the final norm).
// Where the set does not fuse them, or the spec puts a part on another
// set, their parts run, the calls a step made before the ops; the logits
// are the same either way.
func TestChainAcrossBlocks(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "chain_test_only", Device: "cpu", Own: kernels.AllOps, Fallback: "cpu",
		Fuses: []kernels.Op{kernels.OpLinearNormLinear, kernels.OpLinearNormSwiGLU}, New: cpuSet.New})
	defer kernels.Unregister("chain_test_only")
	next, past := []int{3, 500, 42, 7}, make([]int, len(testPrompts))
	for b, p := range testPrompts {
		past[b] = len(p)
	}
	step := func(spec string) ([]string, [][]float32) {
		s, err := kernels.ParseSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		dev, log := cpu.NewDevice(), &opLog{}
		ops, err := s.Build(dev, log)
		if err != nil {
			t.Fatal(err)
		}
		m := loadOn(t, dev, ops, cfg, w, LoadOptions{MaxRows: len(testPrompts), MaxSeq: 32})
		prefillLogits(t, m, testPrompts)
		log.ops = nil
		return log.ops, decodeLogits(t, m, next, past)
	}
	// parts is seq with each call of the two ops as its parts, each under
	// the call's layer.
	parts := func(seq []string) []string {
		var out []string
		for _, c := range seq {
			op, layer, _ := strings.Cut(c, "@")
			if o := kernels.Op(op); o != kernels.OpLinearNormLinear && o != kernels.OpLinearNormSwiGLU {
				out = append(out, c)
				continue
			}
			for _, p := range kernels.PartsOf(kernels.Op(op)) {
				out = append(out, string(p)+"@"+layer)
			}
		}
		return out
	}
	want, wantLogits := step("cpu")
	fused, fusedLogits := step("chain_test_only")
	var chains []string
	for _, c := range fused {
		if op, _, _ := strings.Cut(c, "@"); strings.HasPrefix(op, "linear_add_rms_norm_linear") {
			chains = append(chains, c)
		}
	}
	var wantChains []string
	for i := range cfg.NumLayers {
		if i > 0 {
			wantChains = append(wantChains, fmt.Sprintf("%s@%d", kernels.OpLinearNormLinear, i))
		}
		wantChains = append(wantChains, fmt.Sprintf("%s@%d", kernels.OpLinearNormSwiGLU, i))
	}
	if !slices.Equal(chains, wantChains) {
		t.Errorf("a decode step on a set that fuses them: %v, want %v; all: %v", chains, wantChains, fused)
	}
	if got := parts(fused); !slices.Equal(got, want) {
		t.Errorf("the fused step's calls as their parts: %v, want the cpu set's %v", got, want)
	}
	for _, spec := range []string{"cpu", "chain_test_only,add_rms_norm=cpu"} {
		got, logits := step(spec)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want the parts %v", spec, got, want)
		}
		if !slices.EqualFunc(logits, wantLogits, slices.Equal) {
			t.Errorf("%s: the logits differ from another run's", spec)
		}
	}
	if !slices.EqualFunc(fusedLogits, wantLogits, slices.Equal) {
		t.Errorf("the logits with the ops whole differ from those of their parts")
	}
	for _, c := range want {
		if strings.HasPrefix(c, "linear_add_rms_norm_linear") {
			t.Errorf("the cpu set ran %s whole; it fuses neither", c)
		}
	}
}
