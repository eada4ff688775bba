package userset

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fuselm/fuselm/infile"
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// PathEnv names the environment variable that lists kernel directories to
// load, separated by the system's list separator (':'), as --kernel-dir does.
const PathEnv = "FUSELM_KERNEL_PATH"

// WatchdogEnv names the environment variable that bounds how long a device
// running a user's kernels waits for its queued work (a Go duration, "off"
// for no bound); DefaultWatchdog when unset.
const WatchdogEnv = "FUSELM_WATCHDOG"

// DefaultWatchdog is the bound on a wait for queued work when a user set
// is built: longer than any step of the models at their real sizes.
const DefaultWatchdog = 60 * time.Second

//go:embed compose.cu
var composeSrc string

var (
	mu     sync.Mutex
	loaded = map[string]string{} // set name → the directory it was loaded from
)

// Dirs is the kernel directories to load: those given (--kernel-dir), then
// those of FUSELM_KERNEL_PATH.
func Dirs(given []string, getenv func(string) string) []string {
	dirs := append([]string(nil), given...)
	for _, d := range filepath.SplitList(getenv(PathEnv)) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// Load reads dir's manifest and registers its kernels as a CUDA kernel set
// of the manifest's name, which it returns. Loading a directory again
// replaces its set; a name a set of this build or another directory has
// is refused. No kernel is compiled or loaded until the set is built on a
// device.
func Load(dir string) (string, error) {
	m, ks, err := ReadManifest(dir)
	if err != nil {
		return "", err
	}
	abs, _ := filepath.Abs(dir)
	mu.Lock()
	defer mu.Unlock()
	if from, ok := loaded[m.Name]; ok {
		if from != abs {
			return "", fmt.Errorf("%s: kernel set %q is loaded already, from %s", filepath.Join(dir, ManifestName), m.Name, from)
		}
		kernels.Unregister(m.Name)
		delete(loaded, m.Name)
	}
	if _, ok := kernels.Set(m.Name); ok {
		return "", fmt.Errorf("%s: %q is the name of a kernel set of this build: name yours otherwise", filepath.Join(dir, ManifestName), m.Name)
	}
	own := make([]kernels.Op, len(ks))
	for i, k := range ks {
		own[i] = k.op
	}
	if composesAddRMSNorm(ks) {
		own = append(own, kernels.OpAddRMSNorm)
	}
	name := m.Name
	vs := variants(ks)
	kernels.Register(kernels.SetInfo{Name: name, Device: "cuda", Own: own,
		New:      func(dev kernels.Device) (kernels.Ops, error) { return build(dev, name, ks) },
		Variants: func(op kernels.Op, _ kernels.Shape, _ kernels.Target) []kernels.Variant { return vs[op] }})
	loaded[name] = abs
	return name, nil
}

// variants is what bench --dry-run shows of each op's kernel: one variant,
// "default", its file, entry, block, grid and shared memory, not valid
// when its PTX or cubin lacks the entry or (PTX) takes other parameters
// than the ABI's, which needs no GPU to see.
func variants(ks []kernel) map[kernels.Op][]kernels.Variant {
	vs := map[kernels.Op][]kernels.Variant{}
	for _, k := range ks {
		v := kernels.Variant{Name: "default", Params: fmt.Sprintf("file=%s entry=%s block=%d grid=%q shared=%q",
			filepath.Base(k.path), k.spec.Entry, k.spec.Block, gridText(k), sharedText(k))}
		if k.kind != "cu" {
			img, err := infile.Read(k.path, maxSourceBytes)
			if err == nil {
				err = checkImage(k, img)
			}
			if err != nil {
				v.Why = err.Error()
			}
		}
		vs[k.op] = []kernels.Variant{v}
	}
	if composesAddRMSNorm(ks) {
		v := vs[kernels.OpRMSNorm][0]
		v.Params = "fuselm's residual add, then rms_norm's " + v.Params
		vs[kernels.OpAddRMSNorm] = []kernels.Variant{v}
	}
	return vs
}

func gridText(k kernel) string {
	if k.spec.Grid != "" {
		return k.spec.Grid
	}
	return k.abi.grid
}

func sharedText(k kernel) string {
	if k.spec.Shared != "" {
		return string(k.spec.Shared)
	}
	return "0"
}

// Unload unregisters a set Load registered, for tests.
func Unload(name string) {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := loaded[name]; ok {
		kernels.Unregister(name)
		delete(loaded, name)
	}
}

// composesAddRMSNorm reports whether a set of kernels ks runs add_rms_norm
// as fuselm's residual add followed by its rms_norm: when it has an
// rms_norm and no add_rms_norm, so that its RMSNorm runs at every norm of
// the model, as TileGym's rms_norm patch does (the models call rms_norm
// alone only before the first layer).
func composesAddRMSNorm(ks []kernel) bool {
	has := map[kernels.Op]bool{}
	for _, k := range ks {
		has[k.op] = true
	}
	return has[kernels.OpRMSNorm] && !has[kernels.OpAddRMSNorm]
}

// watchdog is the bound FUSELM_WATCHDOG sets.
func watchdog(getenv func(string) string) (time.Duration, error) {
	v := getenv(WatchdogEnv)
	switch v {
	case "":
		return DefaultWatchdog, nil
	case "off":
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a duration such as 30s, or off", WatchdogEnv, v)
	}
	return d, nil
}

// checked holds, per device, the outcome of each set's check, so that a
// command that builds a set more than once checks it once.
var (
	checkMu sync.Mutex
	checked = map[*cuda.Device]map[string]error{}
)

// build compiles or loads the set's kernels on dev, then holds every one
// against the cpu set (kerneltest.Check): a set that fails is refused,
// naming the op, its file, the case and by how much, and never timed.
func build(dev kernels.Device, name string, ks []kernel) (kernels.Ops, error) {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("runs on CUDA devices, not %s", dev.Name())
	}
	limit, err := watchdog(os.Getenv)
	if err != nil {
		return nil, err
	}
	d.SetWatchdog(limit)
	o, err := newOps(d, name, ks)
	if err != nil {
		return nil, err
	}
	checkMu.Lock()
	defer checkMu.Unlock()
	if checked[d] == nil {
		checked[d] = map[string]error{}
	}
	if err, ok := checked[d][name]; ok {
		return o, err
	}
	rep := kerneltest.Check(d, o, o.owns, kerneltest.DefaultTolerances())
	err = refusal(name, ks, rep)
	if err == nil {
		// The cases' memory goes back to the driver, so that a run's peak
		// is its own.
		err = d.ReleaseScratch()
	}
	checked[d][name] = err
	if err != nil {
		return nil, err
	}
	return o, nil
}

