// Package outfile writes the files a run produces (profiles, traces, JSON
// reports, plots, tuning caches) without ever destroying what was at the
// path.
//
// A new file, or a regular file of the run's own user with no other name,
// is replaced atomically: the data goes to a temporary file in the same
// directory, which is then renamed over it, so that a reader or a failed
// run never sees half a file. A symbolic link is followed and stays: what
// it leads to is written. Anything else is written through, in place: a
// device such as /dev/null, a FIFO, the open file /dev/stdout leads to, a
// regular file of another user or with other hard links (which keeps its
// owner and links). Directories, sockets and links that lead nowhere are
// refused.
//
// A regular file written in place is locked while it is written, so that
// two runs writing it at once leave one whole result. Abandon, called on
// the way out of an interrupted run, removes the temporary files of writes
// under way and waits for an in-place write to finish, so that no
// half-written file remains.
//
// Check says before any work whether Write can succeed, so that a run does
// not compute for an hour and then fail to save its result.
package outfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// how a path is written.
type how int

const (
	replace how = iota // temporary file in the directory, renamed over the path
	inPlace            // opened for writing where it is, truncated if regular
)

// target is what writing a path means: the file to write (the path, or the
// file its symbolic links lead to) and how.
type target struct {
	path string
	how  how
	perm fs.FileMode // the permissions a replaced file keeps; 0 for a new file
}

// resolve decides how path is written, following symbolic links.
func resolve(path string) (target, error) {
	if path == "" {
		return target{}, errors.New("no file name")
	}
	t := target{path: path}
	viaKernel := false // a link only the kernel can follow
	if li, err := os.Lstat(path); err == nil && li.Mode()&fs.ModeSymlink != 0 {
		dest, err := filepath.EvalSymlinks(path)
		switch _, serr := os.Stat(path); {
		case serr == nil && (err != nil || openFileLink(path)):
			viaKernel = true
		case err == nil:
			t.path = dest
		default:
			return t, fmt.Errorf("%s: a symbolic link that leads nowhere (%v)", path, unwrapPath(err))
		}
	}
	fi, err := os.Stat(t.path)
	if err != nil {
		dir := filepath.Dir(t.path)
		if di, derr := os.Stat(dir); derr != nil || !di.IsDir() {
			return t, fmt.Errorf("%s: no directory %s to write it in", path, dir)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return t, nil // a new file
		}
		return t, fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		return t, fmt.Errorf("%s: is a directory", path)
	case m.IsRegular():
		if viaKernel || !ownedAlone(fi) {
			t.how = inPlace
		}
		t.perm = m.Perm()
	case m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe) != 0:
		t.how = inPlace
	default:
		return t, fmt.Errorf("%s: not a regular file, a device or a FIFO (%s)", path, m.Type())
	}
	return t, nil
}

// openFileLink reports whether the links of path pass through the kernel's
// view of an open file, /proc/<pid>/fd/N, where /dev/stdout and /dev/fd/N
// lead. Writing there must go to the open file (a pipe, or a file the shell
// redirected stdout to), never replace the file it names, which the open
// descriptor would no longer reach.
func openFileLink(path string) bool {
	for range 40 { // as many links as Linux follows
		dir, err := filepath.EvalSymlinks(filepath.Dir(path))
		if err != nil {
			return false
		}
		path = filepath.Join(dir, filepath.Base(path))
		if strings.HasPrefix(path, "/proc/") {
			return true
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return false
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(dir, dest)
		}
		path = dest
	}
	return false
}

// Check reports whether Write(path, ...) can succeed now, without changing
// anything: the path resolves to something Write writes, and its directory
// (for a replaced file) or the file itself (written in place) is writable.
func Check(path string) error {
	t, err := resolve(path)
	if err != nil {
		return err
	}
	if t.how == inPlace {
		if err := writable(t.path); err != nil {
			return fmt.Errorf("%s: cannot write it: %w", path, err)
		}
		return nil
	}
	f, err := createTemp(t.path, 0o600)
	if err != nil {
		return fmt.Errorf("%s: cannot create files in %s: %w", path, filepath.Dir(t.path), unwrapPath(err))
	}
	name := f.Name()
	f.Close()
	writes.mu.Lock()
	delete(writes.temps, name)
	err = os.Remove(name)
	writes.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: cannot remove a trial file from %s: %w", path, filepath.Dir(t.path), unwrapPath(err))
	}
	return nil
}

