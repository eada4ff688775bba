package kernels

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// SetInfo describes a kernel set: its name, the device kind it runs on and
// how to build it for a device.
type SetInfo struct {
	Name   string // "cpu", "naive", "fused"
	Device string // the device kind its tensors live on: "cpu" or "cuda"
	// Own lists the ops the set has kernels of its own for; nil means every
	// op. A spec that picks the set for another op runs its fallback's
	// kernel for it (see FallbackOf), and the profile names the fallback.
	Own []Op
	// Fuses lists the composite ops (OpInfo.Parts) the set runs as one
	// kernel of its own, at least for some calls: where the spec runs one
	// on a set that does not fuse it, the Dispatch runs its parts, so that
	// a set whose composite is only its parts profiles as it did before.
	Fuses []Op
	// Fallback names the set that runs what this set does not: the ops it
	// does not own and the calls it declines (Unsupported). "" leaves it to
	// the registry: the baseline of the set's device kind when the set owns
	// only some ops (see Baseline), none when it owns them all.
	Fallback string
	// Rank orders the sets of one device kind: the registered set of
	// highest rank is the kind's default.
	Rank int
	// New builds the set's ops on dev. It is called once per run.
	New func(dev Device) (Ops, error)
	// Variants lists the set's variants of op's kernels for shape s on
	// target t, valid or not (each says why not); nil means one variant,
	// "default", for every op it owns.
	Variants func(op Op, s Shape, t Target) []Variant
}

// VariantsOf is the set's variants of op for s on t: none for an op it
// does not own (its fallback's run it).
func (s SetInfo) VariantsOf(op Op, sh Shape, t Target) []Variant {
	switch {
	case !s.Owns(op):
		return nil
	case s.Variants == nil:
		return []Variant{{Name: "default"}}
	}
	return s.Variants(op, sh, t)
}

// Set is the registered set named name.
func Set(name string) (SetInfo, bool) { return lookup(name) }

// Owns reports whether the set has a kernel of its own for op.
func (s SetInfo) Owns(op Op) bool { return s.Own == nil || slices.Contains(s.Own, op) }

var (
	regMu sync.Mutex
	sets  = map[string]SetInfo{}
)

// Register adds a kernel set; sets register themselves from init.
func Register(s SetInfo) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := sets[s.Name]; dup {
		panic("kernels: set registered twice: " + s.Name)
	}
	sets[s.Name] = s
}

// Unregister removes the set named name, for tests that register sets of
// their own and must leave the registry as they found it.
func Unregister(name string) {
	regMu.Lock()
	defer regMu.Unlock()
	delete(sets, name)
}

