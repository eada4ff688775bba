package kernels_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	_ "github.com/fuselm/fuselm/kernels/fused"
	_ "github.com/fuselm/fuselm/kernels/naive"
	"github.com/fuselm/fuselm/kernels/profile"
)

func TestParseSpec(t *testing.T) {
	cases := []struct {
		in      string
		canon   string
		setFor  map[kernels.Op]string
		wantErr string
	}{
		{in: "cpu", canon: "cpu", setFor: map[kernels.Op]string{kernels.OpRoPE: "cpu"}},
		{in: " fused , attn=naive,rope=naive ", canon: "fused,rope=naive,attn_prefill=naive,attn_decode=naive",
			setFor: map[kernels.Op]string{kernels.OpAttnPrefill: "naive", kernels.OpAttnDecode: "naive", kernels.OpRoPE: "naive", kernels.OpSwiGLU: "fused"}},
		{in: "naive,moe=fused,moe_route=naive", canon: "naive,moe_experts=fused",
			setFor: map[kernels.Op]string{kernels.OpMoERoute: "naive", kernels.OpMoEExperts: "fused"}},
		{in: "naive,rms_norm=naive", canon: "naive"},
		{in: "", wantErr: "no kernel set named"},
		{in: "turbo", wantErr: `unknown kernel set "turbo"`},
		{in: "fused,attn=turbo", wantErr: `unknown kernel set "turbo"`},
		{in: "fused,flash=naive", wantErr: `unknown op "flash"`},
		{in: "fused,attn", wantErr: "is not OP=SET"},
		{in: "fused,=naive", wantErr: "is not OP=SET"},
	}
	for _, c := range cases {
		s, err := kernels.ParseSpec(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ParseSpec(%q) error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", c.in, err)
			continue
		}
		if got := s.String(); got != c.canon {
			t.Errorf("ParseSpec(%q).String() = %q, want %q", c.in, got, c.canon)
		}
		for op, want := range c.setFor {
			if got := s.SetFor(op); got != want {
				t.Errorf("ParseSpec(%q).SetFor(%s) = %q, want %q", c.in, op, got, want)
			}
		}
	}
}

func TestSpecDevices(t *testing.T) {
	s, _ := kernels.ParseSpec("cpu,rope=naive")
	if _, err := s.DeviceKind(); err == nil || !strings.Contains(err.Error(), "mixes sets of different devices") {
		t.Errorf("cpu with a naive op: %v, want an error about mixed devices", err)
	}
	for spec, want := range map[string]string{"cpu": "cpu", "fused": "cuda", "naive,rope=fused": "cuda"} {
		s, _ = kernels.ParseSpec(spec)
		if k, err := s.DeviceKind(); err != nil || k != want {
			t.Errorf("%s: %q, %v, want %s", spec, k, err, want)
		}
	}
}

// TestRunners checks which set runs each op: the one the spec names, or its
// fallback for the ops it has no kernel of its own for.
func TestRunners(t *testing.T) {
	for _, c := range []struct {
		spec string
		want map[kernels.Op]string
	}{
		{"fused", map[kernels.Op]string{kernels.OpRoPE: "fused", kernels.OpAddRMSNorm: "fused",
			kernels.OpAttnDecode: "fused", kernels.OpLinear: "fused", kernels.OpEmbedding: "naive", kernels.OpArgmax: "fused", kernels.OpAdd: "fused",
			kernels.OpDecodeAdvance: "naive"}},
		{"fused,attn=naive", map[kernels.Op]string{kernels.OpAttnPrefill: "naive", kernels.OpAttnDecode: "naive",
			kernels.OpSwiGLU: "fused"}},
		{"naive,add_rms_norm=fused,embedding=fused", map[kernels.Op]string{kernels.OpAddRMSNorm: "fused",
			kernels.OpRMSNorm: "naive", kernels.OpEmbedding: "naive", kernels.OpLinear: "naive"}},
		{"cpu", map[kernels.Op]string{kernels.OpLinear: "cpu", kernels.OpMoEExperts: "cpu"}},
	} {
		s, err := kernels.ParseSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		for op, want := range c.want {
			if got := s.Runner(op); got != want {
				t.Errorf("%s: %s runs on %q, want %q", c.spec, op, got, want)
			}
		}
	}
	for kind, want := range map[string]string{"cpu": "cpu", "cuda": "fused", "tpu": ""} {
		if got := kernels.DefaultSet(kind); got != want {
			t.Errorf("DefaultSet(%s) = %q, want %q", kind, got, want)
		}
	}
}

// TestOpTable checks that the op list, the groups and the profile's order
// all come from one table that names every op once.
func TestOpTable(t *testing.T) {
	seen := map[kernels.Op]bool{}
	for i, info := range kernels.OpTable() {
		if seen[info.Op] || info.Doc == "" || kernels.AllOps[i] != info.Op {
			t.Errorf("op table row %d: %+v", i, info)
		}
		seen[info.Op] = true
	}
	if g := kernels.OpGroups["attn"]; len(g) != 2 || g[0] != kernels.OpAttnPrefill || g[1] != kernels.OpAttnDecode {
		t.Errorf("group attn = %v", g)
	}
}

