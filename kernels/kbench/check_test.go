package kbench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// nudged is the cpu set with every element of linear's output in row r
// scaled by 1 + r·step, and row bad, when set, by 1.5: an error that grows
// from the first chunk of the output to its last.
type nudged struct {
	kernels.Ops
	dev  kernels.Device
	step float64
	bad  int // the row made wrong, -1 for none
}

func (n nudged) Linear(out, x, w, bias *kernels.Tensor) {
	n.Ops.Linear(out, x, w, bias)
	v, err := n.dev.ReadF32(out)
	if err != nil {
		panic(err)
	}
	cols := out.Cols()
	for i := range v {
		r := i / cols
		s := 1 + float64(r)*n.step
		if r == n.bad {
			s = 1.5
		}
		v[i] = float32(float64(v[i]) * s)
	}
	kerneltest.NewBuilder(n.dev, 0, 0).Upload(out, v)
}

// wholeChecked is the checked string and error check gives for a set held
// against the cpu set, worked out from both sets' outputs read whole.
func wholeChecked(t *testing.T, dev kernels.Device, p *kerneltest.Problem, ref, set kernels.Ops) (string, string) {
	t.Helper()
	read := func(o kernels.Ops) [][]float32 {
		p.Run(o, 0)
		var outs [][]float32
		for _, out := range p.Outs {
			v, err := dev.ReadF32(out)
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, v)
		}
		return outs
	}
	want, got := read(ref), read(set)
	worst := 0.0
	for i := range got {
		e := kernels.RelErr(got[i], want[i])
		if !(e <= tolerance) {
			return fmt.Sprintf("cpu %.2g", e), fmt.Sprintf("output %d is %.3g from cpu's (tolerance %g): not timed", i, e, tolerance)
		}
		worst = max(worst, e)
	}
	return fmt.Sprintf("cpu %.1e", worst), ""
}

// The check reads outputs of several chunks a chunk at a time, the
// reference's too, and reaches the verdict the comparison of the outputs
// read whole does: the same relative error within the tolerance, and the
// same output refused beyond it where only a late chunk is wrong.
func TestCheckInChunks(t *testing.T) {
	r, dev, ops := cpuRunner()
	c := CaseFor(kernels.OpLinear)
	s, _ := kernels.ParseShape("M=24,N=40,K=32") // cheap: the cpu set is the reference
	p, err := build(kerneltest.NewBuilder(dev, 0, 0), c, s)
	if err != nil {
		t.Fatal(err)
	}
	defer func(was int) { checkChunk = was }(checkChunk)
	for _, set := range []nudged{
		{Ops: ops, dev: dev, step: 2e-4, bad: -1},
		{Ops: ops, dev: dev, step: 2e-4, bad: 22},
	} {
		checkChunk = 1 << 30
		want, wantErr := wholeChecked(t, dev, p.Problem, ops, set)
		if want == "cpu 0.0e+00" {
			t.Fatalf("nudged set %+v: no error to hold chunks to", set.bad)
		}
		t.Logf("bad row %d: read whole %q %q", set.bad, want, wantErr)
		// One chunk, then chunks of 3 rows, of 2 rows (100 elements:
		// less than 3 rows of 40), and of one row (less than a row).
		for _, chunk := range []int{1 << 30, 120, 100, 1} {
			checkChunk = chunk
			checked, err := r.check(c, s, p, set, "nudged", &reference{})
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if checked != want || gotErr != wantErr {
				t.Errorf("bad row %d, chunks of %d elements: checked %q, error %q; read whole: %q, %q",
					set.bad, chunk, checked, gotErr, want, wantErr)
			}
		}
	}
}

// lastResidRowOff is the cpu set with the last row of add_rms_norm's
// residual (its second output) scaled by 1.5.
type lastResidRowOff struct {
	kernels.Ops
	dev kernels.Device
}

