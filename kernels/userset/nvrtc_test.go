package userset

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels/cuda"
)

// examples is the repository's examples/kernels directory.
var examples = filepath.Join("..", "..", "examples", "kernels")

// compiler is NVRTC at $FUSELM_NVRTC for sm_90a, or the test is skipped.
func compiler(t *testing.T) *cuda.Compiler {
	t.Helper()
	path := os.Getenv("FUSELM_NVRTC")
	if path == "" {
		t.Skip("FUSELM_NVRTC (the path of a libnvrtc.so) is not set: no NVRTC to compile the examples with")
	}
	c, err := cuda.NewCompiler(path, "sm_90a")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// compileKernel compiles k's .cu as a device would (fuselm.cuh among its
// headers, the file's directory on the include path).
func compileKernel(c *cuda.Compiler, k kernel) ([]byte, string, error) {
	src, err := os.ReadFile(k.path)
	if err != nil {
		return nil, "", err
	}
	p, err := program(k, string(src))
	if err != nil {
		return nil, "", err
	}
	return c.Compile(p, compileOptions(k)...)
}

// Every .cu kernel of the examples compiles without a GPU and defines its
// entry point; the broken compile shows NVRTC's message at its file and
// line.
func TestExamplesCompile(t *testing.T) {
	c := compiler(t)
	for _, dir := range []string{"rms_norm_cuda", "rope_simple", "attention_simple", "broken/illegal_address",
		"broken/too_many_threads", "broken/never_ends", "broken/wrong_result"} {
		_, ks, err := ReadManifest(filepath.Join(examples, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			img, log, err := compileKernel(c, k)
			if err != nil {
				t.Errorf("%s: %s: %v\n%s", dir, k.op, err, log)
				continue
			}
			if err := checkImage(kernel{kind: "cubin", spec: k.spec}, img); err != nil {
				t.Errorf("%s: %s: %v", dir, k.op, err)
			}
			missing := k
			missing.kind, missing.spec.Entry = "cubin", "not_there"
			if err := checkImage(missing, img); err == nil || !strings.Contains(err.Error(), `no entry point "not_there"`) {
				t.Errorf("%s: a cubin without the entry: %v", dir, err)
			}
		}
	}
	if _, log, err := c.Compile(cuda.Program{Name: "userset_compose.cu", Src: composeSrc}); err != nil {
		t.Errorf("compose.cu: %v\n%s", err, log)
	}
	_, ks, err := ReadManifest(filepath.Join(examples, "broken", "compile_error"))
	if err != nil {
		t.Fatal(err)
	}
	_, log, err := compileKernel(c, ks[0])
	if err == nil {
		t.Fatal("the broken example compiles")
	}
	got := compileError(ks[0], err).Error()
	t.Logf("raw log:\n%s", log)
	want := ks[0].path + `:9: error: identifier "rstd" is undefined`
	if !strings.Contains(got, want) {
		t.Errorf("compile error:\n%s\nwant a line %q", got, want)
	}
}
