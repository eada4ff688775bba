package model

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/layers"
	"github.com/fuselm/fuselm/loader"
)

// weightSet is where a model's constructor takes its weights from. The same
// constructor runs twice: first with a planning set, which only records the
// tensors it asks for (names and shapes, for Weights.Check and ParamCount)
// and the device memory they will take, and returns tensors with a shape
// and no storage; then with an uploading set, which allocates device
// tensors and copies the checkpoint into them.
type weightSet struct {
	w   *loader.Weights // nil when planning without a checkpoint (ParamCount)
	dev kernels.Device  // nil when planning
	act kernels.DType   // the device's activation type

	want  []loader.Want
	bytes int64 // the device memory of the tensors asked for

	progress    func(done, total int64)
	done, total int64
	owned       []*kernels.Tensor // every tensor allocated, for Model.Close
	err         error             // the first upload error
}

// part is one checkpoint tensor of a device tensor; a part with no name is
// zeros that no checkpoint tensor holds (the bias a module has not, stacked
// beside a module's that has one).
type part struct {
	name  string
	shape []int
}

func (s *weightSet) planning() bool { return s.dev == nil }

// has reports whether the checkpoint holds a tensor called name.
func (s *weightSet) has(name string) bool {
	if s.w == nil {
		return false
	}
	_, ok := s.w.Get(name)
	return ok
}

// storageDType is the element type a weight whose checkpoint type is src is
// kept in on a device whose activations are of type act: bf16 where they are
// bf16 (CUDA), else the checkpoint's own type (the cpu set reads f32, bf16
// and f16 weights, and keeping bf16 halves the memory).
func storageDType(act, src kernels.DType) kernels.DType {
	if act == kernels.BF16 {
		return kernels.BF16
	}
	return src
}

// load returns a device tensor of the given shape made of the parts laid one
// after the other (a stack along the first dimension: the parts of fused
// q/k/v, q/kv_a or gate/up weights, the experts of an MoE layer). Each part
// is uploaded straight into its place in the one allocation, with no stacked
// copy made on the host, so a stack takes the memory of its parts and no
// more. norm says the tensor is a norm weight, kept as f32 where the
// checkpoint types are kept; other tensors keep there the type of their
// first checkpoint part (storageDType).
func (s *weightSet) load(norm bool, shape []int, parts ...part) *kernels.Tensor {
	n := 0
	first := ""
	for _, p := range parts {
		if p.name != "" {
			s.want = append(s.want, loader.Want{Name: p.name, Shape: p.shape})
			if first == "" {
				first = p.name
			}
		}
		n += numel(p.shape)
	}
	if numel(shape) != n {
		panic(fmt.Sprintf("model: %v does not hold its parts (%d elements)", shape, n))
	}
	src := kernels.F32
	if s.w != nil && !norm {
		if info, ok := s.w.Get(first); ok {
			src = info.DType
		}
	}
	dt := storageDType(s.act, src)
	if s.planning() {
		s.bytes += int64(n) * int64(dt.Size())
		return kernels.NewTensor(nil, dt, 0, shape...)
	}
	t := s.dev.Alloc(dt, shape...)
	s.owned = append(s.owned, t)
	off := 0
	for _, p := range parts {
		view := kernels.NewTensor(t.Buf, dt, t.Offset+off, p.shape...)
		off += numel(p.shape)
		if p.name == "" {
			if s.err == nil {
				if err := s.dev.Upload(view, make([]byte, view.Numel()*dt.Size()), dt); err != nil {
					s.err = fmt.Errorf("model: zeroing a part of %v: %w", shape, err)
				}
			}
			continue
		}
		info, _ := s.w.Get(p.name)
		if s.err == nil { // after an error the model is not kept: nothing more to read
			// Read turns a fault reading the mapped file (cut short
			// since it was opened) into an error that names it.
			s.err = s.w.Read(info, func(data []byte) error {
				if err := s.dev.Upload(view, data, info.DType); err != nil {
					return fmt.Errorf("model: uploading %s: %w", p.name, err)
				}
				return nil
			})
		}
		s.done += int64(len(info.Data))
		if s.progress != nil {
			s.progress(s.done, s.total)
		}
	}
	return t
}

// matrix is the weight called name, of the given shape.
func (s *weightSet) matrix(name string, shape ...int) *kernels.Tensor {
	return s.load(false, shape, part{name, shape})
}

// linear is nn.Linear prefix (prefix.weight [out, in], and prefix.bias [out]
// when bias).
func (s *weightSet) linear(prefix string, out, in int, bias bool) layers.Linear {
	return s.stackedLinear(prefix, []string{""}, []int{out}, in, bias)
}

// stackedLinear is the nn.Linear modules prefix+names[i] (outs[i] outputs
// each, in inputs) fused into one whose output is theirs concatenated.
func (s *weightSet) stackedLinear(prefix string, names []string, outs []int, in int, bias bool) layers.Linear {
	var w, b []part
	total := 0
	for i, name := range names {
		p := prefix + name
		if name != "" {
			p = prefix + "." + name
		}
		w = append(w, part{p + ".weight", []int{outs[i], in}})
		b = append(b, part{p + ".bias", []int{outs[i]}})
		total += outs[i]
	}
	l := layers.Linear{Weight: s.load(false, []int{total, in}, w...)}
	if bias {
		l.Bias = s.load(false, []int{total}, b...)
	}
	return l
}

// rmsNorm is the RMSNorm prefix (prefix.weight [n]).
func (s *weightSet) rmsNorm(prefix string, n int, eps float64) layers.RMSNorm {
	shape := []int{n}
	return layers.RMSNorm{Weight: s.load(true, shape, part{prefix + ".weight", shape}), Eps: float32(eps)}
}

// mlp is a SwiGLU MLP prefix with gate_proj and up_proj fused.
func (s *weightSet) mlp(prefix string, hidden, intermediate int) *layers.MLP {
	return &layers.MLP{
		GateUpProj: s.stackedLinear(prefix, []string{"gate_proj", "up_proj"}, []int{intermediate, intermediate}, hidden, false),
		DownProj:   s.linear(prefix+".down_proj", hidden, intermediate, false),
	}
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