// profiledCPU is the cpu set's ops on a cpu device, with their profile.
func profiledCPU(t *testing.T) (*cpu.Device, *profile.Profile, *kernels.Dispatch) {
	t.Helper()
	dev := cpu.NewDevice()
	prof := profile.New(dev)
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	return dev, prof, ops
}

// TestBuildProfiles checks that ops built from a spec count and time every
// call under the op and phase it belongs to.
func TestBuildProfiles(t *testing.T) {
	dev, prof, ops := profiledCPU(t)
	a, b := dev.Alloc(kernels.F32, 4, 8), dev.Alloc(kernels.F32, 4, 8)
	if err := dev.Upload(a, make([]byte, 4*32), kernels.F32); err != nil {
		t.Fatal(err)
	}
	if err := dev.Upload(b, make([]byte, 4*32), kernels.F32); err != nil {
		t.Fatal(err)
	}
	ops.Add(a, a, b)
	prof.SetPhase("decode")
	ops.Add(a, a, b)
	ops.Add(a, a, b)
	prof.SetEnabled(false)
	ops.Add(a, a, b)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	rows := prof.Table()
	if len(rows) != 1 || rows[0].Op != kernels.OpAdd || rows[0].Calls != 3 || rows[0].Share != 1 {
		t.Fatalf("profile %+v, want one add row of 3 calls and all the share", rows)
	}
	if _, ok := rows[0].PhaseMs["prefill"]; !ok {
		t.Errorf("no prefill time recorded: %+v", rows[0].PhaseMs)
	}
	if _, ok := rows[0].PhaseMs["decode"]; !ok {
		t.Errorf("no decode time recorded: %+v", rows[0].PhaseMs)
	}
	prof.Reset()
	if rows := prof.Table(); len(rows) != 0 {
		t.Errorf("after Reset: %+v", rows)
	}
}

func TestParseShape(t *testing.T) {
	s, err := kernels.ParseShape(" N=4096, B=4,H=32 ,D=128,causal=1")
	if err != nil || s.String() != "B=4,H=32,D=128,N=4096,causal=1" {
		t.Errorf("ParseShape: %v, %v", s, err)
	}
	if s.DType(kernels.BF16) != kernels.BF16 {
		t.Errorf("a shape without dt is of the activations' type, not %v", s.DType(kernels.BF16))
	}
	s, err = kernels.ParseShape("dt=f16,N=4096,D=128")
	if err != nil || s.String() != "D=128,N=4096,dt=f16" || s.DType(kernels.BF16) != kernels.F16 {
		t.Errorf("ParseShape with dt: %v, %v", s, err)
	}
	for in, want := range map[string]string{
		"dt=f8":        "is not one of [f32 bf16 f16]",
		"dt=2":         "is not one of",
		"dt=i32":       "is not one of",
		"B=4,B=5":      "given twice",
		"B":            "not NAME=VALUE",
		"=3":           "not NAME=VALUE",
		"N=-1":         "not a whole number",
		"N=4096x":      "not a whole number",
		"N=9999999999": "not a whole number",
	} {
		if _, err := kernels.ParseShape(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseShape(%q) = %v, want an error with %q", in, err, want)
		}
	}
}

// TestApplyTuning: choices for sets the run does not use are passed over,
// choices for a set without variants are reported.
func TestApplyTuning(t *testing.T) {
	dev := cpu.NewDevice()
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := ops.Version()
	applied, skipped := ops.ApplyTuning([]kernels.Tuned{
		{Set: "fused", Op: kernels.OpAttnPrefill, Key: "D=128", Variant: "w4_m2"},
		{Set: "cpu", Op: kernels.OpAttnPrefill, Key: "D=128", Variant: "fast"},
		{Set: "cpu", Op: "warp_drive", Variant: "x"},
	})
	if len(applied) != 0 || len(skipped) != 2 || !strings.Contains(skipped[0].Error(), "has no variants") ||
		!strings.Contains(skipped[1].Error(), "unknown op") {
		t.Errorf("applied %v, skipped %v", applied, skipped)
	}
	if ops.Version() != v {
		t.Errorf("no choice applied, but the version moved from %d to %d", v, ops.Version())
	}
	if info, _ := kernels.Set("naive"); len(info.VariantsOf(kernels.OpRoPE, nil, kernels.Targets["sm_90a"])) != 1 {
		t.Errorf("naive's rope: want its one default variant")
	}
	if info, _ := kernels.Set("fused"); info.VariantsOf(kernels.OpEmbedding, nil, kernels.Targets["sm_90a"]) != nil {
		t.Errorf("fused's embedding: want no variants (naive runs it)")
	}
}