func (o lastResidRowOff) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	o.Ops.AddRMSNorm(out, resid, x, w, eps)
	v, err := o.dev.ReadF32(resid)
	if err != nil {
		panic(err)
	}
	for i := len(v) - resid.Cols(); i < len(v); i++ {
		v[i] *= 1.5
	}
	kerneltest.NewBuilder(o.dev, 0, 0).Upload(resid, v)
}

// An op of two outputs and an in-place input (add_rms_norm's out and
// residual) is checked in chunks as whole: both outputs, the residual put
// back before each run, a wrong last chunk of the second output refused.
func TestCheckInChunksTwoOutputs(t *testing.T) {
	r, dev, ops := cpuRunner()
	c := CaseFor(kernels.OpAddRMSNorm)
	s, _ := kernels.ParseShape("M=8,N=64")
	p, err := build(kerneltest.NewBuilder(dev, 0, 0), c, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Outs) != 2 || len(p.State) != 1 {
		t.Fatalf("add_rms_norm: %d outputs, %d in place", len(p.Outs), len(p.State))
	}
	defer func(was int) { checkChunk = was }(checkChunk)
	for _, chunk := range []int{1 << 30, 3 * 64, 1} {
		checkChunk = chunk
		ref := &reference{}
		checked, err := r.check(c, s, p, ops, "other", ref)
		if err != nil || checked != "cpu 0.0e+00" {
			t.Errorf("chunks of %d: checked %q, %v", chunk, checked, err)
		}
		for i, out := range ref.outs {
			if out.len() != p.Outs[i].Numel() {
				t.Errorf("chunks of %d: output %d kept %d elements of %d", chunk, i, out.len(), p.Outs[i].Numel())
			}
		}
		checked, err = r.check(c, s, p, lastResidRowOff{ops, dev}, "off", &reference{})
		if err == nil || !strings.HasPrefix(err.Error(), "output 1 is ") || !strings.HasPrefix(checked, "cpu ") {
			t.Errorf("chunks of %d: add_rms_norm with its residual's last row off checked %q, %v", chunk, checked, err)
		}
	}
}

// A tensor read in chunks and kept (hostCopy) is the tensor ReadF32 reads
// whole, bit for bit where a number, NaN where NaN: bf16, f16 and f32
// tensors, of one, two and three dimensions, packed or a column slice of a
// wider one, holding infinities, signed zeros, subnormals and NaNs.
func TestHostCopy(t *testing.T) {
	dev := cpu.NewDevice()
	b := kerneltest.NewBuilder(dev, 0, 0)
	defer b.Free()
	defer func(was int) { checkChunk = was }(checkChunk)
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		wide := b.Alloc(dt, 2, 5, 13)
		vals := make([]float32, wide.Numel())
		for i := range vals {
			vals[i] = specialValue(i)
		}
		b.Upload(wide, vals)
		for _, v := range []*kernels.Tensor{wide, wide.ColSlice(2, 11), wide.Reshape(wide.Numel()), wide.Reshape(10, 13).Slice(3, 8)} {
			whole, err := dev.ReadF32(v)
			if err != nil {
				t.Fatal(err)
			}
			for _, chunk := range []int{1 << 30, 20, 1} {
				checkChunk = chunk
				h, reads := newHostCopy(v), 0
				most := 0 // the longest chunk read
				if err := readChunks(dev, v, func(x []float32) { h.append(x); reads++; most = max(most, len(x)) }); err != nil {
					t.Fatal(err)
				}
				if len(v.Shape) >= 2 && most > max(chunk, v.Cols()) {
					t.Errorf("%v in chunks of %d: a chunk of %d elements", v, chunk, most)
				}
				if len(v.Shape) >= 2 && chunk == 1 && reads != v.Rows() {
					t.Errorf("%v in chunks of %d: %d reads, want one a row", v, chunk, reads)
				}
				if h.len() != len(whole) {
					t.Fatalf("%v in chunks of %d: kept %d elements, want %d", v, chunk, h.len(), len(whole))
				}
				got := make([]float32, len(whole))
				h.widen(got[:4], 0)
				h.widen(got[4:], 4)
				for i := range whole {
					g, w := got[i], whole[i]
					if w != w && g == g || w == w && math.Float32bits(g) != math.Float32bits(w) {
						t.Errorf("%v in chunks of %d: element %d is %g, want %g", v, chunk, i, g, w)
						break
					}
				}
			}
		}
	}
}

