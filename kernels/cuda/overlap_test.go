package cuda

import (
	"strings"
	"testing"
	"unsafe"
)

// TestLaunchConfigLayout holds launchConfig and launchAttribute to the
// layout of cuda.h's CUlaunchConfig and CUlaunchAttribute on 64-bit
// machines, which cuLaunchKernelEx reads.
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttribute
	for _, x := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56},
		{"offsetof(CUlaunchConfig, sharedMemBytes)", unsafe.Offsetof(c.shared), 24},
		{"offsetof(CUlaunchConfig, hStream)", unsafe.Offsetof(c.stream), 32},
		{"offsetof(CUlaunchConfig, attrs)", unsafe.Offsetof(c.attrs), 40},
		{"offsetof(CUlaunchConfig, numAttrs)", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72},
		{"offsetof(CUlaunchAttribute, value)", unsafe.Offsetof(a.value), 8},
	} {
		if x.got != x.want {
			t.Errorf("%s = %d, want %d", x.what, x.got, x.want)
		}
	}
}

func TestOverlapAllowed(t *testing.T) {
	for _, c := range []struct {
		cc     int
		ex     bool
		env    string
		expect bool
	}{
		{9, true, "", true},
		{10, true, "on", true},
		{9, true, "off", false},
		{8, true, "", false},
		{9, false, "", false},
	} {
		if got := overlapAllowed(c.cc, c.ex, c.env); got != c.expect {
			t.Errorf("overlapAllowed(%d, %v, %q) = %v, want %v", c.cc, c.ex, c.env, got, c.expect)
		}
	}
}

// TestCarveoutFrom holds FUSELM_CARVEOUT's parsing: empty leaves the
// driver's choice, max and whole percents are taken, anything else is an
// error naming the variable.
func TestCarveoutFrom(t *testing.T) {
	for env, want := range map[string]int{"": -1, "max": 100, "0": 0, "50": 50, "100": 100} {
		if got, err := carveoutFrom(env); err != nil || got != want {
			t.Errorf("carveoutFrom(%q) = %d, %v; want %d", env, got, err, want)
		}
	}
	for _, env := range []string{"101", "-1", "half", "50%"} {
		if _, err := carveoutFrom(env); err == nil || !strings.Contains(err.Error(), "FUSELM_CARVEOUT") {
			t.Errorf("carveoutFrom(%q): %v, want an error naming FUSELM_CARVEOUT", env, err)
		}
	}
}
