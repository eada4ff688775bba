package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// moe_routed_split (moe_split.cu), moe_routed's variant route_split on
// sm_90a: one token's routed experts in one launch after the router's
// logits. Every block routes the token, then streams whole weight rows, a
// few contiguous rows a copy, for an expert's 64 intermediate columns of
// gate/up, and then for a share of that expert's down rows once
// the expert's activations are all written (a count per choice; the down
// rows are already streaming); the last of a row range's blocks sums the
// experts. The folded path's two launches read their weights 128 bytes of a
// row at a time and put a launch hop between gate/up and down.
//
// Its results are within an ulp of moe_route then moe_experts', not bit
// for bit: the f32 sums run in another order (moe_split.cu). The routes
// are moe_route's bit for bit.

// The layout of moe_routed_split, named as in moe_split.cu.
const (
	splitVariant   = "route_split"
	msThreads      = 256             // MS_THREADS
	msRows         = 16              // MS_ROWS: weight rows of a stage
	msCols         = 64              // MS_COLS: intermediate columns of an item
	msMaxStages    = 16              // MS_MAX_STAGES
	msMaxK         = 32              // MS_MAX_K
	msMaxH         = 8192            // MS_MAX_H
	msMaxI         = 4096            // MS_MAX_I
	msMaxS         = 192             // MS_MAX_S: slices of an expert
	msCounters     = 64 + msMaxS     // MS_COUNTERS
	msTrace        = 128             // MS_TRACE: marks of a timeline
	msHead         = 2048            // MS_HEAD: bytes of the small arrays before x
	msWaitOthers   = 2               // status code of a wait for the other blocks' activations
	scrMoESplitAct = "moe.split.act" // moe_routed_split: each choice's activations bf16 [K, I]
	scrMoESplitY   = "moe.split.y"   // moe_routed_split: each choice's output bf16 [K, H]
)

// routeSplitTokens is the most tokens the default moe_routed runs
// moe_routed_split for (where it can run): one, the only count it takes.
// A variable, so that the tests of the folded path can turn it off (0).
var routeSplitTokens = 1

// msPlan is how moe_routed_split covers a token: items of msCols columns
// of an expert's intermediate, blocks blocks taking them in turn, a ring of
// stages slots; shared is a block's dynamic shared memory.
type msPlan struct {
	items, blocks, stages, shared int
}

func (p msPlan) String() string {
	return fmt.Sprintf("items=%d blocks=%d stage=%d whole rows slots=%d shared=%d", p.items, p.blocks, msRows, p.stages, p.shared)
}

// msSlot is the bytes of a ring slot: msRows rows of the wider of H and I.
func msSlot(hidden, inter int) int { return msRows * max(hidden, inter) * 2 }

// planSplit plans one token over top-k of experts experts of intermediate
// inter and hidden columns on sms SMs whose blocks may hold maxShared bytes:
// one block an SM at most (every block must be resident at once), as many
// slots of whole rows as fit up to msMaxStages, two at least. An error says
// why it cannot run.
func planSplit(hidden, inter, topk, experts, sms, maxShared int) (msPlan, error) {
	switch {
	case inter < msCols || inter%msCols != 0 || inter > msMaxI || inter/msCols > msMaxS:
		return msPlan{}, fmt.Errorf("I=%d is not a positive multiple of %d up to %d (whole items)", inter, msCols, msMaxI)
	case hidden < msCols || hidden%msCols != 0 || hidden > msMaxH:
		return msPlan{}, fmt.Errorf("H=%d is not a multiple of %d up to %d (x in shared memory)", hidden, msCols, msMaxH)
	case topk < 1 || topk > msMaxK:
		return msPlan{}, fmt.Errorf("top-%d: 1 to %d", topk, msMaxK)
	case experts > 32*routePerLane:
		return msPlan{}, fmt.Errorf("%d experts, at most %d", experts, 32*routePerLane)
	}
	items := topk * inter / msCols
	blocks := min(items, max(1, sms))
	fixed := msHead + (2*(hidden+inter)+127)/128*128
	slot := msSlot(hidden, inter)
	stages := min(msMaxStages, (maxShared-fixed)/slot)
	if stages < 2 {
		return msPlan{}, fmt.Errorf("x and the activations [%d + %d] leave no room for two stages of %d whole rows (%d bytes each) in %d bytes of shared memory",
			hidden, inter, msRows, slot, maxShared)
	}
	return msPlan{items: items, blocks: blocks, stages: stages, shared: fixed + stages*slot}, nil
}

// msModule is moe_routed_split's NVRTC module.
func msModule() cudaset.Module { return module("moe_split.cu", []string{"moe_routed_split"}) }

