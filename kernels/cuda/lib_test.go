package cuda

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// fakeFS is a finder over a made-up file system that records what it opens.
type fakeFS struct {
	env    map[string]string
	files  map[string]bool // paths that exist
	globs  map[string][]string
	opens  []string        // every open, in order
	loader map[string]bool // sonames the system loader resolves
	broken map[string]bool // existing files whose dlopen fails
}

func (fs *fakeFS) finder() finder {
	return finder{
		getenv: func(k string) string { return fs.env[k] },
		glob:   func(p string) ([]string, error) { return fs.globs[p], nil },
		isFile: func(p string) bool { return fs.files[p] },
		open: func(p string) (uintptr, error) {
			fs.opens = append(fs.opens, p)
			if strings.HasPrefix(p, "/") {
				if fs.files[p] && !fs.broken[p] {
					return 1, nil
				}
				return 0, errors.New("bad ELF")
			}
			if fs.loader[p] {
				return 2, nil
			}
			return 0, errors.New(p + ": cannot open shared object file")
		},
		home:   "/home/u",
		goarch: "amd64",
	}
}

func TestCudaDirsOrder(t *testing.T) {
	fs := &fakeFS{env: map[string]string{"LD_LIBRARY_PATH": "/a::/b/", "CUDA_HOME": "/opt/cuda", "CUDA_PATH": "/opt/cuda"}}
	got := fs.finder().cudaDirs()
	want := []string{"/a", "/b", "/opt/cuda/lib64", "/opt/cuda/targets/x86_64-linux/lib",
		"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cudaDirs = %q, want %q", got, want)
	}
}

