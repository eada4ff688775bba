package kernels

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Observer is told of the op calls of a Dispatch: the profile
// (kernels/profile) counts and times them through it.
type Observer interface {
	// BeginOp is told that a call of op is about to run on set; it returns
	// what is told when the call has been queued, or nil when it does not
	// follow this call.
	BeginOp(op Op, set string) OpEnd
	// SetLayer says which decoder layer the calls that follow belong to,
	// -1 for none.
	SetLayer(layer int)
}

// OpEnd is told that the call BeginOp was told of has been queued: on set
// (the one BeginOp named, or the set it fell back to, see Unsupported),
// with the work it does.
type OpEnd interface {
	EndOp(set string, cost Cost)
}

// Dispatch is the Ops that Spec.Build makes: it routes every op to the set
// the spec chose for it, falls back where that set declines a call, and
// tells its Observer of every call, with the set that ran it and its cost.
type Dispatch struct {
	dev   Device
	obs   Observer       // nil: nobody is told
	kind  string         // the device kind of the sets
	built map[string]Ops // every set built so far, by name (Switch adds to it)
	pick  []Ops          // the set that runs each op, in opTable's order
	names []string       // its name
	whole []bool         // whether a composite op runs as one call (Spec.Whole), else as its parts
	// scratch holds the intermediates of composite ops run as their
	// parts, by name (see scratch).
	scratch map[string]*Tensor
	version uint64 // Version
}

// Build makes the Ops this spec selects on dev, every call told to obs
// (nil for none: the profile, kernels/profile, is the usual observer).
func (s Spec) Build(dev Device, obs Observer) (*Dispatch, error) {
	d := &Dispatch{dev: dev, obs: obs, built: map[string]Ops{},
		pick: make([]Ops, len(opTable)), names: make([]string, len(opTable)), whole: make([]bool, len(opTable)),
		scratch: map[string]*Tensor{}}
	if err := d.use(s); err != nil {
		return nil, err
	}
	return d, nil
}

// Switch makes d run the ops as spec s selects them from now on, building
// the sets it had not built yet on the same device: a loaded model then
// runs another spec without loading its weights again. Work queued before,
// and graphs captured before, keep the kernels they were recorded with.
func (d *Dispatch) Switch(s Spec) error { return d.use(s) }

// Version counts the calls of Switch and the tuning choices applied since
// d was built (kernels.Versioned): a graph recorded at one version runs the
// kernels d would choose only while it stands.
func (d *Dispatch) Version() uint64 { return d.version }

// use builds the sets s needs that d has not built and points every op at
// the set s runs it on; on error nothing changes.
func (d *Dispatch) use(s Spec) error {
	kind, err := s.DeviceKind()
	if err != nil {
		return err
	}
	if d.kind != "" && kind != d.kind {
		return fmt.Errorf("kernel spec %q runs on %s devices, not on the %s device these ops were built for", s, kind, d.kind)
	}
	for _, name := range s.names() {
		if d.built[name] != nil {
			continue
		}
		info, _ := lookup(name)
		ops, err := info.New(d.dev)
		if err != nil {
			return fmt.Errorf("kernel set %s: %w", name, err)
		}
		d.built[name] = ops
	}
	for i, o := range AllOps {
		d.names[i] = s.Runner(o)
		d.pick[i] = d.built[d.names[i]]
		d.whole[i] = s.Whole(o)
	}
	d.kind = kind
	d.version++
	return nil
}

// SetLayer tells d's observer which decoder layer the calls that follow
// belong to; -1 means none.
func (d *Dispatch) SetLayer(layer int) {
	if d.obs != nil {
		d.obs.SetLayer(layer)
	}
}

// LayerMarker is implemented by Ops that tell an observer which decoder
// layer their calls belong to (Dispatch): the model marks each layer
// through it when its Ops have it.
type LayerMarker interface {
	SetLayer(layer int)
}

// TunerOf is the Tunable of the set that runs op, and whether it has one.
// A variant chosen through it directly (kbench's timed rows) is not counted
// by Version: it is for ops that no model's graph outlives.
func (d *Dispatch) TunerOf(op Op) (Tunable, bool) {
	i := opIndex(op)
	if i < 0 {
		return nil, false
	}
	t, ok := d.pick[i].(Tunable)
	return t, ok
}

