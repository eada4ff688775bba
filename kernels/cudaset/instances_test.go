package cudaset

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/fuselm/fuselm/kernels/cuda"
)

// TestSourceMadeHeaders checks that a module compiles the headers made on
// the Go side in place of the checked-in files of their names (a stale
// instance header must not reach NVRTC), keeps the other headers as they
// are, and refuses a made header that replaces no file.
func TestSourceMadeHeaders(t *testing.T) {
	srcs := fstest.MapFS{
		"k.cu":        {Data: []byte(`#include "inst.cuh"`)},
		"inst.cuh":    {Data: []byte("#define K_INSTANCES(X) X(k_old, 1)\n")},
		"other.cuh":   {Data: []byte("// other\n")},
		"another.cuh": {Data: []byte("// another\n")},
	}
	fams := []Instances{{Macro: "K", Kernels: []Instance{Of("k_new", 2)}}}
	m := InstancesModule("k.cu", srcs, "inst.cuh", "regen", fams, []string{"k_new"})
	p, err := Source(m)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range p.Headers {
		got[h.Name] = h.Src
	}
	if got["inst.cuh"] != InstancesHeader("regen", fams) || !strings.Contains(got["inst.cuh"], "X(k_new, 2)") {
		t.Errorf("inst.cuh compiled as\n%s\nwant the header made from the tables", got["inst.cuh"])
	}
	if got["other.cuh"] != "// other\n" || got["another.cuh"] != "// another\n" {
		t.Errorf("the set's other headers changed: %q", got)
	}
	if _, ok := got["common.cuh"]; !ok {
		t.Errorf("cudaset's common.cuh missing: %q", got)
	}
	m.Headers = append(m.Headers, cuda.Header{Name: "typo.cuh", Src: ""})
	if _, err := Source(m); err == nil || !strings.Contains(err.Error(), "typo.cuh") {
		t.Errorf("a made header of no file's name: %v", err)
	}
	rows, err := Source(RowsModule())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range rows.Headers {
		if h.Name == "rows_instances.cuh" && h.Src != InstancesHeader(rowsRegen, rowsInstances()) {
			t.Errorf("rows.cu compiles a rows_instances.cuh other than the tables'")
		}
	}
}
