//go:build unix

package outfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A name as long as the file system takes (255 bytes) can be written:
// the temporary file's name is cut to fit, and none remains.
func TestLongName(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{240, 241, 250, 255} {
		name := strings.Repeat("é", n/2) + strings.Repeat("x", n%2) // two bytes a character
		p := filepath.Join(dir, name)
		if err := write(t, p, "new"); err != nil {
			t.Errorf("%d-byte name: %v", n, err)
			continue
		}
		if err := write(t, p, "replaced"); err != nil || readFile(t, p) != "replaced" {
			t.Errorf("%d-byte name, replaced: %v", n, err)
		}
		noTemporaries(t, dir, name)
		os.Remove(p)
	}
	if err := Check(filepath.Join(dir, strings.Repeat("x", 256))); err == nil {
		t.Errorf("a 256-byte name passes Check")
	}
}

// Abandon, as an interrupted run calls it during a write, removes the
// write's temporary file; the file at the path stays whole (the old
// content), and writes after it fail.
func TestAbandon(t *testing.T) {
	defer func() { writes = writeSet{} }()
	dir := t.TempDir()
	p := filepath.Join(dir, "out.json")
	os.WriteFile(p, []byte("old"), 0o644)
	f, err := createTemp(p, 0o600) // a write under way, its data half out
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("hal")
	f.Close()
	Abandon()
	noTemporaries(t, dir, "out.json")
	if err := renameTemp(f.Name(), p); !errors.Is(err, ErrAbandoned) {
		t.Errorf("the write's rename after Abandon: %v", err)
	}
	if got := readFile(t, p); got != "old" {
		t.Errorf("the file holds %q", got)
	}
	if err := Write(p, []byte("new")); !errors.Is(err, ErrAbandoned) {
		t.Errorf("Write after Abandon: %v", err)
	}
	noTemporaries(t, dir, "out.json")
}

// Two runs writing one output that is a hard link, written in place, at
// once: the file ends as one of the two documents whole, never both
// interleaved.
func TestConcurrentInPlaceWriters(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.json")
	os.WriteFile(p, nil, 0o644)
	if err := os.Link(p, filepath.Join(dir, "other-name")); err != nil {
		t.Skip(err)
	}
	docs := make([][]byte, 2)
	for i := range docs {
		docs[i], _ = json.Marshal(map[string]string{"writer": strings.Repeat(string(rune('a'+i)), 1<<20+i*4096)})
	}
	for round := 0; round < 10; round++ {
		var wg sync.WaitGroup
		for _, d := range docs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := Write(p, d); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, docs[0]) && !bytes.Equal(got, docs[1]) {
			t.Fatalf("round %d: the file is neither document (%d bytes, valid JSON %v)", round, len(got), json.Valid(got))
		}
	}
}
