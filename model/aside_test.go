package model

import (
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
func (o *orderOps) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	*o.log = append(*o.log, "moe_routed")
	o.Ops.MoERouted(out, idx, weight, x, logits, gateUp, down, r)
}

// DeepSeek-V2's MoE queues its shared experts (gate/up and SwiGLU, then
// down) beside the router and the routed experts, and adds their output to
// the routed one after the join, in steps of asideMinTokens tokens or
// more; on a device that can branch, the logits are those of one that
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
	// the routed experts beside it, the join, then the sum.
	moe := "aside{ linear_swiglu linear } linear moe_routed join add"
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
	if strings.Contains(seq, "aside{") || strings.Count(seq, inOrder) != moeLayers {
		t.Errorf("a 3-token step: want %d MoE layers as %q and no branch; the calls: %s", moeLayers, inOrder, seq)
	}
}
