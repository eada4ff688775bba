// Package cudaset is what every CUDA kernel set is built from, so that the
// sets hold only their own kernels and launchers: compiling a set's embedded
// .cu sources (each with the set's headers and common.cuh to #include), its
// kernel table and launch helpers, typed views
// of device matrices (Mat), scratch memory kept under its owner's name, the
// cuBLAS products, and the row movers both sets share (copy_rows, kv_append).
package cudaset

import (
	"embed"
	"fmt"
	"io/fs"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
)

// sources are cudaset's own: the headers every set's sources may include
// (common.cuh) and the row movers.
//
//go:embed *.cuh rows.cu
var sources embed.FS

// Launch shapes every set uses.
const (
	// BlockThreads is the block size of the 1-D grid-stride kernels and the
	// most threads of the per-row ones.
	BlockThreads = 256
	// BlocksPerSM is how many blocks of BlockThreads an SM holds at once
	// (2048 resident threads on Hopper); grid-stride launches fill one wave.
	BlocksPerSM = 8
	// VecWidth is the elements one thread moves per access when every row
	// start allows it: 16 bytes of bf16.
	VecWidth = 8
	// warp is the threads of a warp.
	warp = 32
)

// Module is one NVRTC compilation unit of a set: a .cu file of the set's
// sources, which #includes what it needs of the set's headers (.cuh) and of
// cudaset's (common.cuh), as a CUDA compiler given both folders would.
type Module struct {
	File    string        // the .cu file's name in Sources, for NVRTC's messages and the kernel cache
	Sources fs.FS         // the set's .cu and .cuh files
	Headers []cuda.Header // headers made from Go tables, compiled in place of the Sources files of their names
	Opts    []string      // NVRTC options after the device's
	Funcs   []string      // its extern "C" kernels
}

// InstancesModule is a module whose instance header (header, one of the
// set's .cuh files) is made from fams as InstancesHeader makes it: the
// kernels compiled are the ones the Go tables the launchers read describe,
// whatever the checked-in header holds (the set's TestInstancesHeader keeps
// that file current, for reading and for compiling a .cu by itself).
func InstancesModule(file string, srcs fs.FS, header, regen string, fams []Instances, funcs []string) Module {
	return Module{File: file, Sources: srcs, Funcs: funcs,
		Headers: []cuda.Header{{Name: header, Src: InstancesHeader(regen, fams)}}}
}

// RowsModule holds the shared row movers, which New adds to every set.
func RowsModule() Module {
	return InstancesModule("rows.cu", sources, "rows_instances.cuh", rowsRegen, rowsInstances(), Names(rowsInstances()...))
}

// rowsRegen is how rows_instances.cuh is written again after a table of
// rowsInstances changes.
const rowsRegen = "go test ./kernels/cudaset -run TestRowsInstancesHeader -update"

// rowsInstances are rows.cu's kernels, one table per macro, as
// rows_instances.cuh lists them.
func rowsInstances() []Instances {
	cp := Instances{Macro: "COPY_ROWS"}
	kv := Instances{Macro: "KV_APPEND"}
	mc := Instances{Macro: "MOE_COMBINE"}
	for _, v := range []int{1, VecWidth} {
		for _, in := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			for _, out := range []kernels.DType{kernels.BF16, kernels.F32} {
				cp.Kernels = append(cp.Kernels, Of(copyRowsKernel(out, in, v), CType(out), CType(in), v))
			}
		}
		kv.Kernels = append(kv.Kernels, Of(VName("kv_append", v), v))
		mc.Kernels = append(mc.Kernels, Of(VName("moe_combine", v), v))
	}
	return []Instances{cp, kv, mc}
}

// copyRowsKernel is copy_rows's instance from rows of in to rows of out,
// vec elements an access.
func copyRowsKernel(out, in kernels.DType, vec int) string {
	return fmt.Sprintf("copy_rows_%s_%s_v%d", out, in, vec)
}

// VName is the name of the VEC-wide instance of a kernel.
func VName(kernel string, vec int) string { return fmt.Sprintf("%s_v%d", kernel, vec) }

// Kit is one kernel set's compiled kernels on one device, with the helpers
// its launchers use.
type Kit struct {
	D         *cuda.Device
	Set       string // the set's name: kernel cache names and scratch keys start with it
	SMs       int    // multiprocessors
	MaxShared int    // bytes of shared memory a block may opt in to
	fn        map[string]*cuda.Func
	overlap   map[string]bool // kernels launched to overlap the one before (Overlap)
}

