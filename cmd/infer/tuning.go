package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kbench"
	"github.com/fuselm/fuselm/outfile"
)

// The tuning cache: bench --optimize writes the fastest variant per tuning
// key beside the device's kernel cache, and every run applies it.

// keepTuning writes the run's choices into the device's tuning cache.
func keepTuning(dev kernels.Device, rep *kbench.Report, opt kbench.Options, logw io.Writer) error {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return usageError{errors.New("--optimize keeps choices for a CUDA device; the cpu device has none")}
	}
	if len(rep.Tuned) == 0 {
		fmt.Fprintln(logw, "bench: no op run here has several variants: nothing to keep")
		return nil
	}
	path, cache, stale, err := kbench.DeviceCache(d)
	if err != nil {
		return err
	}
	if stale != "" {
		fmt.Fprintf(logw, "bench: starting a new tuning cache: %s\n", stale)
	}
	var shapes []string
	for _, s := range opt.Shapes {
		shapes = append(shapes, s.String())
	}
	measured := "the default shapes"
	if len(shapes) > 0 {
		measured = strings.Join(shapes, "; ")
	}
	cache.Put(rep.Tuned, measured, time.Now())
	data, err := cache.Marshal()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := outfile.Write(path, data); err != nil {
		return err
	}
	for _, t := range rep.Tuned {
		fmt.Fprintf(logw, "bench: kept %s %s %s → %s in %s\n", t.Set, t.Op, t.Key, t.Variant, path)
	}
	return nil
}

// applyTuning applies the device's tuning cache to ops, saying on logf
// which choices it took and which it could not.
func applyTuning(dev kernels.Device, ops *kernels.Dispatch, logf func(string, ...any)) []kernels.Tuned {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return nil
	}
	path, cache, stale, err := kbench.DeviceCache(d)
	switch {
	case path == "":
		return nil // no kernel cache, so no tuning cache
	case err != nil:
		logf("tuning cache not read: %v", err)
		return nil
	case stale != "":
		logf("tuning cache not applied: %s", stale)
		return nil
	}
	applied, skipped := ops.ApplyTuning(cache.Choices())
	for _, t := range applied {
		logf("tuning: %s %s %s runs %s (from %s)", t.Set, t.Op, t.Key, t.Variant, path)
	}
	for _, err := range skipped {
		logf("tuning: not applied: %v", err)
	}
	return applied
}