// Sets lists the registered kernel sets by name.
func Sets() []SetInfo {
	regMu.Lock()
	defer regMu.Unlock()
	out := make([]SetInfo, 0, len(sets))
	for _, s := range sets {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// DefaultSet is the registered set of highest rank on device kind, "" when
// none is registered.
func DefaultSet(kind string) string {
	best, rank := "", 0
	for _, s := range Sets() {
		if s.Device == kind && (best == "" || s.Rank > rank) {
			best, rank = s.Name, s.Rank
		}
	}
	return best
}

// Names lists the names of the registered kernel sets, sorted: the names a
// spec may use.
func Names() []string {
	var names []string
	for _, s := range Sets() {
		names = append(names, s.Name)
	}
	return names
}

// Baseline is the set the registry falls back to on device kind: of the
// registered sets of that kind that own every op, the one of lowest rank
// (the first by name among equals); "" when none is registered.
func Baseline(kind string) string {
	best, rank := "", 0
	for _, s := range Sets() {
		if s.Device == kind && s.Own == nil && (best == "" || s.Rank < rank) {
			best, rank = s.Name, s.Rank
		}
	}
	return best
}

// FallbackOf is the set that runs what the registered set name does not:
// its Fallback when it names one, else its device kind's Baseline when it
// owns only some ops; "" when it has none, or name is not registered.
func FallbackOf(name string) string {
	info, ok := lookup(name)
	switch {
	case !ok:
		return ""
	case info.Fallback != "":
		return info.Fallback
	case info.Own != nil:
		if b := Baseline(info.Device); b != name {
			return b
		}
	}
	return ""
}

// Spec is a parsed kernel selection: a base set and per-op overrides, e.g.
// "fused,attn=naive,rope=naive".
type Spec struct {
	Base      string
	Overrides map[Op]string
}

// ParseSpec parses "SET[,OP=SET...]", where OP is an op name or a group name
// (attn, mla, moe) and SET a kernel set name.
func ParseSpec(s string) (Spec, error) {
	parts := strings.Split(strings.TrimSpace(s), ",")
	spec := Spec{Base: strings.TrimSpace(parts[0]), Overrides: map[Op]string{}}
	if spec.Base == "" {
		return Spec{}, fmt.Errorf("kernel spec %q: no kernel set named (want one of %s)", s, strings.Join(Names(), ", "))
	}
	if err := checkSetName(spec.Base); err != nil {
		return Spec{}, fmt.Errorf("kernel spec %q: %w", s, err)
	}
	for _, p := range parts[1:] {
		op, set, ok := strings.Cut(strings.TrimSpace(p), "=")
		op, set = strings.TrimSpace(op), strings.TrimSpace(set)
		if !ok || op == "" || set == "" {
			return Spec{}, fmt.Errorf("kernel spec %q: %q is not OP=SET", s, p)
		}
		if err := checkSetName(set); err != nil {
			return Spec{}, fmt.Errorf("kernel spec %q: %w", s, err)
		}
		ops, err := opsNamed(op)
		if err != nil {
			return Spec{}, fmt.Errorf("kernel spec %q: %w", s, err)
		}
		for _, o := range ops {
			spec.Overrides[o] = set
		}
	}
	return spec, nil
}

// checkSetName checks that a set of that name is registered in this build.
func checkSetName(name string) error {
	if _, ok := lookup(name); ok {
		return nil
	}
	return fmt.Errorf("unknown kernel set %q (want one of %s: the sets built into this binary)", name, strings.Join(Names(), ", "))
}

func opsNamed(name string) ([]Op, error) {
	for _, o := range AllOps {
		if string(o) == name {
			return []Op{o}, nil
		}
	}
	if g, ok := OpGroups[name]; ok {
		return g, nil
	}
	names := make([]string, 0, len(AllOps)+len(OpGroups))
	for _, o := range AllOps {
		names = append(names, string(o))
	}
	for g := range OpGroups {
		names = append(names, g)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("unknown op %q (want one of %s)", name, strings.Join(names, ", "))
}

// SetFor is the set this spec asks to run op.
func (s Spec) SetFor(op Op) string {
	if set, ok := s.Overrides[op]; ok {
		return set
	}
	return s.Base
}

// Runner is the set that runs op under this spec: SetFor(op), or the set it
// falls back to when that set has no kernel of its own for op (see
// SetInfo.Own). It is "" when a set is not registered in this build.
func (s Spec) Runner(op Op) string {
	name := s.SetFor(op)
	for range len(Sets()) + 1 { // a fallback chain visits each set at most once
		info, ok := lookup(name)
		if !ok {
			return ""
		}
		if info.Owns(op) {
			return name
		}
		name = FallbackOf(name)
	}
	return ""
}

// Whole reports whether the spec runs op as one call of its Runner: always
// for an op without parts; for a composite op (OpInfo.Parts) when the spec
// names the op itself, or when the set that runs it fuses it
// (SetInfo.Fuses) and runs each of its parts too, and each composite op
// made of its parts only (rms_norm_rope in mla_decode_rope). Otherwise the Dispatch
// runs the parts, each on its own set: "fused,linear=naive" runs naive's
// linear and fused's swiglu where the MLP calls linear_swiglu, as it did
// before there was one, and naive's and cpu's runs profile as before.
func (s Spec) Whole(op Op) bool {
	if _, named := s.Overrides[op]; named {
		return true
	}
	i := opIndex(op)
	if i < 0 || len(opTable[i].Parts) == 0 {
		return true
	}
	r := s.Runner(op)
	if info, ok := lookup(r); !ok || !slices.Contains(info.Fuses, op) {
		return false
	}
	for _, p := range opTable[i].Parts {
		if s.Runner(p) != r {
			return false
		}
	}
	// A composite op whose parts are all among op's (rms_norm_rope in
	// mla_decode_rope) is what op's parts run as: it must run on r too.
	for _, in := range opTable {
		if in.Op != op && len(in.Parts) > 0 && subset(in.Parts, opTable[i].Parts) && s.Runner(in.Op) != r {
			return false
		}
	}
	return true
}

// subset reports whether every op of a is in b, as many times as a holds
// it: add_rms_norm_linear's parts are among linear_add_rms_norm_linear's,
// but not the other way round (two linears).
func subset(a, b []Op) bool {
	n := map[Op]int{}
	for _, o := range b {
		n[o]++
	}
	for _, o := range a {
		if n[o]--; n[o] < 0 {
			return false
		}
	}
	return true
}

// String is the canonical form of the spec: the base set, then the ops that
// differ from it in AllOps order.
func (s Spec) String() string {
	parts := []string{s.Base}
	for _, o := range AllOps {
		if set, ok := s.Overrides[o]; ok && set != s.Base {
			parts = append(parts, string(o)+"="+set)
		}
	}
	return strings.Join(parts, ",")
}

// DeviceKind is the device kind every set of the spec must run on.
func (s Spec) DeviceKind() (string, error) {
	kind := ""
	for _, name := range s.names() {
		info, ok := lookup(name)
		if !ok {
			return "", fmt.Errorf("kernel set %q is not built into this binary", name)
		}
		if kind != "" && info.Device != kind {
			return "", fmt.Errorf("kernel spec %q mixes sets of different devices (%s and %s)", s, kind, info.Device)
		}
		kind = info.Device
	}
	for _, o := range AllOps {
		if s.Runner(o) == "" {
			return "", fmt.Errorf("kernel spec %q: set %s has no kernel for %s and no set to fall back to (no set of %s devices that runs every op is built into this binary)",
				s, s.SetFor(o), o, kind)
		}
	}
	return kind, nil
}

// names lists the sets the spec names and the sets they fall back to.
func (s Spec) names() []string {
	seen := map[string]bool{}
	var out []string
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	add(s.Base)
	for _, o := range AllOps {
		add(s.SetFor(o))
		if r := s.Runner(o); r != "" {
			add(r)
		}
	}
	// Each set's fallback too: it runs the calls the set declines (see
	// Unsupported).
	for i := 0; i < len(out); i++ {
		if fb := FallbackOf(out[i]); fb != "" {
			add(fb)
		}
	}
	return out
}

func lookup(name string) (SetInfo, bool) {
	regMu.Lock()
	defer regMu.Unlock()
	s, ok := sets[name]
	return s, ok
}
