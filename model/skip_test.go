package model

import (
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestSkipOps holds FUSELM_SKIP_OPS's parsing: unset is nothing left out,
// names are ops, and an unknown op or one a step needs is an error.
func TestSkipOps(t *testing.T) {
	t.Setenv(skipEnv, "")
	if ops, err := skipOps(); ops != nil || err != nil {
		t.Errorf("unset: %v, %v", ops, err)
	}
	t.Setenv(skipEnv, "rope, rms_norm")
	if ops, err := skipOps(); err != nil || len(ops) != 2 || ops[0] != kernels.OpRoPE || ops[1] != kernels.OpRMSNorm {
		t.Errorf("rope, rms_norm: %v, %v", ops, err)
	}
	for text, want := range map[string]string{"ropes": "unknown op", "argmax": "cannot leave out", "rope,embedding": "cannot leave out"} {
		t.Setenv(skipEnv, text)
		if _, err := skipOps(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", text, err, want)
		}
	}
	// The wrapper leaves out what it names and runs the rest.
	var c counting
	s := newSkipping(&c, []kernels.Op{kernels.OpRoPE})
	s.RoPE(nil, 0, 0, 0, nil, nil)
	s.Add(nil, nil, nil)
	if c.rope != 0 || c.add != 1 {
		t.Errorf("skipping rope: rope ran %d times, add %d, want 0 and 1", c.rope, c.add)
	}
}

// counting counts the calls of two ops; the others are not called.
type counting struct {
	kernels.Ops
	rope, add int
}

func (c *counting) RoPE(*kernels.Tensor, int, int, int, *kernels.Tensor, *kernels.Rope) { c.rope++ }
func (c *counting) Add(_, _, _ *kernels.Tensor)                                         { c.add++ }
