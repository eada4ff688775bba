package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// variants is testdata/tokenizer/variants_golden.json.gz, written by
// scripts/hf_tokenizer_variants.py with HF `tokenizers`: tokenizer.json
// variants (a real file with some top-level keys replaced, or a small BPE
// given whole) and HF's output for each over a fuzz corpus.
type variants struct {
	Version  string   `json:"tokenizers_version"`
	Texts    []string `json:"texts"`
	Variants []struct {
		Name      string                     `json:"name"`
		Base      *string                    `json:"base"`
		Set       map[string]json.RawMessage `json:"set"`
		Error     string                     `json:"error"`
		VocabSize int                        `json:"vocab_size"`
		Results   []goldenRow                `json:"results"`
	} `json:"variants"`
}

// variantsPath may be overridden with FUSELM_TOKENIZER_VARIANTS (a
// larger run of hf_tokenizer_variants.py, say).
func variantsPath() string {
	if p := os.Getenv("FUSELM_TOKENIZER_VARIANTS"); p != "" {
		return p
	}
	return filepath.Join("..", "testdata", "tokenizer", "variants_golden.json.gz")
}

func TestTokenizerVariants(t *testing.T) {
	path := variantsPath()
	if _, err := os.Stat(path); os.IsNotExist(err) {
		t.Skipf("%s absent: run scripts/hf_tokenizer_variants.py where HF tokenizers is installed", path)
	}
	var g variants
	if err := json.Unmarshal(readGzip(t, path), &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	bases := map[string]map[string]json.RawMessage{}
	for _, v := range g.Variants {
		t.Run(v.Name, func(t *testing.T) {
			top := map[string]json.RawMessage{}
			if v.Base != nil {
				if bases[*v.Base] == nil {
					var m map[string]json.RawMessage
					if err := json.Unmarshal(testJSON(t, *v.Base), &m); err != nil {
						t.Fatal(err)
					}
					bases[*v.Base] = m
				}
				for k, raw := range bases[*v.Base] {
					top[k] = raw
				}
			}
			for k, raw := range v.Set {
				top[k] = raw
			}
			if v.Name == "merges-as-pairs" { // the file names the change, too large to hold
				top["model"] = mergesAsPairs(t, bases[*v.Base]["model"])
			}
			data, err := json.Marshal(top)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := Parse(data)
			if v.Error != "" {
				if err == nil {
					t.Errorf("HF fails to load it (%s); Parse does not", v.Error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != v.VocabSize {
				t.Errorf("VocabSize = %d, HF %d", tok.VocabSize(), v.VocabSize)
			}
			bad := 0
			for i, r := range v.Results {
				text := g.Texts[i]
				label := label(i, text)
				if got := mustEncode(t, tok, text); !slices.Equal(got, r.IDs) {
					t.Errorf("%s: Encode\n got %v\nwant %v", label, head(got), head(r.IDs))
					bad++
				}
				if got := mustEncodeNoSpecial(t, tok, text); !slices.Equal(got, r.IDsNoSpecial) {
					t.Errorf("%s: EncodeNoSpecial\n got %v\nwant %v", label, head(got), head(r.IDsNoSpecial))
					bad++
				}
				if got := tok.Decode(r.IDs, false); got != *r.Decoded {
					t.Errorf("%s: Decode(ids, false) = %q, want %q", label, cut(got), cut(*r.Decoded))
					bad++
				}
				if got := tok.Decode(r.IDs, true); got != *r.DecodedSkipSpecial {
					t.Errorf("%s: Decode(ids, true) = %q, want %q", label, cut(got), cut(*r.DecodedSkipSpecial))
					bad++
				}
				for _, skip := range []bool{false, true} {
					s := tok.NewStreamDecoder(skip)
					var b strings.Builder
					for _, id := range r.IDs {
						b.WriteString(s.Next(id))
					}
					b.WriteString(s.Flush())
					if got, want := b.String(), tok.Decode(r.IDs, skip); got != want {
						t.Errorf("%s: stream decoding (skip %v) = %q, Decode %q", label, skip, cut(got), cut(want))
						bad++
					}
				}
				if bad > 20 {
					t.Fatal("too many differences")
				}
			}
		})
	}
}

// mergesAsPairs rewrites a BPE model's "a b" merges as ["a", "b"] pairs.
func mergesAsPairs(t *testing.T, raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var merges []string
	if err := json.Unmarshal(m["merges"], &merges); err != nil {
		t.Fatal(err)
	}
	pairs := make([][]string, len(merges))
	for i, s := range merges {
		pairs[i] = strings.SplitN(s, " ", 2)
	}
	var err error
	if m["merges"], err = json.Marshal(pairs); err != nil {
		t.Fatal(err)
	}
	if raw, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	return raw
}