// Tuned is one tuning choice: set's op runs Variant for problems of Key.
type Tuned struct {
	Set     string `json:"set"`
	Op      Op     `json:"op"`
	Key     string `json:"key"`
	Variant string `json:"variant"`
}

// ApplyTuning makes the sets d runs use the choices that concern them; it
// returns the choices it applied and, for each one it could not, why.
func (d *Dispatch) ApplyTuning(choices []Tuned) (applied []Tuned, skipped []error) {
	for _, c := range choices {
		i := opIndex(c.Op)
		if i < 0 {
			skipped = append(skipped, fmt.Errorf("%s: unknown op %q", c.Set, c.Op))
			continue
		}
		if d.names[i] != c.Set {
			continue // this run does not run op on that set
		}
		t, ok := d.pick[i].(Tunable)
		if !ok {
			skipped = append(skipped, fmt.Errorf("%s %s: the set has no variants", c.Set, c.Op))
			continue
		}
		if err := t.UseVariant(c.Op, c.Key, c.Variant); err != nil {
			skipped = append(skipped, fmt.Errorf("%s %s %s: %w", c.Set, c.Op, c.Key, err))
			continue
		}
		applied = append(applied, c)
		d.version++
	}
	return applied, skipped
}

// call runs f, a call of op, on op's set, telling the observer; the call's
// cost comes from running f on costOf after the set ran it (and checked the
// arguments).
func (d *Dispatch) call(op Op, f func(Ops)) {
	i := opPos[op]
	if d.obs == nil {
		d.run(i, f)
		return
	}
	end := d.obs.BeginOp(op, d.names[i])
	set := d.run(i, f)
	if end != nil {
		var c Cost
		f(costOf{&c})
		end.EndOp(set, c)
	}
}

// callWhole runs a composite op: whole, a call of it, on its set where the
// spec runs it as one call (Spec.Whole), else parts, which calls its parts
// through d, each told to the observer as its own op. A set that declines
// the whole call (Unsupported: it fuses only some shapes) has the parts
// run too, not its fallback's composite: the observer is then told of the
// parts only, so a call shows as the op only where one kernel ran it.
func (d *Dispatch) callWhole(op Op, whole func(Ops), parts func()) {
	i := opPos[op]
	if !d.whole[i] {
		parts()
		return
	}
	var end OpEnd
	if d.obs != nil {
		end = d.obs.BeginOp(op, d.names[i])
	}
	if _, declined := Declined(func() { whole(d.pick[i]) }); declined {
		parts() // the begun call is dropped: a set declines before it queues any work
		return
	}
	if end != nil {
		var c Cost
		whole(costOf{&c})
		end.EndOp(d.names[i], c)
	}
}

// moERoutedParts is MoERouted as its parts, MoERoute into idx and weight
// then MoEExperts over them, each on the set the spec runs it on.
func (d *Dispatch) moERoutedParts(out, idx, weight, x, logits, gateUp, down *Tensor, r *Routing) {
	d.MoERoute(idx, weight, logits, r)
	d.MoEExperts(out, x, idx, weight, gateUp, down)
}

// addAddRMSNormParts is AddAddRMSNorm as its parts, each on the set the
// spec runs it on.
func (d *Dispatch) addAddRMSNormParts(out, resid, x, y, w *Tensor, eps float32) {
	AddAddRMSNormParts(d, out, resid, x, y, w, eps)
}

// AddAddRMSNormParts runs AddAddRMSNorm's work on o as the calls it
// replaces: Add of x and y into x, then AddRMSNorm of x into resid. The
// sets that do not fuse it run it so, and so does a Dispatch where the
// spec splits its parts.
func AddAddRMSNormParts(o Ops, out, resid, x, y, w *Tensor, eps float32) {
	o.Add(x, x, y)
	o.AddRMSNorm(out, resid, x, w, eps)
}

