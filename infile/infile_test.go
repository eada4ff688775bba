package infile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// within fails t when f does not return in a second: what Open refuses it
// must refuse without blocking.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatalf("%s: still blocked after a second", what)
	}
}

// Only regular files are read: a FIFO (with no writer: opening it for
// reading would block), a device, a directory or a socket fails at once,
// saying what it is; a symbolic link to a regular file is followed.
func TestOpenOnlyRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	os.WriteFile(filepath.Join(dir, "real"), []byte("data"), 0o644)
	os.Symlink("real", filepath.Join(dir, "link"))
	os.Symlink("fifo", filepath.Join(dir, "fifolink"))
	for _, c := range []struct{ path, want string }{
		{fifo, "fifo: a FIFO, not a regular file"},
		{filepath.Join(dir, "fifolink"), "fifolink: a FIFO, not a regular file"},
		{"/dev/zero", "/dev/zero: a device, not a regular file"},
		{dir, "a directory, not a regular file"},
	} {
		within(t, c.path, func() {
			f, err := Open(c.path)
			if err == nil {
				f.Close()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open(%s): %v, want %q", c.path, err, c.want)
			}
			if _, err := Read(c.path, 1<<20); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Read(%s): %v, want %q", c.path, err, c.want)
			}
		})
	}
	if b, err := Read(filepath.Join(dir, "link"), 4); err != nil || string(b) != "data" {
		t.Errorf("Read through a symlink: %q, %v", b, err)
	}
	var tl *TooLargeError
	if _, err := Read(filepath.Join(dir, "real"), 3); !errors.As(err, &tl) || tl.Size != 4 {
		t.Errorf("Read of 4 bytes with limit 3: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), 3); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing file: %v", err)
	}
	// A link to nothing says so: ls lists it, "no such file" would mislead.
	os.Symlink("gone", filepath.Join(dir, "dangling"))
	os.Symlink("dangling", filepath.Join(dir, "chain"))
	for _, c := range []struct{ name, target string }{{"dangling", "gone"}, {"chain", "dangling"}} {
		path := filepath.Join(dir, c.name)
		want := path + ": a symbolic link to " + c.target + ", which leads to no file"
		if _, err := Read(path, 3); !errors.Is(err, fs.ErrNotExist) || err.Error() != want {
			t.Errorf("Read of a link to nothing: %v, want %q", err, want)
		}
	}
}
