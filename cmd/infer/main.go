// Command infer runs Qwen2 and DeepSeek-V2 checkpoints with a chosen kernel
// set and reports tokens/s and the time of every op.
//
//	infer --model Qwen/Qwen2-7B --batch 16 --kernels fused
//	infer --model Qwen/Qwen2-7B --batch 16 --kernels naive
//	infer tokenize --model DIR --text "hello"
//	infer inspect --model DIR
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// usageError marks errors in the command line itself.
type usageError struct{ error }

func main() {
	root := newRootCmd()
	root.AddCommand(newTokenizeCmd(), newInspectCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "infer: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// silence makes cobra leave error printing to main, so that every failure is
// one line on stderr.
func silence(c *cobra.Command) *cobra.Command {
	c.SilenceErrors = true
	c.SilenceUsage = true
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return c
}
