package loader

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/fuselm/fuselm/infile"
)

// Resolve turns the --model argument into a model directory holding
// config.json. model is either a directory, or a Hugging Face repo id
// "Org/Name" looked up offline in the HF cache (HubCacheDir):
// models--Org--Name/snapshots/<rev>, <rev> read from refs/main, or, without
// refs/main, the only (or most recently modified) snapshot. Nothing is
// downloaded.
func Resolve(model string) (string, error) {
	if model == "" {
		return "", errors.New("loader: no model given")
	}
	path := model
	if path == "~" || strings.HasPrefix(path, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			path = filepath.Join(home, path[1:])
		}
	}
	if fi, err := os.Stat(path); err == nil {
		if !fi.IsDir() {
			return "", fmt.Errorf("loader: model %q: not a directory", model)
		}
		return resolveCheckDir(model, path)
	}

	if !resolveRepoID.MatchString(model) {
		return "", fmt.Errorf("loader: model %q: no such directory (and not an Org/Name id of the HF cache)", model)
	}
	hub := HubCacheDir()
	repo := filepath.Join(hub, "models--"+strings.ReplaceAll(model, "/", "--"))
	if fi, err := os.Stat(repo); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("loader: model %q: not a directory, and not in the HF cache (tried %s)", model, repo)
	}
	snap, err := resolveSnapshot(repo)
	if err != nil {
		return "", fmt.Errorf("loader: model %q: in the HF cache at %s, but %v", model, repo, err)
	}
	return resolveCheckDir(model, snap)
}

// resolveRepoID matches a Hugging Face repo id "Org/Name".
var resolveRepoID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$`)

// HubCacheDir is the Hugging Face hub cache directory, chosen as
// huggingface_hub does: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its legacy
// name), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub.
func HubCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return resolveExpandHome(d)
	}
	if d := os.Getenv("HUGGINGFACE_HUB_CACHE"); d != "" {
		return resolveExpandHome(d)
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(resolveExpandHome(d), "hub")
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(resolveExpandHome(d), "huggingface", "hub")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "~"
	}
	return filepath.Join(home, ".cache", "huggingface", "hub")
}

func resolveExpandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, p[1:])
		}
	}
	return p
}

// maxRefBytes bounds a hub cache's refs/main, which holds one commit hash.
const maxRefBytes = 4096

// resolveSnapshot picks the snapshot directory of a cached repo.
func resolveSnapshot(repo string) (string, error) {
	snaps := filepath.Join(repo, "snapshots")
	if ref, err := infile.Read(filepath.Join(repo, "refs", "main"), maxRefBytes); err == nil {
		rev := strings.TrimSpace(string(ref))
		if rev != "" && !strings.ContainsAny(rev, `/\`) && rev != "." && rev != ".." {
			dir := filepath.Join(snaps, rev)
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
				return dir, nil
			}
		}
	}
	entries, err := os.ReadDir(snaps)
	if err != nil {
		return "", fmt.Errorf("it has no snapshots directory")
	}
	best := ""
	var bestTime int64
	for _, e := range entries {
		fi, err := os.Stat(filepath.Join(snaps, e.Name())) // follows links
		if err != nil || !fi.IsDir() {
			continue
		}
		t := fi.ModTime().UnixNano()
		if best == "" || t > bestTime || (t == bestTime && e.Name() > best) {
			best, bestTime = e.Name(), t
		}
	}
	if best == "" {
		return "", fmt.Errorf("it has no snapshot (refs/main missing or stale, snapshots/ empty)")
	}
	return filepath.Join(snaps, best), nil
}

// resolveCheckDir makes sure dir holds a config.json.
func resolveCheckDir(model, dir string) (string, error) {
	fi, err := os.Stat(filepath.Join(dir, configFile))
	if err != nil || fi.IsDir() {
		return "", fmt.Errorf("loader: model %q: %s has no config.json (not a Hugging Face model directory?)", model, dir)
	}
	return dir, nil
}

// CheckpointFiles lists the files of the model directory dir that a run
// reads (config.json, generation_config.json, the tokenizer's two files,
// the weights, the index and the shards it names), so that no output of the
// run is allowed to overwrite one. Other files of the directory, an earlier
// run's profile say, are not inputs.
func CheckpointFiles(dir string) []string {
	var files []string
	for _, name := range []string{configFile, generationConfigFile, "tokenizer.json", "tokenizer_config.json",
		SingleWeightsFile, WeightsIndexFile} {
		files = append(files, filepath.Join(dir, name))
	}
	if data, err := ReadJSONFile(filepath.Join(dir, WeightsIndexFile)); err == nil {
		var idx stIndex
		if json.Unmarshal(data, &idx) == nil {
			shards := map[string]bool{}
			for _, shard := range idx.WeightMap {
				shards[shard] = filepath.IsLocal(shard)
			}
			for _, shard := range cfgSortedKeys(shards) {
				if shards[shard] {
					files = append(files, filepath.Join(dir, shard))
				}
			}
		}
	}
	return files
}

// MaxJSONFileBytes bounds the JSON files of a model directory that are read
// whole: config.json, generation_config.json, the shard index,
// tokenizer.json and tokenizer_config.json. The largest real ones are tens
// of MB.
const MaxJSONFileBytes = 1 << 30

// ReadJSONFile reads one of a model directory's JSON files whole. It
// refuses anything but a regular file (symlinks to one are fine) and a file
// larger than MaxJSONFileBytes, so that /dev/zero or a FIFO in its place
// fails at once instead of exhausting memory or waiting forever. A missing
// file's error satisfies errors.Is(err, fs.ErrNotExist).
func ReadJSONFile(path string) ([]byte, error) {
	b, err := infile.Read(path, MaxJSONFileBytes)
	if tl := (*infile.TooLargeError)(nil); errors.As(err, &tl) {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d MiB a model's JSON file may have", path, tl.Size, MaxJSONFileBytes>>20)
	}
	return b, err
}
