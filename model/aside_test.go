package model

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// sideDevice is a CPU device that answers Aside as a second stream would be
// asked: it logs where the branch opens and closes and where it is joined,
// into the log the ops below write their names to. The work runs in
// order, so the logits must be those of a run without a side.
type sideDevice struct {
	*cpu.Device
	log *[]string
}

func (d *sideDevice) Aside(f func()) func() {
	*d.log = append(*d.log, "aside{")
	f()
	*d.log = append(*d.log, "}")
	return func() { *d.log = append(*d.log, "join") }
}

// orderOps logs the names of the MoE's ops.
type orderOps struct {
	kernels.Ops
	log *[]string
}

func (o *orderOps) Linear(out, x, w, bias *kernels.Tensor) {
	*o.log = append(*o.log, "linear")
	o.Ops.Linear(out, x, w, bias)
}
func (o *orderOps) LinearSwiGLU(out, x, w *kernels.Tensor) {
	*o.log = append(*o.log, "linear_swiglu")
	o.Ops.LinearSwiGLU(out, x, w)
}
func (o *orderOps) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	*o.log = append(*o.log, "linear_add")
	o.Ops.LinearAdd(out, x, w, bias, addend)
}
func (o *orderOps) Add(out, a, b *kernels.Tensor) {
	*o.log = append(*o.log, "add")
	o.Ops.Add(out, a, b)
}
func (o *orderOps) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	*o.log = append(*o.log, "add_add_rms_norm")
	o.Ops.AddAddRMSNorm(out, resid, x, y, w, eps)
}
func (o *orderOps) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	*o.log = append(*o.log, "add_add_rms_norm_linear")
	o.Ops.AddAddRMSNormLinear(out, h, resid, x, y, norm, eps, w, bias)
}
func (o *orderOps) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	*o.log = append(*o.log, "moe_routed")
	o.Ops.MoERouted(out, idx, weight, x, logits, gateUp, down, r)
}

// DeepSeek-V2's MoE queues its shared experts (gate/up and SwiGLU, then
// down) beside the router and the routed experts, and leaves their output
// and the routed one to the next norm after the join, which adds both
// into the residual (add_add_rms_norm), in steps of asideMinTokens tokens
// or more; on a device that can branch, the logits are those of one that
// cannot, bit for bit.
func TestMoESharedAside(t *testing.T) {
	cfg, w, _ := openFixture(t, "deepseek-v2-tiny")
	opt := LoadOptions{MaxRows: 4, MaxSeq: 32}
	want := prefillLogits(t, loadCPU(t, cfg, w, opt), testPrompts)

	inner, ops := cpuOps(t)
	var log []string
	dev := &sideDevice{Device: inner.(*cpu.Device), log: &log}
	m := loadOn(t, dev, &orderOps{Ops: ops, log: &log}, cfg, w, opt)
	log = log[:0]
	got := prefillLogits(t, m, testPrompts)
	for r := range want {
		if !slices.Equal(got[r], want[r]) {
			t.Fatalf("row %d: logits with the shared experts aside differ from those in order", r)
		}
	}
	// One MoE layer's calls: the branch (the shared MLP), the router and
	// the routed experts beside it, the join, then the next norm of the
	// two outputs' sum (the next layer's, with its attention's first
	// projection, or the final norm).
	moe := "aside{ linear_swiglu linear } linear moe_routed join add_add_rms_norm"
	seq := strings.Join(log, " ")
	moeLayers := cfg.NumLayers - cfg.DeepSeek.FirstKDenseReplace
	if n := strings.Count(seq, moe); n != moeLayers || moeLayers < 1 {
		t.Errorf("%d MoE layers ran as %q, want %d; the calls: %s", n, moe, moeLayers, seq)
	}
	if n := strings.Count(seq, "aside{"); n != moeLayers {
		t.Errorf("%d branches for %d MoE layers: %s", n, moeLayers, seq)
	}

	// A step of fewer tokens keeps them in order: the shared experts
	// before the router, no branch.
	log = log[:0]
	decodeLogits(t, m, []int{17, 5, 400}, []int{0, 0, 0})
	seq = strings.Join(log, " ")
	inOrder := "linear_swiglu linear moe_routed linear_add"
	if strings.Contains(seq, "aside{") || strings.Count(seq, inOrder) != moeLayers || strings.Contains(seq, "add_add_rms_norm") {
		t.Errorf("a 3-token step: want %d MoE layers as %q, no branch and no add_add_rms_norm; the calls: %s", moeLayers, inOrder, seq)
	}
}

// Where DeepSeek-V2's shared experts ran aside, a decode step of 12 rows,
// their output and the routed experts' join the next norm in one call of
// add_add_rms_norm, counted under the layer whose block that norm starts
// (the last layer's under it, with the final norm), in place of the add
// after the join and the add_rms_norm; where the spec splits the op its
// parts run, add then add_rms_norm, the calls a step made before it (the
// add now counted under the norm's layer, not the MoE's). On
// bf16 activations the logits are the same bit for bit.
func TestMoESharedJoinsNorm(t *testing.T) {
	cfg, w, _ := openFixture(t, "deepseek-v2-tiny")
	const rows = 12
	ids := make([]int, rows)
	for b := range ids {
		ids[b] = 17 + 31*b
	}
	step := func(spec string) ([]string, [][]float32) {
		s, err := kernels.ParseSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		dev, err := cpu.NewDeviceAct(kernels.BF16)
		if err != nil {
			t.Fatal(err)
		}
		log := &opLog{}
		ops, err := s.Build(dev, log)
		if err != nil {
			t.Fatal(err)
		}
		m := loadOn(t, dev, ops, cfg, w, LoadOptions{MaxRows: rows, MaxSeq: 32})
		prefillLogits(t, m, testPrompts)
		log.ops = nil
		return log.ops, decodeLogits(t, m, ids, make([]int, rows))
	}
	whole, wholeLogits := step("cpu,add_add_rms_norm=cpu")
	parts, partsLogits := step("cpu")
	var joins, split []string
	for _, c := range whole {
		op, layer, _ := strings.Cut(c, "@")
		if kernels.Op(op) != kernels.OpAddAddRMSNorm {
			split = append(split, c)
			continue
		}
		joins = append(joins, c)
		for _, p := range kernels.PartsOf(kernels.OpAddAddRMSNorm) {
			split = append(split, string(p)+"@"+layer)
		}
	}
	var wantJoins []string
	for i := cfg.DeepSeek.FirstKDenseReplace; i < cfg.NumLayers; i++ {
		wantJoins = append(wantJoins, fmt.Sprintf("%s@%d", kernels.OpAddAddRMSNorm, min(i+1, cfg.NumLayers-1)))
	}
	if len(wantJoins) == 0 || !slices.Equal(joins, wantJoins) {
		t.Errorf("a %d-row decode step: add_add_rms_norm calls %v, want %v; all: %v", rows, joins, wantJoins, whole)
	}
	if !slices.Equal(split, parts) {
		t.Errorf("the step's calls with add_add_rms_norm as its parts: %v, want the split spec's %v", split, parts)
	}
	if !slices.EqualFunc(wholeLogits, partsLogits, slices.Equal) {
		t.Errorf("the logits with add_add_rms_norm whole differ from those of its parts")
	}
}