// linearSwiGLUParts is LinearSwiGLU as its parts, Linear into a [N, 2I]
// intermediate then SwiGLU, each on the set the spec runs it on.
func (d *Dispatch) linearSwiGLUParts(out, x, w *Tensor) {
	gateUp := d.scratchOf("linear_swiglu.gate_up", out.DType, x.Rows(), w.Rows())
	d.Linear(gateUp, x, w, nil)
	d.SwiGLU(out, gateUp)
}

// rmsNormRoPEParts is RMSNormRoPE as its parts, RMSNorm then RoPE twice,
// each on the set the spec runs it on.
func (d *Dispatch) rmsNormRoPEParts(q, kv, w *Tensor, eps float32, heads, headStride, offset int, pos *Tensor, r *Rope) {
	RMSNormRoPEParts(d, q, kv, w, eps, heads, headStride, offset, pos, r)
}

// RMSNormRoPEParts runs RMSNormRoPE's work on o as the three calls it
// replaces: RMSNorm of kv's latent in place, RoPE of q's heads, RoPE of
// k_pe (kv's one head after the latent). The sets that do not fuse it run
// it so, and so does a Dispatch where the spec splits its parts.
func RMSNormRoPEParts(o Ops, q, kv, w *Tensor, eps float32, heads, headStride, offset int, pos *Tensor, r *Rope) {
	rank := w.Numel()
	latent := kv.ColSlice(0, rank)
	o.RMSNorm(latent, latent, w, eps)
	o.RoPE(q, heads, headStride, offset, pos, r)
	o.RoPE(kv, 1, kv.Cols(), rank, pos, r)
}

// mlaDecodeRoPEParts is MLADecodeRoPE as its parts through d:
// RMSNormRoPE, which may itself run whole, then MLADecode.
func (d *Dispatch) mlaDecodeRoPEParts(a *MLAArgs, w *Tensor, eps float32, pos *Tensor, r *Rope) {
	MLADecodeRoPEParts(d, a, w, eps, pos, r)
}

// MLADecodeRoPEParts runs MLADecodeRoPE's work on o as the two calls it
// replaces: RMSNormRoPE of a.Q and a.KV (a.Heads heads of
// NopeDim+RopeDim, rotated from NopeDim), then MLADecode(a). The sets that
// do not fuse it run it so, and so does a Dispatch where the spec splits
// its parts.
func MLADecodeRoPEParts(o Ops, a *MLAArgs, w *Tensor, eps float32, pos *Tensor, r *Rope) {
	o.RMSNormRoPE(a.Q, a.KV, w, eps, a.Heads, a.NopeDim+a.RopeDim, a.NopeDim, pos, r)
	o.MLADecode(a)
}

// roPEAttentionDecodeParts is RoPEAttentionDecode as its parts, RoPE then
// AttentionDecode, each on the set the spec runs it on.
func (d *Dispatch) roPEAttentionDecodeParts(a *AttnArgs, pos *Tensor, r *Rope) {
	RoPEAttentionDecodeParts(d, a, pos, r)
}

// RoPEAttentionDecodeParts runs RoPEAttentionDecode's work on o as the
// calls it replaces: RoPE of the q and k heads, one call where a.K's
// columns follow a.Q's in the rows of one matrix (the layer's qkv buffer,
// which it rotated so), else one each; then AttentionDecode. The sets that
// do not fuse it run it so, and so does a Dispatch where the spec splits
// its parts.
func RoPEAttentionDecodeParts(o Ops, a *AttnArgs, pos *Tensor, r *Rope) {
	if qk := joined(a.Q, a.K); qk != nil {
		o.RoPE(qk, a.Heads+a.KVHeads, a.HeadDim, 0, pos, r)
	} else {
		o.RoPE(a.Q, a.Heads, a.HeadDim, 0, pos, r)
		o.RoPE(a.K, a.KVHeads, a.HeadDim, 0, pos, r)
	}
	o.AttentionDecode(a)
}

// joined is the view of a's columns then b's where b's follow a's in the
// rows of one matrix (one buffer, type and pitch), else nil.
func joined(a, b *Tensor) *Tensor {
	if a.Buf != b.Buf || a.DType != b.DType || len(a.Shape) != 2 || len(b.Shape) != 2 || a.Rows() != b.Rows() ||
		a.Pitch != b.Pitch || b.Offset != a.Offset+a.Cols() || a.Cols()+b.Cols() > a.Pitch && a.Rows() > 1 {
		return nil
	}
	v := *a
	v.Shape = []int{a.Rows(), a.Cols() + b.Cols()}
	return &v
}