// msKit is moe_routed_split on one device.
type msKit struct {
	err      error           // why it cannot run here; nil when it can
	status   *kernels.Tensor // i32 [hopperStatusLen]: a timed-out wait's record, zero while none
	counters *kernels.Tensor // i32 [msCounters]: the counts of finished items, zero between launches
	// trace, where a probe sets it, is an i64 [msTrace] for block 0's
	// timeline (moe_split.cu's ms_mark); 0 in every other launch.
	trace uintptr
}

// newMoESplit compiles moe_routed_split into k where the device allows it,
// lets it take all the shared memory a block may, and launches it
// overlapped. It never fails: what went wrong is kept in the kit.
func newMoESplit(k *cudaset.Kit) *msKit {
	m := &msKit{}
	if m.err = addHopperModule(k, "moe_routed "+splitVariant, "moe_routed_split", msModule()); m.err != nil {
		return m
	}
	if err := k.FitShared("moe_routed_split", k.MaxShared); err != nil {
		m.err = fmt.Errorf("fused: moe_routed %s: %w", splitVariant, err)
		return m
	}
	k.Overlap(msModule().Funcs...)
	m.status = newWaitStatus(k)
	m.counters = newCounters(k, msCounters)
	return m
}

// ready is nil where moe_routed_split runs, else why not.
func (m *msKit) ready() error {
	if m == nil {
		return fmt.Errorf("fused: moe_routed %s: not built", splitVariant)
	}
	return m.err
}

// routedSplit launches moe_routed_split for one token, or reports false,
// launching nothing, where it cannot (the caller runs the folded path):
// bf16 throughout, packed 16-byte aligned weights, x on a 16-byte boundary.
func (o *ops) routedSplit(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) bool {
	n, hidden := x.Rows(), x.Cols()
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	if n != 1 || o.ms.ready() != nil || !cudaset.IsBF16(x) || !cudaset.IsBF16(out) || !cudaset.IsBF16(gateUp) || !cudaset.IsBF16(down) ||
		gateUp.Pitch != hidden || down.Pitch != inter || o.D.Ptr(gateUp)%16 != 0 || o.D.Ptr(down)%16 != 0 || o.D.Ptr(x)%16 != 0 {
		return false
	}
	p, err := planSplit(hidden, inter, r.TopK, experts, o.SMs, o.MaxShared)
	if err != nil {
		return false
	}
	act := o.Scratch(scrMoESplitAct, kernels.BF16, r.TopK, inter)
	y := o.Scratch(scrMoESplitY, kernels.BF16, r.TopK, hidden)
	args := []any{o.D.Ptr(out), o.D.Ptr(x), o.D.Ptr(logits)}
	args = append(append(args, routeArgs(experts, r)...), o.D.Ptr(idx), o.D.Ptr(weight), o.D.Ptr(gateUp), o.D.Ptr(down),
		act.P, y.P, int32(hidden), int32(inter), int32(p.stages), o.D.Ptr(o.ms.counters), o.D.Ptr(o.ms.status), o.ms.trace)
	o.LaunchShared("moe_routed_split", p.blocks, msThreads, p.shared, args...)
	return true
}

// moeSplitWaits reports a wait of moe_routed_split that timed out since the
// last call (synchronizing with the device), and clears the record and the
// counts (a block that gave up may have left them counted).
func (o *ops) moeSplitWaits() error {
	if o.ms == nil {
		return nil
	}
	st, err := o.takeWait(o.ms.status)
	if st == nil {
		return err
	}
	o.D.Zero(o.ms.counters)
	if st[0] == msWaitOthers {
		return fmt.Errorf("fused: moe_routed_split: block %d waited too long for the other blocks' activations of item %d (the kernel gave up; its output is garbage)",
			st[1], st[5])
	}
	return fmt.Errorf("fused: moe_routed_split: a wait for a stage of weights timed out: block %d, thread %d, stage %d, parity %d (the kernel gave up; its output is garbage)",
		st[1], st[4], st[5], st[6])
}

// splitValid is moe_routed's variant route_split for shape s on t, or why
// it cannot run it: offered on hopperArch only.
func splitValid(s kernels.Shape, t kernels.Target) (params, why string, offered bool) {
	if t.Arch != hopperArch {
		return "", "", false
	}
	if c := gemmTiling(kernels.OpMoERouted, s); c.Name != foldTiling {
		return "", "", false
	}
	params = fmt.Sprintf("one token in one launch (an expert's %d columns of gate/up a block, then its share of the expert's down rows, "+
		"bulk copies of whole row stretches; the last block of a row range sums the experts); more tokens as %s", msCols, routedVariant)
	p, err := planSplit(s["H"], s["I"], s["topk"], s["E"], t.SMs, t.SharedPerBlock)
	if err != nil {
		return params, err.Error(), true
	}
	return params + "; " + p.String(), "", true
}