// New compiles the set's modules, and the shared row movers, for dev, which
// must be a *cuda.Device.
func New(dev kernels.Device, set string, mods []Module) (*Kit, error) {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("%s: needs a cuda device, got %T (%s)", set, dev, dev.Name())
	}
	p := d.Props()
	k := &Kit{D: d, Set: set, SMs: p.SMs, MaxShared: p.MaxSharedOptin, fn: map[string]*cuda.Func{}, overlap: map[string]bool{}}
	if err := k.add(RowsModule(), "cudaset"); err != nil {
		return nil, err
	}
	for _, m := range mods {
		if err := k.AddModule(m); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// AddModule compiles one more module of the set and adds its kernels; when it
// fails (its error carries NVRTC's log) the kit is as it was, so that a set
// can keep an optional module apart from the ones it cannot do without.
func (k *Kit) AddModule(m Module) error { return k.add(m, k.Set) }

func (k *Kit) add(m Module, owner string) error {
	p, err := program(m, owner)
	if err != nil {
		return fmt.Errorf("%s: %w", k.Set, err)
	}
	mod, err := k.D.ProgramModule(p, m.Opts...)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", k.Set, m.File, err)
	}
	fs := map[string]*cuda.Func{}
	for _, name := range m.Funcs {
		f, err := mod.Func(name)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", k.Set, m.File, err)
		}
		fs[name] = f
	}
	for name, f := range fs {
		k.fn[name] = f
	}
	return nil
}

// program is m as owner's kit compiles it: Source, named owner_File (the
// kernel cache's and NVRTC's messages' name).
func program(m Module, owner string) (cuda.Program, error) {
	p, err := Source(m)
	p.Name = owner + "_" + m.File
	return p, err
}

// Prebuild compiles with c what New compiles for set from mods (the shared
// row movers first), into the kernel cache dir, as a device of c's
// architecture would: a run there then loads them instead of compiling
// them. done is told of each module (its name and cache file) as it is
// finished; compiled counts those it compiled, cached those the cache held
// already.
func Prebuild(c *cuda.Compiler, dir, set string, mods []Module, done func(name, path string)) (compiled, cached int, err error) {
	for i, m := range append([]Module{RowsModule()}, mods...) {
		owner := set
		if i == 0 {
			owner = "cudaset"
		}
		p, err := program(m, owner)
		if err != nil {
			return compiled, cached, fmt.Errorf("%s: %w", set, err)
		}
		path, made, err := c.CacheModule(dir, p, m.Opts...)
		if err != nil {
			return compiled, cached, fmt.Errorf("%s: %s: %w", set, m.File, err)
		}
		if made {
			compiled++
		} else {
			cached++
		}
		if done != nil {
			done(p.Name, path)
		}
	}
	return compiled, cached, nil
}

// Source is what NVRTC compiles for m: m.File, with every header of the
// set and of cudaset (their .cuh files) for its #includes to name, those of
// m.Headers in place of the files of their names. The headers of a set may
// not take cudaset's names, and each of m.Headers replaces a file.
func Source(m Module) (cuda.Program, error) {
	src, err := fs.ReadFile(m.Sources, m.File)
	if err != nil {
		return cuda.Program{}, fmt.Errorf("module %s: %w", m.File, err)
	}
	p := cuda.Program{Name: m.File, Src: string(src)}
	sets := []fs.FS{sources}
	if m.Sources != fs.FS(sources) { // cudaset's own module has no set beside
		sets = append(sets, m.Sources)
	}
	made := map[string]string{}
	for _, h := range m.Headers {
		made[h.Name] = h.Src
	}
	seen := map[string]bool{}
	for _, files := range sets {
		names, err := fs.Glob(files, "*.cuh")
		if err != nil {
			return cuda.Program{}, fmt.Errorf("module %s: %w", m.File, err)
		}
		for _, name := range names {
			if seen[name] {
				return cuda.Program{}, fmt.Errorf("module %s: the set's header %s takes the name of cudaset's", m.File, name)
			}
			seen[name] = true
			if src, ok := made[name]; ok {
				p.Headers = append(p.Headers, cuda.Header{Name: name, Src: src})
				continue
			}
			b, err := fs.ReadFile(files, name)
			if err != nil {
				return cuda.Program{}, fmt.Errorf("module %s: %w", m.File, err)
			}
			p.Headers = append(p.Headers, cuda.Header{Name: name, Src: string(b)})
		}
	}
	for _, h := range m.Headers {
		if !seen[h.Name] {
			return cuda.Program{}, fmt.Errorf("module %s: made header %s replaces no .cuh file of the sources", m.File, h.Name)
		}
	}
	return p, nil
}

