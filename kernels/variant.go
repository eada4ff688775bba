package kernels

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Shape is an op's problem size by named dimensions, as the kernel
// benchmarks name them: "B" rows, "H" heads, "KVH" kv heads, "D" head dim,
// "N" new tokens or keys, "M" rows of a matrix, "causal" 0 or 1, ...; and,
// where an op is measured in another element type than the activations',
// that type ("dt", ShapeDType).
type Shape map[string]int

// ShapeDType names a shape's element type: its value is a DType, written
// by the type's name ("dt=f16"). A shape without it is of the device's
// activation type.
const ShapeDType = "dt"

// DType is the element type s names, or act when it names none.
func (s Shape) DType(act DType) DType {
	if v, ok := s[ShapeDType]; ok {
		return DType(v)
	}
	return act
}

// floatDTypes are the element types a shape may name, by their names.
var floatDTypes = []DType{F32, BF16, F16}

// ParseShape reads "B=4,H=32,D=128,N=4096": comma-separated NAME=INT, each
// name once, every value at least 0; ShapeDType's value is a float type's
// name ("dt=f16").
func ParseShape(s string) (Shape, error) {
	sh := Shape{}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if !ok || name == "" {
			return nil, fmt.Errorf("shape %q: %q is not NAME=VALUE", s, part)
		}
		if _, dup := sh[name]; dup {
			return nil, fmt.Errorf("shape %q: %s given twice", s, name)
		}
		if name == ShapeDType {
			i := slices.IndexFunc(floatDTypes, func(dt DType) bool { return dt.String() == val })
			if i < 0 {
				return nil, fmt.Errorf("shape %q: %s=%s is not one of %v", s, name, val, floatDTypes)
			}
			sh[name] = int(floatDTypes[i])
			continue
		}
		n, err := strconv.ParseInt(val, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("shape %q: %s=%s is not a whole number from 0 to %d", s, name, val, int32(1<<31-1))
		}
		sh[name] = int(n)
	}
	return sh, nil
}

// String is the shape as ParseShape reads it, names in order.
func (s Shape) String() string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return shapeOrder(names[i]) < shapeOrder(names[j]) })
	parts := make([]string, len(names))
	for i, n := range names {
		if n == ShapeDType {
			parts[i] = fmt.Sprintf("%s=%v", n, DType(s[n]))
			continue
		}
		parts[i] = fmt.Sprintf("%s=%d", n, s[n])
	}
	return strings.Join(parts, ",")
}

// shapeOrder puts the usual dimensions first, in the order TileGym prints
// them, then the others by name.
func shapeOrder(name string) string {
	for i, n := range []string{"B", "M", "T", "H", "KVH", "D", "Dn", "Dr", "Dv", "R", "N", "ctx", "K", "I", "E", "topk", "causal", "interleaved", ShapeDType} {
		if n == name {
			return fmt.Sprintf("%02d", i)
		}
	}
	return "99" + name
}

// Target is what a kernel's launch configuration depends on: the
// architecture it is compiled for and the limits of the device.
type Target struct {
	Arch           string // NVRTC's target: "sm_90a"
	SMs            int
	SharedPerBlock int // bytes of shared memory a block may opt in to
	SharedPerSM    int
	L2Bytes        int
}

// Targets are the architectures --arch may name where no GPU is present,
// with the limits of the GPU they are measured on.
var Targets = map[string]Target{
	// H100 and H200 (SXM): the device tool's H200 reports these.
	"sm_90a": {Arch: "sm_90a", SMs: 132, SharedPerBlock: 227 << 10, SharedPerSM: 228 << 10, L2Bytes: 60 << 20},
	// A100 (SXM, 40 and 80 GB).
	"sm_80": {Arch: "sm_80", SMs: 108, SharedPerBlock: 163 << 10, SharedPerSM: 164 << 10, L2Bytes: 40 << 20},
}

// Variant is one configuration of a set's kernel for an op: a tiling, a
// split, a number of stages. A set offers its variants for a shape on a
// target through SetInfo.Variants; the one in use is chosen per tuning key
// (Tunable).
type Variant struct {
	Name   string // as the tuning cache and --optimize name it: "w4_m2"
	Params string // what it is: "warps=4 rows=128 key_tile=64 stages=2 shared=98304"
	Why    string // why it cannot run this shape on this target; "" when it can
}

// Valid reports whether the variant can run.
func (v Variant) Valid() bool { return v.Why == "" }

// Tunable is implemented by a set's Ops whose kernels come in several
// variants: a choice holds for the problems of one tuning key of an op (for
// attention, its head dim), so that a choice measured on one shape serves
// every shape that shares the key.
type Tunable interface {
	// TuningKey is the key op's problems of shape s are chosen by.
	TuningKey(op Op, s Shape) string
	// UseVariant makes op run variant name for problems of key; an unknown
	// op, key or name is an error and changes nothing.
	UseVariant(op Op, key, name string) error
	// VariantFor is the variant op runs for problems of key.
	VariantFor(op Op, key string) string
}

// Tuned is one tuning choice: set's op runs Variant for problems of Key.
type Tuned struct {
	Set     string `json:"set"`
	Op      Op     `json:"op"`
	Key     string `json:"key"`
	Variant string `json:"variant"`
}
