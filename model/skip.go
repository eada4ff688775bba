package model

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/fuselm/fuselm/kernels"
)

// skipEnv names ops that decode steps leave out: a measurement, not a mode.
// What a decode step costs with an op left out, against the same run with
// it, is what that op costs on the step's critical path, launches and
// overlap included, which no per-kernel time says (a kernel that runs under
// its neighbour's tail costs less than its own duration). The generated
// text is then wrong, and the run says so on stderr; prefill runs every op,
// so the cache and the first token are right. linear_swiglu and
// linear_add are left out whole or not at all: where a set does not fuse
// them their parts run inside the Dispatch, which this does not reach.
// rms_norm_rope, rope_attn_decode, moe_routed, add_add_rms_norm,
// add_rms_norm_linear, add_rms_norm_linear_swiglu,
// linear_add_rms_norm_linear and linear_add_rms_norm_linear_swiglu run as
// their parts through this when one of those is named (below), so that
// part alone is left out.
const skipEnv = "FUSELM_SKIP_OPS"

// skipOps parses skipEnv: nil when it is unset or empty, else the ops it
// names (comma-separated op names), or an error naming an unknown one or
// one a step cannot go without (embedding, argmax and decode_advance feed
// the next step).
func skipOps() ([]kernels.Op, error) {
	text := strings.TrimSpace(os.Getenv(skipEnv))
	if text == "" {
		return nil, nil
	}
	var ops []kernels.Op
	for _, name := range strings.Split(text, ",") {
		op := kernels.Op(strings.TrimSpace(name))
		switch {
		case !slices.Contains(kernels.AllOps, op):
			return nil, fmt.Errorf("model: %s=%q: unknown op %q", skipEnv, text, op)
		case op == kernels.OpEmbedding || op == kernels.OpArgmax || op == kernels.OpDecodeAdvance:
			return nil, fmt.Errorf("model: %s=%q: a decode step cannot leave out %s", skipEnv, text, op)
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// skipping runs every op on Ops but those in skip, which it leaves out.
type skipping struct {
	kernels.Ops
	skip map[kernels.Op]bool
}

func newSkipping(ops kernels.Ops, skip []kernels.Op) *skipping {
	s := &skipping{Ops: ops, skip: map[kernels.Op]bool{}}
	for _, op := range skip {
		s.skip[op] = true
	}
	return s
}

func (s *skipping) Linear(out, x, w, bias *kernels.Tensor) {
	if !s.skip[kernels.OpLinear] {
		s.Ops.Linear(out, x, w, bias)
	}
}

func (s *skipping) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	if !s.skip[kernels.OpRMSNorm] {
		s.Ops.RMSNorm(out, x, w, eps)
	}
}

func (s *skipping) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	if !s.skip[kernels.OpAddRMSNorm] {
		s.Ops.AddRMSNorm(out, resid, x, w, eps)
	}
}

func (s *skipping) Add(out, a, b *kernels.Tensor) {
	if !s.skip[kernels.OpAdd] {
		s.Ops.Add(out, a, b)
	}
}

// AddAddRMSNorm is left out when named; where add or add_rms_norm is
// named, it runs as its parts through s (add into x, then add_rms_norm of
// x), so that the one named alone is left out as it was before the MoE
// left its shared experts' output to the next norm.
func (s *skipping) AddAddRMSNorm(out, resid, x, y, w *kernels.Tensor, eps float32) {
	switch {
	case s.skip[kernels.OpAddAddRMSNorm]:
	case s.skip[kernels.OpAdd] || s.skip[kernels.OpAddRMSNorm]:
		kernels.AddAddRMSNormParts(s, out, resid, x, y, w, eps)
	default:
		s.Ops.AddAddRMSNorm(out, resid, x, y, w, eps)
	}
}

func (s *skipping) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	if !s.skip[kernels.OpRoPE] {
		s.Ops.RoPE(x, heads, headStride, offset, pos, r)
	}
}