// Narrowing into a hostCopy (append) and widening out of it (widen) cut
// into chunks of any size on kernels.Parallel's goroutines give what one
// chunk does, bit for bit: bf16, f16 and f32 copies of every kind of value (NaNs, infinities,
// subnormals, signed zeros among random bits), appended in two pieces and
// widened from offsets inside the copy.
func TestHostCopyParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n := 50001
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		v := make([]float32, n) // values as ReadF32 reads them from a dt tensor
		for i := range v {
			switch dt {
			case kernels.BF16:
				v[i] = math.Float32frombits(uint32(rng.Uint32()) &^ 0xffff)
			case kernels.F16:
				v[i] = kernels.F16ToF32(uint16(rng.Uint32()))
			default:
				v[i] = math.Float32frombits(rng.Uint32())
			}
		}
		keep := func(grain int) *hostCopy {
			h := newHostCopy(&kernels.Tensor{DType: dt, Shape: []int{n}})
			h.appendOn(v[:n/3], grain)
			h.appendOn(v[n/3:], grain)
			return h
		}
		one := keep(n) // one chunk, on this goroutine
		if ok, where := sameBits(widened(one), v); !ok {
			t.Fatalf("%v: kept and widened, %s", dt, where)
		}
		for _, grain := range []int{1, n / 16, n / 7, n / 3, n / 2} {
			h := keep(grain)
			if !slices.Equal(h.bits, one.bits) || !slices.Equal(bitsOf(h.f32), bitsOf(one.f32)) {
				t.Fatalf("%v: appended in chunks of %d or more, not as in one", dt, grain)
			}
			for _, r := range [][2]int{{0, n}, {7, n - 7}, {n / 2, n/2 + 1}, {n - 1000, 1000}} {
				got, want := make([]float32, r[1]), make([]float32, r[1])
				h.widenOn(got, r[0], grain)
				one.widenOn(want, r[0], n)
				if !slices.Equal(bitsOf(got), bitsOf(want)) {
					t.Fatalf("%v: %d elements from %d widened in chunks of %d or more, not as in one", dt, r[1], r[0], grain)
				}
			}
		}
	}
}

// bitsOf is v's elements as their bits.
func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}

// widened is all of h's elements as float32.
func widened(h *hostCopy) []float32 {
	v := make([]float32, h.len())
	h.widen(v, 0)
	return v
}

// uploads is a device that records every Upload: the tensor written and
// the type of the data.
type uploads struct {
	kernels.Device
	into []*kernels.Tensor
	src  []kernels.DType
}

func (u *uploads) Upload(t *kernels.Tensor, data []byte, src kernels.DType) error {
	u.into, u.src = append(u.into, t), append(u.src, src)
	return u.Device.Upload(t, data, src)
}

// sameBits reports whether got is want bit for bit where a number, NaN
// where NaN, and says where not.
func sameBits(got, want []float32) (bool, string) {
	if len(got) != len(want) {
		return false, fmt.Sprintf("%d elements, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if w != w && g == g || w == w && math.Float32bits(g) != math.Float32bits(w) {
			return false, fmt.Sprintf("element %d is %g, want %g", i, g, w)
		}
	}
	return true, ""
}