// Func is the compiled kernel name; it panics when the set has none.
func (k *Kit) Func(name string) *cuda.Func {
	f, ok := k.fn[name]
	if !ok {
		panic(k.Set + ": no kernel " + name)
	}
	return f
}

// Overlap makes the set's launches of the named kernels overlap the kernel
// before them on the stream (cuda.Device.LaunchOverlapped): each must call
// common.cuh's grid_wait before it touches what earlier kernels write or
// read. The mark is the set's own: another set launching the same shared
// kernel (the row movers) launches it as before.
func (k *Kit) Overlap(names ...string) {
	for _, name := range names {
		k.Func(name) // panics on a name the set lacks
		k.overlap[name] = true
	}
}

// NoRoom is FitShared's error when a block cannot hold a kernel's shared
// memory: Need bytes (dynamic and static) against the Have a block may
// opt in to.
type NoRoom struct{ Need, Have int }

func (e NoRoom) Error() string {
	return fmt.Sprintf("needs %d bytes of shared memory, the device gives a block %d", e.Need, e.Have)
}

// FitShared readies kernel name to launch with bytes of dynamic shared
// memory: NoRoom when that and the kernel's static shared memory exceed
// what a block may have, else the driver's error, if any.
func (k *Kit) FitShared(name string, bytes int) error {
	f := k.Func(name)
	attrs, err := f.Attrs()
	if err != nil {
		return err
	}
	if need := bytes + attrs.StaticShared; need > k.MaxShared {
		return NoRoom{Need: need, Have: k.MaxShared}
	}
	return f.SetMaxDynamicShared(bytes)
}

// Need declines the call, panicking with kernels.Unsupported, when a check
// the set adds to the ops' contract fails: a set calls it before queueing
// any work, so that the dispatch can run the call on the set's fallback
// (naive's kernels take every shape; naive has none and the panic goes on).
func (k *Kit) Need(ok bool, op kernels.Op, format string, args ...any) {
	if !ok {
		panic(kernels.Unsupported{Set: k.Set, Op: op, Why: fmt.Sprintf(format, args...)})
	}
}

// Launch runs kernel name on a 1-D grid of 1-D blocks.
func (k *Kit) Launch(name string, blocks, threads int, args ...any) {
	k.LaunchShared(name, blocks, threads, 0, args...)
}

// LaunchShared is Launch with shared bytes of dynamic shared memory per block.
func (k *Kit) LaunchShared(name string, blocks, threads, shared int, args ...any) {
	k.LaunchGrid(name, cuda.Dim3{X: uint32(blocks)}, cuda.Dim3{X: uint32(threads)}, shared, args...)
}

// LaunchGrid runs kernel name on grid blocks of block threads (a zero Y or
// Z counts as 1); a grid whose X is 0 launches nothing.
func (k *Kit) LaunchGrid(name string, grid, block cuda.Dim3, shared int, args ...any) {
	f := k.Func(name)
	switch {
	case grid.X == 0:
	case k.overlap[name]:
		k.D.LaunchOverlapped(f, grid, block, shared, args...)
	default:
		k.D.Launch(f, grid, block, shared, args...)
	}
}

// LaunchItems runs a grid-stride kernel over n items: one wave of
// BlockThreads blocks, fewer when n is small.
func (k *Kit) LaunchItems(name string, n int64, args ...any) {
	blocks := min((n+BlockThreads-1)/BlockThreads, int64(k.SMs*BlocksPerSM))
	k.Launch(name, int(blocks), BlockThreads, args...)
}

// ThreadsFor is the block for n items of per-block work: n rounded up to
// whole warps, at most BlockThreads.
func ThreadsFor(n int) int {
	t := (n + warp - 1) / warp * warp
	return max(warp, min(t, BlockThreads))
}

// Mat is a pitched matrix in device memory: element (r, c) at P + (r*Pitch
// + c) elements of DT.
type Mat struct {
	P     uintptr
	Pitch int
	DT    kernels.DType
}

