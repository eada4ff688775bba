package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels/userset"
)

// kernelExamples is the repository's examples/kernels.
var kernelExamples = filepath.Join("..", "..", "examples", "kernels")

// --kernel-dir and FUSELM_KERNEL_PATH register a user's kernel set before
// the command reads its sets: bench lists it beside naive and fused, with
// the naive fallback for the ops a set lacks. A directory that cannot be a set
// fails in one line, exit 1.
func TestKernelDir(t *testing.T) {
	t.Cleanup(func() {
		for _, name := range []string{"my_rms", "ptx_swiglu", "broken_entry"} {
			userset.Unload(name)
		}
	})
	t.Setenv(userset.PathEnv, filepath.Join(kernelExamples, "swiglu_ptx"))
	args := []string{"--kernel-dir", filepath.Join(kernelExamples, "rms_norm_cuda"),
		"bench", "--dry-run", "--arch", "sm_90a", "rms_norm", "--shape", "M=4,N=64"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK || !strings.Contains(stdout, "my_rms      default") ||
		!strings.Contains(stdout, "no kernel of its own: runs naive's") {
		t.Errorf("infer %q: exit %d\n%s%s", args, code, stdout, stderr)
	}

	// The dry run, with no GPU, sees a PTX file without its entry point.
	args = []string{"--kernel-dir", filepath.Join(kernelExamples, "broken", "missing_entry"),
		"bench", "--dry-run", "--arch", "sm_90a", "swiglu", "--shape", "N=5,I=300"}
	code, stdout, stderr = runInfer(t, args...)
	if code != exitOK || !strings.Contains(stdout, `broken_entry  default   no     no entry point "swiglu_kernel" (the PTX defines swiglu_entry)`) {
		t.Errorf("infer %q: exit %d\n%s%s", args, code, stdout, stderr)
	}

	t.Setenv(userset.PathEnv, "")
	for dir, want := range map[string]string{
		"broken/wrong_abi": "kernels written for ABI 2; this fuselm calls kernels through ABI 1",
		"no_such_dir":      "has no fuselm.json",
	} {
		args := []string{"--kernel-dir", filepath.Join(kernelExamples, dir), "bench", "--dry-run", "--arch", "sm_90a", "rms_norm"}
		code, _, stderr := runInfer(t, args...)
		if code != exitError {
			t.Errorf("%s: exit %d, want %d", dir, code, exitError)
		}
		oneLine(t, args, stderr, want)
	}
}
