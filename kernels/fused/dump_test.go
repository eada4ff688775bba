package fused

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fuselm/fuselm/kernels/cudaset"
)

// TestDumpSources writes every module's .cu file and the headers NVRTC
// gets with it (the set's and common.cuh) under $FUSELM_DUMP_SOURCES, for
// compile checks with an NVRTC or nvcc apart from the set (nvcc -I. in that
// folder); skipped when unset.
func TestDumpSources(t *testing.T) {
	dir := os.Getenv("FUSELM_DUMP_SOURCES")
	if dir == "" {
		t.Skip("FUSELM_DUMP_SOURCES is unset")
	}
	for _, m := range Modules() {
		p, err := cudaset.Source(m)
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]string{m.File: p.Src}
		for _, h := range p.Headers {
			files[h.Name] = h.Src
		}
		for name, src := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