// Switch re-points built ops at another spec, and refuses what it cannot
// build, changing nothing. (Only the Ops of Spec.Build have it: the type
// says so.)
func TestSwitch(t *testing.T) {
	dev, prof, ops := profiledCPU(t)
	s, _ := kernels.ParseSpec("cpu")
	naive, _ := kernels.ParseSpec("naive")
	v := ops.Version()
	if err := ops.Switch(naive); err == nil || !strings.Contains(err.Error(), "runs on cuda devices, not on the cpu device") {
		t.Errorf("Switch to a set of another device: %v", err)
	}
	if ops.Version() != v {
		t.Errorf("a refused Switch moved the version from %d to %d", v, ops.Version())
	}
	if err := ops.Switch(s); err != nil {
		t.Fatal(err)
	}
	if ops.Version() == v {
		t.Errorf("Switch left the version at %d: graphs recorded before it would replay the old kernels", v)
	}
	a := dev.Alloc(kernels.F32, 1, 4)
	ops.Add(a, a, a)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	if rows := prof.Table(); len(rows) != 1 || rows[0].Set != "cpu" {
		t.Errorf("after Switch: %+v", rows)
	}
}

// A set a test registers can be removed again.
func TestUnregister(t *testing.T) {
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "cpu_test_only", Device: "cpu", New: cpuSet.New})
	if _, ok := kernels.Set("cpu_test_only"); !ok {
		t.Fatal("not registered")
	}
	kernels.Unregister("cpu_test_only")
	if _, ok := kernels.Set("cpu_test_only"); ok {
		t.Error("still registered after Unregister")
	}
}

// TunerOf reaches a set's variants through the Ops Spec.Build returns.
func TestTunerOf(t *testing.T) {
	dev := cpu.NewDevice()
	s, _ := kernels.ParseSpec("cpu")
	ops, _ := s.Build(dev, nil)
	if _, ok := ops.TunerOf(kernels.OpAttnPrefill); ok {
		t.Errorf("the cpu set has no variants, but TunerOf found some")
	}
	if _, ok := ops.TunerOf("warp_drive"); ok {
		t.Errorf("an unknown op has a tuner")
	}
}

// picky is the cpu set, except that it declines to add rows of an odd
// width (as fused declines head dims it has no kernel for).
type picky struct{ kernels.Ops }

func (p picky) Add(out, a, b *kernels.Tensor) {
	if out.Cols()%2 != 0 {
		panic(kernels.Unsupported{Set: "picky", Op: kernels.OpAdd, Why: "odd rows"})
	}
	p.Ops.Add(out, a, b)
}

func (p picky) LinearSwiGLU(out, x, w *kernels.Tensor) {
	if x.Rows()%2 != 0 {
		panic(kernels.Unsupported{Set: "picky", Op: kernels.OpLinearSwiGLU, Why: "odd rows"})
	}
	p.Ops.LinearSwiGLU(out, x, w)
}

// TestDeclinedCallsFallBack: a call a set declines runs on its fallback,
// and the profile names the set that ran it; without a fallback the
// Unsupported panic goes on.
func TestDeclinedCallsFallBack(t *testing.T) {
	cpuSet, _ := kernels.Set("cpu")
	newPicky := func(dev kernels.Device) (kernels.Ops, error) {
		ops, err := cpuSet.New(dev)
		return picky{ops}, err
	}
	kernels.Register(kernels.SetInfo{Name: "picky_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpAdd},
		Fallback: "cpu", New: newPicky})
	defer kernels.Unregister("picky_test_only")
	dev := cpu.NewDevice()
	prof := profile.New(dev)
	s := kernels.Spec{Base: "picky_test_only"} // a name ParseSpec does not know
	ops, err := s.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	for _, cols := range []int{8, 7, 7} {
		a := dev.Alloc(kernels.F32, 2, cols)
		if err := dev.Upload(a, make([]byte, 4*2*cols), kernels.F32); err != nil {
			t.Fatal(err)
		}
		ops.Add(a, a, a)
	}
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	if rows := prof.Table(); len(rows) != 1 || rows[0].Set != "picky_test_only+cpu" || rows[0].Calls != 3 {
		t.Errorf("profile %+v, want one add row of 3 calls run by picky_test_only+cpu", rows)
	}

	kernels.Register(kernels.SetInfo{Name: "picky_alone_test_only", Device: "cpu", New: newPicky})
	defer kernels.Unregister("picky_alone_test_only")
	alone, err := kernels.Spec{Base: "picky_alone_test_only"}.Build(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if u, ok := recover().(kernels.Unsupported); !ok || u.Why != "odd rows" {
			t.Errorf("no fallback: recovered %v, want the Unsupported", u)
		}
	}()
	a := dev.Alloc(kernels.F32, 1, 3)
	alone.Add(a, a, a)
}

