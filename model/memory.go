package model

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/layers"
	"github.com/fuselm/fuselm/loader"
)

// Bytes is an amount of memory; it prints as a person reads it ("1.50
// GiB").
type Bytes int64

func (b Bytes) String() string {
	switch {
	case b >= 1<<50:
		return fmt.Sprintf("%.2f PiB", float64(b)/(1<<50))
	case b >= 1<<40:
		return fmt.Sprintf("%.2f TiB", float64(b)/(1<<40))
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", int64(b))
}

// Memory is the device memory a model holds, or will hold.
type Memory struct {
	Weights Bytes // weights and rotary tables
	Cache   Bytes // the KV cache
	Work    Bytes // activations, step inputs, logits
}

// Total is all of it (saturating at the largest int64).
func (m Memory) Total() Bytes { return addSat(m.Weights, m.Cache, m.Work) }

func (m Memory) String() string {
	return fmt.Sprintf("weights %s, KV cache %s, work %s", m.Weights, m.Cache, m.Work)
}

// MemoryError is Load's answer when a model does not fit: what it needs and
// what the device has.
type MemoryError struct {
	Need   Memory
	Free   Bytes  // the device's free memory
	Device string // the device's name
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("model: needs %s of memory (%s) but %s has %s free", e.Need.Total(), e.Need, e.Device, e.Free)
}

// memInfoer is what devices that know their free memory implement: the CUDA
// device and the cpu one.
type memInfoer interface {
	MemInfo() (free, total int64, err error)
}

// checkMemory compares what a model needs with what dev has free. A device
// that cannot tell passes: its allocations will say.
func checkMemory(dev kernels.Device, need Memory) error {
	mi, ok := dev.(memInfoer)
	if !ok {
		return nil
	}
	free, _, err := mi.MemInfo()
	if err != nil || Bytes(free) >= need.Total() {
		return nil
	}
	return &MemoryError{Need: need, Free: Bytes(free), Device: dev.Name()}
}

// plan is what Load knows before allocating anything: the checkpoint checked
// against the model, the model built over tensors with shapes and no
// storage, and the memory it will take.
type plan struct {
	decoder
	weights     *weightSet // the planning set: the tensors wanted
	ropeDim     int
	interleaved bool
	maxTokens   int // the largest step: PrefillChunk, and at least MaxRows
	need        Memory
}

// maxStepTokens is the most tokens a step, or a cache row, may hold: token
// ids, positions and row offsets are i32 on the device.
const maxStepTokens = math.MaxInt32

// checkpointLayers is how many decoder layers w holds tensors of: one more
// than the largest N of its model.layers.N.* names.
func checkpointLayers(w *loader.Weights) int {
	n := 0
	for _, name := range w.Names() {
		rest, ok := strings.CutPrefix(name, "model.layers.")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		if i, err := strconv.Atoi(num); err == nil && i >= 0 && i < math.MaxInt {
			n = max(n, i+1)
		}
	}
	return n
}

// planLoad checks what Load is asked, config, options and checkpoint (every
// tensor's presence, shape and dtype), and estimates the memory of the model
// on a device whose activations are of type act. Every size it multiplies
// is then bounded by the checkpoint's own, the options' by saturation.
func planLoad(cfg *loader.Config, w *loader.Weights, act kernels.DType, opt LoadOptions) (*plan, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if opt.MaxRows < 1 || opt.MaxSeq < 1 {
		return nil, fmt.Errorf("model: MaxRows (%d) and MaxSeq (%d) must be at least 1", opt.MaxRows, opt.MaxSeq)
	}
	if opt.PrefillChunk < 0 {
		return nil, fmt.Errorf("model: PrefillChunk %d is negative", opt.PrefillChunk)
	}
	// A config may ask for far more layers than the checkpoint holds (a
	// million of two): the layers past the first missing one are not
	// planned one by one, only summed up in the error.
	planCfg, held := cfg, 0
	if w != nil {
		if held = checkpointLayers(w); cfg.NumLayers > held+1 {
			c := *cfg
			c.NumLayers = held + 1
			planCfg = &c
		}
	}
	build, ropeDim, interleaved := archOf(planCfg)
	if build == nil {
		return nil, fmt.Errorf("model: architecture %q is not supported (want %s or %s)", cfg.Arch, loader.ArchQwen2, loader.ArchDeepseekV2)
	}
	s := &weightSet{w: w, act: act}
	p := &plan{decoder: build(s), weights: s, ropeDim: ropeDim, interleaved: interleaved}
	if err := w.Check(s.want); err != nil {
		if ce := (*loader.CheckError)(nil); planCfg != cfg && errors.As(err, &ce) {
			summary := fmt.Sprintf("model.layers.%d to model.layers.%d: missing (num_hidden_layers is %d; the checkpoint holds %d layers)",
				held+1, cfg.NumLayers-1, cfg.NumLayers, held)
			ce.Prepend(summary, 1)
		}
		return nil, fmt.Errorf("model: %w", err)
	}
	rows, seq := Bytes(opt.MaxRows), Bytes(opt.MaxSeq)
	tokens := Bytes(opt.PrefillChunk)
	if tokens == 0 {
		tokens = mulSat(rows, seq)
	}
	tokens = max(tokens, rows)

	ws := layers.NewWorkspace()
	p.reserve(ws, act, cfg.HiddenSize)
	work := mulSat(Bytes(ws.Bytes(1)), tokens)
	// Rows and tokens past the i32 bound are refused after this estimate
	// (checkSteps); counting the buffers at the bound keeps ints in range.
	sizing := &engine{cfg: cfg}
	for _, b := range sizing.ioBuffers(act, int(min(rows, maxStepTokens)), int(min(tokens, maxStepTokens))) {
		n := Bytes(b.dt.Size())
		for _, d := range b.shape {
			n = mulSat(n, Bytes(d))
		}
		work = addSat(work, n)
	}
	p.need = Memory{
		Weights: addSat(Bytes(s.bytes), ropeBytes(ropeDim, seq)),
		Cache:   mulSat(Bytes(KVBytesPerToken(cfg, act)), rows, seq),
		Work:    work,
	}
	if tokens <= maxStepTokens {
		p.maxTokens = int(tokens)
	}
	return p, nil
}

// checkSteps rejects, once memory is known to suffice, steps and rows the
// device's i32 indices cannot address.
func (p *plan) checkSteps(opt LoadOptions) error {
	if p.maxTokens == 0 || opt.MaxSeq > maxStepTokens {
		return fmt.Errorf("model: %d rows of %d tokens: a step or a row of more than %d tokens cannot be addressed",
			opt.MaxRows, opt.MaxSeq, maxStepTokens)
	}
	return nil
}

// ropeBytes is the memory of the rotary tables: cos and sin, f32, dim/2
// per position.
func ropeBytes(dim int, positions Bytes) Bytes {
	return mulSat(Bytes(2*(dim/2)*kernels.F32.Size()), positions)
}

// Estimate checks the checkpoint w against the model cfg describes, as Load
// does first, and returns the memory Load would allocate with opt on a
// device whose activations are of type act (its ActDType).
func Estimate(cfg *loader.Config, w *loader.Weights, act kernels.DType, opt LoadOptions) (Memory, error) {
	p, err := planLoad(cfg, w, act, opt)
	if err != nil {
		return Memory{}, err
	}
	return p.need, nil
}

// Check reports why Load could not run the checkpoint w of the model cfg
// describes (an unsupported config, a tensor missing, of another shape or
// an unsupported dtype), or nil.
func Check(cfg *loader.Config, w *loader.Weights) error {
	_, err := planLoad(cfg, w, kernels.F32, LoadOptions{MaxRows: 1, MaxSeq: 1})
	return err
}

// mulSat is the product of non-negative amounts, or the largest Bytes when
// it overflows.
func mulSat(a Bytes, more ...Bytes) Bytes {
	for _, b := range more {
		hi, lo := bits.Mul64(uint64(a), uint64(b))
		if hi != 0 || lo > math.MaxInt64 {
			return math.MaxInt64
		}
		a = Bytes(lo)
	}
	return a
}

// addSat is the sum of non-negative amounts, or the largest Bytes when it
// overflows.
func addSat(a Bytes, more ...Bytes) Bytes {
	for _, b := range more {
		if a > math.MaxInt64-b {
			return math.MaxInt64
		}
		a += b
	}
	return a
}
