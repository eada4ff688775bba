package model

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
)

// A model that cannot fit is refused before anything is allocated or
// uploaded, saying what it needs and what the device has; sizes that
// overflow saturate instead of wrapping past the check.
func TestLoadMemory(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	dev, ops := cpuOps(t)
	if _, _, err := dev.(memInfoer).MemInfo(); err != nil {
		t.Skip("the cpu device cannot tell its memory here:", err)
	}
	for _, opt := range []LoadOptions{
		{MaxRows: 1099511627776, MaxSeq: 64}, // --batch 1099511627776
		{MaxRows: 10_000_000, MaxSeq: 64},    // --batch 10000000
		{MaxRows: 1, MaxSeq: math.MaxInt},    // a sequence no cache holds
		{MaxRows: math.MaxInt, MaxSeq: math.MaxInt},
	} {
		uploads := 0
		opt.Progress = func(int64, int64) { uploads++ }
		_, err := Load(cfg, w, dev, ops, opt)
		var me *MemoryError
		if !errors.As(err, &me) || uploads != 0 {
			t.Errorf("Load(%d rows, %d tokens): %v after %d uploads, want a *MemoryError before any", opt.MaxRows, opt.MaxSeq, err, uploads)
			continue
		}
		if me.Need.Total() <= me.Free || !strings.Contains(err.Error(), "needs ") || !strings.Contains(err.Error(), " free") {
			t.Errorf("Load(%d rows, %d tokens): %v", opt.MaxRows, opt.MaxSeq, err)
		}
	}
	if err := dev.Sync(); err != nil {
		t.Errorf("the refused loads allocated: %v", err)
	}
}

// noMemInfo is a device that cannot tell its free memory.
type noMemInfo struct{ kernels.Device }

// On a device that cannot tell its memory, an allocation that fails is an
// error from Load, not a panic.
func TestLoadAllocFails(t *testing.T) {
	cfg, w, _ := openFixture(t, "qwen2-tiny")
	dev, ops := cpuOps(t)
	_, err := Load(cfg, w, noMemInfo{dev}, ops, LoadOptions{MaxRows: 1 << 26, MaxSeq: 256, PrefillChunk: 1 << 26})
	if err == nil || !strings.Contains(err.Error(), "Alloc") {
		t.Errorf("Load of an 8 TiB cache: %v", err)
	}
}

func TestSaturation(t *testing.T) {
	if got := mulSat(1<<40, 1<<30); got != math.MaxInt64 {
		t.Errorf("mulSat(2^40, 2^30) = %d", got)
	}
	if got := mulSat(3, 5, 7); got != 105 {
		t.Errorf("mulSat(3, 5, 7) = %d", got)
	}
	if got := addSat(math.MaxInt64-1, 5); got != math.MaxInt64 {
		t.Errorf("addSat near the top = %d", got)
	}
	if got := (Memory{Weights: 1 << 30, Cache: 3 << 29, Work: 512}).String(); got != "weights 1.00 GiB, KV cache 1.50 GiB, work 512 B" {
		t.Errorf("Memory.String() = %q", got)
	}
}

// A config that asks for a million layers of a two-layer checkpoint fails
// at once, with a first line that says so and a short message, instead of
// planning every missing layer and listing its tensors.
func TestMillionLayers(t *testing.T) {
	for _, fixture := range []string{"qwen2-tiny", "deepseek-v2-tiny"} {
		cfg, w, _ := openFixture(t, fixture)
		held := cfg.NumLayers
		cfg.NumLayers = 1_000_000
		start := time.Now()
		err := Check(cfg, w)
		first, _, _ := strings.Cut(fmt.Sprint(err), "\n")
		want := fmt.Sprintf("model.layers.%d to model.layers.999999: missing (num_hidden_layers is 1000000; the checkpoint holds %d layers)", held+1, held)
		if !strings.Contains(first, want) || len(err.Error()) > 2000 {
			t.Errorf("%s: %v", fixture, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: Check took %v", fixture, d)
		}
	}
}