// TestRegistryFallback: set names and fallbacks come from the registry. A
// set registered here is a name specs take; a set owning only some ops
// falls back to its device's baseline (the lowest-ranked set that owns
// every op) unless it names its own fallback; with no baseline the spec
// fails before anything is built.
func TestRegistryFallback(t *testing.T) {
	if got := kernels.Baseline("cuda"); got != "naive" {
		t.Errorf("Baseline(cuda) = %q, want naive", got)
	}
	if got := kernels.FallbackOf("fused"); got != "naive" {
		t.Errorf("FallbackOf(fused) = %q, want naive", got)
	}
	if got := kernels.FallbackOf("naive"); got != "" {
		t.Errorf("FallbackOf(naive) = %q, want none: it owns every op", got)
	}
	kernels.Register(kernels.SetInfo{Name: "tpu_test_only", Device: "tpu", Own: []kernels.Op{kernels.OpAdd},
		New: func(kernels.Device) (kernels.Ops, error) { return nil, nil }})
	defer kernels.Unregister("tpu_test_only")
	s, err := kernels.ParseSpec("tpu_test_only")
	if err != nil {
		t.Fatalf("a registered set's name: %v", err)
	}
	if _, err := s.DeviceKind(); err == nil || !strings.Contains(err.Error(), "no kernel for embedding and no set to fall back to") {
		t.Errorf("a set with no baseline to fall back to: %v", err)
	}
	if _, err := kernels.ParseSpec("cpu,add=turbo"); err == nil ||
		!strings.Contains(err.Error(), `unknown kernel set "turbo" (want one of cpu, fused, naive, tpu_test_only: the sets built into this binary)`) {
		t.Errorf("an unregistered set: %v, want the registered ones listed", err)
	}
}

// TestCompositeParts: linear_swiglu runs as one call of its set where the
// set fuses it and the spec runs linear and swiglu there too, or where the
// spec names it; else as linear then swiglu, each on its own set and in its
// own profile row, with the same result.
func TestCompositeParts(t *testing.T) {
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true}, {"naive", false}, {"cpu", false}, {"naive,linear_swiglu=naive", true},
		{"fused,linear=naive", false}, {"fused,swiglu=naive", false},
		{"fused,linear=naive,swiglu=naive", false}, {"fused,linear=naive,linear_swiglu=fused", true},
	} {
		wantWhole(t, c.spec, kernels.OpLinearSwiGLU, c.whole)
		wantWhole(t, c.spec, kernels.OpLinear, true) // an op without parts
	}

	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "swiglu_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpSwiGLU},
		Fallback: "cpu", New: cpuSet.New})
	defer kernels.Unregister("swiglu_test_only")
	dev := cpu.NewDevice()
	const n, k, inter = 3, 16, 8
	x, w := dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, 2*inter, k)
	for i, t := range []*kernels.Tensor{x, w} {
		patterned(t, i)
	}
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"cpu,linear_swiglu=cpu", map[kernels.Op]string{kernels.OpLinearSwiGLU: "cpu"}},
		{"cpu", map[kernels.Op]string{kernels.OpLinear: "cpu", kernels.OpSwiGLU: "cpu"}},
		{"cpu,swiglu=swiglu_test_only", map[kernels.Op]string{kernels.OpLinear: "cpu", kernels.OpSwiGLU: "swiglu_test_only"}},
	} {
		out := dev.Alloc(kernels.F32, n, inter)
		got, calls := profiledRun(t, dev, c.spec, func(ops kernels.Ops) {
			ops.LinearSwiGLU(out, x, w)
			ops.LinearSwiGLU(out, x, w) // the intermediate kept from the first call
		})
		for op, n := range calls {
			if n != 2 {
				t.Errorf("%s: %s ran %d times, want 2", c.spec, op, n)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Clone(cpu.F32(out)))
	}
	for _, o := range outs[1:] {
		if !slices.Equal(outs[0], o) {
			t.Errorf("linear_swiglu whole %v, as its parts %v", outs[0], o)
		}
	}

	// A set that fuses it for some calls only: the calls it declines run
	// as the parts, on the same set, in their own rows.
	kernels.Register(kernels.SetInfo{Name: "fuses_test_only", Device: "cpu", Fallback: "cpu",
		Own:   []kernels.Op{kernels.OpLinear, kernels.OpSwiGLU, kernels.OpLinearSwiGLU},
		Fuses: []kernels.Op{kernels.OpLinearSwiGLU},
		New: func(dev kernels.Device) (kernels.Ops, error) {
			ops, err := cpuSet.New(dev)
			return picky{ops}, err
		}})
	defer kernels.Unregister("fuses_test_only")
	prof := profile.New(dev)
	ops, err := kernels.Spec{Base: "fuses_test_only"}.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	for _, rows := range []int{2, 3} {
		ops.LinearSwiGLU(dev.Alloc(kernels.F32, rows, inter), dev.Alloc(kernels.F32, rows, k), w)
	}
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	got := map[kernels.Op]int{}
	for _, r := range prof.Table() {
		got[r.Op] = r.Calls
	}
	if want := map[kernels.Op]int{kernels.OpLinearSwiGLU: 1, kernels.OpLinear: 1, kernels.OpSwiGLU: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a set declining odd rows: calls %v, want %v", got, want)
	}
}

