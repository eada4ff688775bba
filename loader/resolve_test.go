package loader

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// resolveTestEnv clears every variable HubCacheDir reads and points HOME at
// a fresh directory.
func resolveTestEnv(t *testing.T) (home string) {
	t.Helper()
	home = t.TempDir()
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
	return home
}

// resolveTestFile writes a file, making its directories.
func resolveTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHubCacheDir(t *testing.T) {
	home := resolveTestEnv(t)
	if got, want := HubCacheDir(), filepath.Join(home, ".cache", "huggingface", "hub"); got != want {
		t.Errorf("default: %s, want %s", got, want)
	}
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if got := HubCacheDir(); got != "/xdg/huggingface/hub" {
		t.Errorf("XDG_CACHE_HOME: %s", got)
	}
	t.Setenv("HF_HOME", "/hfhome")
	if got := HubCacheDir(); got != "/hfhome/hub" {
		t.Errorf("HF_HOME: %s", got)
	}
	t.Setenv("HUGGINGFACE_HUB_CACHE", "/legacy")
	if got := HubCacheDir(); got != "/legacy" {
		t.Errorf("HUGGINGFACE_HUB_CACHE: %s", got)
	}
	t.Setenv("HF_HUB_CACHE", "~/hub")
	if got := HubCacheDir(); got != filepath.Join(home, "hub") {
		t.Errorf("HF_HUB_CACHE: %s", got)
	}
}

func TestResolve(t *testing.T) {
	home := resolveTestEnv(t)
	hub := filepath.Join(t.TempDir(), "hub")
	repo := filepath.Join(hub, "models--Qwen--Qwen2-7B")
	snap := func(rev string) string { return filepath.Join(repo, "snapshots", rev) }
	resolveTestFile(t, filepath.Join(snap("aaa111"), "config.json"), "{}")
	resolveTestFile(t, filepath.Join(snap("bbb222"), "config.json"), "{}")
	resolveTestFile(t, filepath.Join(repo, "refs", "main"), "aaa111\n")
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(snap("aaa111"), old, old); err != nil {
		t.Fatal(err)
	}

	// Not in any cache yet: the error names the path tried.
	_, err := Resolve("Qwen/Qwen2-7B")
	want := `loader: model "Qwen/Qwen2-7B": not a directory, and not in the HF cache (tried ` +
		filepath.Join(home, ".cache", "huggingface", "hub", "models--Qwen--Qwen2-7B") + `)`
	if err == nil || err.Error() != want {
		t.Fatalf("not cached: %v\nwant %s", err, want)
	}

	t.Setenv("HF_HUB_CACHE", hub)
	if got, err := Resolve("Qwen/Qwen2-7B"); err != nil || got != snap("aaa111") {
		t.Errorf("refs/main: %q, %v; want %s", got, err, snap("aaa111"))
	}

	// HF_HOME/hub when HF_HUB_CACHE is unset.
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", filepath.Dir(hub))
	if got, err := Resolve("Qwen/Qwen2-7B"); err != nil || got != snap("aaa111") {
		t.Errorf("HF_HOME: %q, %v", got, err)
	}

	// Without refs/main (or with a stale one): the newest snapshot.
	for _, ref := range []string{"", "ccc333"} {
		if ref == "" {
			os.Remove(filepath.Join(repo, "refs", "main"))
		} else {
			resolveTestFile(t, filepath.Join(repo, "refs", "main"), ref)
		}
		if got, err := Resolve("Qwen/Qwen2-7B"); err != nil || got != snap("bbb222") {
			t.Errorf("refs/main %q: %q, %v; want the newest, %s", ref, got, err, snap("bbb222"))
		}
	}
	os.RemoveAll(snap("bbb222"))
	if got, err := Resolve("Qwen/Qwen2-7B"); err != nil || got != snap("aaa111") {
		t.Errorf("only snapshot: %q, %v", got, err)
	}

	// A snapshot without config.json.
	os.Remove(filepath.Join(snap("aaa111"), "config.json"))
	if _, err := Resolve("Qwen/Qwen2-7B"); err == nil || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("snapshot without config.json: %v", err)
	}
	// No snapshot at all.
	os.RemoveAll(filepath.Join(repo, "snapshots"))
	if _, err := Resolve("Qwen/Qwen2-7B"); err == nil || !strings.Contains(err.Error(), "snapshot") ||
		strings.Contains(err.Error(), "\n") {
		t.Errorf("no snapshots: %v", err)
	}
}

func TestResolveDirectory(t *testing.T) {
	resolveTestEnv(t)
	dir := t.TempDir()
	if _, err := Resolve(dir); err == nil || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("dir without config.json: %v", err)
	}
	resolveTestFile(t, filepath.Join(dir, "config.json"), "{}")
	if got, err := Resolve(dir); err != nil || got != dir {
		t.Errorf("dir: %q, %v", got, err)
	}
	if _, err := Resolve(filepath.Join(dir, "config.json")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file: %v", err)
	}
	if _, err := Resolve(filepath.Join(dir, "nope")); err == nil || !strings.Contains(err.Error(), "no such directory") {
		t.Errorf("missing path: %v", err)
	}
	if _, err := Resolve(""); err == nil {
		t.Error("empty: no error")
	}
	// A local directory wins over the cache, even when it looks like an id.
	t.Chdir(dir)
	resolveTestFile(t, filepath.Join(dir, "Org", "Name", "config.json"), "{}")
	if got, err := Resolve("Org/Name"); err != nil || got != "Org/Name" {
		t.Errorf("local Org/Name: %q, %v", got, err)
	}
}

// A model directory's JSON files are read only when they are regular files
// of a sane size: /dev/zero or a FIFO in their place fails at once.
func TestReadJSONFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "config.json")); err != nil {
		t.Skip(err)
	}
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("config.json -> /dev/zero: %v", err)
	}
	os.Mkdir(filepath.Join(dir, "generation_config.json"), 0o755)
	if _, err := LoadGenerationConfig(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("generation_config.json a directory: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "real.json"), []byte("{}"), 0o644)
	os.Symlink("real.json", filepath.Join(dir, "link.json"))
	if b, err := ReadJSONFile(filepath.Join(dir, "link.json")); err != nil || string(b) != "{}" {
		t.Errorf("a symlink to a regular file: %q, %v", b, err)
	}
	if _, err := ReadJSONFile(filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}
