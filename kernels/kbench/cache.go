package kbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"time"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
)

// Cache is the tuning cache of one device and compiler: the variants
// --optimize chose, which infer applies to the sets it builds. A file
// belongs to the device name, architecture and NVRTC version it was
// measured with (its name says which), so that a new GPU or compiler
// starts from the defaults rather than from choices made for another.
type Cache struct {
	Version int     `json:"version"`
	Device  string  `json:"device"`
	Arch    string  `json:"arch"`
	NVRTC   int     `json:"nvrtc"`
	Entries []Entry `json:"entries"`
}

// Entry is one choice and what it was measured on.
type Entry struct {
	kernels.Tuned
	Shapes string    `json:"measured_on"`
	Date   time.Time `json:"date"`
}

// cacheVersion changes when the file's meaning does: an older file is not
// applied.
const cacheVersion = 1

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// CachePath is the tuning cache of a device under dir (the directory that
// holds the kernel cache's): dir/tuning/<device>_<arch>_nvrtc<version>.json.
func CachePath(dir, device, arch string, nvrtc int) string {
	name := fmt.Sprintf("%s_%s_nvrtc%d.json", unsafeName.ReplaceAllString(device, "-"), arch, nvrtc)
	return filepath.Join(dir, "tuning", name)
}

// DeviceCache finds and reads the tuning cache of CUDA device d, kept
// beside its kernel cache (in the parent of $FUSELM_KERNEL_CACHE); stale
// says why a cache found there does not hold for d (c is then a new, empty
// one).
func DeviceCache(d *cuda.Device) (path string, c *Cache, stale string, err error) {
	dir := d.CacheDir()
	if dir == "" {
		return "", nil, "", errors.New("the kernel cache is off (FUSELM_KERNEL_CACHE=off), and the tuning cache lives beside it")
	}
	p := d.Props()
	path = CachePath(filepath.Dir(dir), p.Name, p.Arch, p.NVRTCVersion)
	c, stale, err = ReadCache(path, p.Name, p.Arch, p.NVRTCVersion)
	return path, c, stale, err
}

// maxCacheBytes bounds a tuning cache file: a few choices per op and shape.
const maxCacheBytes = 64 << 20

// ReadCache reads the tuning cache at path for device, arch and nvrtc. A
// missing file is an empty cache; a file of another version, device,
// architecture or compiler is one too, with the reason in stale.
func ReadCache(path, device, arch string, nvrtc int) (c *Cache, stale string, err error) {
	c = &Cache{Version: cacheVersion, Device: device, Arch: arch, NVRTC: nvrtc}
	data, err := infile.Read(path, maxCacheBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return c, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("tuning cache: %w", err)
	}
	var f Cache
	if err := json.Unmarshal(data, &f); err != nil {
		return c, fmt.Sprintf("%s is not a tuning cache (%v)", path, err), nil
	}
	switch {
	case f.Version != cacheVersion:
		return c, fmt.Sprintf("%s is version %d, this build reads %d", path, f.Version, cacheVersion), nil
	case f.Device != device || f.Arch != arch || f.NVRTC != nvrtc:
		return c, fmt.Sprintf("%s was measured on %s (%s, NVRTC %d), not %s (%s, NVRTC %d)", path, f.Device, f.Arch, f.NVRTC, device, arch, nvrtc), nil
	}
	return &f, "", nil
}

// Put records choices measured on shapes, replacing earlier choices for
// the same set, op and key.
func (c *Cache) Put(choices []kernels.Tuned, shapes string, now time.Time) {
	for _, t := range choices {
		e := Entry{Tuned: t, Shapes: shapes, Date: now.UTC()}
		replaced := false
		for i, old := range c.Entries {
			if old.Set == t.Set && old.Op == t.Op && old.Key == t.Key {
				c.Entries[i], replaced = e, true
			}
		}
		if !replaced {
			c.Entries = append(c.Entries, e)
		}
	}
}

// Choices are the cache's entries as tuning choices (kernels.Dispatch.ApplyTuning).
func (c *Cache) Choices() []kernels.Tuned {
	out := make([]kernels.Tuned, len(c.Entries))
	for i, e := range c.Entries {
		out[i] = e.Tuned
	}
	return out
}

// Marshal is the file's content.
func (c *Cache) Marshal() ([]byte, error) {
	data, err := json.MarshalIndent(c, "", "  ")
	return append(data, '\n'), err
}
