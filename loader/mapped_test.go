//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A checkpoint cut short after it was mapped makes reading the lost
// tensors an error naming the file and the tensor, never a crash; the
// tensors before the cut read as before.
func TestWeightsReadCutShort(t *testing.T) {
	page := os.Getpagesize()
	tensors := []stTestTensor{
		{"first", "F32", []int{4, page}}, // 4 pages
		{"second", "BF16", []int{8, page}},
	}
	good := stTestBuild(tensors)
	// Upload reads the data element by element (the cpu set) or with copy
	// (the CUDA sets' staging of data of the device's type): both fault.
	sum := func(data []byte) error {
		s := 0
		for _, b := range data {
			s += int(b)
		}
		if s < 0 {
			return errors.New("no")
		}
		return nil
	}
	cp := func(data []byte) error {
		copy(make([]byte, len(data)), data)
		return nil
	}
	for _, c := range []struct {
		name   string
		size   int64    // the file's size once cut
		ok     []string // tensors still readable
		failed []string // tensors whose Read fails
	}{
		{"cut in the second tensor", int64(len(good) - 3*page), []string{"first"}, []string{"second"}},
		{"cut in the first tensor", int64(len(good)/2 - 2*page), nil, []string{"second"}},
		{"cut to nothing", 0, nil, []string{"first", "second"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			stTestWrite(t, dir, SingleWeightsFile, good)
			w, err := OpenWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := os.Truncate(filepath.Join(dir, SingleWeightsFile), c.size); err != nil {
				t.Fatal(err)
			}
			for _, read := range []func([]byte) error{sum, cp} {
				for _, name := range c.ok {
					ti, _ := w.Get(name)
					if err := w.Read(ti, read); err != nil {
						t.Errorf("Read(%s): %v", name, err)
					}
				}
				for _, name := range c.failed {
					ti, _ := w.Get(name)
					err := w.Read(ti, read)
					want := fmt.Sprintf("loader: %s: tensor %q: the file was cut short while it was being read (%d bytes when opened, %d now)",
						SingleWeightsFile, name, len(good), c.size)
					if err == nil || err.Error() != want {
						t.Errorf("Read(%s): %v, want %q", name, err, want)
					}
				}
			}
		})
	}
}

// Read returns fn's own error as it is, and lets a panic that is no fault
// of the mapping go on.
func TestWeightsReadPassesThrough(t *testing.T) {
	dir := t.TempDir()
	stTestWrite(t, dir, SingleWeightsFile, stTestBuild(stTestTensors[:1]))
	w, err := OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ti, _ := w.Get(stTestTensors[0].name)
	mine := errors.New("device full")
	if err := w.Read(ti, func([]byte) error { return mine }); err != mine {
		t.Errorf("fn's error: got %v", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "index out of range") {
			t.Errorf("a bug's panic: recovered %v", r)
		}
	}()
	w.Read(ti, func(data []byte) error {
		_ = data[len(data)+1]
		return nil
	})
	t.Error("the panic was swallowed")
}