// refusal is the error of a set whose check failed: one line naming the op
// and file of the first failed case, the case and how it failed.
func refusal(name string, ks []kernel, rep kerneltest.Report) error {
	if len(rep.Failures) == 0 {
		return nil
	}
	f := rep.Failures[0]
	op, _, _ := strings.Cut(f.Case, "/")
	var where []string
	for _, k := range ks {
		switch {
		case string(k.op) == op || op == "graph" || op == "":
			where = append(where, fmt.Sprintf("%s (%s, entry %s)", k.op, k.path, k.spec.Entry))
		case op == string(kernels.OpAddRMSNorm) && k.op == kernels.OpRMSNorm && composesAddRMSNorm(ks):
			where = append(where, fmt.Sprintf("add_rms_norm (the residual add, then rms_norm's %s, entry %s)", k.path, k.spec.Entry))
		}
	}
	more := ""
	if n := len(rep.Failures) - 1; n > 0 {
		more = fmt.Sprintf(" (and %d more failure(s))", n)
	}
	msg := fmt.Sprintf("fails its check and is not timed: %s: case %s: %s%s",
		strings.Join(where, ", "), f.Case, f.Msg, more)
	return fmt.Errorf("%s", strings.Join(strings.Fields(msg), " "))
}

// ops is a user set on one device: its kernels by op, launched through
// each op's ABI; the ops it does not own are NotOwned's (the registry's
// fallback runs them).
type ops struct {
	kernels.NotOwned
	kit *cudaset.Kit
	set string
	k   map[kernels.Op]*bound
	// residualAdd is compose.cu's kernel where add_rms_norm is composed
	// (composesAddRMSNorm), else nil.
	residualAdd *cuda.Func
}