// linearAddParts is LinearAdd as its parts, each on the set the spec runs
// it on: Linear into a [N, M] intermediate, then Add of addend and it into
// out (addend first, as the MoE added its shared experts before the op),
// so that out may be addend.
func (d *Dispatch) linearAddParts(out, x, w, bias, addend *Tensor) {
	lin := d.scratchOf("linear_add.linear", out.DType, x.Rows(), w.Rows())
	d.Linear(lin, x, w, bias)
	d.Add(out, addend, lin)
}

// addRMSNormLinearParts is AddRMSNormLinear as its parts, each on the set
// the spec runs it on.
func (d *Dispatch) addRMSNormLinearParts(out, h, resid, x, norm *Tensor, eps float32, w, bias *Tensor) {
	AddRMSNormLinearParts(d, out, h, resid, x, norm, eps, w, bias)
}

// AddRMSNormLinearParts runs AddRMSNormLinear's work on o as the calls it
// replaces: AddRMSNorm into h, then Linear of h. The sets that do not fuse
// it run it so, and so does a Dispatch where the spec splits its parts.
func AddRMSNormLinearParts(o Ops, out, h, resid, x, norm *Tensor, eps float32, w, bias *Tensor) {
	o.AddRMSNorm(h, resid, x, norm, eps)
	o.Linear(out, h, w, bias)
}

// addAddRMSNormLinearParts is AddAddRMSNormLinear as its parts, each on
// the set the spec runs it on.
func (d *Dispatch) addAddRMSNormLinearParts(out, h, resid, x, y, norm *Tensor, eps float32, w, bias *Tensor) {
	AddAddRMSNormLinearParts(d, out, h, resid, x, y, norm, eps, w, bias)
}

// AddAddRMSNormLinearParts runs AddAddRMSNormLinear's work on o as the
// calls it replaces: AddAddRMSNorm into h (on a Dispatch itself one op or
// Add and AddRMSNorm, as the spec puts those), then Linear of h. The sets
// that do not fuse it run it so, and so does a Dispatch where the spec
// splits its parts.
func AddAddRMSNormLinearParts(o Ops, out, h, resid, x, y, norm *Tensor, eps float32, w, bias *Tensor) {
	o.AddAddRMSNorm(h, resid, x, y, norm, eps)
	o.Linear(out, h, w, bias)
}

// addRMSNormLinearSwiGLUParts is AddRMSNormLinearSwiGLU as its parts, each
// on the set the spec runs it on.
func (d *Dispatch) addRMSNormLinearSwiGLUParts(out, h, resid, x, norm *Tensor, eps float32, w *Tensor) {
	AddRMSNormLinearSwiGLUParts(d, out, h, resid, x, norm, eps, w)
}

// AddRMSNormLinearSwiGLUParts runs AddRMSNormLinearSwiGLU's work on o:
// AddRMSNorm into h, then LinearSwiGLU of h (on a Dispatch itself one op
// or Linear and SwiGLU, as the spec puts those).
func AddRMSNormLinearSwiGLUParts(o Ops, out, h, resid, x, norm *Tensor, eps float32, w *Tensor) {
	o.AddRMSNorm(h, resid, x, norm, eps)
	o.LinearSwiGLU(out, h, w)
}

// linearAddRMSNormLinearParts is LinearAddRMSNormLinear as its parts, each
// on the set the spec runs it on.
func (d *Dispatch) linearAddRMSNormLinearParts(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w, bias *Tensor) {
	LinearAddRMSNormLinearParts(d, mid, x, w0, bias0, out, h, resid, norm, eps, w, bias)
}

// LinearAddRMSNormLinearParts runs LinearAddRMSNormLinear's work on o as
// the calls it replaces: Linear into mid, then AddRMSNormLinear of mid (on
// a Dispatch itself one op or AddRMSNorm and Linear, as the spec puts
// those). The sets that do not fuse it run it so, and so does a Dispatch
// where the spec splits its parts.
func LinearAddRMSNormLinearParts(o Ops, mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w, bias *Tensor) {
	o.Linear(mid, x, w0, bias0)
	o.AddRMSNormLinear(out, h, resid, mid, norm, eps, w, bias)
}

