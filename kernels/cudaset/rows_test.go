package cudaset

import (
	"flag"
	"testing"
)

var update = flag.Bool("update", false, "write rows_instances.cuh from the Go tables")

// TestRowsInstancesHeader holds rows_instances.cuh to rowsInstances (with
// -update it writes it), and checks that rows.cu expands every list.
func TestRowsInstancesHeader(t *testing.T) {
	uses := map[string][]Instances{"rows.cu": rowsInstances()}
	for _, bad := range CheckInstances(sources, "rows_instances.cuh", rowsRegen, rowsInstances(), uses, *update) {
		t.Error(bad)
	}
}