// TestRMSNormRoPEParts: rms_norm_rope runs whole where the set that runs it
// fuses it (fused) and runs rms_norm and rope too, or where the spec names
// it; the cpu set, which does not fuse it, runs it as rms_norm and two
// ropes, in their own profile rows, unless the spec names it; either way
// with the same result.
func TestRMSNormRoPEParts(t *testing.T) {
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true}, {"naive", false}, {"cpu", false}, {"fused,rope=naive", false}, {"fused,rms_norm=naive", false},
		{"fused,attn=naive,linear=naive", true}, {"naive,rms_norm_rope=fused", true}, {"fused,rope=naive,rms_norm_rope=fused", true},
	} {
		wantWhole(t, c.spec, kernels.OpRMSNormRoPE, c.whole)
	}

	dev := cpu.NewDevice()
	const tokens, heads, nope, dim, rank, positions = 3, 2, 4, 4, 8, 8
	fill := patterned
	w := fill(dev.Alloc(kernels.F32, rank), 1)
	rope := &kernels.Rope{Dim: dim, Interleaved: true, Cos: fill(dev.Alloc(kernels.F32, positions, dim/2), 2),
		Sin: fill(dev.Alloc(kernels.F32, positions, dim/2), 3)}
	pos := dev.Alloc(kernels.I32, tokens)
	copy(cpu.I32(pos), []int32{7, 0, 3})
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]int
	}{
		{"cpu,rms_norm_rope=cpu", map[kernels.Op]int{kernels.OpRMSNormRoPE: 1}},
		{"cpu", map[kernels.Op]int{kernels.OpRMSNorm: 1, kernels.OpRoPE: 2}},
	} {
		// q and kv as the model's stacked q_kv_a row holds them.
		qkva := fill(dev.Alloc(kernels.F32, tokens, heads*(nope+dim)+rank+dim), 4)
		q, kv := qkva.ColSlice(0, heads*(nope+dim)), qkva.ColSlice(heads*(nope+dim), qkva.Cols())
		_, got := profiledRun(t, dev, c.spec, func(ops kernels.Ops) {
			ops.RMSNormRoPE(q, kv, w, 1e-6, heads, nope+dim, nope, pos, rope)
		})
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile calls %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Clone(cpu.F32(qkva)))
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Errorf("rms_norm_rope whole %v, as its parts %v", outs[0], outs[1])
	}
	// q and kv may not share an element: the contract, which a set's own
	// call checks, says so.
	qkva := dev.Alloc(kernels.F32, tokens, heads*(nope+dim)+rank+dim)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "share elements") {
			t.Errorf("q overlapping kv: %v, want a panic saying they share elements", r)
		}
	}()
	cpuSet, _ := kernels.Set("cpu")
	cpuOps, _ := cpuSet.New(dev)
	cpuOps.RMSNormRoPE(qkva.ColSlice(0, heads*(nope+dim)), qkva.ColSlice(heads*(nope+dim)-1, qkva.Cols()-1), w, 1e-6, heads, nope+dim, nope, pos, rope)
}

// TestLinearAddParts: linear_add runs as one call of its set where the set
// fuses it and the spec runs linear and add there too, or where the spec
// names it; else as linear into an intermediate then add, each on its own
// set and in its own profile row. Either way out may be addend (the MoE's
// out += shared experts), and the result is the same.
func TestLinearAddParts(t *testing.T) {
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true}, {"naive", false}, {"cpu", false}, {"cpu,linear_add=cpu", true},
		{"fused,add=naive", false}, {"fused,linear=naive", false}, {"fused,add=naive,linear_add=fused", true},
	} {
		wantWhole(t, c.spec, kernels.OpLinearAdd, c.whole)
	}

	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "add_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpAdd},
		Fallback: "cpu", New: cpuSet.New})
	defer kernels.Unregister("add_test_only")
	dev := cpu.NewDevice()
	const n, k, m = 3, 16, 8
	x, w, bias, out := dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, m, k), dev.Alloc(kernels.F32, m), dev.Alloc(kernels.F32, n, m)
	fill := patterned
	for i, a := range []*kernels.Tensor{x, w, bias} {
		fill(a, i)
	}
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"cpu,linear_add=cpu", map[kernels.Op]string{kernels.OpLinearAdd: "cpu"}},
		{"cpu", map[kernels.Op]string{kernels.OpLinear: "cpu", kernels.OpAdd: "cpu"}},
		{"cpu,add=add_test_only", map[kernels.Op]string{kernels.OpLinear: "cpu", kernels.OpAdd: "add_test_only"}},
	} {
		fill(out, 3)
		got, calls := profiledRun(t, dev, c.spec, func(ops kernels.Ops) {
			ops.LinearAdd(out, x, w, bias, out)
			ops.LinearAdd(out, x, w, bias, out) // added twice; the intermediate kept from the first call
		})
		for op, n := range calls {
			if n != 2 {
				t.Errorf("%s: %s ran %d times, want 2", c.spec, op, n)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Clone(cpu.F32(out)))
	}
	fill(out, 3)
	lin := dev.Alloc(kernels.F32, n, m)
	ref, _ := cpuSet.New(dev)
	for range 2 {
		ref.Linear(lin, x, w, bias)
		ref.Add(out, out, lin)
	}
	for i, o := range outs {
		if !slices.Equal(cpu.F32(out), o) {
			t.Errorf("linear_add run %d: %v, want linear then add %v", i, o, cpu.F32(out))
		}
	}
}

