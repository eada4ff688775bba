package layers

import "github.com/fuselm/fuselm/kernels"

// Workspace buffers of MLP and MoE.
const (
	bufAct          = "mlp.act"           // [T, intermediate] act: silu(gate)·up
	bufRouterLogits = "moe.router_logits" // [T, n_routed_experts] f32
	bufTopkIdx      = "moe.topk_idx"      // [T, num_experts_per_tok] i32
	bufTopkWeight   = "moe.topk_weight"   // [T, num_experts_per_tok] f32
	bufSharedOut    = "moe.shared_out"    // [T, hidden] act: the shared experts' output, computed aside
)

// MLP is the SwiGLU feed-forward block, as HF's Qwen2MLP and DeepseekV2MLP:
// down_proj(silu(gate_proj(x)) · up_proj(x)). The gate/up projection and
// SwiGLU are one op, LinearSwiGLU, which a kernel set may run as one GEMM
// with SwiGLU in its epilogue (the [T, 2·intermediate] of gate and up then
// never reaches memory) or as Linear then SwiGLU, as before.
type MLP struct {
	// GateUpProj is gate_proj and up_proj stacked: weight
	// [2·intermediate, hidden], the gate rows first; no bias (HF's have
	// none).
	GateUpProj Linear
	DownProj   Linear // down_proj [hidden, intermediate]
}

// IntermediateSize is the width of the hidden activation.
func (m *MLP) IntermediateSize() int { return m.GateUpProj.OutFeatures() / 2 }

// Reserve asks ws for the buffers Forward uses.
func (m *MLP) Reserve(ws *Workspace, act kernels.DType) {
	ws.Reserve(bufAct, act, m.IntermediateSize())
}

// Forward computes out [T, hidden] from x [T, hidden].
func (m *MLP) Forward(s *Step, out, x *kernels.Tensor) {
	m.DownProj.Forward(s, out, m.act(s, x))
}

// ForwardNorm is Forward on in.Ready(s), the residual add and the norm
// taken with the gate/up projection where in has an add (see
// ForwardDefer).
func (m *MLP) ForwardNorm(s *Step, out *kernels.Tensor, in NormIn) {
	m.ForwardDefer(s, out, in).Forward(s, out)
}

// ForwardDefer is ForwardNorm but for down_proj, which it returns: the
// gate/up projection takes the residual add and the norm with it
// (AddRMSNormLinearSwiGLU) where in has an add, and the block before's
// pending projection too (LinearAddRMSNormLinearSwiGLU) where in has one.
func (m *MLP) ForwardDefer(s *Step, out *kernels.Tensor, in NormIn) *Pending {
	act := m.actBuf(s)
	switch p := in.Pending; {
	case in.Add == nil, p != nil && p.Also != nil: // no add, or two parts to add: no projection op takes them
		s.Ops.LinearSwiGLU(act, in.Ready(s), m.GateUpProj.Weight)
	case p != nil:
		s.Ops.LinearAddRMSNormLinearSwiGLU(in.Add, p.X, p.Proj.Weight, p.Proj.Bias,
			act, in.H, in.Resid, in.Norm.Weight, in.Norm.Eps, m.GateUpProj.Weight)
	default:
		s.Ops.AddRMSNormLinearSwiGLU(act, in.H, in.Resid, in.Add, in.Norm.Weight, in.Norm.Eps, m.GateUpProj.Weight)
	}
	return &Pending{Proj: &m.DownProj, X: act}
}

// act is silu(gate_proj(x)) · up_proj(x) [T, intermediate], in the
// workspace.
func (m *MLP) act(s *Step, x *kernels.Tensor) *kernels.Tensor {
	act := m.actBuf(s)
	s.Ops.LinearSwiGLU(act, x, m.GateUpProj.Weight)
	return act
}

// actBuf is the workspace's buffer of act.
func (m *MLP) actBuf(s *Step) *kernels.Tensor {
	if m.GateUpProj.Bias != nil {
		panic("layers: MLP.GateUpProj has a bias; LinearSwiGLU takes none (HF's gate_proj and up_proj have none)")
	}
	return s.WS.Get(bufAct, s.Tokens(), m.IntermediateSize())
}

