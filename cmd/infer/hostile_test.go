package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inferWithin runs infer and fails t if it has not returned in ten
// seconds (what it must refuse, it refuses without blocking).
func inferWithin(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := runInfer(t, args...)
		done <- result{code, stdout, stderr}
	}()
	select {
	case r := <-done:
		return r.code, r.stdout, r.stderr
	case <-time.After(10 * time.Second):
		t.Fatalf("infer %q: still running after ten seconds", args)
	}
	return 0, "", ""
}

// A prompt or text file that is a FIFO is refused at once, as every input
// is, instead of waiting for a writer.
func TestInputFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "prompt")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	for _, args := range [][]string{
		{"--model", tinyQwen, "--prompt-file", fifo},
		{"tokenize", "--model", tinyQwen, "--file", fifo},
	} {
		code, _, stderr := inferWithin(t, args...)
		if code != exitError {
			t.Errorf("infer %q: exit %d", args, code)
		}
		oneLine(t, args, stderr, fifo+": a FIFO, not a regular file")
	}
}

// An output that is an input of the run (the checkpoint's files, the
// prompt file, reached by name, symlink or hard link) or the file of
// another output is refused before any work, as a usage error, and the
// file is left as it was.
func TestOutputIsInput(t *testing.T) {
	model := patchCheckpoint(t, tinyQwen, func(map[string]any, []byte) {})
	dir := t.TempDir()
	prompt := filepath.Join(dir, "prompt.txt")
	os.WriteFile(prompt, []byte("hello"), 0o644)
	link := filepath.Join(dir, "weights-link")
	os.Symlink(filepath.Join(model, "model.safetensors"), link)
	hard := filepath.Join(dir, "tokenizer-hard")
	if err := os.Link(filepath.Join(model, "tokenizer.json"), hard); err != nil {
		t.Skip(err)
	}
	out := filepath.Join(dir, "out.json")
	old := filepath.Join(dir, "old.json")
	os.WriteFile(old, []byte("old"), 0o644)
	os.Symlink("old.json", filepath.Join(dir, "old-link"))
	gen := []string{"--model", model, "--prompt-file", prompt, "--max-new-tokens", "2", "--quiet"}
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--profile", filepath.Join(model, "config.json")}, "is the checkpoint's config.json, an input of this run"},
		{[]string{"--trace", link}, "is the checkpoint's model.safetensors, an input of this run"},
		{[]string{"--trace", hard}, "is the checkpoint's tokenizer.json, an input of this run"},
		{[]string{"--profile", prompt}, "is --prompt-file, an input of this run"},
		{[]string{"--profile", out, "--trace", out}, "--trace " + out + ": is also the file of --profile"},
		{[]string{"--profile", old, "--trace", filepath.Join(dir, "old-link")}, "is also the file of --profile"},
		{[]string{"--profile", out, "--trace", filepath.Join(dir, ".", "out.json")}, "is also the file of --profile"},
	} {
		before := snapshot(t, model, prompt, old)
		args := append(append([]string(nil), gen...), c.extra...)
		code, stdout, stderr := runInfer(t, args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("infer %q: exit %d, stdout %q", c.extra, code, stdout)
		}
		oneLine(t, args, stderr, c.want)
		if after := snapshot(t, model, prompt, old); after != before {
			t.Errorf("infer %q changed an input", c.extra)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("infer %q wrote %s", c.extra, out)
		}
	}
	withTestSets(t)
	plot := filepath.Join(model, "config.json")
	cmp := append(compareArgs("--baseline", "cpu_slow", "--candidate", "cpu", "--plot", plot), "--model", model)
	before := snapshot(t, model)
	code, _, stderr := runInfer(t, cmp...)
	if code != exitUsage || snapshot(t, model) != before {
		t.Errorf("compare with --plot the checkpoint's config.json: exit %d", code)
	}
	oneLine(t, cmp, stderr, "--plot "+plot+": is the checkpoint's config.json, an input of this run")

	// Devices are not files outputs could lose: both may go to /dev/null.
	args := append(append([]string(nil), gen...), "--profile", os.DevNull, "--trace", os.DevNull)
	if code, _, stderr := runInfer(t, args...); code != exitOK {
		t.Errorf("--profile and --trace both %s: exit %d: %s", os.DevNull, code, stderr)
	}
}

// snapshot is the content of every file of dir and of the files named.
func snapshot(t *testing.T, dir string, files ...string) string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		files = append(files, filepath.Join(dir, e.Name()))
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %x\n", f, sha256.Sum256(data))
	}
	return b.String()
}

// TestInferChild is infer itself, run as a child process by the tests that
// signal it; it skips unless FUSELM_INFER_ARGS holds the arguments.
func TestInferChild(t *testing.T) {
	raw := os.Getenv("FUSELM_INFER_ARGS")
	if raw == "" {
		t.Skip("run by TestInterrupted")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	exitOnSignal()
	os.Exit(run(args, os.Stdout, os.Stderr))
}

// SIGINT or SIGTERM while the outputs are being written ends infer with
// 128 + the signal's number, one line on stderr, no temporary file left
// and each output whole: here the profile is written and the trace, a FIFO
// nobody reads, blocks.
func TestInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		dir := t.TempDir()
		fifo := filepath.Join(dir, "trace")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Skip("no FIFOs here:", err)
		}
		prof := filepath.Join(dir, "profile.json")
		args, _ := json.Marshal([]string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--quiet",
			"--profile", prof, "--trace", fifo})
		cmd := exec.Command(os.Args[0], "-test.run=^TestInferChild$")
		cmd.Env = append(os.Environ(), "FUSELM_INFER_ARGS="+string(args))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(prof); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // into the trace's open
		cmd.Process.Signal(sig)
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != 128+int(sig) {
			t.Errorf("%v: exit %d, want %d (stderr %q)", sig, code, 128+int(sig), stderr.String())
		}
		if !strings.HasSuffix(stderr.String(), fmt.Sprintf("infer: interrupted (%v)\n", sig)) {
			t.Errorf("%v: stderr %q", sig, stderr.String())
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() != "trace" && e.Name() != "profile.json" {
				t.Errorf("%v: %s left behind", sig, e.Name())
			}
		}
		if b, err := os.ReadFile(prof); err != nil || !json.Valid(b) {
			t.Errorf("%v: the profile is not whole: %v", sig, err)
		}
	}
}

