package model

import (
	"errors"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// faultingOps is the cpu set's ops with a record of a kernel that gave up,
// as fused's Hopper kernels leave one on the device.
type faultingOps struct {
	kernels.Ops
	fault *error
}

func (o faultingOps) Faults() error {
	err := *o.fault
	*o.fault = nil
	return err
}

// A generation fails, naming the fault, where a set of its Dispatch
// recorded that a kernel gave up on a wait (kernels.Faulter), and succeeds
// once the record is cleared.
func TestGenerateFaults(t *testing.T) {
	var fault error
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "faults_test_only", Device: "cpu", Own: []kernels.Op{kernels.OpArgmax}, Fallback: "cpu",
		New: func(dev kernels.Device) (kernels.Ops, error) {
			ops, err := cpuSet.New(dev)
			return faultingOps{Ops: ops, fault: &fault}, err
		}})
	defer kernels.Unregister("faults_test_only")
	spec, err := kernels.ParseSpec("cpu,argmax=faults_test_only")
	if err != nil {
		t.Fatal(err)
	}
	dev := cpu.NewDevice()
	ops, err := spec.Build(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	m := loadOn(t, dev, ops, cfg, w, LoadOptions{MaxRows: 4, MaxSeq: 32})
	opt := GenerateOptions{MaxNewTokens: 3}
	fault = errors.New("fused: linear_stream: a wait for x timed out")
	if _, err := Generate(m, testPrompts, opt); err == nil || !strings.Contains(err.Error(), "a wait for x timed out") {
		t.Errorf("a generation after a fault: %v, want an error naming it", err)
	}
	if err := kernels.JoinFaults(nil, errors.New("a"), nil, errors.New("b")); err == nil || err.Error() != "a; b" {
		t.Errorf("two faults: %q, want one line %q", err, "a; b")
	}
	if err := kernels.JoinFaults(nil, nil); err != nil {
		t.Errorf("no faults: %v", err)
	}
	if g, err := Generate(m, testPrompts, opt); err != nil || len(g.Tokens[0]) != 3 {
		t.Errorf("the next generation: %v, %v", g, err)
	}
}