// MoE is DeepSeek-V2's mixture of experts, as HF's DeepseekV2Moe:
//
//	logits = x·gateᵀ in f32                       (DeepseekV2TopkRouter)
//	idx, w = route(softmax(logits))               (Routing)
//	out = Σ_k w_k · expert_{idx_k}(x) + shared_experts(x)
//
// The routing and the routed experts are one op, MoERouted, which a kernel
// set may run as one kernel chain (the routing in the experts' first
// kernel) or as MoERoute then MoEExperts, as before.
// The shared experts' down projection is added to the routed experts'
// output in one op, LinearAdd; where the shared experts run aside (see
// asideMinTokens) their output joins the routed experts' in the next
// block's residual add and norm instead (ForwardDefer).
type MoE struct {
	// Gate is the router, mlp.gate.weight [n_routed_experts, hidden]; its
	// output is f32, as HF computes router logits in float32.
	Gate    Linear
	Routing kernels.Routing
	// Experts are the routed experts' weights stacked as in transformers
	// 5.x's DeepseekV2Experts: GateUp [E, 2·moe_intermediate, hidden] (gate
	// rows first) and Down [E, hidden, moe_intermediate].
	ExpertsGateUp *kernels.Tensor
	ExpertsDown   *kernels.Tensor
	// SharedExperts is the always-on MLP of width moe_intermediate ·
	// n_shared_experts; nil when n_shared_experts is 0.
	SharedExperts *MLP
}

// Reserve asks ws for the buffers Forward uses.
func (m *MoE) Reserve(ws *Workspace, act kernels.DType) {
	ws.Reserve(bufRouterLogits, kernels.F32, m.Gate.OutFeatures())
	ws.Reserve(bufTopkIdx, kernels.I32, m.Routing.TopK)
	ws.Reserve(bufTopkWeight, kernels.F32, m.Routing.TopK)
	if m.SharedExperts != nil {
		m.SharedExperts.Reserve(ws, act)
		ws.Reserve(bufSharedOut, act, m.SharedExperts.DownProj.OutFeatures())
	}
}

// asideMinTokens is the fewest tokens of a step whose shared experts run
// beside the routed ones. Measured on DeepSeek-V2-Lite's decode
// (bench/RESULTS.md): at one token (W3) the side's reads slow the routed
// experts' kernels more than the two launches off the chain save (with
// its gate/up alone aside; the whole MLP there is not measured), at 16
// rows (W4, W5) the branch gains, and gains more with the down projection
// on it too (then the two outputs summed after both, not linear_add
// after the routed experts); 9 is where the fused set's MoE leaves its block-a-tile
// kernels for the persistent grid, which shares the SMs better. Between 1
// and 16 rows it is not measured; at one token (W3) the whole MLP aside
// lost too (bench/TRIED.md).
const asideMinTokens = 9

// Forward computes out [T, hidden] from x [T, hidden]. The shared
// experts need only x, so from asideMinTokens tokens the whole shared MLP
// is queued beside the router and the routed experts (Step.Aside), and
// its output is added to theirs once both are done; below, its down
// projection is added with it (LinearAdd). The sums round alike: the
// projection to act, then the sum.
func (m *MoE) Forward(s *Step, out, x *kernels.Tensor) {
	if shared := m.forward(s, out, x); shared != nil {
		s.Ops.Add(out, out, shared)
	}
}

// ForwardDefer is Forward on in.Ready(s), but where the shared experts ran
// aside it leaves their output unadded: out holds the routed experts'
// output and the returned Pending's Also the shared experts', which the
// next block's NormIn adds into the residual with it and normalises, one
// op (add_add_rms_norm) where Forward's add and that norm were two. Below
// asideMinTokens, or without shared experts, it writes out whole and
// returns nil.
func (m *MoE) ForwardDefer(s *Step, out *kernels.Tensor, in NormIn) *Pending {
	if shared := m.forward(s, out, in.Ready(s)); shared != nil {
		return &Pending{Also: shared}
	}
	return nil
}

// forward is Forward but for the add of the shared experts' output where
// they ran aside: it returns that output (in the workspace, ready once the
// ops it queued after the join run), else nil, out then whole.
func (m *MoE) forward(s *Step, out, x *kernels.Tensor) (shared *kernels.Tensor) {
	T, K := s.Tokens(), m.Routing.TopK
	var act *kernels.Tensor
	join := func() {}
	switch {
	case m.SharedExperts == nil:
	case T >= asideMinTokens:
		shared = s.WS.Get(bufSharedOut, T, m.SharedExperts.DownProj.OutFeatures())
		join = s.Aside(func() { m.SharedExperts.Forward(s, shared, x) })
	default:
		act = m.SharedExperts.act(s, x)
	}
	logits := s.WS.Get(bufRouterLogits, T, m.Gate.OutFeatures())
	m.Gate.Forward(s, logits, x)
	idx := s.WS.Get(bufTopkIdx, T, K)
	weight := s.WS.Get(bufTopkWeight, T, K)
	s.Ops.MoERouted(out, idx, weight, x, logits, m.ExpertsGateUp, m.ExpertsDown, &m.Routing)
	join()
	if act != nil {
		down := m.SharedExperts.DownProj
		s.Ops.LinearAdd(out, act, down.Weight, down.Bias, out)
	}
	return shared
}