// linearAddRMSNormLinearSwiGLUParts is LinearAddRMSNormLinearSwiGLU as its
// parts, each on the set the spec runs it on.
func (d *Dispatch) linearAddRMSNormLinearSwiGLUParts(mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w *Tensor) {
	LinearAddRMSNormLinearSwiGLUParts(d, mid, x, w0, bias0, out, h, resid, norm, eps, w)
}

// LinearAddRMSNormLinearSwiGLUParts runs LinearAddRMSNormLinearSwiGLU's
// work on o: Linear into mid, then AddRMSNormLinearSwiGLU of mid (on a
// Dispatch itself one op or its parts, as the spec puts those).
func LinearAddRMSNormLinearSwiGLUParts(o Ops, mid, x, w0, bias0, out, h, resid, norm *Tensor, eps float32, w *Tensor) {
	o.Linear(mid, x, w0, bias0)
	o.AddRMSNormLinearSwiGLU(out, h, resid, mid, norm, eps, w)
}

// Faulter is a kernel set whose kernels may give up on a bounded wait and
// leave a record of it on the device instead of hanging (fused's Hopper
// kernels and their mbarrier waits): their outputs are then garbage.
// Faults reports what was recorded since the last call, and clears it;
// nil when nothing was. It reads the device, so it waits for queued work.
type Faulter interface {
	Faults() error
}

// Faults is every set d has built that is a Faulter's Faults, joined, in
// the order of the sets' names.
func (d *Dispatch) Faults() error {
	names := slices.Sorted(maps.Keys(d.built))
	var errs []error
	for _, name := range names {
		if f, ok := d.built[name].(Faulter); ok {
			errs = append(errs, f.Faults())
		}
	}
	return JoinFaults(errs...)
}

// JoinFaults is the non-nil errs as one error of one line, their messages
// joined by "; " (errors.Join's newlines would break a run's one-line
// failure), or nil where there are none.
func JoinFaults(errs ...error) error {
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}

// scratchOf is a packed [rows, cols] tensor of dt over the buffer d keeps
// under name, which grows (the old one freed: work queued on it is
// unaffected) when it is too small. Like the sets' scratch, a decode step
// sizes it when it first runs eagerly, before a graph captures it.
func (d *Dispatch) scratchOf(name string, dt DType, rows, cols int) *Tensor {
	t := d.scratch[name]
	if t == nil || t.Buf.Bytes() < rows*cols*dt.Size() {
		if t != nil {
			d.dev.Free(t)
		}
		t = d.dev.Alloc(dt, rows, cols)
		d.scratch[name] = t
	}
	return NewTensor(t.Buf, dt, 0, rows, cols)
}

// run calls f on op i's set, or, when that set declines the call
// (Unsupported), on the set it falls back to, and so on; it returns the
// name of the set that ran it.
func (d *Dispatch) run(i int, f func(Ops)) string {
	name := d.names[i]
	for {
		ops := d.built[name]
		u, declined := Declined(func() { f(ops) })
		if !declined {
			return name
		}
		fb := FallbackOf(name)
		if fb == "" || d.built[fb] == nil {
			panic(u)
		}
		name = fb
	}
}

// Unsupported is what a set panics with when it has no kernel for the
// shapes of one call, before queueing any of its work: the fused set's
// kernels are instantiated for some head dims and latent ranks only, say.
// The Dispatch then runs that call on the set's fallback (see FallbackOf),
// and the profile names the set that ran it; a set with no fallback lets
// the panic through.
type Unsupported struct {
	Set string
	Op  Op
	Why string
}

func (u Unsupported) Error() string { return u.Set + ": " + string(u.Op) + ": " + u.Why }

// Declined calls f and reports the Unsupported it panicked with, if it
// did; any other panic goes on.
func Declined(f func()) (u Unsupported, declined bool) {
	defer func() {
		if r := recover(); r != nil {
			if u, declined = r.(Unsupported); !declined {
				panic(r)
			}
		}
	}()
	f()
	return u, false
}
