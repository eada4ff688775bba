// Command infer runs Qwen2 and DeepSeek-V2 checkpoints with a chosen kernel
// set and reports tokens/s and the time of every op.
//
//	infer --model Qwen/Qwen2-7B --batch 16 --kernels naive
//	infer --model testdata/models/qwen2-tiny --prompt-file testdata/prompts/short.txt
//	infer tokenize --model DIR --text "hello"
//	infer inspect --model DIR
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/userset"
)

// The exit statuses of every command.
const (
	exitOK    = 0
	exitError = 1 // the work failed: a file, the model, the device
	exitUsage = 2 // the command line is wrong
)

// exitRule is how --help and the README state the exit statuses.
const exitRule = `Exit status: 0 on success; 2 when the command line is wrong (an unknown
command or flag, a stray argument, a flag value out of its range); 1 for
every other failure (a file that cannot be read or written, a checkpoint
that cannot run, a device error, numbers that stop being finite).`

// usageError marks errors in the command line itself.
type usageError struct{ error }

func main() {
	exitOnSignal()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit status. Every failure
// is said on stderr, prefixed with "infer: ".
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.AddCommand(newTokenizeCmd(), newInspectCmd(), newBenchCmd(), newCompareCmd(), newKernelsCmd())
	root.SetHelpCommand(newHelpCmd())
	root.CompletionOptions.HiddenDefaultCmd = true
	root.Version = versionLine()
	root.SetVersionTemplate("{{.Version}}\n")
	// Cobra parses flags, finds the command and checks its arguments before
	// any PersistentPreRun: what fails before is the command line's fault.
	parsed := false
	var kernelDirs []string
	root.PersistentFlags().StringArrayVar(&kernelDirs, "kernel-dir", nil,
		"load a kernel set of your own from this directory (its fuselm.json; docs/KERNEL_ABI.md); repeatable, "+
			"and "+userset.PathEnv+" lists more")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		parsed = true
		return loadKernelDirs(userset.Dirs(kernelDirs, os.Getenv))
	}
	root.SetArgs(args)
	out := &resultWriter{w: stdout}
	root.SetOut(out)
	root.SetErr(stderr)
	err := root.Execute()
	if out.err != nil && (err == nil || errors.Is(err, out.err)) {
		err = fmt.Errorf("writing the result to stdout: %w", out.err)
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "infer: %s\n", clipLines(err.Error()))
	if errors.As(err, new(usageError)) || !parsed {
		return exitUsage
	}
	return exitError
}

// resultWriter is stdout, which carries the results: it keeps the first
// write error (a full disk, a closed stdout), which fails the run, and
// writes nothing after it.
type resultWriter struct {
	w   io.Writer
	err error
}

func (r *resultWriter) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	r.err = err
	return n, err
}

// maxErrorLine is the longest line of an error infer prints: a name or a
// pattern copied from a hostile file may be megabytes long.
const maxErrorLine = 1000

// clipLines shortens every line of msg longer than maxErrorLine to its
// beginning (where the error happened) and its end (what went wrong).
func clipLines(msg string) string {
	lines := strings.Split(msg, "\n")
	for i, l := range lines {
		if len(l) <= maxErrorLine {
			continue
		}
		head, tail := l[:maxErrorLine/2], l[len(l)-maxErrorLine/3:]
		for !utf8.ValidString(head) && len(head) > 0 { // a character cut in two
			head = head[:len(head)-1]
		}
		for !utf8.ValidString(tail) && len(tail) > 0 {
			tail = tail[1:]
		}
		lines[i] = fmt.Sprintf("%s[… %d bytes …]%s", head, len(l)-len(head)-len(tail), tail)
	}
	return strings.Join(lines, "\n")
}

// silence makes cobra leave error printing to run, so that every failure is
// one line on stderr, and marks flag and argument errors as usage errors.
func silence(c *cobra.Command) *cobra.Command {
	c.SilenceErrors = true
	c.SilenceUsage = true
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	c.Args = noArgs
	return c
}

// noArgs refuses positional arguments: every input is a flag.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if js := c.Flags().Lookup("json"); js != nil && js.Changed && js.Value.Type() == "bool" && strings.HasSuffix(args[0], ".json") {
		return usageError{fmt.Errorf("--json takes no file name: stdout is the JSON document (redirect it: --json > %s)", args[0])}
	}
	msg := fmt.Sprintf("unexpected argument %q: %s takes only flags", args[0], c.CommandPath())
	if !c.HasParent() {
		msg = fmt.Sprintf("unknown command or stray argument %q (commands: %s; the prompt goes in --prompt)", args[0], commandNames(c))
	}
	return usageError{errors.New(msg)}
}

func commandNames(root *cobra.Command) string {
	var names []string
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// newHelpCmd is "infer help [command]", which fails as a usage error on a
// command that does not exist (cobra's own prints a line and succeeds).
func newHelpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return usageError{fmt.Errorf("no help for %q: the commands are %s", strings.Join(args, " "), commandNames(c.Root()))}
			}
			return cmd.Help()
		},
	}
}

// loadKernelDirs registers the kernel set of each directory (userset.Load)
// before the command reads its kernel specs.
func loadKernelDirs(dirs []string) error {
	for _, dir := range dirs {
		if _, err := userset.Load(dir); err != nil {
			return err
		}
	}
	return nil
}

// opList is the --help table of ops: each op's group, what it does, and the
// set that runs it under each CUDA set's name (a set that has no kernel of
// its own for an op runs its fallback's, named in parentheses).
func opList() string {
	var b strings.Builder
	var cudaSets []kernels.SetInfo
	for _, s := range kernels.Sets() {
		if s.Device == "cuda" {
			cudaSets = append(cudaSets, s)
		}
	}
	b.WriteString("Ops (a group name, such as attn, selects all its ops):\n")
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprint(tw, "  op\tgroup")
	for _, s := range cudaSets {
		fmt.Fprintf(tw, "\t%s", s.Name)
	}
	fmt.Fprint(tw, "\twhat it does\n")
	for _, info := range kernels.OpTable() {
		fmt.Fprintf(tw, "  %s\t%s", info.Op, info.Group)
		for _, s := range cudaSets {
			spec := kernels.Spec{Base: s.Name}
			runner := spec.Runner(info.Op)
			if runner != s.Name {
				runner = "(" + runner + ")"
			}
			fmt.Fprintf(tw, "\t%s", runner)
		}
		fmt.Fprintf(tw, "\t%s\n", info.Doc)
	}
	tw.Flush()
	b.WriteString("(set): the set has no kernel of its own for the op and runs that set's. A set may also\n" +
		"decline one call whose shapes its kernels do not take (fused's MLA kernels take DeepSeek-V2's\n" +
		"head dims, say); that call runs on the set it falls back to, and the profile names both.\n")
	return strings.TrimRight(b.String(), "\n")
}
