package main

import (
	"fmt"
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
		Short: "Print a checkpoint's architecture, size and KV-cache cost",
		Args:  cobra.NoArgs,
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
			dtypes := map[string]int{}
			for _, n := range w.Names() {
				t, _ := w.Get(n)
				dtypes[t.SafeDType]++
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			row := func(k string, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }
			row("directory", "%s", dir)
			row("architecture", "%s (%s)", cfg.Arch, cfg.ModelType)
			row("parameters", "%s (%d)", human(model.ParamCount(cfg)), model.ParamCount(cfg))
			row("dtype", "%s (config), tensors: %v", cfg.DType, dtypes)
			row("tensors", "%d, %s", len(w.Names()), humanBytes(w.TotalBytes()))
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
			row("kv cache / token", "%s in bf16 (cuda), %s in f32 (cpu)",
				humanBytes(model.KVBytesPerToken(cfg, kernels.BF16)), humanBytes(model.KVBytesPerToken(cfg, kernels.F32)))
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&modelArg, "model", "", "checkpoint directory or HF cache id Org/Name")
	return silence(cmd)
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

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
