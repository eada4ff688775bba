//go:build !unix

package infile

// openNoWait: no such flag here; Open's Stat refuses what is not a regular
// file.
const openNoWait = 0
