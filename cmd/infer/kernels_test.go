package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pruneCache removes the cache files kept does not name, and nothing that
// is not a cache file.
func TestPruneCache(t *testing.T) {
	dir := t.TempDir()
	key := func(c byte) string { return strings.Repeat(string(c), 64) }
	files := []string{key('a') + ".cubin", key('b') + ".cubin", key('c') + ".ptx", "notes.txt", key('d') + ".cubin.tmp"}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := pruneCache(dir, map[string]bool{key('a') + ".cubin": true})
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	for i, f := range files {
		_, err := os.Stat(filepath.Join(dir, f))
		if gone := os.IsNotExist(err); gone != (i == 1 || i == 2) {
			t.Errorf("%s: removed %v", f, gone)
		}
	}
}

// With NVRTC ($FUSELM_NVRTC), an --arch that no device compiles for with
// it, or that a device would name otherwise, is the command line's fault.
func TestKernelsArch(t *testing.T) {
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to check infer kernels' --arch against it")
	}
	for _, c := range []struct{ arch, want string }{
		{"sm_90", "give --arch sm_90a"},
		{"sm_00", "does not compile for it"},
	} {
		code, _, stderr := runInfer(t, "kernels", "--nvrtc", lib, "--arch", c.arch, "--cache", t.TempDir())
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("--arch %s: exit %d, %q; want %d and %q", c.arch, code, stderr, exitUsage, c.want)
		}
	}
}