// Write writes data to path as the package documentation says: atomically
// for a new file or a regular file the run's user alone owns, through
// links, devices and FIFOs otherwise, a regular file locked meanwhile. On
// failure a replaced file is left as it was and no temporary file remains.
func Write(path string, data []byte) error {
	t, err := resolve(path)
	if err != nil {
		return err
	}
	if t.how == inPlace {
		if err := writeInPlace(t, data); err != nil {
			return fmt.Errorf("%s: %w", path, unwrapPath(err))
		}
		return nil
	}
	// A new file gets what any new file gets (0666 less the umask); a
	// replaced one keeps its permissions.
	perm := fs.FileMode(0o666)
	if t.perm != 0 {
		perm = 0o600
	}
	f, err := createTemp(t.path, perm)
	if err != nil {
		return fmt.Errorf("%s: cannot create files in %s: %w", path, filepath.Dir(t.path), unwrapPath(err))
	}
	tmp := f.Name()
	if t.perm != 0 {
		err = f.Chmod(t.perm)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = renameTemp(tmp, t.path)
	}
	if err != nil {
		dropTemp(tmp)
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	return nil
}

// writeInPlace writes data over the file t names. A regular file is locked
// against other writers (another run writing the same file) and against
// Abandon for the whole truncate and write; a device or a FIFO, which may
// block for as long as nobody reads, is written without either.
func writeInPlace(t target, data []byte) error {
	f, err := os.OpenFile(t.path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() {
		if !writes.begin() {
			return ErrAbandoned
		}
		defer writes.end()
		if err := lockFile(f); err != nil {
			return err
		}
		if err := f.Truncate(0); err != nil {
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Close()
}

// ErrAbandoned is Write's error after Abandon.
var ErrAbandoned = errors.New("the run is being interrupted")

// writeSet is what Abandon must not cut short: the temporary files of
// writes under way, and the in-place writes of regular files.
type writeSet struct {
	mu        sync.Mutex
	temps     map[string]bool
	inPlace   sync.WaitGroup
	abandoned bool
}

// writes is the process's writeSet.
var writes writeSet

// begin counts an in-place write in, unless the run was abandoned.
func (w *writeSet) begin() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.abandoned {
		return false
	}
	w.inPlace.Add(1)
	return true
}

// end counts an in-place write out.
func (w *writeSet) end() {
	w.inPlace.Done()
}

// Abandon is called once, on the way out of an interrupted run: it removes
// the temporary file of every write under way, waits for in-place writes
// of regular files to finish, and makes later writes fail with
// ErrAbandoned. A file being renamed into place is either whole at its path
// or not there.
func Abandon() {
	writes.mu.Lock()
	writes.abandoned = true
	for name := range writes.temps {
		os.Remove(name)
	}
	writes.temps = nil
	writes.mu.Unlock()
	writes.inPlace.Wait()
}

// renameTemp renames the temporary file tmp to path, unless the run has
// been abandoned (then tmp is gone).
func renameTemp(tmp, path string) error {
	writes.mu.Lock()
	defer writes.mu.Unlock()
	if writes.abandoned {
		return ErrAbandoned
	}
	delete(writes.temps, tmp)
	return os.Rename(tmp, path)
}

// dropTemp removes the temporary file tmp after a failed write.
func dropTemp(tmp string) {
	writes.mu.Lock()
	defer writes.mu.Unlock()
	delete(writes.temps, tmp)
	os.Remove(tmp)
}

// maxNameBytes is the longest file name the common file systems accept
// (NAME_MAX).
const maxNameBytes = 255

// tempName is the name of a temporary file beside path,
// ".NAME.XXXXXXXX.tmp", with NAME (path's own name) cut to the bytes that
// let the whole fit maxNameBytes.
func tempName(path string, rnd uint32) string {
	dir, base := filepath.Split(path)
	const extra = len(".") + len(".00000000.tmp")
	if len(base) > maxNameBytes-extra {
		base = base[:maxNameBytes-extra]
	}
	return filepath.Join(dir, fmt.Sprintf(".%s.%08x.tmp", base, rnd))
}

// createTemp creates a new file beside path, named after it, with the
// permissions perm less the umask, and registers it for Abandon.
func createTemp(path string, perm fs.FileMode) (*os.File, error) {
	writes.mu.Lock()
	defer writes.mu.Unlock()
	if writes.abandoned {
		return nil, ErrAbandoned
	}
	for try := 0; ; try++ {
		f, err := os.OpenFile(tempName(path, rand.Uint32()), os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err == nil {
			if writes.temps == nil {
				writes.temps = map[string]bool{}
			}
			writes.temps[f.Name()] = true
		}
		if !errors.Is(err, fs.ErrExist) || try == 100 {
			return f, err
		}
	}
}

// unwrapPath drops the file name an *fs.PathError adds (the temporary
// file's, or one the message already gives).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// Same reports whether writing path would write the file other names,
// following symbolic links and seeing hard links, so that an output that
// is one of a run's inputs, or another of its outputs, can be refused
// before any work. Devices and FIFOs, which writing does not replace or
// truncate, are never the same file: two outputs may both go to /dev/null.
func Same(path, other string) bool {
	t, err := resolve(path)
	if err != nil {
		return false // Check says why
	}
	fi, err := os.Stat(t.path)
	oi, oerr := os.Stat(other)
	switch {
	case err == nil && oerr == nil:
		return fi.Mode().IsRegular() && os.SameFile(fi, oi)
	case err == nil || oerr == nil:
		return false // one exists, the other not
	}
	// Neither exists yet: the same name in the same directory.
	ot, oerr := resolve(other)
	if oerr != nil {
		return false
	}
	a, b := canonical(t.path), canonical(ot.path)
	return a != "" && a == b
}

// canonical is the absolute name of path with the links of its directory
// followed, or "" when its directory cannot be found.
func canonical(path string) string {
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return ""
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return ""
	}
	return filepath.Join(dir, filepath.Base(path))
}
