package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/loader"
	"github.com/fuselm/fuselm/model"
)

func newInspectCmd() *cobra.Command {
	var modelArg string
	cmd := &cobra.Command{
		Use:   "inspect --model M",
		Short: "Print a checkpoint's architecture, size and KV-cache cost, and whether infer can run it",
		Long: `inspect prints a checkpoint's architecture, its tensors by dtype, its size and
the KV cache a token takes, then checks it as infer would before running it
(every tensor present, with its shape and a supported dtype): when infer could
not run it, inspect says why on stderr and exits 1.

` + exitRule,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if modelArg == "" {
				return usageError{fmt.Errorf("--model is required")}
			}
			dir, err := loader.Resolve(modelArg)
			if err != nil {
				return err
			}
			cfg, err := loader.LoadConfig(dir)
			if err != nil {
				return err
			}
			w, err := loader.OpenWeights(dir)
			if err != nil {
				return err
			}
			defer w.Close()
			checkErr := model.Check(cfg, w)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			row := func(k string, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }
			row("directory", "%s", dir)
			row("architecture", "%s (%s)", cfg.Arch, cfg.ModelType)
			row("parameters", "%s (%d)", human(model.ParamCount(cfg)), model.ParamCount(cfg))
			dtype := cfg.DType
			if dtype == "" {
				dtype = "not given"
			}
			row("dtype", "%s (config.json)", dtype)
			row("tensors", "%d (%s): %s", len(w.Names()), model.Bytes(w.TotalBytes()), tensorsByDType(w))
			row("layers", "%d, hidden %d, vocab %d, max positions %d", cfg.NumLayers, cfg.HiddenSize, cfg.VocabSize, cfg.MaxPositions)
			row("attention", "%d heads, %d kv heads, head dim %d", cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim)
			row("rope", "%s, theta %g, dim %d", cfg.Rope.Type, cfg.Rope.Theta, cfg.Rope.Dim)
			if d := cfg.DeepSeek; d != nil {
				row("mla", "q_lora_rank %d, kv_lora_rank %d, nope %d, rope %d, v %d", d.QLoraRank, d.KVLoraRank, d.QKNopeHeadDim, d.QKRopeHeadDim, d.VHeadDim)
				row("moe", "%d routed + %d shared experts, top %d (%s), intermediate %d, first %d layers dense",
					d.NRoutedExperts, d.NSharedExperts, d.NumExpertsPerTok, d.TopkMethod, d.MoEIntermediateSize, d.FirstKDenseReplace)
			} else {
				row("mlp", "intermediate %d", cfg.IntermediateSize)
			}
			if checkErr == nil {
				row("kv cache / token", "%s in bf16 (cuda), %s in f32 (cpu)",
					model.Bytes(model.KVBytesPerToken(cfg, kernels.BF16)), model.Bytes(model.KVBytesPerToken(cfg, kernels.F32)))
				row("infer can run it", "yes")
			} else {
				row("infer can run it", "no (why: below)")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return checkErr
		},
	}
	cmd.Flags().StringVar(&modelArg, "model", "", "checkpoint directory or HF cache id Org/Name")
	return silence(cmd)
}

// tensorsByDType counts a checkpoint's tensors by dtype, as the safetensors
// header spells it, with their bytes when there are several dtypes:
// "290 BF16 (14.19 GiB), 1 F32 (4.0 KiB)", or "89 F32".
func tensorsByDType(w *loader.Weights) string {
	count := map[string]int{}
	size := map[string]int64{}
	for _, n := range w.Names() {
		t, _ := w.Get(n)
		count[t.SafeDType]++
		size[t.SafeDType] += int64(len(t.Data))
	}
	var parts []string
	for _, dt := range slices.Sorted(maps.Keys(count)) {
		p := fmt.Sprintf("%d %s", count[dt], dt)
		if len(count) > 1 {
			p += fmt.Sprintf(" (%s)", model.Bytes(size[dt]))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func human(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
