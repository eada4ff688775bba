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
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("%s: cannot remove a trial file from %s: %w", path, filepath.Dir(t.path), unwrapPath(err))
	}
	return nil
}

// Write writes data to path as the package documentation says: atomically
// for a new file or a regular file the run's user alone owns, through
// links, devices and FIFOs otherwise. On failure a replaced file is left as
// it was and no temporary file remains.
func Write(path string, data []byte) error {
	t, err := resolve(path)
	if err != nil {
		return err
	}
	if t.how == inPlace {
		f, err := os.OpenFile(t.path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", path, unwrapPath(err))
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
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
		err = os.Rename(tmp, t.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	return nil
}

// createTemp creates a new file beside path, named after it, with the
// permissions perm less the umask.
func createTemp(path string, perm fs.FileMode) (*os.File, error) {
	dir, base := filepath.Split(path)
	for try := 0; ; try++ {
		name := filepath.Join(dir, fmt.Sprintf(".%s.%08x.tmp", base, rand.Uint32()))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
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
