//go:build unix

package infile

import "syscall"

// openNoWait makes opening a FIFO return at once instead of waiting for a
// writer; reads of a regular file do not heed it.
const openNoWait = syscall.O_NONBLOCK
