package cpu

import (
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// Sizes no machine has, or that overflow, are refused through Sync, not by
// a panic or the Go runtime's out-of-memory crash; the device stays usable.
func TestAllocTooLarge(t *testing.T) {
	d := NewDevice()
	for _, c := range []struct {
		dt    kernels.DType
		shape []int
		want  string
	}{
		{kernels.F32, []int{1 << 40, 1 << 30}, "overflows"},
		{kernels.BF16, []int{-1, 4}, "overflows"},
		{kernels.F32, []int{1099511627776, 1 << 23}, "overflows"},
		{kernels.F32, []int{1099511627776, 2, 64}, "memory available"}, // --batch 1099511627776
		{kernels.I32, []int{1 << 40}, "memory available"},
	} {
		if _, _, err := MemInfo(); err != nil && c.want == "memory available" {
			continue // no /proc/meminfo: only the overflow bound applies
		}
		x := d.Alloc(c.dt, c.shape...)
		err := d.Sync()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Alloc(%s, %v): Sync = %v, want %q", c.dt, c.shape, err, c.want)
		}
		if _, err := d.ReadF32(x); err == nil {
			t.Errorf("Alloc(%s, %v): reading the tensor works", c.dt, c.shape)
		}
		if err := d.Upload(x, nil, kernels.F32); err == nil {
			t.Errorf("Alloc(%s, %v): uploading into the tensor works", c.dt, c.shape)
		}
		d.Free(x)
	}
	ok := d.Alloc(kernels.F32, 2, 3)
	if v, err := d.ReadF32(ok); err != nil || len(v) != 6 || d.Sync() != nil {
		t.Errorf("a normal Alloc after failed ones: %v %v", v, err)
	}
}

func TestParseMemInfo(t *testing.T) {
	avail, total, err := parseMemInfo([]byte("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\nHugePages_Total:       0\n"))
	if err != nil || avail != 20480000<<10 || total != 24576000<<10 {
		t.Errorf("parseMemInfo = %d, %d, %v", avail, total, err)
	}
	if _, _, err := parseMemInfo([]byte("MemTotal: 5 kB\n")); err == nil {
		t.Errorf("no MemAvailable: no error")
	}
	if _, _, err := parseMemInfo([]byte("MemTotal: 5 kB\nMemAvailable: x kB\n")); err == nil {
		t.Errorf("a bad number: no error")
	}
}