// fullWriter fails every write, as stdout on a full disk does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// A result that cannot be written to stdout (a full disk, a closed
// stdout) fails the run: exit 1, one line.
func TestStdoutWriteError(t *testing.T) {
	for _, args := range [][]string{
		{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--quiet"},
		{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--quiet", "--json"},
		{"tokenize", "--model", tinyQwen, "--text", "hello"},
		{"inspect", "--model", tinyQwen},
	} {
		var stderr bytes.Buffer
		code := run(args, fullWriter{}, &stderr)
		if code != exitError {
			t.Errorf("infer %q to a full stdout: exit %d", args, code)
		}
		oneLine(t, args, stderr.String(), "writing the result to stdout: no space left on device")
	}
	// The real thing: /dev/full as stdout, and a stdout that cannot be
	// written (opened for reading: EBADF, as a closed one gives).
	if _, err := os.Stat("/dev/full"); err != nil {
		return
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer full.Close()
	readOnly, err := os.Open(os.DevNull)
	if err != nil {
		t.Skip(err)
	}
	defer readOnly.Close()
	args, _ := json.Marshal([]string{"tokenize", "--model", tinyQwen, "--text", "hello"})
	for _, c := range []struct {
		stdout *os.File
		want   string
	}{{full, "no space left on device"}, {readOnly, "bad file descriptor"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInferChild$")
		cmd.Env = append(os.Environ(), "FUSELM_INFER_ARGS="+string(args))
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = c.stdout, &stderr
		cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != exitError {
			t.Errorf("tokenize with stdout %s: exit %d", c.stdout.Name(), code)
		}
		oneLine(t, nil, stderr.String(), "writing the result to stdout: write /dev/stdout: "+c.want)
	}
}

// A file of the checkpoint directory that the run does not read, such as
// an earlier run's profile written there, may be an output.
func TestOutputBesideCheckpoint(t *testing.T) {
	model := patchCheckpoint(t, tinyQwen, func(map[string]any, []byte) {})
	prof := filepath.Join(model, "profile.json")
	args := []string{"--model", model, "--prompt", "hi", "--max-new-tokens", "2", "--quiet", "--profile", prof}
	for run := range 2 {
		if code, _, stderr := runInfer(t, args...); code != exitOK {
			t.Errorf("run %d with --profile in the checkpoint directory: exit %d: %s", run, code, stderr)
		}
	}
}

// An output that is the file stdout is redirected to (infer --profile F
// > F) is refused: replacing it would lose what stdout writes.
func TestOutputIsStdout(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.txt")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args, _ := json.Marshal([]string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--quiet", "--profile", out})
	cmd := exec.Command(os.Args[0], "-test.run=^TestInferChild$")
	cmd.Env = append(os.Environ(), "FUSELM_INFER_ARGS="+string(args))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = f, &stderr
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
	oneLine(t, nil, stderr.String(), "--profile "+out+": is also the file stdout goes to")
}

// A megabyte name or pattern in a hostile checkpoint does not make a
// megabyte error: the line keeps where it happened and what went wrong.
func TestLongErrorsClipped(t *testing.T) {
	name := strings.Repeat("A", 1<<20)
	badName := patchCheckpoint(t, tinyQwen, func(h map[string]any, _ []byte) {
		h[name] = map[string]any{"dtype": "BOGUS", "shape": []int{1}, "data_offsets": []int{0, 4}}
	})
	badPattern := patchCheckpoint(t, tinyQwen, func(map[string]any, []byte) {})
	b, _ := os.ReadFile(filepath.Join(badPattern, "tokenizer.json"))
	var tok map[string]any
	json.Unmarshal(b, &tok)
	tok["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] =
		map[string]any{"Regex": strings.Repeat("(", 100_000)}
	b, _ = json.Marshal(tok)
	os.WriteFile(filepath.Join(badPattern, "tokenizer.json"), b, 0o644)
	for _, c := range []struct {
		args       []string
		start, end string
	}{
		{[]string{"inspect", "--model", badName}, `infer: loader: model.safetensors: tensor "AAAA`, `": unknown dtype "BOGUS"`},
		{[]string{"tokenize", "--model", badPattern, "--text", "hi"}, `infer: tokenizer: `, `… (100000 bytes): error parsing regexp: missing closing )`},
	} {
		code, _, stderr := runInfer(t, c.args...)
		line := strings.TrimSuffix(stderr, "\n")
		if code != exitError || len(stderr) > 1200 || strings.Contains(line, "\n") ||
			!strings.HasPrefix(line, c.start) || !strings.HasSuffix(line, c.end) {
			t.Errorf("infer %s: exit %d, %d bytes: %.300q", c.args[0], code, len(stderr), stderr)
		}
	}
}
