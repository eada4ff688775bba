//go:build linux

package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/loader"
)

// A weights file cut short after it was opened, before its tensors are
// uploaded, fails Load with one line that names the file, instead of the
// crash reading its mapping past the new end would be.
func TestLoadFileCutShort(t *testing.T) {
	for _, c := range []struct{ fixture, file string }{
		{"qwen2-tiny", "model.safetensors"},
		{"qwen2-tiny-bf16", "model-00002-of-00003.safetensors"},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			dir := t.TempDir()
			ents, err := os.ReadDir(fixtureDir(c.fixture))
			if err != nil {
				t.Skip(err)
			}
			for _, e := range ents {
				b, err := os.ReadFile(filepath.Join(fixtureDir(c.fixture), e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644)
			}
			cfg, err := loader.LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			w, err := loader.OpenWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := os.Truncate(filepath.Join(dir, c.file), 4096); err != nil {
				t.Fatal(err)
			}
			dev, ops := cpuOps(t)
			m, err := Load(cfg, w, dev, ops, LoadOptions{MaxRows: 1, MaxSeq: 8})
			if err == nil {
				m.Close()
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "loader: "+c.file+": tensor ") || strings.Contains(msg, "\n") ||
				!strings.Contains(msg, "the file was cut short while it was being read") {
				t.Errorf("error %q: want one line naming %s and saying it was cut short", msg, c.file)
			}
			t.Log(msg)
		})
	}
}