// A tensor kept (hostCopy) and put back in chunks (writeChunks) after it
// was overwritten reads as it did, and the elements of the buffer beside
// it are left as they were: bf16, f16 and f32 tensors of one, two and
// three dimensions, packed or a column slice of a wider one, holding
// infinities, signed zeros, subnormals and NaNs. Each chunk is whole rows
// of at most checkChunk elements (one row of a column slice), written in
// the tensor's own type.
func TestWriteChunks(t *testing.T) {
	host := cpu.NewDevice()
	dev := &uploads{Device: host}
	b := kerneltest.NewBuilder(host, 0, 0)
	defer b.Free()
	defer func(was int) { checkChunk = was }(checkChunk)
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		wide := b.Alloc(dt, 2, 5, 13)
		all := wide.Reshape(wide.Numel())
		vals, other := make([]float32, wide.Numel()), make([]float32, wide.Numel())
		for i := range vals {
			vals[i] = specialValue(i)
			other[i] = float32(i%5) - 7
		}
		for _, v := range []*kernels.Tensor{wide, wide.ColSlice(2, 11), wide.Reshape(10, 13).Slice(3, 8),
			wide.Reshape(10, 13).Slice(3, 8).ColSlice(0, 12), all, wide.Reshape(wide.Numel()/2, 2)} {
			for _, chunk := range []int{1 << 30, 20, 1} {
				checkChunk = chunk
				b.Upload(wide, vals)
				h := newHostCopy(v)
				if err := readChunks(host, v, h.append); err != nil {
					t.Fatal(err)
				}
				b.Upload(wide, other)
				beside, err := host.ReadF32(all) // what the buffer holds, v overwritten
				if err != nil {
					t.Fatal(err)
				}
				dev.into, dev.src = nil, nil
				if err := writeChunks(dev, v, h); err != nil {
					t.Fatalf("%v in chunks of %d: %v", v, chunk, err)
				}
				got, err := host.ReadF32(v)
				if err != nil {
					t.Fatal(err)
				}
				b.Upload(wide, vals)
				want, err := host.ReadF32(v)
				if err != nil {
					t.Fatal(err)
				}
				if ok, why := sameBits(got, want); !ok {
					t.Errorf("%v in chunks of %d, put back: %s", v, chunk, why)
				}
				// Put v back over other again and read the whole buffer: v
				// as built, the rest as other left it.
				b.Upload(wide, other)
				if err := writeChunks(host, v, h); err != nil {
					t.Fatal(err)
				}
				after, err := host.ReadF32(all)
				if err != nil {
					t.Fatal(err)
				}
				in := map[int]bool{} // the buffer's elements that are v's
				rows := v.Reshape(v.Rows(), v.Cols())
				for r := range v.Rows() {
					for c := range v.Cols() {
						in[rows.Offset-all.Offset+r*rows.Pitch+c] = true
					}
				}
				for i := range after {
					if !in[i] && math.Float32bits(after[i]) != math.Float32bits(beside[i]) {
						t.Errorf("%v in chunks of %d: element %d of the buffer, not the tensor's, is %g, was %g", v, chunk, i, after[i], beside[i])
						break
					}
				}
				most, n := 0, 0 // the largest chunk written, the elements written
				for i, c := range dev.into {
					if !c.Packed() || dev.src[i] != v.DType {
						t.Errorf("%v in chunks of %d: chunk %v written as %v", v, chunk, c, dev.src[i])
						break
					}
					most, n = max(most, c.Numel()), n+c.Numel()
				}
				if n != v.Numel() {
					t.Errorf("%v in chunks of %d: %d elements written, want %d", v, chunk, n, v.Numel())
				}
				if len(v.Shape) >= 2 && most > max(chunk, v.Cols()) {
					t.Errorf("%v in chunks of %d: a chunk of %d elements", v, chunk, most)
				}
				if len(v.Shape) >= 2 && (chunk == 1 || !v.Packed()) && len(dev.into) != v.Rows() {
					t.Errorf("%v in chunks of %d: %d writes, want one a row", v, chunk, len(dev.into))
				}
				if len(v.Shape) >= 2 && v.Packed() && chunk == 20 && len(dev.into) < 2 {
					t.Errorf("%v in chunks of %d: %d writes, want several", v, chunk, len(dev.into))
				}
			}
		}
	}
}

