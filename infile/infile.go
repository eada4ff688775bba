// Package infile opens the files a run reads (weights, JSON files, prompts,
// caches), which may be anything a path can name: only regular files are
// read, so that a FIFO, a device or a directory in their place fails at
// once, with one line that names it, instead of blocking forever or
// reading without end.
package infile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Open opens path for reading if it is a regular file (symbolic links to
// one are followed), without blocking on anything else: a FIFO is opened
// without waiting for a writer, seen for what it is and closed. A missing
// file's error satisfies errors.Is(err, fs.ErrNotExist).
func Open(path string) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if target, lerr := os.Readlink(path); lerr == nil && errors.Is(err, fs.ErrNotExist) {
			return nil, &DanglingError{Path: path, Target: target, Err: err}
		}
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	// What the path names may change between the Stat and the open: the
	// open does not wait, and the open file is checked again.
	f, err := os.OpenFile(path, os.O_RDONLY|openNoWait, 0)
	if err != nil {
		return nil, err
	}
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, err
		}
		return nil, notRegular(path, fi.Mode())
	}
	return f, nil
}

// Read reads the regular file at path whole, refusing one of more than
// limit bytes before reading it.
func Read(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, &TooLargeError{Path: path, Size: fi.Size(), Limit: limit}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1)) // it may grow meanwhile
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, &TooLargeError{Path: path, Size: int64(len(b)), Limit: limit}
	}
	return b, nil
}

// TooLargeError is Read's error for a file larger than its limit.
type TooLargeError struct {
	Path        string
	Size, Limit int64 // Size: at least this many bytes
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s: more than %d bytes (%d)", e.Path, e.Limit, e.Size)
}

// DanglingError is Open's error for a symbolic link to nothing (a Hugging
// Face cache's snapshot whose blob is gone, say): ls lists the path, so
// "no such file" would mislead. It satisfies errors.Is(err, fs.ErrNotExist).
type DanglingError struct {
	Path, Target string
	Err          error // os.Stat's
}

func (e *DanglingError) Error() string {
	return fmt.Sprintf("%s: a symbolic link to %s, which leads to no file", e.Path, e.Target)
}

func (e *DanglingError) Unwrap() error { return e.Err }

// notRegular says what path is instead of a regular file.
func notRegular(path string, m fs.FileMode) error {
	what := "not a regular file (" + m.Type().String() + ")"
	switch {
	case m.IsDir():
		what = "a directory"
	case m&fs.ModeNamedPipe != 0:
		what = "a FIFO"
	case m&fs.ModeSocket != 0:
		what = "a socket"
	case m&fs.ModeDevice != 0:
		what = "a device"
	}
	return fmt.Errorf("%s: %s, not a regular file", path, what)
}
