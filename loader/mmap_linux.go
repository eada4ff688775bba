//go:build linux

package loader

import (
	"os"
	"syscall"
)

// stMap maps size bytes of f read-only.
func stMap(f *os.File, size int64) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

// stUnmap undoes stMap.
func stUnmap(b []byte) error { return syscall.Munmap(b) }

// stWillNeed asks the kernel to read b ahead.
func stWillNeed(b []byte) { _ = syscall.Madvise(b, syscall.MADV_WILLNEED) }
