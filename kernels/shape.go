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
