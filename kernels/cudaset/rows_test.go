package cudaset

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write rows_instances.cuh from the Go tables")

// TestRowsInstancesHeader holds rows_instances.cuh to rowsInstances (with
// -update it writes it), and checks that rows.cu expands every list.
func TestRowsInstancesHeader(t *testing.T) {
	want := InstancesHeader(rowsRegen, rowsInstances())
	if *update {
		if err := os.WriteFile("rows_instances.cuh", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if got, err := sources.ReadFile("rows_instances.cuh"); err != nil || string(got) != want {
		t.Errorf("rows_instances.cuh is not what rowsInstances makes (%v): run %s", err, rowsRegen)
	}
	src, err := sources.ReadFile("rows.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rowsInstances() {
		if use := "\n" + f.Macro + "_INSTANCES(" + f.Macro + ")\n"; !strings.Contains(string(src), use) {
			t.Errorf("rows.cu has no line %q", strings.TrimSpace(use))
		}
	}
}
