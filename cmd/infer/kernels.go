package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/naive"
)

// archPattern is a real GPU architecture as NVRTC names it: its compute
// capability's major digits, then the minor one.
var archPattern = regexp.MustCompile(`^sm_([0-9]{1,2})([0-9])a?$`)

func newKernelsCmd() *cobra.Command {
	var arch, cache, nvrtcPath string
	var prune bool
	cmd := &cobra.Command{
		Use:   "kernels [--arch A] [--cache DIR] [--nvrtc LIB]",
		Short: "Compile the CUDA sets' kernels into the kernel cache ahead of a run, without a GPU",
		Long: `kernels compiles every NVRTC module of the naive and fused sets for the
architecture --arch into the kernel cache, as a run on such a GPU would on its
first start, and needs no GPU: only NVRTC (found as a run finds it, or --nvrtc).
A run whose kernel cache is that directory (FUSELM_KERNEL_CACHE, or the user's
cache directory) then loads them instead of compiling them; its log line
"kernels built" says how many it still compiled. Modules the cache holds
already are left as they are; with --prune the cache's other modules (of
earlier sources) are removed. The NVRTC must be the one the run will use
(the cache is keyed by its version).

` + exitRule,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cc := archPattern.FindStringSubmatch(arch)
			if cc == nil {
				return usageError{fmt.Errorf("--arch %q: want a real architecture as NVRTC names it, sm_XY or sm_XYa (sm_90a)", arch)}
			}
			if cache == "" {
				cache = cuda.CacheDir()
			}
			if cache == "" {
				return usageError{fmt.Errorf("the kernel cache is off (FUSELM_KERNEL_CACHE=off): give --cache DIR")}
			}
			if nvrtcPath == "" {
				p, err := cuda.FindNVRTC()
				if err != nil {
					return err
				}
				nvrtcPath = p
			}
			c, err := cuda.NewCompiler(nvrtcPath, arch)
			if err != nil {
				return err
			}
			major, _ := strconv.Atoi(cc[1])
			minor, _ := strconv.Atoi(cc[2])
			if archs := c.Archs(); archs != nil && !slices.Contains(archs, 10*major+minor) {
				return usageError{fmt.Errorf("--arch %s: NVRTC %d.%d does not compile for it (it takes compute capabilities %v)",
					arch, c.Version()/1000, c.Version()%1000/10, archs)}
			}
			switch want, cubin := c.DeviceArch(major, minor); {
			case !cubin:
				return usageError{fmt.Errorf("--arch %s: NVRTC %d.%d cannot compile for it (a device of compute capability %d.%d gets PTX for %s, compiled by the driver): nothing to cache",
					arch, c.Version()/1000, c.Version()%1000/10, major, minor, want)}
			case want != arch:
				return usageError{fmt.Errorf("--arch %s: a device of compute capability %d.%d compiles for %s with this NVRTC: give --arch %s", arch, major, minor, want, want)}
			}
			if err := os.MkdirAll(cache, 0o755); err != nil {
				return fmt.Errorf("kernel cache: %w", err)
			}
			sets := []struct {
				name string
				mods []cudaset.Module
			}{{"naive", naive.Modules()}, {"fused", fused.ModulesFor(arch)}}
			total := 0
			for _, s := range sets {
				total += 1 + len(s.mods) // the shared row movers, then the set's
			}
			bar := newProgress(cmd.ErrOrStderr(), false, int64(total), "compiling kernels", false)
			start, done := time.Now(), 0
			compiled, cached := 0, 0
			kept := map[string]bool{}
			for _, s := range sets {
				n, m, err := cudaset.Prebuild(c, cache, s.name, s.mods, func(_, path string) {
					kept[filepath.Base(path)] = true
					done++
					bar.Set(int64(done))
				})
				compiled, cached = compiled+n, cached+m
				if err != nil {
					bar.Done()
					return err
				}
			}
			bar.Done()
			pruned := 0
			if prune {
				if pruned, err = pruneCache(cache, kept); err != nil {
					return err
				}
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "kernel cache %s: %d modules compiled for %s by NVRTC %d.%d (%s) in %.1f s, %d there already, %d others removed\n",
				cache, compiled, arch, c.Version()/1000, c.Version()%1000/10, nvrtcPath, time.Since(start).Seconds(), cached, pruned)
			return err
		},
	}
	cmd.Flags().StringVar(&arch, "arch", "sm_90a", "the GPU architecture the runs will use (a real sm_XY[a], as NVRTC names it)")
	cmd.Flags().StringVar(&cache, "cache", "", "the kernel cache directory (default: the one a run uses)")
	cmd.Flags().StringVar(&nvrtcPath, "nvrtc", "", "NVRTC's library, libnvrtc.so.N (default: the one a run finds)")
	cmd.Flags().BoolVar(&prune, "prune", false, "remove the cache's other modules (those of earlier sources): a cache that travels with the binaries")
	return cmd
}

// pruneCache removes the kernel cache files in dir that kept does not name,
// and says how many.
func pruneCache(dir string, kept map[string]bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("kernel cache: %w", err)
	}
	n := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || kept[e.Name()] || !cuda.IsCacheFile(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return n, fmt.Errorf("kernel cache: %w", err)
		}
		n++
	}
	return n, nil
}