// bound is a kernel loaded on the device.
type bound struct {
	kernel
	f         *cuda.Func
	static    int // bytes of static shared memory
	optedInTo int // the dynamic shared memory the kernel may use so far
}

// owns reports whether the set runs op with its own kernels.
func (o *ops) owns(op kernels.Op) bool {
	return o.k[op] != nil || op == kernels.OpAddRMSNorm && o.residualAdd != nil
}

// newOps loads every kernel of the set on d: each file once, compiled by
// NVRTC (a .cu) or checked and loaded as it is (.ptx, .cubin).
func newOps(d *cuda.Device, name string, ks []kernel) (*ops, error) {
	kit, err := cudaset.New(d, name, nil) // the row movers: the KV cache append before a user's attention
	if err != nil {
		return nil, err
	}
	o := &ops{NotOwned: kernels.NotOwned{Set: name}, kit: kit, set: name, k: map[kernels.Op]*bound{}}
	for _, k := range ks {
		mod, err := loadModule(d, k)
		if err != nil {
			return nil, err
		}
		f, err := mod.Func(k.spec.Entry)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: no entry point %q (declare it extern \"C\" __global__, or with fuselm.cuh's %s)",
				k.op, k.path, k.spec.Entry, k.abi.macro)
		}
		attrs, err := f.Attrs()
		if err != nil {
			return nil, err
		}
		if k.spec.Block > attrs.MaxThreadsPerBlock {
			return nil, fmt.Errorf("%s: %s: entry %s: a block of %d threads exceeds what the kernel can run, %d (its %d registers per thread)",
				k.op, k.path, k.spec.Entry, k.spec.Block, attrs.MaxThreadsPerBlock, attrs.Regs)
		}
		o.k[k.op] = &bound{kernel: k, f: f, static: attrs.StaticShared}
	}
	if composesAddRMSNorm(ks) {
		mod, err := d.ProgramModule(cuda.Program{Name: "userset_compose.cu", Src: composeSrc})
		if err != nil {
			return nil, err
		}
		if o.residualAdd, err = mod.Func("userset_residual_add"); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// loadModule compiles or loads the file of kernel k.
func loadModule(d *cuda.Device, k kernel) (*cuda.Module, error) {
	src, err := infile.Read(k.path, maxSourceBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.op, err)
	}
	if k.kind == "cu" {
		p, err := program(k, string(src))
		if err != nil {
			return nil, err
		}
		mod, err := d.ProgramModule(p, compileOptions(k)...)
		if err != nil {
			return nil, compileError(k, err)
		}
		return mod, nil
	}
	if err := checkImage(k, src); err != nil {
		return nil, fmt.Errorf("%s: %s: %v", k.op, k.path, err)
	}
	mod, err := d.ModuleImage(k.path, src)
	if err != nil {
		return nil, fmt.Errorf("%s: %s does not load: %v", k.op, k.path, err)
	}
	return mod, nil
}

// Owned reports the ops a loaded set owns, in the ABI's order; nil when no
// set of that name was loaded.
func Owned(name string) []kernels.Op {
	info, ok := kernels.Set(name)
	mu.Lock()
	_, user := loaded[name]
	mu.Unlock()
	if !ok || !user {
		return nil
	}
	var out []kernels.Op
	for _, op := range Ops() {
		if slices.Contains(info.Own, op) {
			out = append(out, op)
		}
	}
	return out
}
