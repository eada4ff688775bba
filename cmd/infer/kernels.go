package main

import (
	"fmt"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
	"github.com/fuselm/fuselm/kernels/fused"
	"github.com/fuselm/fuselm/kernels/naive"
)

// archPattern is a real GPU architecture as NVRTC names it.
var archPattern = regexp.MustCompile(`^sm_[0-9]{2,3}a?$`)

func newKernelsCmd() *cobra.Command {
	var arch, cache, nvrtcPath string
	cmd := &cobra.Command{
		Use:   "kernels [--arch A] [--cache DIR] [--nvrtc LIB]",
		Short: "Compile the CUDA sets' kernels into the kernel cache ahead of a run, without a GPU",
		Long: `kernels compiles every NVRTC module of the naive and fused sets for the
architecture --arch into the kernel cache, as a run on such a GPU would on its
first start, and needs no GPU: only NVRTC (found as a run finds it, or --nvrtc).
A run whose kernel cache is that directory (FUSELM_KERNEL_CACHE, or the user's
cache directory) then loads them instead of compiling them; its log line
"kernels built" says how many it still compiled. Modules the cache holds
already are left as they are. The NVRTC must be the one the run will use
(the cache is keyed by its version).

` + exitRule,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !archPattern.MatchString(arch) {
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
			for _, s := range sets {
				n, m, err := cudaset.Prebuild(c, cache, s.name, s.mods, func(string) { done++; bar.Set(int64(done)) })
				compiled, cached = compiled+n, cached+m
				if err != nil {
					bar.Done()
					return err
				}
			}
			bar.Done()
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "kernel cache %s: %d modules compiled for %s by NVRTC %d.%d (%s) in %.1f s, %d there already\n",
				cache, compiled, arch, c.Version()/1000, c.Version()%1000/10, nvrtcPath, time.Since(start).Seconds(), cached)
			return err
		},
	}
	cmd.Flags().StringVar(&arch, "arch", "sm_90a", "the GPU architecture the runs will use (a real sm_XY[a], as NVRTC names it)")
	cmd.Flags().StringVar(&cache, "cache", "", "the kernel cache directory (default: the one a run uses)")
	cmd.Flags().StringVar(&nvrtcPath, "nvrtc", "", "NVRTC's library, libnvrtc.so.N (default: the one a run finds)")
	return cmd
}
