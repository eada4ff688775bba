package userset

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestProgramHeaders holds a .cu file's program to carrying the headers
// beside it by name, so that they are in the kernel cache's key and an
// edited header recompiles; other files, and a fuselm.cuh of the user's,
// stay out.
func TestProgramHeaders(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"k.cu": "#include \"a.cuh\"\n", "a.cuh": "#define A 1\n", "b.h": "#define B 2\n",
		"notes.txt": "x", HeaderName: "// not fuselm's\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k := kernel{op: kernels.OpRMSNorm, path: filepath.Join(dir, "k.cu"), kind: "cu"}
	p, err := program(k, "#include \"a.cuh\"\n")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range p.Headers {
		got[h.Name] = h.Src
	}
	if len(got) != 3 || got["a.cuh"] != "#define A 1\n" || got["b.h"] != "#define B 2\n" || got[HeaderName] != header {
		t.Errorf("headers %v, want fuselm's own fuselm.cuh, a.cuh and b.h", got)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "c.cuh"), 0o644); err == nil {
		if _, err := program(k, ""); err == nil {
			t.Error("a FIFO header was read without an error")
		}
	}
}
