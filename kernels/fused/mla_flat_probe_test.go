package fused

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The flat variant's timestamp probe (mla_probe.cuh): where mla_flat's time
// goes at batch 1, block by block.

// mlaProbeEnv must be "1" for TestMLAFlatProbe to run: a measurement, not a
// check of the normal tiers.
const mlaProbeEnv = "FUSELM_MLF_PROBE"

// mlaProbeOpt builds mla_flat.cu with its probe.
const mlaProbeOpt = "-DMLF_PROBE=1"

// mla_probe.cuh's limits, kernels and slots (TestMLAProbeHeader holds them
// to the header).
const (
	probeCalls, probeBlocks, probeStamps, probeTiles = 2, 1024, 32, 8
)

const (
	probeQlat = iota
	probeFlat
	probeOut
	probeKernels
)

const (
	stEntry = iota
	stPreloaded
	stWaited
	stQueued
	stReady
	stComputed = stReady + probeTiles
	stRunDone  = stComputed + probeTiles
)

const (
	stSums = stRunDone + 1 + iota
	stSync1
	stScaled
	stSync2
	stMerged
	stExit
	stSMID
	stTiles
	stKeys
	stRank
)

// probeStampNames are MlaStamp's names in order, as the header spells them.
var probeStampNames = []string{"MLA_ENTRY", "MLA_PRELOADED", "MLA_WAITED", "MLA_QUEUED", "MLA_READY", "MLA_COMPUTED",
	"MLA_RUN_DONE", "MLA_SUMS", "MLA_SYNC1", "MLA_SCALED", "MLA_SYNC2", "MLA_MERGED", "MLA_EXIT", "MLA_SMID", "MLA_TILES",
	"MLA_KEYS", "MLA_RANK"}

// TestMLAProbeHeader holds the Go mirror of mla_probe.cuh to the header:
// its limits, its kernels' order and its slots' order and values.
func TestMLAProbeHeader(t *testing.T) {
	src, err := fs.ReadFile(sources, "mla_probe.cuh")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"MLA_PROBE_CALLS": probeCalls, "MLA_PROBE_BLOCKS": probeBlocks,
		"MLA_PROBE_STAMPS": probeStamps, "MLA_PROBE_TILES": probeTiles} {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindSubmatch(src)
		if m == nil {
			t.Errorf("mla_probe.cuh defines no %s", name)
		} else if got, _ := strconv.Atoi(string(m[1])); got != want {
			t.Errorf("%s is %d in mla_probe.cuh, %d here", name, got, want)
		}
	}
	if !bytes.Contains(src, []byte("enum MlaProbeKernel { MLA_PROBE_QLAT, MLA_PROBE_FLAT, MLA_PROBE_OUT, MLA_PROBE_KERNELS };")) {
		t.Errorf("mla_probe.cuh's MlaProbeKernel is not (qlat, flat, out)")
	}
	body := regexp.MustCompile(`(?s)enum MlaStamp \{(.*?)\};`).FindSubmatch(src)
	if body == nil {
		t.Fatal("mla_probe.cuh has no enum MlaStamp")
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(MLA_[A-Z0-9_]+)`).FindAllSubmatch(body[1], -1) {
		names = append(names, string(m[1]))
	}
	if !slices.Equal(names, probeStampNames) {
		t.Errorf("MlaStamp is %v in mla_probe.cuh, here %v", names, probeStampNames)
	}
	for _, c := range []struct {
		name string
		got  int
		want string
	}{{"MLA_COMPUTED", stComputed, "MLA_READY + MLA_PROBE_TILES"}, {"MLA_RUN_DONE", stRunDone, "MLA_COMPUTED + MLA_PROBE_TILES"}} {
		if !bytes.Contains(body[1], []byte(c.name+" = "+c.want+",")) {
			t.Errorf("mla_probe.cuh's %s is not %s", c.name, c.want)
		}
	}
	if stRank != stExit+4 || stExit != stRunDone+6 || stRank >= probeStamps {
		t.Errorf("the slots after MLA_RUN_DONE: exit %d, rank %d", stExit, stRank)
	}
}

// TestMLAFlatProbeCompiles compiles mla_flat.cu with and without its probe
// with the NVRTC library at $FUSELM_NVRTC for $FUSELM_NVRTC_ARCH (sm_90a when
// unset), without a GPU, as kernels/cudaset's TestNVRTCCompile does: both
// must define every kernel, the probe build its two globals, and the
// normal build neither. It logs ptxas's report of V2-Lite's instance in
// each; with $FUSELM_NVRTC_OUT set it writes both cubins there. Skipped
// when FUSELM_NVRTC is unset.
func TestMLAFlatProbeCompiles(t *testing.T) {
	lib := os.Getenv("FUSELM_NVRTC")
	if lib == "" {
		t.Skip("FUSELM_NVRTC is unset: set it to a libnvrtc.so to compile without a GPU")
	}
	arch := os.Getenv("FUSELM_NVRTC_ARCH")
	if arch == "" {
		arch = hopperArch
	}
	c, err := cuda.NewCompiler(lib, arch)
	if err != nil {
		t.Fatal(err)
	}
	for _, probe := range []bool{false, true} {
		saved := mlaFlatOpts
		if probe {
			mlaFlatOpts = []string{mlaProbeOpt}
		}
		m := mlaFlatModule()
		mlaFlatOpts = saved
		p, err := cudaset.Source(m)
		if err != nil {
			t.Fatal(err)
		}
		p.Name = "fused_" + m.File
		img, log, err := c.Compile(p, append(slices.Clone(m.Opts), "--ptxas-options=-v")...)
		if err != nil {
			t.Fatalf("probe=%v, options %q: %v\n%s", probe, m.Opts, err, log)
		}
		for _, f := range m.Funcs {
			if !strings.Contains(log, "Compiling entry function '"+f+"'") {
				t.Errorf("probe=%v: no kernel %s in ptxas's report", probe, f)
			}
		}
		for _, g := range []string{"mla_probe", "mla_probe_runs"} {
			has := bytes.Contains(img, []byte("\x00"+g+"\x00"))
			if has != probe {
				t.Errorf("probe=%v: the cubin holds the global %s: %v", probe, g, has)
			}
		}
		lite := mlaFlatKernel(mlaLatent{512, 64}, 4)
		report := regexp.MustCompile(`(?s)Compiling entry function '` + lite + `'.*?Used [^\n]*`).FindString(log)
		t.Logf("probe=%v, options %q: %d kernels, %d bytes of cubin; %s", probe, m.Opts, len(m.Funcs), len(img), report)
		if dir := os.Getenv("FUSELM_NVRTC_OUT"); dir != "" {
			name := fmt.Sprintf("%s/%s.probe=%v.cubin", dir, p.Name, probe)
			if err := os.WriteFile(name, img, 0o644); err != nil {
				t.Error(err)
			}
		}
	}
}
