package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/loader"
	"github.com/fuselm/fuselm/tokenizer"
)

func newTokenizeCmd() *cobra.Command {
	var model, text, file string
	var noSpecial bool
	cmd := &cobra.Command{
		Use:   "tokenize --model M (--text S | --file F)",
		Short: "Print the token ids of a text as a JSON array",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" {
				return usageError{fmt.Errorf("--model is required")}
			}
			if cmd.Flags().Changed("text") == (file != "") {
				return usageError{fmt.Errorf("give exactly one of --text or --file")}
			}
			if file != "" {
				var err error
				if text, err = readText(file); err != nil {
					return fmt.Errorf("--file: %w", err)
				}
			}
			dir, err := loader.Resolve(model)
			if err != nil {
				return err
			}
			tok, err := tokenizer.Load(dir)
			if err != nil {
				return err
			}
			encode := tok.Encode
			if noSpecial {
				encode = tok.EncodeNoSpecial
			}
			ids, err := encode(text)
			if err != nil {
				return err
			}
			if ids == nil {
				ids = []int{}
			}
			b, err := json.Marshal(ids)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "checkpoint directory or HF cache id Org/Name")
	cmd.Flags().StringVar(&text, "text", "", "text to encode")
	cmd.Flags().StringVar(&file, "file", "", "file whose whole content is encoded")
	cmd.Flags().BoolVar(&noSpecial, "no-special", false, "leave out the special tokens the post-processor adds (BOS)")
	return silence(cmd)
}