func (s *skipping) SwiGLU(out, gateUp *kernels.Tensor) {
	if !s.skip[kernels.OpSwiGLU] {
		s.Ops.SwiGLU(out, gateUp)
	}
}

func (s *skipping) LinearSwiGLU(out, x, w *kernels.Tensor) {
	if !s.skip[kernels.OpLinearSwiGLU] {
		s.Ops.LinearSwiGLU(out, x, w)
	}
}

// RMSNormRoPE is left out when named; where one of its parts is named, it
// runs as its parts through s, so that rms_norm or rope alone is left out
// as it was before the three calls were one op.
func (s *skipping) RMSNormRoPE(q, kv, w *kernels.Tensor, eps float32, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	switch {
	case s.skip[kernels.OpRMSNormRoPE]:
	case s.skip[kernels.OpRMSNorm] || s.skip[kernels.OpRoPE]:
		kernels.RMSNormRoPEParts(s, q, kv, w, eps, heads, headStride, offset, pos, r)
	default:
		s.Ops.RMSNormRoPE(q, kv, w, eps, heads, headStride, offset, pos, r)
	}
}

func (s *skipping) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	if !s.skip[kernels.OpLinearAdd] {
		s.Ops.LinearAdd(out, x, w, bias, addend)
	}
}

// AddRMSNormLinear is left out when named; where add_rms_norm or linear is
// named, it runs as its parts through s, so that the one named alone is
// left out as it was before the layers called them as one op.
func (s *skipping) AddRMSNormLinear(out, h, resid, x, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	switch {
	case s.skip[kernels.OpNormLinear]:
	case s.skip[kernels.OpAddRMSNorm] || s.skip[kernels.OpLinear]:
		kernels.AddRMSNormLinearParts(s, out, h, resid, x, norm, eps, w, bias)
	default:
		s.Ops.AddRMSNormLinear(out, h, resid, x, norm, eps, w, bias)
	}
}

// AddAddRMSNormLinear is left out when named; where add_add_rms_norm (or
// one of its own parts) or linear is named, it runs as its parts through
// s, as AddRMSNormLinear does.
func (s *skipping) AddAddRMSNormLinear(out, h, resid, x, y, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	switch {
	case s.skip[kernels.OpAddAddNormLinear]:
	case s.skip[kernels.OpAddAddRMSNorm] || s.skip[kernels.OpAdd] || s.skip[kernels.OpAddRMSNorm] || s.skip[kernels.OpLinear]:
		kernels.AddAddRMSNormLinearParts(s, out, h, resid, x, y, norm, eps, w, bias)
	default:
		s.Ops.AddAddRMSNormLinear(out, h, resid, x, y, norm, eps, w, bias)
	}
}

// AddRMSNormLinearSwiGLU is left out when named; where add_rms_norm or
// linear_swiglu is named, it runs as its parts through s, as
// AddRMSNormLinear does.
func (s *skipping) AddRMSNormLinearSwiGLU(out, h, resid, x, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	switch {
	case s.skip[kernels.OpNormSwiGLU]:
	case s.skip[kernels.OpAddRMSNorm] || s.skip[kernels.OpLinearSwiGLU]:
		kernels.AddRMSNormLinearSwiGLUParts(s, out, h, resid, x, norm, eps, w)
	default:
		s.Ops.AddRMSNormLinearSwiGLU(out, h, resid, x, norm, eps, w)
	}
}