// TestAddAddRMSNormParts: add_add_rms_norm runs as one call of its set
// where the set fuses it and the spec runs add and add_rms_norm there too,
// or where the spec names it; else as add into x then add_rms_norm, each
// on its own set and in its own profile row, with the same out and
// residual. Its contract refuses an x that is the residual (the parts
// would add the sum into itself) and an out that is y.
func TestAddAddRMSNormParts(t *testing.T) {
	for _, c := range []struct {
		spec  string
		whole bool
	}{
		{"fused", true}, {"naive", false}, {"cpu", false}, {"cpu,add_add_rms_norm=cpu", true},
		{"fused,add=naive", false}, {"fused,add_rms_norm=naive", false}, {"fused,rms_norm=naive", true},
		{"fused,add=naive,add_add_rms_norm=fused", true}, {"naive,add_add_rms_norm=fused", true},
	} {
		wantWhole(t, c.spec, kernels.OpAddAddRMSNorm, c.whole)
	}

	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "add_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpAdd},
		Fallback: "cpu", New: cpuSet.New})
	defer kernels.Unregister("add_test_only")
	dev := cpu.NewDevice()
	const n, d = 3, 16
	x, y, w := dev.Alloc(kernels.F32, n, d), patterned(dev.Alloc(kernels.F32, n, d), 2), patterned(dev.Alloc(kernels.F32, d), 3)
	resid, out := dev.Alloc(kernels.F32, n, d), dev.Alloc(kernels.F32, n, d)
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"cpu,add_add_rms_norm=cpu", map[kernels.Op]string{kernels.OpAddAddRMSNorm: "cpu"}},
		{"cpu", map[kernels.Op]string{kernels.OpAdd: "cpu", kernels.OpAddRMSNorm: "cpu"}},
		{"cpu,add=add_test_only", map[kernels.Op]string{kernels.OpAdd: "add_test_only", kernels.OpAddRMSNorm: "cpu"}},
	} {
		patterned(x, 1)
		patterned(resid, 4)
		got, _ := profiledRun(t, dev, c.spec, func(ops kernels.Ops) { ops.AddAddRMSNorm(out, resid, x, y, w, 1e-6) })
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Concat(cpu.F32(out), cpu.F32(resid)))
	}
	patterned(x, 1)
	patterned(resid, 4)
	ref, _ := cpuSet.New(dev)
	ref.Add(x, x, y)
	ref.AddRMSNorm(out, resid, x, w, 1e-6)
	want := slices.Concat(cpu.F32(out), cpu.F32(resid))
	for i, o := range outs {
		if !slices.Equal(want, o) {
			t.Errorf("run %d: %v, want the parts' %v", i, o, want)
		}
	}
	for _, c := range []struct {
		name   string
		out, x *kernels.Tensor
		want   string
	}{
		{"x is resid", out, resid, "x aliases resid"},
		{"out is y", y, x, "out aliases resid, x or y"},
	} {
		msg := func() (msg string) {
			defer func() { msg = fmt.Sprint(recover()) }()
			ref.AddAddRMSNorm(c.out, resid, c.x, y, w, 1e-6)
			return ""
		}()
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: %q, want a panic saying %q", c.name, msg, c.want)
		}
	}
}

