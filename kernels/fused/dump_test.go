package fused

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fuselm/fuselm/kernels/cudaset"
)

// TestDumpSources writes every module's full NVRTC source (common.cuh
// first, as cudaset compiles it) under $FUSELM_DUMP_SOURCES, for compile
// checks with an NVRTC or nvcc apart from the set; skipped when unset.
func TestDumpSources(t *testing.T) {
	dir := os.Getenv("FUSELM_DUMP_SOURCES")
	if dir == "" {
		t.Skip("FUSELM_DUMP_SOURCES is unset")
	}
	for _, m := range Modules() {
		if err := os.WriteFile(filepath.Join(dir, "fused_"+m.File), []byte(cudaset.Source(m).Src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
