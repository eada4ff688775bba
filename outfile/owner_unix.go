//go:build unix

package outfile

import (
	"io/fs"
	"os"
	"syscall"
)

// ownedAlone reports whether a regular file belongs to the run's user and
// has no other name, so that replacing it loses nothing: neither its owner
// nor the content its other hard links see.
func ownedAlone(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return !ok || int(st.Uid) == os.Geteuid() && st.Nlink == 1
}

// writable reports why path cannot be opened for writing, without opening
// it (opening a FIFO would wait for a reader).
func writable(path string) error {
	return syscall.Access(path, 0x2) // W_OK
}

// lockFile takes an exclusive lock on f, waiting for other writers; closing
// f releases it.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}
