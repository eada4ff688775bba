package cudaset_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/naive"
)

// TestNVRTCCompile compiles every module of every CUDA set, and the shared
// row movers, with the NVRTC library at $FUSELM_NVRTC for
// $FUSELM_NVRTC_ARCH (sm_90a when unset), without a GPU: each module must
// compile and define every kernel its Funcs name. It logs ptxas's report of
// each kernel (registers, stack, spills) and the compile times; with
// $FUSELM_NVRTC_OUT set it writes there each module's cubin and the whole
// report (report.txt), for comparing two builds of the sources. The CUDA
// headers are looked for as a device would (CUDA_HOME among the places).
// Skipped when FUSELM_NVRTC is unset.
func TestNVRTCCompile(t *testing.T) {
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile every module without a GPU")
	}
	arch := os.Getenv("FUSELM_NVRTC_ARCH")
	if arch == "" {
		arch = "sm_90a"
	}
	c, err := cuda.NewCompiler(lib, arch)
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("FUSELM_NVRTC_OUT")
	t.Logf("NVRTC %d.%d, options %q", c.Version()/1000, c.Version()%1000/10, c.Options())
	sets := []struct {
		name string
		mods []cudaset.Module
	}{
		{"cudaset", []cudaset.Module{cudaset.RowsModule()}},
		{"naive", naive.Modules()},
		{"fused", fused.Modules()},
	}
	var report strings.Builder
	var total time.Duration
	for _, s := range sets {
		for _, m := range s.mods {
			p, err := cudaset.Source(m)
			if err != nil {
				t.Fatal(err)
			}
			p.Name = s.name + "_" + m.File
			start := time.Now()
			img, log, err := c.Compile(p, append(slices.Clone(m.Opts), "--ptxas-options=-v")...)
			took := time.Since(start)
			total += took
			if err != nil {
				t.Errorf("%s: %v\n%s", p.Name, err, log)
				continue
			}
			kernels := ptxasReport(log)
			for _, f := range m.Funcs {
				if _, ok := kernels[f]; !ok {
					t.Errorf("%s: no kernel %s among the %d compiled", p.Name, f, len(kernels))
				}
			}
			fmt.Fprintf(&report, "== %s: %d kernels, %d of them in Funcs\n", p.Name, len(kernels), len(m.Funcs))
			for _, k := range slices.Sorted(func(yield func(string) bool) {
				for k := range kernels {
					if !yield(k) {
						return
					}
				}
			}) {
				fmt.Fprintf(&report, "%s: %s\n", k, kernels[k])
			}
			t.Logf("%s: %d kernels, %.2f s", p.Name, len(kernels), took.Seconds())
			if out != "" {
				if err := os.WriteFile(filepath.Join(out, p.Name+".cubin"), img, 0o644); err != nil {
					t.Error(err)
				}
			}
		}
	}
	t.Logf("compile time in all: %.2f s\n%s", total.Seconds(), report.String())
	if out != "" {
		if err := os.WriteFile(filepath.Join(out, "report.txt"), []byte(report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

var (
	ptxasEntry = regexp.MustCompile(`^ptxas info\s*: Compiling entry function '([^']+)'`)
	ptxasInfo  = regexp.MustCompile(`^ptxas\s+(?:info\s*:|\.)\s*(Used .*|\d+ bytes stack frame.*)$`)
)

// ptxasReport is ptxas's -v report per entry function: its "Used ...
// registers" and "stack frame, spill" lines, joined.
func ptxasReport(log string) map[string]string {
	r := map[string]string{}
	cur := ""
	for _, line := range strings.Split(log, "\n") {
		if m := ptxasEntry.FindStringSubmatch(line); m != nil {
			cur = m[1]
			r[cur] = ""
			continue
		}
		if strings.Contains(line, "Function properties for") && !strings.HasSuffix(strings.TrimSpace(line), cur) {
			cur = "" // a device function's properties
			continue
		}
		if m := ptxasInfo.FindStringSubmatch(line); m != nil && cur != "" {
			r[cur] = strings.TrimSpace(r[cur] + "; " + m[1])
			r[cur] = strings.TrimPrefix(r[cur], "; ")
		}
	}
	return r
}

// TestPrebuild fills a kernel cache with the NVRTC library at $FUSELM_NVRTC
// as infer kernels does: the shared row movers once under their own name
// (both sets' kits load that one module), each module a cubin file, and a
// second pass compiles nothing. Skipped when FUSELM_NVRTC is unset.
func TestPrebuild(t *testing.T) {
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile without a GPU")
	}
	c, err := cuda.NewCompiler(lib, "sm_90a")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var names []string
	for _, pass := range []struct{ compiled, cached int }{{1, 0}, {0, 1}} {
		names = names[:0]
		n, m, err := cudaset.Prebuild(c, dir, "naive", nil, func(name, path string) {
			names = append(names, name)
			if filepath.Dir(path) != dir || !cuda.IsCacheFile(filepath.Base(path)) {
				t.Errorf("%s cached as %s", name, path)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if n != pass.compiled || m != pass.cached || !slices.Equal(names, []string{"cudaset_rows.cu"}) {
			t.Errorf("compiled %d, cached %d, modules %v; want %d, %d, [cudaset_rows.cu]", n, m, names, pass.compiled, pass.cached)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.cubin"))
	if len(files) != 1 {
		t.Errorf("cache holds %v, want one cubin", files)
	}
}
