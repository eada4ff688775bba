package loader

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every file of a checkpoint is read only when it is a regular file: a FIFO
// as model.safetensors, as a shard or as the hub cache's refs/main fails at
// once, naming the file, instead of blocking for a writer.
func TestInputsNotRegular(t *testing.T) {
	fifo := func(t *testing.T, path string) {
		t.Helper()
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Skip("no FIFOs here:", err)
		}
	}
	within := func(t *testing.T, f func() error, want string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err %v, want %q", err, want)
			}
		case <-time.After(time.Second):
			t.Fatalf("still blocked after a second (want %q)", want)
		}
	}
	open := func(dir string) func() error {
		return func() error {
			w, err := OpenWeights(dir)
			if err == nil {
				w.Close()
			}
			return err
		}
	}

	single := t.TempDir()
	fifo(t, filepath.Join(single, SingleWeightsFile))
	within(t, open(single), "loader: "+filepath.Join(single, SingleWeightsFile)+": a FIFO, not a regular file")

	sharded := t.TempDir()
	stTestWrite(t, sharded, "a.safetensors", stTestBuild(stTestTensors[:1]))
	fifo(t, filepath.Join(sharded, "b.safetensors"))
	stTestIndex(t, sharded, map[string]string{stTestTensors[0].name: "a.safetensors", "other": "b.safetensors"})
	within(t, open(sharded), "b.safetensors: a FIFO, not a regular file")

	// The hub cache's refs/main as a FIFO: the snapshot is found by listing.
	hub := t.TempDir()
	repo := filepath.Join(hub, "models--Org--Name")
	snap := filepath.Join(repo, "snapshots", "abc")
	os.MkdirAll(snap, 0o755)
	os.MkdirAll(filepath.Join(repo, "refs"), 0o755)
	os.WriteFile(filepath.Join(snap, "config.json"), []byte("{}"), 0o644)
	fifo(t, filepath.Join(repo, "refs", "main"))
	t.Setenv("HF_HUB_CACHE", hub)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if dir, err := Resolve("Org/Name"); err != nil || dir != snap {
			t.Errorf("Resolve with refs/main a FIFO: %q, %v", dir, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("Resolve still blocked on refs/main after a second")
	}
}
