package kernels

// Target is what a kernel's launch configuration depends on: the
// architecture it is compiled for and the limits of the device.
type Target struct {
	Arch           string `json:"arch"` // NVRTC's target: "sm_90a"
	SMs            int    `json:"sms"`
	SharedPerBlock int    `json:"shared_per_block_bytes"` // bytes of shared memory a block may opt in to
	SharedPerSM    int    `json:"shared_per_sm_bytes"`
	L2Bytes        int    `json:"l2_bytes"`
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
