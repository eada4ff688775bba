package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// GenerationConfig is generation_config.json: the token ids generation
// needs and the sampling defaults the model ships with. Absent or null fields
// are nil (EOS: empty).
type GenerationConfig struct {
	BOS *int  // bos_token_id
	EOS []int // eos_token_id: an int or a list
	PAD *int  // pad_token_id

	DoSample          *bool    // do_sample
	Temperature       *float64 // temperature
	TopP              *float64 // top_p
	TopK              *int     // top_k
	RepetitionPenalty *float64 // repetition_penalty
	MaxNewTokens      *int     // max_new_tokens
	MaxLength         *int     // max_length
}

// generationConfigFile is the name of the generation config in a model
// directory.
const generationConfigFile = "generation_config.json"

// LoadGenerationConfig reads dir/generation_config.json. A directory without
// one gives nil, nil.
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	path := filepath.Join(dir, generationConfigFile)
	data, err := ReadJSONFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("loader: %w", err)
	}
	g, err := ParseGenerationConfig(data)
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", path, err)
	}
	return g, nil
}

// ParseGenerationConfig parses the bytes of a generation_config.json.
func ParseGenerationConfig(data []byte) (*GenerationConfig, error) {
	o, err := cfgParseObject(data)
	if err != nil {
		return nil, err
	}
	g := &GenerationConfig{}
	if g.BOS, err = o.optTokenID("bos_token_id"); err != nil {
		return nil, err
	}
	if g.EOS, err = o.tokenIDs("eos_token_id"); err != nil {
		return nil, err
	}
	if g.PAD, err = o.optTokenID("pad_token_id"); err != nil {
		return nil, err
	}
	if o.present("do_sample") {
		v, err := o.optBool("do_sample", false)
		if err != nil {
			return nil, err
		}
		g.DoSample = &v
	}
	for _, f := range []struct {
		key string
		dst **float64
	}{
		{"temperature", &g.Temperature},
		{"top_p", &g.TopP},
		{"repetition_penalty", &g.RepetitionPenalty},
	} {
		v, ok, err := o.maybeFloat(f.key)
		if err != nil {
			return nil, err
		}
		if ok {
			*f.dst = &v
		}
	}
	for _, f := range []struct {
		key string
		dst **int
	}{
		{"top_k", &g.TopK},
		{"max_new_tokens", &g.MaxNewTokens},
		{"max_length", &g.MaxLength},
	} {
		v, ok, err := o.maybeInt(f.key)
		if err != nil {
			return nil, err
		}
		if ok {
			*f.dst = &v
		}
	}
	return g, nil
}
