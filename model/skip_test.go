package model

import (
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestSkipOps holds FUSELM_SKIP_OPS's parsing: unset is nothing left out,
// names are ops, and an unknown op or one a step needs is an error.
func TestSkipOps(t *testing.T) {
	t.Setenv(skipEnv, "")
	if ops, err := skipOps(); ops != nil || err != nil {
		t.Errorf("unset: %v, %v", ops, err)
	}
	t.Setenv(skipEnv, "rope, rms_norm")
	if ops, err := skipOps(); err != nil || len(ops) != 2 || ops[0] != kernels.OpRoPE || ops[1] != kernels.OpRMSNorm {
		t.Errorf("rope, rms_norm: %v, %v", ops, err)
	}
	for text, want := range map[string]string{"ropes": "unknown op", "argmax": "cannot leave out", "rope,embedding": "cannot leave out",
		"decode_advance": "cannot leave out"} {
		t.Setenv(skipEnv, text)
		if _, err := skipOps(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", text, err, want)
		}
	}
	// The wrapper leaves out what it names and runs the rest.
	var c counting
	s := newSkipping(&c, []kernels.Op{kernels.OpRoPE})
	s.RoPE(nil, 0, 0, 0, nil, nil)
	s.Add(nil, nil, nil)
	if c.rope != 0 || c.add != 1 {
		t.Errorf("skipping rope: rope ran %d times, add %d, want 0 and 1", c.rope, c.add)
	}
	// MLA's norm and ropes, one op: left out whole when named, run as
	// their parts (the rope ones left out) when rope is named.
	q, kv, w := &kernels.Tensor{Shape: []int{1, 8}, Pitch: 8}, &kernels.Tensor{Shape: []int{1, 6}, Pitch: 6}, &kernels.Tensor{Shape: []int{4}, Pitch: 4}
	r := &kernels.Rope{Dim: 2}
	s.RMSNormRoPE(q, kv, w, 1e-6, 2, 4, 2, nil, r)
	if c.norm != 1 || c.rope != 0 || c.whole != 0 {
		t.Errorf("skipping rope: MLA's rms_norm_rope ran rms_norm %d times, rope %d, whole %d, want 1, 0, 0", c.norm, c.rope, c.whole)
	}
	c = counting{}
	s = newSkipping(&c, []kernels.Op{kernels.OpRMSNormRoPE})
	s.RMSNormRoPE(q, kv, w, 1e-6, 2, 4, 2, nil, r)
	if c.norm != 0 || c.rope != 0 || c.whole != 0 {
		t.Errorf("skipping rms_norm_rope: it ran (rms_norm %d, rope %d, whole %d)", c.norm, c.rope, c.whole)
	}
	s = newSkipping(&c, []kernels.Op{kernels.OpAdd})
	s.RMSNormRoPE(q, kv, w, 1e-6, 2, 4, 2, nil, r)
	if c.norm != 0 || c.rope != 0 || c.whole != 1 {
		t.Errorf("skipping add: rms_norm_rope ran rms_norm %d times, rope %d, whole %d, want 0, 0, 1", c.norm, c.rope, c.whole)
	}
	// MLA's decode with its norm and ropes: left out whole when named; run
	// as its parts when one of them is named, that one left out.
	a := &kernels.MLAArgs{Q: q, KV: kv, Heads: 2, NopeDim: 2, RopeDim: 2, Rank: 4}
	for _, c2 := range []struct {
		skip                       kernels.Op
		norm, rope, nr, mla, whole int
	}{
		{kernels.OpMLADecodeRoPE, 0, 0, 0, 0, 0},
		{kernels.OpRoPE, 1, 0, 0, 1, 0},
		{kernels.OpRMSNormRoPE, 0, 0, 0, 1, 0},
		{kernels.OpMLADecode, 0, 0, 1, 0, 0},
		{kernels.OpAdd, 0, 0, 0, 0, 1},
	} {
		c = counting{}
		newSkipping(&c, []kernels.Op{c2.skip}).MLADecodeRoPE(a, w, 1e-6, nil, r)
		got := [5]int{c.norm, c.rope, c.whole, c.mla, c.mlaWhole}
		if want := [5]int{c2.norm, c2.rope, c2.nr, c2.mla, c2.whole}; got != want {
			t.Errorf("skipping %s: mla_decode_rope ran rms_norm, rope, rms_norm_rope, mla_decode, whole %v times, want %v", c2.skip, got, want)
		}
	}
}

// counting counts the calls of some ops; the others are not called.
type counting struct {
	kernels.Ops
	rope, add, norm, whole int
	mla, mlaWhole          int
	attn, ropeAttn         int
}

func (c *counting) MLADecode(*kernels.MLAArgs) { c.mla++ }
func (c *counting) MLADecodeRoPE(*kernels.MLAArgs, *kernels.Tensor, float32, *kernels.Tensor, *kernels.Rope) {
	c.mlaWhole++
}

func (c *counting) RoPE(*kernels.Tensor, int, int, int, *kernels.Tensor, *kernels.Rope) { c.rope++ }
func (c *counting) Add(_, _, _ *kernels.Tensor)                                         { c.add++ }
func (c *counting) RMSNorm(_, _, _ *kernels.Tensor, _ float32)                          { c.norm++ }
func (c *counting) RMSNormRoPE(_, _, _ *kernels.Tensor, _ float32, _, _, _ int, _ *kernels.Tensor, _ *kernels.Rope) {
	c.whole++
}
func (c *counting) AttentionDecode(*kernels.AttnArgs) { c.attn++ }
func (c *counting) RoPEAttentionDecode(*kernels.AttnArgs, *kernels.Tensor, *kernels.Rope) {
	c.ropeAttn++
}

// TestSkipMoERouted: leaving out moe_route or moe_experts leaves out that
// part of a moe_routed call and runs the other; moe_routed leaves out both.
func TestSkipMoERouted(t *testing.T) {
	for _, c := range []struct {
		skip                  []kernels.Op
		whole, route, experts int
	}{
		{nil, 1, 0, 0},
		{[]kernels.Op{kernels.OpMoERoute}, 0, 0, 1},
		{[]kernels.Op{kernels.OpMoEExperts}, 0, 1, 0},
		{[]kernels.Op{kernels.OpMoERoute, kernels.OpMoEExperts}, 0, 0, 0},
		{[]kernels.Op{kernels.OpMoERouted}, 0, 0, 0},
	} {
		var m moeCounting
		newSkipping(&m, c.skip).MoERouted(nil, nil, nil, nil, nil, nil, nil, nil)
		if m.whole != c.whole || m.route != c.route || m.experts != c.experts {
			t.Errorf("skipping %v: moe_routed, moe_route, moe_experts ran %d, %d, %d times, want %d, %d, %d",
				c.skip, m.whole, m.route, m.experts, c.whole, c.route, c.experts)
		}
	}
}

// moeCounting counts the calls of the MoE ops; the others are not called.
type moeCounting struct {
	kernels.Ops
	whole, route, experts int
}

func (c *moeCounting) MoERouted(_, _, _, _, _, _, _ *kernels.Tensor, _ *kernels.Routing) { c.whole++ }
func (c *moeCounting) MoERoute(_, _, _ *kernels.Tensor, _ *kernels.Routing)              { c.route++ }
func (c *moeCounting) MoEExperts(_, _, _, _, _, _ *kernels.Tensor)                       { c.experts++ }

// TestSkipRoPEAttnDecode: leaving out rope or attn_decode leaves out that
// part of Qwen2's rope_attn_decode and runs the other (rope as the layer
// called it before, one call over the q and k heads); rope_attn_decode
// leaves out both, and another op named leaves it whole.
func TestSkipRoPEAttnDecode(t *testing.T) {
	const heads, kvHeads, dim = 4, 2, 8
	qkv := &kernels.Tensor{Shape: []int{1, (heads + 2*kvHeads) * dim}, Pitch: (heads + 2*kvHeads) * dim}
	a := &kernels.AttnArgs{Q: qkv.ColSlice(0, heads*dim), K: qkv.ColSlice(heads*dim, (heads+kvHeads)*dim),
		Heads: heads, KVHeads: kvHeads, HeadDim: dim}
	for _, c := range []struct {
		skip              []kernels.Op
		whole, rope, attn int
	}{
		{nil, 1, 0, 0},
		{[]kernels.Op{kernels.OpAdd}, 1, 0, 0},
		{[]kernels.Op{kernels.OpRoPE}, 0, 0, 1},
		{[]kernels.Op{kernels.OpAttnDecode}, 0, 1, 0},
		{[]kernels.Op{kernels.OpRoPEAttnDecode}, 0, 0, 0},
	} {
		var n counting
		newSkipping(&n, c.skip).RoPEAttentionDecode(a, nil, &kernels.Rope{Dim: dim})
		if n.ropeAttn != c.whole || n.rope != c.rope || n.attn != c.attn {
			t.Errorf("skipping %v: rope_attn_decode ran whole %d times, rope %d, attn_decode %d; want %d, %d, %d",
				c.skip, n.ropeAttn, n.rope, n.attn, c.whole, c.rope, c.attn)
		}
	}
}

// TestSkipLinearNormLinear: naming linear_add_rms_norm_linear or its
// SwiGLU twin leaves the op out whole; naming one of its parts (or the
// composite after its first projection) runs it as its parts with that one
// left out, as before the layers called them as one op; another op named
// leaves it whole.
func TestSkipLinearNormLinear(t *testing.T) {
	for _, c := range []struct {
		skip   kernels.Op
		swiglu bool
		// linear, add_rms_norm, linear_swiglu, add_rms_norm_linear(_swiglu), the op whole
		want [5]int
	}{
		{kernels.OpAdd, false, [5]int{0, 0, 0, 0, 1}},
		{kernels.OpLinearNormLinear, false, [5]int{}},
		{kernels.OpLinear, false, [5]int{0, 1, 0, 0, 0}},
		{kernels.OpAddRMSNorm, false, [5]int{2, 0, 0, 0, 0}},
		{kernels.OpNormLinear, false, [5]int{1, 0, 0, 0, 0}},
		{kernels.OpAdd, true, [5]int{0, 0, 0, 0, 1}},
		{kernels.OpLinearNormSwiGLU, true, [5]int{}},
		{kernels.OpLinear, true, [5]int{0, 0, 0, 1, 0}},
		{kernels.OpAddRMSNorm, true, [5]int{1, 0, 1, 0, 0}},
		{kernels.OpLinearSwiGLU, true, [5]int{1, 1, 0, 0, 0}},
		{kernels.OpNormSwiGLU, true, [5]int{1, 0, 0, 0, 0}},
	} {
		var n chainCounting
		s := newSkipping(&n, []kernels.Op{c.skip})
		op := kernels.OpLinearNormLinear
		if c.swiglu {
			op = kernels.OpLinearNormSwiGLU
			s.LinearAddRMSNormLinearSwiGLU(nil, nil, nil, nil, nil, nil, nil, nil, 1e-6, nil)
		} else {
			s.LinearAddRMSNormLinear(nil, nil, nil, nil, nil, nil, nil, nil, 1e-6, nil, nil)
		}
		if got := [5]int{n.linear, n.norm, n.linearSwiGLU, n.normLinear, n.whole}; got != c.want {
			t.Errorf("skipping %s: %s ran linear, add_rms_norm, linear_swiglu, the norm with its projection, whole %v times, want %v",
				c.skip, op, got, c.want)
		}
	}
}

// chainCounting counts the calls of linear_add_rms_norm_linear, its SwiGLU
// twin and their parts; the other ops are not called.
type chainCounting struct {
	kernels.Ops
	linear, norm, linearSwiGLU, normLinear, whole int
}

func (c *chainCounting) Linear(_, _, _, _ *kernels.Tensor)                { c.linear++ }
func (c *chainCounting) AddRMSNorm(_, _, _, _ *kernels.Tensor, _ float32) { c.norm++ }
func (c *chainCounting) LinearSwiGLU(_, _, _ *kernels.Tensor)             { c.linearSwiGLU++ }
func (c *chainCounting) AddRMSNormLinear(_, _, _, _, _ *kernels.Tensor, _ float32, _, _ *kernels.Tensor) {
	c.normLinear++
}
func (c *chainCounting) AddRMSNormLinearSwiGLU(_, _, _, _, _ *kernels.Tensor, _ float32, _ *kernels.Tensor) {
	c.normLinear++
}
func (c *chainCounting) LinearAddRMSNormLinear(_, _, _, _, _, _, _, _ *kernels.Tensor, _ float32, _, _ *kernels.Tensor) {
	c.whole++
}
func (c *chainCounting) LinearAddRMSNormLinearSwiGLU(_, _, _, _, _, _, _, _ *kernels.Tensor, _ float32, _ *kernels.Tensor) {
	c.whole++
}

// TestSkipAddAddRMSNorm: naming add_add_rms_norm leaves it out whole;
// naming add or add_rms_norm runs it as its parts with that one left out,
// as before the MoE left its shared experts' output to the next norm;
// another op named leaves it whole.
func TestSkipAddAddRMSNorm(t *testing.T) {
	for _, c := range []struct {
		skip             kernels.Op
		add, norm, whole int
	}{
		{kernels.OpRoPE, 0, 0, 1},
		{kernels.OpAddAddRMSNorm, 0, 0, 0},
		{kernels.OpAdd, 0, 1, 0},
		{kernels.OpAddRMSNorm, 1, 0, 0},
	} {
		var n joinCounting
		newSkipping(&n, []kernels.Op{c.skip}).AddAddRMSNorm(nil, nil, nil, nil, nil, 1e-6)
		if n.add != c.add || n.norm != c.norm || n.whole != c.whole {
			t.Errorf("skipping %s: add_add_rms_norm ran add %d times, add_rms_norm %d, whole %d; want %d, %d, %d",
				c.skip, n.add, n.norm, n.whole, c.add, c.norm, c.whole)
		}
	}
}

// joinCounting counts the calls of add_add_rms_norm and its parts; the
// other ops are not called.
type joinCounting struct {
	kernels.Ops
	add, norm, whole int
}

func (c *joinCounting) Add(_, _, _ *kernels.Tensor)                            { c.add++ }
func (c *joinCounting) AddRMSNorm(_, _, _, _ *kernels.Tensor, _ float32)       { c.norm++ }
func (c *joinCounting) AddAddRMSNorm(_, _, _, _, _ *kernels.Tensor, _ float32) { c.whole++ }
