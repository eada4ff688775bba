//go:build unix

package outfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// write is Check then Write, as a run uses them.
func write(t *testing.T, path, data string) error {
	t.Helper()
	if err := Check(path); err != nil {
		return err
	}
	return Write(path, []byte(data))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noTemporaries fails when dir holds anything but names.
func noTemporaries(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.Contains(strings.Join(names, "\x00")+"\x00", e.Name()+"\x00") {
			t.Errorf("%s holds %s after the write", dir, e.Name())
		}
	}
}

func TestNewFile(t *testing.T) {
	dir := t.TempDir()
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	p := filepath.Join(dir, "profile.json")
	if err := write(t, p, "new"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p); got != "new" {
		t.Errorf("content %q", got)
	}
	if fi, _ := os.Stat(p); fi.Mode() != 0o644 {
		t.Errorf("a new file has mode %v, want -rw-r--r-- (0666 less the umask)", fi.Mode())
	}
	noTemporaries(t, dir, "profile.json")
}

// A regular file of the run's user is replaced whole, keeping its mode.
func TestReplaceKeepsMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.json")
	if err := os.WriteFile(p, []byte("old content, longer"), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o640)
	before, _ := os.Stat(p)
	if err := write(t, p, "new"); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(p)
	if got := readFile(t, p); got != "new" {
		t.Errorf("content %q", got)
	}
	if after.Mode() != 0o640 {
		t.Errorf("mode %v, want -rw-r-----", after.Mode())
	}
	if os.SameFile(before, after) {
		t.Errorf("the file was rewritten in place, not replaced")
	}
	noTemporaries(t, dir, "out.json")
}

// A symbolic link is written through: the link stays, its target changes.
func TestSymlinkWrittenThrough(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real.json")
	link := filepath.Join(dir, "link.json")
	os.WriteFile(real, []byte("old"), 0o644)
	if err := os.Symlink("real.json", link); err != nil {
		t.Fatal(err)
	}
	if err := write(t, link, "new"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi.Mode(), err)
	}
	if got := readFile(t, real); got != "new" {
		t.Errorf("target content %q", got)
	}
	noTemporaries(t, dir, "real.json", "link.json")

	dangling := filepath.Join(dir, "dangling.json")
	os.Symlink("nowhere/x.json", dangling)
	for _, f := range []func(string) error{Check, func(p string) error { return Write(p, []byte("x")) }} {
		if err := f(dangling); err == nil || !strings.Contains(err.Error(), "leads nowhere") {
			t.Errorf("dangling link: err = %v", err)
		}
	}
	if fi, err := os.Lstat(dangling); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the dangling link was replaced")
	}
}

// A FIFO is written through, never replaced by a file.
func TestFIFOWrittenThrough(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	got := make(chan string)
	go func() {
		f, err := os.Open(p)
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(f)
		f.Close()
		got <- string(b)
	}()
	if err := write(t, p, "through the pipe"); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "through the pipe" {
		t.Errorf("reader got %q", s)
	}
	if fi, err := os.Lstat(p); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v %v", fi.Mode(), err)
	}
	noTemporaries(t, dir, "fifo")
}

// A device is written through: /dev/null stays a device.
func TestDeviceWrittenThrough(t *testing.T) {
	before, err := os.Lstat(os.DevNull)
	if err != nil || before.Mode()&fs.ModeCharDevice == 0 {
		t.Skip("no character device at", os.DevNull)
	}
	tgt, err := resolve(os.DevNull)
	if err != nil || tgt.how != inPlace {
		// Never try Write here: replacing /dev/null (as root) breaks the machine.
		t.Fatalf("%s would be replaced (%v)", os.DevNull, err)
	}
	if err := write(t, os.DevNull, "nothing"); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Lstat(os.DevNull); err != nil || !os.SameFile(before, after) {
		t.Errorf("%s changed", os.DevNull)
	}
}

// /proc/self/fd/N, where /dev/stdout leads, is the open file: written
// through it, not replaced by a new file the descriptor no longer reaches.
func TestOpenFileLinkWrittenThrough(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	link := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if _, err := os.Lstat(link); err != nil {
		t.Skip("no /proc/self/fd here")
	}
	before, _ := f.Stat()
	if err := write(t, link, "to the open file"); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(f.Name())
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the file behind the descriptor was replaced")
	}
	if got := readFile(t, f.Name()); got != "to the open file" {
		t.Errorf("content %q", got)
	}
}

// A file with another name elsewhere is overwritten in place, so that both
// names still share it.
func TestHardLinkWrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	os.WriteFile(a, []byte("old content"), 0o644)
	if err := os.Link(a, b); err != nil {
		t.Skip("no hard links here:", err)
	}
	if err := write(t, a, "new"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, b); got != "new" {
		t.Errorf("the other name reads %q", got)
	}
	noTemporaries(t, dir, "a.json", "b.json")
}

// A file of another user is overwritten in place, keeping its owner.
func TestOtherUsersFileWrittenInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a file of another user needs root")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "theirs.json")
	os.WriteFile(p, []byte("old content"), 0o666)
	if err := os.Chown(p, 12345, 12345); err != nil {
		t.Skip(err)
	}
	if err := write(t, p, "new"); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 12345 {
		t.Errorf("owner %d, want 12345", st.Uid)
	}
	if got := readFile(t, p); got != "new" {
		t.Errorf("content %q", got)
	}
}

// What cannot be written is refused by Check, before any work, and by
// Write, which then leaves everything as it was.
func TestRefused(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	os.WriteFile(filepath.Join(sub, "keep"), []byte("x"), 0o644)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	for _, c := range []struct{ path, want string }{
		{sub, "is a directory"},
		{sub + "/", "is a directory"},
		{filepath.Join(dir, "missing", "out.json"), "no directory"},
		{filepath.Join(file, "out.json"), "no directory"},
		{"", "no file name"},
	} {
		if err := Check(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%q) = %v, want %q", c.path, err, c.want)
		}
		if err := Write(c.path, []byte("data")); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Write(%q) = %v, want %q", c.path, err, c.want)
		}
	}
	if fi, err := os.Stat(sub); err != nil || !fi.IsDir() {
		t.Errorf("the directory was replaced")
	}
	noTemporaries(t, dir, "sub", "file")
	noTemporaries(t, sub, "keep")
}

func TestUnwritableDirectory(t *testing.T) {
	// /proc takes no new files, even from root.
	if fi, err := os.Stat("/proc/self"); err == nil && fi.IsDir() {
		if err := Check("/proc/fuselm-out.json"); err == nil || !strings.Contains(err.Error(), "cannot create files in /proc") {
			t.Errorf("Check(/proc/...) = %v", err)
		}
	}
	if os.Geteuid() == 0 {
		t.Skip("root writes in any directory")
	}
	dir := t.TempDir()
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o555)
	defer os.Chmod(ro, 0o755)
	p := filepath.Join(ro, "out.json")
	if err := Check(p); err == nil || !strings.Contains(err.Error(), "cannot create files in") {
		t.Errorf("Check = %v", err)
	}
	noTemporaries(t, ro)
}
