package kernels_test

import (
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
	_ "github.com/fuselm/fuselm/kernels/naive"
)

func TestParseSpec(t *testing.T) {
	cases := []struct {
		in      string
		canon   string
		setFor  map[kernels.Op]string
		wantErr string
	}{
		{in: "cpu", canon: "cpu", setFor: map[kernels.Op]string{kernels.OpRoPE: "cpu"}},
		{in: " fused , attn=naive,rope=naive ", canon: "fused,rope=naive,attn_prefill=naive,attn_decode=naive",
			setFor: map[kernels.Op]string{kernels.OpAttnPrefill: "naive", kernels.OpAttnDecode: "naive", kernels.OpRoPE: "naive", kernels.OpSwiGLU: "fused"}},
		{in: "naive,moe=fused,moe_route=naive", canon: "naive,moe_experts=fused",
			setFor: map[kernels.Op]string{kernels.OpMoERoute: "naive", kernels.OpMoEExperts: "fused"}},
		{in: "naive,rms_norm=naive", canon: "naive"},
		{in: "", wantErr: "no kernel set named"},
		{in: "turbo", wantErr: `unknown kernel set "turbo"`},
		{in: "fused,attn=turbo", wantErr: `unknown kernel set "turbo"`},
		{in: "fused,flash=naive", wantErr: `unknown op "flash"`},
		{in: "fused,attn", wantErr: "is not OP=SET"},
		{in: "fused,=naive", wantErr: "is not OP=SET"},
	}
	for _, c := range cases {
		s, err := kernels.ParseSpec(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ParseSpec(%q) error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", c.in, err)
			continue
		}
		if got := s.String(); got != c.canon {
			t.Errorf("ParseSpec(%q).String() = %q, want %q", c.in, got, c.canon)
		}
		for op, want := range c.setFor {
			if got := s.SetFor(op); got != want {
				t.Errorf("ParseSpec(%q).SetFor(%s) = %q, want %q", c.in, op, got, want)
			}
		}
	}
}

func TestSpecDevices(t *testing.T) {
	s, _ := kernels.ParseSpec("cpu,rope=naive")
	if _, err := s.DeviceKind(); err == nil || !strings.Contains(err.Error(), "mixes sets of different devices") {
		t.Errorf("cpu with a naive op: %v, want an error about mixed devices", err)
	}
	s, _ = kernels.ParseSpec("fused")
	if _, err := s.DeviceKind(); err == nil || !strings.Contains(err.Error(), "not built into this binary") {
		t.Errorf("fused, absent from this test binary: %v, want not built", err)
	}
	s, _ = kernels.ParseSpec("cpu")
	if k, err := s.DeviceKind(); err != nil || k != "cpu" {
		t.Errorf("cpu: %q, %v", k, err)
	}
}

// TestBuildProfiles checks that ops built from a spec count and time every
// call under the op and phase it belongs to.
func TestBuildProfiles(t *testing.T) {
	dev := cpu.NewDevice()
	prof := kernels.NewProfile(dev)
	s, _ := kernels.ParseSpec("cpu")
	ops, err := s.Build(dev, prof)
	if err != nil {
		t.Fatal(err)
	}
	a, b := dev.Alloc(kernels.F32, 4, 8), dev.Alloc(kernels.F32, 4, 8)
	if err := dev.Upload(a, make([]byte, 4*32), kernels.F32); err != nil {
		t.Fatal(err)
	}
	if err := dev.Upload(b, make([]byte, 4*32), kernels.F32); err != nil {
		t.Fatal(err)
	}
	ops.Add(a, a, b)
	prof.SetPhase("decode")
	ops.Add(a, a, b)
	ops.Add(a, a, b)
	prof.SetEnabled(false)
	ops.Add(a, a, b)
	if err := prof.Flush(); err != nil {
		t.Fatal(err)
	}
	rows := prof.Table()
	if len(rows) != 1 || rows[0].Op != kernels.OpAdd || rows[0].Calls != 3 || rows[0].Share != 1 {
		t.Fatalf("profile %+v, want one add row of 3 calls and all the share", rows)
	}
	if _, ok := rows[0].PhaseMs["prefill"]; !ok {
		t.Errorf("no prefill time recorded: %+v", rows[0].PhaseMs)
	}
	if _, ok := rows[0].PhaseMs["decode"]; !ok {
		t.Errorf("no decode time recorded: %+v", rows[0].PhaseMs)
	}
	prof.Reset()
	if rows := prof.Table(); len(rows) != 0 {
		t.Errorf("after Reset: %+v", rows)
	}
}