// TestNormLinearParts: add_rms_norm_linear and add_rms_norm_linear_swiglu
// run as one call of their set where the set fuses them and the spec runs
// every part there too, or where the spec names them; else as add_rms_norm
// into h then linear (linear_swiglu, itself whole or linear and swiglu),
// each on its own set and in its own profile row, with the same results.
func TestNormLinearParts(t *testing.T) {
	for _, c := range []struct {
		spec         string
		whole, swish bool // Whole of add_rms_norm_linear, of add_rms_norm_linear_swiglu
	}{
		{"fused", true, true}, {"naive", false, false}, {"cpu", false, false},
		{"fused,add_rms_norm=naive", false, false}, {"fused,linear=naive", false, false},
		{"fused,swiglu=naive", true, false}, {"fused,add_rms_norm=naive,add_rms_norm_linear=fused", true, false},
	} {
		wantWhole(t, c.spec, kernels.OpNormLinear, c.whole)
		wantWhole(t, c.spec, kernels.OpNormSwiGLU, c.swish)
	}

	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "norm_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpAddRMSNorm},
		Fallback: "cpu", New: cpuSet.New})
	defer kernels.Unregister("norm_test_only")
	dev := cpu.NewDevice()
	const n, k, m = 3, 16, 8
	x, norm, w, bias := dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, k), dev.Alloc(kernels.F32, 2*m, k), dev.Alloc(kernels.F32, 2*m)
	resid, h, out, act := dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, n, 2*m), dev.Alloc(kernels.F32, n, m)
	for i, a := range []*kernels.Tensor{x, norm, w, bias} {
		patterned(a, i)
	}
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"cpu,add_rms_norm_linear=cpu,add_rms_norm_linear_swiglu=cpu",
			map[kernels.Op]string{kernels.OpNormLinear: "cpu", kernels.OpNormSwiGLU: "cpu"}},
		// cpu fuses no linear_swiglu either: its parts run
		{"cpu", map[kernels.Op]string{kernels.OpAddRMSNorm: "cpu", kernels.OpLinear: "cpu", kernels.OpSwiGLU: "cpu"}},
		{"cpu,add_rms_norm=norm_test_only", map[kernels.Op]string{kernels.OpAddRMSNorm: "norm_test_only", kernels.OpLinear: "cpu",
			kernels.OpSwiGLU: "cpu"}},
	} {
		patterned(resid, 4)
		got, _ := profiledRun(t, dev, c.spec, func(ops kernels.Ops) {
			ops.AddRMSNormLinear(out, h, resid, x, norm, 1e-6, w, bias)
			ops.AddRMSNormLinearSwiGLU(act, h, resid, x, norm, 1e-6, w)
		})
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Concat(cpu.F32(out), cpu.F32(act), cpu.F32(resid)))
	}
	patterned(resid, 4)
	ref, _ := cpuSet.New(dev)
	ref.AddRMSNorm(h, resid, x, norm, 1e-6)
	ref.Linear(out, h, w, bias)
	ref.AddRMSNorm(h, resid, x, norm, 1e-6)
	ref.LinearSwiGLU(act, h, w)
	want := slices.Concat(cpu.F32(out), cpu.F32(act), cpu.F32(resid))
	for i, o := range outs {
		if !slices.Equal(want, o) {
			t.Errorf("run %d: %v, want the parts' %v", i, o, want)
		}
	}
}

// TestLinearNormLinearParts: linear_add_rms_norm_linear and its SwiGLU
// twin run as one call of their set where the set fuses them and the spec
// runs every part there too (and each composite of their parts:
// add_rms_norm_linear in both), or where the spec names them; else as
// linear into mid then add_rms_norm_linear (_swiglu), itself whole or its
// parts, each on its own set and in its own profile row, with the same
// results.
func TestLinearNormLinearParts(t *testing.T) {
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "chain_test_only", Device: "cpu", Own: kernels.AllOps, Fallback: "cpu",
		Fuses: []kernels.Op{kernels.OpNormLinear, kernels.OpNormSwiGLU, kernels.OpLinearNormLinear, kernels.OpLinearNormSwiGLU},
		New:   cpuSet.New})
	defer kernels.Unregister("chain_test_only")
	for _, c := range []struct {
		spec         string
		whole, swish bool // Whole of linear_add_rms_norm_linear, of its SwiGLU twin
	}{
		{"chain_test_only", true, true}, {"cpu", false, false},
		{"chain_test_only,linear=cpu", false, false}, {"chain_test_only,add_rms_norm=cpu", false, false},
		{"chain_test_only,swiglu=cpu", true, false}, {"chain_test_only,add_rms_norm_linear=cpu", false, false},
		{"chain_test_only,add_rms_norm_linear_swiglu=cpu", true, false},
		{"cpu,linear_add_rms_norm_linear=cpu,linear_add_rms_norm_linear_swiglu=cpu", true, true},
	} {
		wantWhole(t, c.spec, kernels.OpLinearNormLinear, c.whole)
		wantWhole(t, c.spec, kernels.OpLinearNormSwiGLU, c.swish)
	}

	dev := cpu.NewDevice()
	const n, k0, k, m = 3, 24, 16, 8
	x, w0, bias0 := dev.Alloc(kernels.F32, n, k0), dev.Alloc(kernels.F32, k, k0), dev.Alloc(kernels.F32, k)
	norm, w, bias := dev.Alloc(kernels.F32, k), dev.Alloc(kernels.F32, 2*m, k), dev.Alloc(kernels.F32, 2*m)
	mid, resid, h := dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, n, k), dev.Alloc(kernels.F32, n, k)
	out, act := dev.Alloc(kernels.F32, n, 2*m), dev.Alloc(kernels.F32, n, m)
	for i, a := range []*kernels.Tensor{x, w0, bias0, norm, w, bias} {
		patterned(a, i)
	}
	run := func(ops kernels.Ops) {
		ops.LinearAddRMSNormLinear(mid, x, w0, bias0, out, h, resid, norm, 1e-6, w, bias)
		ops.LinearAddRMSNormLinearSwiGLU(mid, x, w0, bias0, act, h, resid, norm, 1e-6, w)
	}
	var outs [][]float32
	for _, c := range []struct {
		spec string
		rows map[kernels.Op]string
	}{
		{"chain_test_only", map[kernels.Op]string{kernels.OpLinearNormLinear: "chain_test_only", kernels.OpLinearNormSwiGLU: "chain_test_only"}},
		{"cpu,linear_add_rms_norm_linear=cpu,linear_add_rms_norm_linear_swiglu=cpu",
			map[kernels.Op]string{kernels.OpLinearNormLinear: "cpu", kernels.OpLinearNormSwiGLU: "cpu"}},
		// cpu fuses none of them: every part runs
		{"cpu", map[kernels.Op]string{kernels.OpAddRMSNorm: "cpu", kernels.OpLinear: "cpu", kernels.OpSwiGLU: "cpu"}},
		// the first projection apart, the rest whole where it is fused
		{"chain_test_only,linear=cpu", map[kernels.Op]string{kernels.OpAddRMSNorm: "chain_test_only", kernels.OpLinear: "cpu",
			kernels.OpSwiGLU: "chain_test_only"}},
		{"chain_test_only,swiglu=cpu", map[kernels.Op]string{kernels.OpLinearNormLinear: "chain_test_only", kernels.OpLinear: "chain_test_only",
			kernels.OpAddRMSNorm: "chain_test_only", kernels.OpSwiGLU: "cpu"}},
		{"chain_test_only,add_rms_norm=cpu", map[kernels.Op]string{kernels.OpAddRMSNorm: "cpu", kernels.OpLinear: "chain_test_only",
			kernels.OpSwiGLU: "chain_test_only"}},
	} {
		patterned(resid, 6)
		got, _ := profiledRun(t, dev, c.spec, run)
		if fmt.Sprint(got) != fmt.Sprint(c.rows) {
			t.Errorf("%s: profile rows %v, want %v", c.spec, got, c.rows)
		}
		outs = append(outs, slices.Concat(cpu.F32(out), cpu.F32(act), cpu.F32(mid), cpu.F32(resid)))
	}
	patterned(resid, 6)
	ref, _ := cpuSet.New(dev)
	for _, swiglu := range []bool{false, true} {
		ref.Linear(mid, x, w0, bias0)
		ref.AddRMSNorm(h, resid, mid, norm, 1e-6)
		if swiglu {
			ref.LinearSwiGLU(act, h, w)
		} else {
			ref.Linear(out, h, w, bias)
		}
	}
	want := slices.Concat(cpu.F32(out), cpu.F32(act), cpu.F32(mid), cpu.F32(resid))
	for i, o := range outs {
		if !slices.Equal(want, o) {
			t.Errorf("run %d: %v, want the parts' %v", i, o, want)
		}
	}
}

