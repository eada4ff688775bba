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

// Tensor names (and every other string of a header) must be UTF-8, as the
// reference parser requires: raw bytes that are not, or an escape of half a
// surrogate pair, are refused instead of becoming U+FFFD.
func TestHeaderNotUTF8(t *testing.T) {
	entry := `{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}`
	for _, c := range []struct{ name, want string }{
		{"w\xff", "not valid UTF-8 (byte 11)"},
		{"w\xc3", "not valid UTF-8"},
		{`w\udc80`, `\udc80 at byte 11 escapes half a UTF-16 surrogate pair`},
		{`w\ud83dx`, `\ud83d at byte 11 escapes half`},
		{`w\ud83d\u0041`, `\ud83d at byte 11 escapes half`},
	} {
		_, err := stParseHeader(stTestRaw(`{"`+c.name+`": `+entry+`}`, make([]byte, 4)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("name %q: %v, want %q", c.name, err, c.want)
		}
	}
	for _, name := range []string{"wé", `w\ud83d\ude00`, `w\\udc80`, `w\"\u00e9`} {
		if _, err := stParseHeader(stTestRaw(`{"`+name+`": `+entry+`}`, make([]byte, 4))); err != nil {
			t.Errorf("name %q: %v", name, err)
		}
	}
}
