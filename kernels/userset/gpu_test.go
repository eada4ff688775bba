package userset

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// buildSet loads dir and builds its set on a CUDA device as every command
// does (the gate included), returning the set's name and the error.
func buildSet(t *testing.T, dev kernels.Device, dir string) (string, error) {
	t.Helper()
	name, err := Load(filepath.Join(examples, dir))
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { Unload(name) })
	_, err = kernels.Spec{Base: name}.Build(dev, nil)
	return name, err
}

// On a GPU: every example passes the kerneltest cases of its ops (and the
// decode graph, for attn_decode) and is built; each broken example that
// leaves the device usable is refused with its one error.
func TestExamplesOnGPU(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	for _, dir := range []string{"rms_norm_cuda", "swiglu_ptx", "rope_simple", "attention_simple"} {
		_, ks, err := ReadManifest(filepath.Join(examples, dir))
		if err != nil {
			t.Fatal(err)
		}
		o, err := newOps(dev, dir, ks)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		rep := kerneltest.Check(dev, o, o.owns, kerneltest.DefaultTolerances())
		t.Logf("%s: %d cases, %d declined, %d failed", dir, rep.Cases, rep.Skipped, len(rep.Failures))
		for _, f := range rep.Failures {
			t.Errorf("%s: %s", dir, f)
		}
		if rep.Cases == 0 {
			t.Errorf("%s: no case ran", dir)
		}
		if _, err := buildSet(t, dev, dir); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
	for dir, want := range map[string]string{
		"broken/compile_error":    `compile_error/rms_norm.cu:9: error: identifier "rstd" is undefined`,
		"broken/missing_entry":    `no entry point "swiglu_kernel" (the PTX defines swiglu_entry)`,
		"broken/wrong_signature":  "entry swiglu_ptx takes 5 parameters; ABI 1's swiglu kernel takes 6",
		"broken/too_many_threads": "a block of 1024 threads exceeds what the kernel can run, 64",
		"broken/wrong_result":     "fails its check and is not timed: rms_norm (",
	} {
		name, err := buildSet(t, dev, dir)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v\nwant %q", dir, err, want)
			continue
		}
		if dir != "broken/compile_error" && strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: more than one line: %v", dir, err)
		}
		if !strings.HasPrefix(err.Error(), "kernel set "+name+": ") {
			t.Errorf("%s: %v does not name the set", dir, err)
		}
		t.Logf("%s: %v", dir, err)
	}
	if err := dev.Err(); err != nil {
		t.Errorf("the device is left with an error: %v", err)
	}
}

// childEnv runs the test's own binary in a child process to build the set
// of one example (FUSELM_USERSET_CHILD): a kernel that faults or never ends
// takes its process's CUDA context with it.
const childEnv = "FUSELM_USERSET_CHILD"

func TestChildBuild(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("run by TestDestructiveExamplesOnGPU in a process of its own")
	}
	dev := kerneltest.OpenCUDA(t)
	_, err := buildSet(t, dev, dir)
	fmt.Printf("BUILD: %v\n", err)
}

// On a GPU, each in a process of its own: an illegal address is one line
// naming the op and its file, and a kernel that never ends is stopped by
// the watchdog within its bound instead of being waited on.
func TestDestructiveExamplesOnGPU(t *testing.T) {
	kerneltest.OpenCUDA(t) // skips without a GPU
	for dir, want := range map[string]string{
		"broken/illegal_address": "rms_norm (" + filepath.Join(examples, "broken/illegal_address/rms_norm.cu") + ", entry rms_norm_far)",
		"broken/never_ends":      "did not finish within 3s",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestChildBuild$", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+dir, WatchdogEnv+"=3s")
		start := time.Now()
		out, _ := cmd.CombinedOutput()
		took := time.Since(start)
		line := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "BUILD: ") {
				line = l
			}
		}
		t.Logf("%s (%v): %s", dir, took.Round(time.Millisecond), line)
		if !strings.Contains(line, want) || !strings.Contains(line, "fails its check and is not timed") {
			t.Errorf("%s: %q, want %q\n%s", dir, line, want, out)
		}
		if ctx.Err() != nil {
			t.Errorf("%s: the child did not exit within 2 minutes (killed)", dir)
		}
	}
}