// LinearAddRMSNormLinear is left out when named; where linear,
// add_rms_norm or add_rms_norm_linear is named, it runs as its parts
// through s (Linear, then AddRMSNormLinear, itself split where its part is
// named), so that the one named alone is left out as it was before the
// layers called them as one op.
func (s *skipping) LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w, bias *kernels.Tensor) {
	switch {
	case s.skip[kernels.OpLinearNormLinear]:
	case s.skip[kernels.OpLinear] || s.skip[kernels.OpAddRMSNorm] || s.skip[kernels.OpNormLinear]:
		kernels.LinearAddRMSNormLinearParts(s, mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
	default:
		s.Ops.LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
	}
}

// LinearAddRMSNormLinearSwiGLU is left out when named; where linear,
// add_rms_norm, linear_swiglu or add_rms_norm_linear_swiglu is named, it
// runs as its parts through s, as LinearAddRMSNormLinear does.
func (s *skipping) LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm *kernels.Tensor, eps float32, w *kernels.Tensor) {
	switch {
	case s.skip[kernels.OpLinearNormSwiGLU]:
	case s.skip[kernels.OpLinear] || s.skip[kernels.OpAddRMSNorm] || s.skip[kernels.OpLinearSwiGLU] || s.skip[kernels.OpNormSwiGLU]:
		kernels.LinearAddRMSNormLinearSwiGLUParts(s, mid, x, w0, bias0, out, h, resid, norm, eps, w)
	default:
		s.Ops.LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, out, h, resid, norm, eps, w)
	}
}

// RoPEAttentionDecode is left out when named; where rope or attn_decode is
// named, it runs as its parts through s, so that the one named alone is
// left out as it was before Qwen2's layer called the two as one op.
func (s *skipping) RoPEAttentionDecode(a *kernels.AttnArgs, pos *kernels.Tensor, r *kernels.Rope) {
	switch {
	case s.skip[kernels.OpRoPEAttnDecode]:
	case s.skip[kernels.OpRoPE] || s.skip[kernels.OpAttnDecode]:
		kernels.RoPEAttentionDecodeParts(s, a, pos, r)
	default:
		s.Ops.RoPEAttentionDecode(a, pos, r)
	}
}

func (s *skipping) AttentionDecode(a *kernels.AttnArgs) {
	if !s.skip[kernels.OpAttnDecode] {
		s.Ops.AttentionDecode(a)
	}
}

func (s *skipping) MLADecode(a *kernels.MLAArgs) {
	if !s.skip[kernels.OpMLADecode] {
		s.Ops.MLADecode(a)
	}
}

// MLADecodeRoPE is left out when named; where one of its parts (rms_norm,
// rope, mla_decode) is named, it runs as its parts through s, so that the
// named part alone is left out as it was before the calls were one op.
func (s *skipping) MLADecodeRoPE(a *kernels.MLAArgs, w *kernels.Tensor, eps float32, pos *kernels.Tensor, r *kernels.Rope) {
	switch {
	case s.skip[kernels.OpMLADecodeRoPE]:
	case s.skip[kernels.OpRMSNorm] || s.skip[kernels.OpRoPE] || s.skip[kernels.OpRMSNormRoPE] || s.skip[kernels.OpMLADecode]:
		kernels.MLADecodeRoPEParts(s, a, w, eps, pos, r)
	default:
		s.Ops.MLADecodeRoPE(a, w, eps, pos, r)
	}
}

func (s *skipping) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	if !s.skip[kernels.OpMoERoute] {
		s.Ops.MoERoute(idx, weight, logits, r)
	}
}

func (s *skipping) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	if !s.skip[kernels.OpMoEExperts] {
		s.Ops.MoEExperts(out, x, idx, weight, gateUp, down)
	}
}

// MoERouted leaves out the whole op where skip names it, else the part
// skip names (the Dispatch runs a composite's parts out of reach of this
// wrapper), so that moe_route and moe_experts are left out as before the
// op; with neither named it runs whole.
func (s *skipping) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	switch route, experts := !s.skip[kernels.OpMoERoute], !s.skip[kernels.OpMoEExperts]; {
	case s.skip[kernels.OpMoERouted]:
	case route && experts:
		s.Ops.MoERouted(out, idx, weight, x, logits, gateUp, down, r)
	case route:
		s.Ops.MoERoute(idx, weight, logits, r)
	case experts:
		s.Ops.MoEExperts(out, x, idx, weight, gateUp, down)
	}
}

func (s *skipping) GroupGemm(out, x, w, first *kernels.Tensor) {
	if !s.skip[kernels.OpGroupGemm] {
		s.Ops.GroupGemm(out, x, w, first)
	}
}