// profiledRun builds spec's Dispatch on dev with a profile, calls run with
// it and returns the profile's rows: the set that ran each op and how many
// times it ran.
func profiledRun(t *testing.T, dev kernels.Device, spec string, run func(kernels.Ops)) (sets map[kernels.Op]string, calls map[kernels.Op]int) {
	t.Helper()
	s, err := kernels.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	prof := profile.New(dev)
	ops, err := s.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	run(ops)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	sets, calls = map[kernels.Op]string{}, map[kernels.Op]int{}
	for _, r := range prof.Table() {
		sets[r.Op], calls[r.Op] = r.Set, r.Calls
	}
	return sets, calls
}

// TestMLADecodeRoPEWhole: mla_decode_rope runs whole only where the set
// that runs it fuses it and runs rms_norm, rope and mla_decode too, or
// where the spec names it; "mla=naive" names mla_decode (not this op, which
// is in no group), so the norm and ropes stay on fused's rms_norm_rope;
// and "rms_norm_rope=naive" puts the norm and ropes on naive.
func TestMLADecodeRoPEWhole(t *testing.T) {
	for _, c := range []struct {
		spec           string
		whole, nrWhole bool
	}{
		{"fused", true, true}, {"naive", false, false}, {"cpu", false, false},
		{"fused,mla=naive", false, true}, {"fused,mla_decode=naive", false, true},
		{"fused,rope=naive", false, false}, {"fused,rms_norm=naive", false, false},
		{"fused,rms_norm_rope=naive", false, true}, {"fused,attn=naive,linear=naive", true, true},
		{"naive,mla_decode_rope=fused", true, false},
	} {
		wantWhole(t, c.spec, kernels.OpMLADecodeRoPE, c.whole)
		wantWhole(t, c.spec, kernels.OpRMSNormRoPE, c.nrWhole)
	}
}

// wantWhole fails t where spec runs op as one call (Spec.Whole) other than
// as want says.
func wantWhole(t *testing.T, spec string, op kernels.Op, want bool) {
	t.Helper()
	s, err := kernels.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Whole(op); got != want {
		t.Errorf("%s: Whole(%s) = %v, want %v", spec, op, got, want)
	}
}

// patterned fills the cpu device's f32 tensor t with a pattern of small
// exact values that seed shifts, and returns it.
func patterned(t *kernels.Tensor, seed int) *kernels.Tensor {
	v := cpu.F32(t)
	for j := range v {
		v[j] = float32((j*7+seed*3)%11-5) / 8
	}
	return t
}
