package cuda

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
)

// TestPrecompile: Precompile compiles the programs the cache lacks, several
// at once, into the kernel cache; the ProgramModule calls after it load
// them without compiling, and their kernels run; a program that does not
// compile is left for ProgramModule to report, with NVRTC's log.
func TestPrecompile(t *testing.T) {
	d := openDevice(t)
	stamp := fmt.Sprintf("\n// %d\n", time.Now().UnixNano()) // fresh keys
	var bs []Build
	for i := range 3 {
		bs = append(bs, Build{P: Program{Name: fmt.Sprintf("inc%d.cu", i), Src: incSrc + stamp}, Opts: []string{fmt.Sprintf("-DTHE_%d", i)}})
	}
	bad := Build{P: Program{Name: "bad.cu", Src: "extern \"C\" __global__ void k(int* p) { p[0] = undefined_thing; }" + stamp}}
	d.Precompile(append(bs, bad))
	if st := d.ModuleStats(); st.Compiled != 3 || st.DiskHits != 0 || st.CacheErrors != 0 {
		t.Fatalf("after Precompile: %+v, want 3 compiled", st)
	}
	if files, _ := filepath.Glob(filepath.Join(d.CacheDir(), "*.cubin")); len(files) != 3 {
		t.Errorf("the kernel cache holds %v, want 3 cubins", files)
	}
	d.Precompile(bs) // all prepared: nothing to do
	if st := d.ModuleStats(); st.Compiled != 3 {
		t.Errorf("a second Precompile compiled again: %+v", st)
	}
	buf := d.Alloc(kernels.I32, 1000)
	if err := d.WriteI32(buf, make([]int32, 1000)); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		m, err := d.ProgramModule(b.P, b.Opts...)
		if err != nil {
			t.Fatal(err)
		}
		f, err := m.Func("inc")
		if err != nil {
			t.Fatal(err)
		}
		d.Launch(f, Dim3{X: 4}, Dim3{X: 256}, 0, buf, int32(1000))
	}
	if st := d.ModuleStats(); st.Compiled != 3 || st.DiskHits != 0 || st.MemHits != 0 {
		t.Errorf("ProgramModule after Precompile: %+v, want no compile and no cache read", st)
	}
	v, err := d.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 3 || v[999] != 3 {
		t.Errorf("three increments made %d, %d", v[0], v[999])
	}
	_, err = d.ProgramModule(bad.P)
	var e *Error
	if !errors.As(err, &e) || e.Name != "NVRTC_ERROR_COMPILATION" || !strings.Contains(e.Log, "undefined_thing") {
		t.Errorf("the program Precompile could not compile: %v", err)
	}

	// A second device finds them in the cache.
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	d2.Precompile(bs)
	if _, err := d2.ProgramModule(bs[0].P, bs[0].Opts...); err != nil {
		t.Fatal(err)
	}
	if st := d2.ModuleStats(); st.Compiled != 0 || st.DiskHits != 1 {
		t.Errorf("a new device: %+v, want the cache read", st)
	}
}