// addNudged is the cpu set with linear_add's output in row r scaled by
// 1 + r·step after the add: an error that grows from the first chunk of
// the output to its last, and that depends on the addend, the in-place
// input, being put back as built.
type addNudged struct {
	kernels.Ops
	dev  kernels.Device
	step float64
}

func (n addNudged) LinearAdd(out, x, w, bias, addend *kernels.Tensor) {
	n.Ops.LinearAdd(out, x, w, bias, addend)
	v, err := n.dev.ReadF32(out)
	if err != nil {
		panic(err)
	}
	cols := out.Cols()
	for i := range v {
		v[i] = float32(float64(v[i]) * (1 + float64(i/cols)*n.step))
	}
	kerneltest.NewBuilder(n.dev, 0, 0).Upload(out, v)
}

// An op that adds into its output (linear_add) is checked in chunks as
// whole, whatever ran on its in-place output before: the checked string
// is the one the outputs of two problems built afresh give, one run with
// the reference and one with the set, read whole; for the cpu reference
// (its own problem, built on the host) and for a reference run on the
// problem itself, as naive is on a GPU (here the cpu set under naive's
// name).
func TestCheckStateInChunks(t *testing.T) {
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	ops, _ := kernels.Spec{Base: "cpu"}.Build(dev, nil)
	r := &runner{dev: dev, built: map[string]setOps{"cpu": ops, "naive": ops}, rep: &Report{}, opt: Options{Seed: 5}}
	c := CaseFor(kernels.OpLinearAdd)
	s, _ := kernels.ParseShape("M=12,N=40,K=32")
	set := addNudged{Ops: ops, dev: dev, step: 1e-3}
	fresh := func(o kernels.Ops) []float32 {
		p, err := build(kerneltest.NewBuilder(dev, 5, 0), c, s)
		if err != nil {
			t.Fatal(err)
		}
		p.Run(o, 0)
		v, err := dev.ReadF32(p.Outs[0])
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	e := kernels.RelErr(fresh(set), fresh(ops))
	if e == 0 || !(e <= tolerance) {
		t.Fatalf("nudged linear_add is %g from cpu's: want an error within the tolerance", e)
	}
	p, err := build(kerneltest.NewBuilder(dev, 5, 1<<14), c, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.State) != 1 || p.State[0] != p.Outs[0] {
		t.Fatalf("linear_add: state %v, outputs %v: want its output in place", p.State, p.Outs)
	}
	defer func(was int) { checkChunk = was }(checkChunk)
	for _, by := range []string{"cpu", "naive"} {
		want := fmt.Sprintf("%s %.1e", by, e)
		// Chunks of the whole, of 5 rows, of 2 rows (100 elements: less
		// than 3 rows of 40), and of one row (less than a row).
		for _, chunk := range []int{1 << 30, 200, 100, 1} {
			checkChunk = chunk
			for range 3 { // the state left as timing leaves it
				p.Run(set, 0)
			}
			ref := &reference{}
			if by == "naive" {
				ref.by = by
				ref.outs, ref.err = r.reference(c, s, p, by)
				for range 2 {
					p.Run(set, 0)
				}
			}
			checked, err := r.check(c, s, p, set, "nudged", ref)
			if err != nil || checked != want {
				t.Errorf("%s reference, chunks of %d: checked %q, %v; read whole: %q", by, chunk, checked, err, want)
			}
			got, err := dev.ReadF32(p.State[0])
			if err != nil {
				t.Fatal(err)
			}
			if ok, why := sameBits(got, widened(p.built[0])); !ok {
				t.Errorf("%s reference, chunks of %d: the output after the check is not as built: %s", by, chunk, why)
			}
		}
	}
}

// specialValue is element i of the tests' tensors of hard values:
// infinities, signed zeros, NaN, subnormals, f16's largest, and beyond it.
func specialValue(i int) float32 {
	special := [...]float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1)), 0,
		float32(math.NaN()), 1e-40, 6e-8, -3.5, 65504, 1e30}
	return special[i%len(special)] * float32(1+i%7)
}