func TestWheelDirs(t *testing.T) {
	fs := &fakeFS{
		env: map[string]string{"VIRTUAL_ENV": "/venv"},
		globs: map[string][]string{
			"/venv/lib/python3*/site-packages":          {"/venv/lib/python3.12/site-packages"},
			"/opt/*/.venv/lib/python3*/site-packages":   {"/opt/torch/.venv/lib/python3.10/site-packages", "/opt/torch/.venv/lib/python3.12/site-packages"},
			"/home/u/.local/lib/python3*/site-packages": {"/venv/lib/python3.12/site-packages"}, // a duplicate
		},
	}
	got := fs.finder().wheelDirs()
	var want []string
	for _, sp := range []string{"/venv/lib/python3.12/site-packages", "/opt/torch/.venv/lib/python3.12/site-packages", "/opt/torch/.venv/lib/python3.10/site-packages"} {
		for _, w := range wheelLibDirs {
			want = append(want, filepath.Join(sp, w))
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wheelDirs =\n%q\nwant\n%q", got, want)
	}
}

func TestFindOrder(t *testing.T) {
	wheel := "/opt/torch/.venv/lib/python3.12/site-packages"
	fs := &fakeFS{
		env: map[string]string{"LD_LIBRARY_PATH": "/a"},
		globs: map[string][]string{
			"/opt/*/.venv/lib/python3*/site-packages": {wheel},
		},
		files: map[string]bool{
			wheel + "/nvidia/cu13/lib/libnvrtc.so.13": true,
			"/usr/local/cuda/lib64/libnvrtc.so.12":    true,
		},
	}
	var preloaded []string
	lib, err := fs.finder().find("libnvrtc", []string{"libnvrtc.so.13", "libnvrtc.so.12"}, func(dir, so string) {
		preloaded = append(preloaded, dir+"|"+so)
	})
	if err != nil {
		t.Fatal(err)
	}
	// .so.13 first everywhere (the system loader before the wheels), then .so.12.
	if lib.path != wheel+"/nvidia/cu13/lib/libnvrtc.so.13" {
		t.Errorf("found %s", lib.path)
	}
	wantOpens := []string{"libnvrtc.so.13", wheel + "/nvidia/cu13/lib/libnvrtc.so.13"}
	if !reflect.DeepEqual(fs.opens, wantOpens) {
		t.Errorf("opened %q, want %q", fs.opens, wantOpens)
	}
	if want := []string{wheel + "/nvidia/cu13/lib|libnvrtc.so.13"}; !reflect.DeepEqual(preloaded, want) {
		t.Errorf("preloaded %q, want %q", preloaded, want)
	}

	// The system loader wins over the wheels, the CUDA dirs over the loader.
	fs.opens = nil
	fs.loader = map[string]bool{"libnvrtc.so.13": true}
	if lib, _ := fs.finder().find("libnvrtc", []string{"libnvrtc.so.13"}, nil); lib.path != "libnvrtc.so.13" {
		t.Errorf("found %s, want the system loader's", lib.path)
	}
	fs.files["/a/libnvrtc.so.13"] = true
	if lib, _ := fs.finder().find("libnvrtc", []string{"libnvrtc.so.13"}, nil); lib.path != "/a/libnvrtc.so.13" {
		t.Errorf("found %s, want LD_LIBRARY_PATH's", lib.path)
	}
}

func TestFindError(t *testing.T) {
	fs := &fakeFS{
		env:    map[string]string{"CUDA_HOME": "/c"},
		files:  map[string]bool{"/c/lib64/libcublas.so.13": true},
		broken: map[string]bool{"/c/lib64/libcublas.so.13": true},
	}
	_, err := fs.finder().find("libcublas", []string{"libcublas.so.13", "libcublas.so.12"}, nil)
	if err == nil {
		t.Fatal("found a library that is not there")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cuda: cuBLAS not found: libcublas.so.13 or libcublas.so.12 is in none of 5 places searched (/c/lib64,") {
		t.Errorf("the error does not start with what is missing:\n%s", msg)
	}
	for _, want := range []string{"and 2 more", "/c/lib64/libcublas.so.13 does not load (bad ELF)", "CUDA_HOME"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "cannot open shared object file") {
		t.Errorf("the system loader's plain not-found is noise:\n%s", msg)
	}
}

// On a machine with no GPU and many library and Python directories, the
// error stays short and names the problem first.
func TestFindErrorShort(t *testing.T) {
	var ld []string
	for i := range 20 {
		ld = append(ld, fmt.Sprintf("/very/long/library/directory/number/%d/lib64", i))
	}
	fs := &fakeFS{
		env: map[string]string{"LD_LIBRARY_PATH": strings.Join(ld, ":"), "VIRTUAL_ENV": "/venv"},
		globs: map[string][]string{
			"/venv/lib/python3*/site-packages":      {"/venv/lib/python3.12/site-packages"},
			"/usr/lib/python3*/dist-packages":       {"/usr/lib/python3.11/dist-packages", "/usr/lib/python3.12/dist-packages"},
			"/usr/local/lib/python3*/site-packages": {"/usr/local/lib/python3.12/site-packages"},
		},
	}
	_, err := fs.finder().find("libcuda", []string{"libcuda.so.1"}, nil)
	if err == nil {
		t.Fatal("found a driver that is not there")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cuda: no CUDA driver found: libcuda.so.1 is in none of 39 places searched") {
		t.Errorf("the error does not start with what is missing:\n%s", msg)
	}
	if len(msg) > 300 {
		t.Errorf("the error is %d characters long:\n%s", len(msg), msg)
	}
}

func TestMajorsFor(t *testing.T) {
	if got := majorsFor(13000); !reflect.DeepEqual(got, []int{13, 12}) {
		t.Errorf("majorsFor(13000) = %v", got)
	}
	if got := majorsFor(12080); !reflect.DeepEqual(got, []int{12, 13}) {
		t.Errorf("majorsFor(12080) = %v", got)
	}
}

func TestCString(t *testing.T) {
	b := cStr("hello")
	if got := cString(uintptr(ptrOfBytes(b))); got != "hello" {
		t.Errorf("cString = %q", got)
	}
	runtime.KeepAlive(b)
	if cString(0) != "" {
		t.Error("cString(0) not empty")
	}
}
