package kbench

import (
	"fmt"
	"math"
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
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	ops, _ := kernels.Spec{Base: "cpu"}.Build(dev, nil)
	r := &runner{dev: dev, built: map[string]setOps{"cpu": ops}, rep: &Report{}}
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
		want, wantErr := wholeChecked(t, dev, p, ops, set)
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
	dev, _ := cpu.NewDeviceAct(kernels.BF16)
	ops, _ := kernels.Spec{Base: "cpu"}.Build(dev, nil)
	r := &runner{dev: dev, built: map[string]setOps{"cpu": ops}, rep: &Report{}}
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
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1)), 0,
		float32(math.NaN()), 1e-40, 6e-8, -3.5, 65504, 1e30}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		wide := b.Alloc(dt, 2, 5, 13)
		vals := make([]float32, wide.Numel())
		for i := range vals {
			vals[i] = special[i%len(special)] * float32(1+i%7)
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
