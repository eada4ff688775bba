package main

import (
	"path/filepath"
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