// Mat is t's view as a Mat.
func (k *Kit) Mat(t *kernels.Tensor) Mat { return Mat{P: k.D.Ptr(t), Pitch: t.Pitch, DT: t.DType} }

// Sub is the matrix starting at element (r, c) of m, with m's pitch.
func (m Mat) Sub(r, c int) Mat {
	m.P += uintptr((int64(r)*int64(m.Pitch) + int64(c)) * int64(m.DT.Size()))
	return m
}

// Skip is m advanced by n elements.
func (m Mat) Skip(n int64) Mat {
	m.P += uintptr(n * int64(m.DT.Size()))
	return m
}

// Scratch is a packed [rows, cols] matrix of dt in the scratch buffer the
// set keeps under name (see cuda.Device.Scratch).
func (k *Kit) Scratch(name string, dt kernels.DType, rows, cols int) Mat {
	return Mat{P: k.D.Scratch(k.Set+"."+name, rows*cols*dt.Size()), Pitch: cols, DT: dt}
}

// ScratchTensor is Scratch as a tensor, for a launcher that runs the set's
// own ops on its temporaries (see cuda.Device.ScratchTensor).
func (k *Kit) ScratchTensor(name string, dt kernels.DType, rows, cols int) *kernels.Tensor {
	return k.D.ScratchTensor(k.Set+"."+name, dt, rows, cols)
}

// VecFor is the widest access (VecWidth or 1 elements) that every row start
// of the matrices allows when rows of cols elements are moved.
func VecFor(cols int, ms ...Mat) int {
	if cols%VecWidth != 0 {
		return 1
	}
	for _, m := range ms {
		if m.P%uintptr(VecWidth*m.DT.Size()) != 0 || m.Pitch%VecWidth != 0 {
			return 1
		}
	}
	return VecWidth
}

// IsBF16 reports whether t holds bf16: the CUDA sets' activations, and the
// only weights cuBLAS multiplies them by.
func IsBF16(t *kernels.Tensor) bool { return t != nil && t.DType == kernels.BF16 }

// CombineRows launches moe_combine: out[t] = Σ_k weight[t,k]·y[slot[t·kk+k]]
// for t < n, rows of cols, summed in f32 and rounded once; slot is the
// device array of each choice's row of y.
func (k *Kit) CombineRows(out, y Mat, slot uintptr, weight *kernels.Tensor, n, kk, cols int) {
	v := VecFor(cols, out, y)
	k.LaunchItems(VName("moe_combine", v), int64(n)*int64(cols/v), out.P, int32(out.Pitch), y.P, int32(y.Pitch), slot,
		k.D.Ptr(weight), int32(weight.Pitch), int32(n), int32(kk), int32(cols))
}

// CopyRows launches copy_rows: dst[didx[r] or r] = src[sidx[r] or r/sdiv]
// for r < rows (index pointers 0 when absent); srows bounds sidx.
func (k *Kit) CopyRows(dst Mat, didx uintptr, src Mat, sidx uintptr, sdiv, srows, rows, cols int) {
	v := VecFor(cols, dst, src)
	k.LaunchItems(copyRowsKernel(dst.DT, src.DT, v), int64(rows)*int64(cols/v),
		dst.P, int32(dst.Pitch), didx, src.P, int32(src.Pitch), sidx, int32(sdiv), int32(srows), int32(rows), int32(cols))
}

// AppendKV launches kv_append: the new rows of src (and vsrc) go into cache
// (and vcache), [B, heads, MaxSeq, dim], at the positions the device tables
// Batch.StartDev and Batch.PastDev give. vcache and vsrc may be nil.
func (k *Kit) AppendKV(cache, vcache, src, vsrc *kernels.Tensor, b *kernels.Batch, heads, dim int) {
	c, s := k.Mat(cache), k.Mat(src)
	var vc, vs Mat
	ms := []Mat{c, s}
	if vcache != nil {
		vc, vs = k.Mat(vcache), k.Mat(vsrc)
		ms = append(ms, vc, vs)
	}
	v := VecFor(dim, ms...)
	k.Launch(VName("kv_append", v), b.Tokens, ThreadsFor(heads*dim/v),
		c.P, vc.P, s.P, int32(s.Pitch), vs.P, int32(vs.Pitch), k.D.Ptr(b.StartDev), k.D.Ptr(b.PastDev),
		int32(b.Rows), int32(heads), int32(dim), int32(b.MaxSeq))
}
