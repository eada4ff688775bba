package main

import (
	"bytes"
	"os"
	"testing"
)

// kernels/ops_gen.go is what opsgen writes from kernels/ops.go now: an op
// added to the table and to Ops, then go generate ./kernels.
func TestGeneratedIsCurrent(t *testing.T) {
	want, err := generate("../../ops.go")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../ops_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("kernels/ops_gen.go is stale: run go generate ./kernels")
	}
}

// TestUnexported: a parts method's name lowers the method's leading word,
// an initialism whole.
func TestUnexported(t *testing.T) {
	for in, want := range map[string]string{"LinearSwiGLU": "linearSwiGLU", "RMSNormRoPE": "rmsNormRoPE", "ABC": "abc", "X": "x"} {
		if got := unexported(in); got != want {
			t.Errorf("unexported(%q) = %q, want %q", in, got, want)
		}
	}
}
