package main

import (
	"fmt"
	"path/filepath"

	"github.com/fuselm/fuselm/loader"
	"github.com/fuselm/fuselm/outfile"
)

// namedPath is a file of the command line and the flag that names it.
type namedPath struct{ flag, path string }

// checkOutputs makes sure, before any work, that every output of outs
// (those given) can be written, and, as usage errors, that none is one of
// the run's inputs (the checkpoint's files of model, which may be "", and
// the files of inputs; after symbolic links) or the file of another output
// or of stdout.
func checkOutputs(outs []namedPath, model string, inputs ...namedPath) error {
	var given []namedPath
	for _, o := range outs {
		if o.path == "" {
			continue
		}
		if err := outfile.Check(o.path); err != nil {
			return fmt.Errorf("%s %w", o.flag, err)
		}
		given = append(given, o)
	}
	if len(given) == 0 {
		return nil
	}
	ins := append([]namedPath(nil), inputs...)
	if dir, err := loader.Resolve(model); model != "" && err == nil { // else loading says why
		for _, file := range loader.CheckpointFiles(dir) {
			ins = append(ins, namedPath{"the checkpoint's " + filepath.Base(file), file})
		}
	}
	for i, o := range given {
		for _, in := range ins {
			if outfile.Same(o.path, in.path) {
				return usageError{fmt.Errorf("%s %s: is %s, an input of this run", o.flag, o.path, in.flag)}
			}
		}
		for _, other := range given[:i] {
			if outfile.Same(o.path, other.path) {
				return usageError{fmt.Errorf("%s %s: is also the file of %s", o.flag, o.path, other.flag)}
			}
		}
		// stdout redirected to the same file: the output would replace
		// the file stdout then writes to, unlinked.
		if outfile.Same(o.path, "/dev/stdout") {
			return usageError{fmt.Errorf("%s %s: is also the file stdout goes to", o.flag, o.path)}
		}
	}
	return nil
}
