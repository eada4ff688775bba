package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// A kernel set that a package registers, here this test, is one the
// command line takes with no edit anywhere else: --kernels names it, it
// runs the ops it owns, the registry's baseline for its device runs the
// others, bench lists it among its device's sets, and a set name that is
// not registered fails listing it.
func TestRegisteredSetNeedsNoOtherEdit(t *testing.T) {
	cpuSet, _ := kernels.Set("cpu")
	kernels.Register(kernels.SetInfo{Name: "cpu_throwaway", Device: "cpu", Own: []kernels.Op{kernels.OpRMSNorm}, New: cpuSet.New})
	t.Cleanup(func() { kernels.Unregister("cpu_throwaway") })

	args := []string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--kernels", "cpu_throwaway", "--json", "--quiet"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep struct {
		Kernels string           `json:"kernels"`
		Profile []profile.OpStat `json:"profile"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	sets := map[kernels.Op]string{}
	for _, row := range rep.Profile {
		sets[row.Op] = row.Set
	}
	if rep.Kernels != "cpu_throwaway" || sets[kernels.OpRMSNorm] != "cpu_throwaway" || sets[kernels.OpLinear] != "cpu" {
		t.Errorf("kernels %q, sets by op %v: want rms_norm on cpu_throwaway and linear on its fallback, cpu", rep.Kernels, sets)
	}

	code, stdout, stderr = runInfer(t, "bench", "--dry-run", "--device", "cpu", "rms_norm", "add_rms_norm", "--shape", "M=4,N=32")
	if code != exitOK || !strings.Contains(stdout, "cpu_throwaway  default") ||
		!strings.Contains(stdout, "no kernel of its own: runs cpu's") {
		t.Errorf("bench --dry-run: exit %d, want cpu_throwaway's rms_norm and its fallback for add_rms_norm:\n%s%s", code, stdout, stderr)
	}

	args = []string{"--model", tinyQwen, "--prompt", "hi", "--kernels", "cpu,rms_norm=turbo"}
	code, _, stderr = runInfer(t, args...)
	if code != exitUsage {
		t.Errorf("unknown set: exit %d, want %d", code, exitUsage)
	}
	oneLine(t, args, stderr, `unknown kernel set "turbo" (want one of cpu, cpu_throwaway, fused, naive: the sets built into this binary)`)
}
