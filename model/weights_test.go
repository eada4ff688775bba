package model

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nlpodyssey/safetensors"

	"github.com/fuselm/fuselm/kernels/cpu"
	"github.com/fuselm/fuselm/loader"
)

// writeF32Checkpoint writes tensors (f32 values and their shapes) as a
// single-file checkpoint in a new directory and opens it.
func writeF32Checkpoint(t *testing.T, tensors map[string][]float32, shapes map[string][]uint64) *loader.Weights {
	t.Helper()
	views := map[string]safetensors.TensorView{}
	for name, v := range tensors {
		raw := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		tv, err := safetensors.NewTensorView(safetensors.F32, shapes[name], raw)
		if err != nil {
			t.Fatal(err)
		}
		views[name] = tv
	}
	data, err := safetensors.Serialize(views, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, loader.SingleWeightsFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := loader.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// q_proj and kv_a_proj_with_mqa load as one Linear, q_proj's rows first;
// with attention_bias its bias is zero over q_proj's rows (HF gives q_proj
// none) and kv_a_proj_with_mqa's after them, and only the checkpoint's
// tensors are asked for.
func TestQKVAProjStacked(t *testing.T) {
	const a = "model.layers.0.self_attn"
	const qOut, kvaOut, hidden = 4, 3, 2
	seq := func(n int, from float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = from + float32(i)
		}
		return v
	}
	tensors := map[string][]float32{
		a + ".q_proj.weight":             seq(qOut*hidden, 1),
		a + ".kv_a_proj_with_mqa.weight": seq(kvaOut*hidden, 100),
		a + ".kv_a_proj_with_mqa.bias":   seq(kvaOut, -5),
	}
	shapes := map[string][]uint64{
		a + ".q_proj.weight":             {qOut, hidden},
		a + ".kv_a_proj_with_mqa.weight": {kvaOut, hidden},
		a + ".kv_a_proj_with_mqa.bias":   {kvaOut},
	}
	w := writeF32Checkpoint(t, tensors, shapes)
	dev := cpu.NewDevice()
	for _, bias := range []bool{false, true} {
		s := &weightSet{w: w, dev: dev, act: dev.ActDType()}
		l := qKVAProj(s, a, qOut, kvaOut, hidden, bias)
		t.Cleanup(func() {
			for _, t := range s.owned {
				dev.Free(t)
			}
		})
		if s.err != nil {
			t.Fatal(s.err)
		}
		got, err := dev.ReadF32(l.Weight)
		if err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(tensors[a+".q_proj.weight"]), tensors[a+".kv_a_proj_with_mqa.weight"]...)
		if !slices.Equal(got, want) || !slices.Equal(l.Weight.Shape, []int{qOut + kvaOut, hidden}) {
			t.Errorf("bias %v: weight %v %v, want [%d %d] %v", bias, l.Weight.Shape, got, qOut+kvaOut, hidden, want)
		}
		wants := []string{a + ".q_proj.weight", a + ".kv_a_proj_with_mqa.weight"}
		switch {
		case !bias && l.Bias != nil:
			t.Errorf("no attention_bias: bias %v", l.Bias)
		case bias:
			wants = append(wants, a+".kv_a_proj_with_mqa.bias")
			got, err := dev.ReadF32(l.Bias)
			if err != nil {
				t.Fatal(err)
			}
			if want := append(make([]float32, qOut), tensors[a+".kv_a_proj_with_mqa.bias"]...); !slices.Equal(got, want) {
				t.Errorf("bias %v, want %v", got, want)
			}
		}
		var names []string
		for _, wt := range s.want {
			names = append(names, wt.Name)
		}
		if !slices.Equal(names, wants) {
			t.Errorf("bias %v: asked for %v, want %v", bias, names, wants)
		}
	}
}
