package report

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kbench"
	"github.com/fuselm/fuselm/kernels/profile"
)

// A dry run's last column wraps between words, and inside a word longer
// than a line.
func TestWrap(t *testing.T) {
	if got := wrap("aaaa bb cccccccccc d", 4); strings.Join(got, "|") != "aaaa|bb|cccc|cccc|cc d" {
		t.Errorf("wrap: %q", got)
	}
}

// tracedReport is a report as --cupti gives it (the first row's kernels
// are kbench's TestTraceKernels's): an attention call of kv_append and
// flash_hopper, a row whose top kernel has a long cuBLAS name and whose
// tracer lost records, and an op that appends nothing.
func tracedReport() *kbench.Report {
	return &kbench.Report{Device: "fake", Rows: []kbench.Row{
		{Op: kernels.OpAttnPrefill, Shape: "B=1,H=2,KVH=1,D=16,N=8,causal=1", Set: "fused", Variant: "wgmma", Bound: "compute",
			Ms: 0.104, TFLOPS: 393.8, GBs: 147.7, Checked: "cpu 1.2e-03",
			Kernels: []kbench.KernelTime{
				{Name: "flash_hopper_d16_s2", Source: profile.SourceOwn, Launches: 1, Ms: 0.09, Share: 0.09 / 0.104},
				{Name: "kv_append_v8", Source: profile.SourceOwn, Launches: 1, Ms: 0.01, Share: 0.01 / 0.104}},
			NoAppendMs: 0.09, NoAppendTFLOPS: 455.1, NoAppendGBs: 170.7},
		{Op: kernels.OpAttnPrefill, Shape: "B=1,H=2,KVH=1,D=16,N=8,causal=1", Set: "naive", Variant: "default", Bound: "compute",
			Ms: 0.5, TFLOPS: 81.9, GBs: 30.7, Checked: "cpu 2.0e-03", Note: "CUPTI dropped 3 records: kernel times miss some kernels",
			Kernels: []kbench.KernelTime{
				{Name: "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", Source: profile.SourceCUBLAS, Launches: 2, Ms: 0.3, Share: 0.6}}},
		{Op: kernels.OpLinear, Shape: "M=3,N=16,K=32", Set: "naive", Variant: "default", Bound: "compute", Ms: 0.051, TFLOPS: 1, GBs: 1,
			Checked: "is the reference",
			Kernels: []kbench.KernelTime{{Name: "splitKreduce_kernel", Source: profile.SourceCUBLAS, Launches: 1, Ms: 0.005, Share: 0.098}}},
	}}
}

// The table adds each traced row's longest kernel (the name cut, its ms
// and share) and, for the op whose calls appended to the cache, its metric
// without the append; a lost-records note follows its row's numbers. CSV
// carries the same.
func TestBenchKernelColumns(t *testing.T) {
	var out bytes.Buffer
	if err := WriteBench(&out, tracedReport(), Provenance{}, AsTables); err != nil {
		t.Fatal(err)
	}
	tables := out.String()
	t.Logf("\n%s", tables)
	lines := strings.Split(tables, "\n")
	find := func(parts ...string) string {
		for _, l := range lines {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(l, p)
			}
			if all {
				return l
			}
		}
		t.Errorf("no line holds %q:\n%s", parts, tables)
		return ""
	}
	find("top kernel", "its ms", "TFLOP/s w/o kv_append")
	find("fused", "wgmma", "0.1040", "flash_hopper_d16_s2", "0.0900 (87%)", "455.1")
	naive := find("naive", "0.5000", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_t...", "0.3000 (60%)")
	if !strings.HasSuffix(naive, "-  CUPTI dropped 3 records: kernel times miss some kernels") {
		t.Errorf("the naive row's note is not after its numbers: %q", naive)
	}
	if l := find("linear"); l != "linear" {
		t.Errorf("linear's title: %q", l)
	}
	find("top kernel", "its ms")
	if strings.Count(tables, "w/o kv_append") != 1 {
		t.Errorf("a table without an append has the column:\n%s", tables)
	}

	out.Reset()
	if err := WriteBench(&out, tracedReport(), Provenance{}, AsCSV); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil || len(recs) != 4 {
		t.Fatalf("CSV: %v, %q", err, recs)
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	if r := recs[1]; r[col["top_kernel"]] != "flash_hopper_d16_s2" || r[col["top_kernel_ms"]] != "0.09" ||
		r[col["tflop_s_without_kv_append"]] != "455.1" || recs[3][col["ms_without_kv_append"]] != "" {
		t.Errorf("CSV: %q", recs)
	}
}
