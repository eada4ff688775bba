package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fuselm/fuselm/outfile"
)

// exitOnSignal makes SIGINT and SIGTERM end infer the way the shell
// reports a process the signal killed (128 + its number), after removing
// the temporary files of output writes under way and letting an in-place
// write finish: an interrupted run leaves each output whole or as it was.
func exitOnSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		outfile.Abandon()
		fmt.Fprintf(os.Stderr, "infer: interrupted (%v)\n", sig)
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()
}
