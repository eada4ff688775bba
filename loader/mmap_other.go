//go:build !linux

package loader

import (
	"io"
	"os"
)

// stMap reads size bytes of f (no mmap off Linux).
func stMap(f *os.File, size int64) ([]byte, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}

func stUnmap(b []byte) error { return nil }

func stWillNeed(b []byte) {}
