package kerneltest

import (
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// The table has one row per op, in the op table's order, so that an op
// added to kernels.AllOps without its row fails here by name.
func TestTable(t *testing.T) {
	if len(table) != len(kernels.AllOps) {
		t.Errorf("table has %d rows, the op table %d ops", len(table), len(kernels.AllOps))
	}
	for i, o := range kernels.AllOps {
		if i >= len(table) || table[i].op != o {
			t.Fatalf("row %d of the table is not op %s (rows follow kernels.AllOps)", i, o)
		}
		if table[i].checks == nil {
			t.Errorf("%s: no checks", o)
		}
		if b := table[i].bench; b != nil && (b.Op != o || b.Build == nil || b.FLOPs == nil || b.Bytes == nil || len(b.Dims) == 0) {
			t.Errorf("%s: its benchmark lacks its op, Build, FLOPs, Bytes or Dims", o)
		}
	}
}
