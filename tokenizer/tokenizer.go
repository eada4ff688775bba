// Package tokenizer is Hugging Face's tokenizer.json in pure Go: the BPE
// model with its normalizers, pre-tokenizers, post-processors and decoders,
// giving the ids HF `tokenizers` gives for the same file.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/fuselm/fuselm/loader"
)

// Tokenizer is a Hugging Face tokenizer.json (a BPE model with its
// normalizer, pre-tokenizer, post-processor and decoder) in pure Go. Encode
// gives the ids HF `tokenizers` gives for the same file. It is safe for
// concurrent use.
//
// The pipeline is HF's: added tokens are split out of the raw text first
// (those with normalized=false), each remaining piece is normalized and
// searched for the normalized=true added tokens, the rest is pre-tokenized
// into words, each word is encoded by BPE, and the post-processor adds the
// special tokens around the result.
type Tokenizer struct {
	normalizer   normalizer    // nil: none
	preTokenizer preTokenizer  // nil: none
	model        *bpe          // the BPE model
	post         postProcessor // nil: none
	decoder      decoder       // nil: tokens joined with spaces
	added        *addedVocab   // added and special tokens

	vocabSize int   // largest id + 1
	bos       int   // -1: none
	eos       []int // ids that end generation
	addBOS    bool  // whether prompts start with BOS
}

// The files Load reads from a model directory.
const (
	tokenizerFile       = "tokenizer.json"
	tokenizerConfigFile = "tokenizer_config.json"
)

// Load reads dir/tokenizer.json and, when present beside it,
// tokenizer_config.json and generation_config.json for the BOS and EOS tokens.
func Load(dir string) (*Tokenizer, error) {
	path := filepath.Join(dir, tokenizerFile)
	data, err := loader.ReadJSONFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	cfgPath := filepath.Join(dir, tokenizerConfigFile)
	var cfg *tokenizerConfig
	if data, err := loader.ReadJSONFile(cfgPath); err == nil {
		if cfg, err = parseConfig(data); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", cfgPath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	gen, err := loader.LoadGenerationConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := t.setBOSEOS(cfg, gen); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", cfgPath, err)
	}
	return t, nil
}

// Parse parses the bytes of a tokenizer.json. BOS is the special
// token the post-processor puts first, if any; EOS is empty.
func Parse(tokenizerJSON []byte) (*Tokenizer, error) {
	t, err := parse(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", tokenizerFile, err)
	}
	if err := t.setBOSEOS(nil, nil); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", tokenizerFile, err)
	}
	return t, nil
}

// Encode gives the ids of text as HF's tokenizer.encode(text) does, with the
// special tokens the post-processor adds (DeepSeek's BOS, say). It fails,
// with a *MatchTimeoutError, only when a pattern of the tokenizer takes
// longer than its bound to match.
func (t *Tokenizer) Encode(text string) ([]int, error) { return t.encode(text, true) }

// EncodeNoSpecial gives the ids of text without the post-processor's special
// tokens (add_special_tokens=False). Special tokens written in the text are
// still recognised. It fails as Encode does.
func (t *Tokenizer) EncodeNoSpecial(text string) ([]int, error) { return t.encode(text, false) }

// Decode turns ids back into text, leaving out special tokens when
// skipSpecial is set. Unknown ids are skipped; bytes that do not form valid
// UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	var buf []byte
	n := 0
	for _, id := range ids {
		tok, ok := t.decodable(id, skipSpecial)
		if !ok {
			continue
		}
		buf = t.appendTokenBytes(buf, tok, n == 0)
		n++
	}
	s, _ := lossyUTF8(buf, true)
	return s
}

// VocabSize is the largest token id plus one, added tokens included.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS is the beginning-of-sequence token: tokenizer_config.json's bos_token
// when that file names one (null there means none), else
// generation_config.json's bos_token_id, else the special token the
// post-processor puts first. Encode already adds it where the
// post-processor does.
func (t *Tokenizer) BOS() (int, bool) { return t.bos, t.bos >= 0 }

// AddBOS reports whether prompts start with BOS: tokenizer_config.json's
// add_bos_token when given, else whether Encode's post-processor adds it.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// EOS is the ids that end generation: generation_config.json's eos_token_id
// (an int or a list) when present, else tokenizer_config.json's eos_token.
func (t *Tokenizer) EOS() []int { return append([]int(nil), t.eos...) }

// IsSpecial reports whether id is a special added token (skipped by
// Decode(ids, true)).
func (t *Tokenizer) IsSpecial(id int) bool {
	a, ok := t.added.byID[id]
	return ok && a.special
}

func (t *Tokenizer) encode(text string, addSpecial bool) (ids []int, err error) {
	defer catchMatchFailure(&err, "tokenizer: "+tokenizerFile+": ")
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	for _, sp := range t.added.extract(text, t.normalizer) {
		if sp.id >= 0 {
			ids = append(ids, sp.id)
			continue
		}
		words := []string{sp.text}
		if t.preTokenizer != nil {
			words = t.preTokenizer.preTokenize(words)
		}
		for _, w := range words {
			ids = t.model.tokenize(w, ids)
		}
	}
	if t.post != nil {
		ids = t.post.process(ids, addSpecial)
	}
	return ids, nil
}

// decodable is the token string of id as Decode uses it (an added token's
// content, normalized if the token is, else the model's vocabulary entry),
// and false for ids Decode leaves out. As in HF, a special token is skipped
// when that string is the content of a special token.
func (t *Tokenizer) decodable(id int, skipSpecial bool) (string, bool) {
	var tok string
	if a, ok := t.added.byID[id]; ok {
		tok = a.decoded
	} else if tok, ok = t.model.token(id); !ok {
		return "", false
	}
	if skipSpecial && t.added.special[tok] {
		return "", false
	}
	return tok, true
}

// appendTokenBytes appends the bytes a token decodes to; first says whether
// it is the first token decoded.
func (t *Tokenizer) appendTokenBytes(buf []byte, tok string, first bool) []byte {
	if t.decoder == nil {
		// HF joins the tokens with spaces when there is no decoder.
		if !first {
			buf = append(buf, ' ')
		}
		return append(buf, tok...)
	}
	return t.decoder.appendBytes(buf, tok)
}

// fileJSON is the top level of tokenizer.json.
type fileJSON struct {
	Version       string          `json:"version"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedTokenDef `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

func parse(data []byte) (t *Tokenizer, err error) {
	defer catchMatchFailure(&err, "") // the normalizer runs on the added tokens
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if f.Version != "" && f.Version != "1.0" {
		return nil, fmt.Errorf("version %q not supported (want 1.0)", f.Version)
	}
	if !isNull(f.Truncation) {
		return nil, errors.New("truncation is set; truncation is not supported")
	}
	if !isNull(f.Padding) {
		var p struct {
			Strategy json.RawMessage `json:"strategy"`
		}
		// Padding to the longest of a batch leaves a single encoding as it is.
		if json.Unmarshal(f.Padding, &p) != nil || string(bytes.TrimSpace(p.Strategy)) != `"BatchLongest"` {
			return nil, errors.New("padding to a fixed length is set; padding is not supported")
		}
	}
	if isNull(f.Model) {
		return nil, errors.New("model missing")
	}
	t = &Tokenizer{bos: -1}
	if t.model, err = parseBPE(f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.preTokenizer, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.decoder, err = parseDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t.added = newAddedVocab(f.AddedTokens, t.model, t.normalizer)
	if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	t.vocabSize = t.model.maxID + 1
	for id := range t.added.byID {
		t.vocabSize = max(t.vocabSize, id+1)
	}
	return t, nil
}

// tokenID is the id of a token string: an added token, else the model's.
func (t *Tokenizer) tokenID(tok string) (int, bool) {
	if id, ok := t.added.byContent[tok]; ok {
		return id, true
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// tokenizerConfig is what the tokenizer reads from tokenizer_config.json.
type tokenizerConfig struct {
	bos, eos         configToken
	addBOS, addBOSOK bool
}

// configToken is a bos_token or eos_token entry: absent, null, a string
// or an object with "content".
type configToken struct {
	present bool   // the key is there (maybe null)
	content string // "" for null
}

func parseConfig(data []byte) (*tokenizerConfig, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	c := &tokenizerConfig{}
	var err error
	if c.bos, err = configTokenOf(m, "bos_token"); err != nil {
		return nil, err
	}
	if c.eos, err = configTokenOf(m, "eos_token"); err != nil {
		return nil, err
	}
	if raw, ok := m["add_bos_token"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &c.addBOS); err != nil {
			return nil, fmt.Errorf("add_bos_token: want true or false, got %s", short(raw))
		}
		c.addBOSOK = true
	}
	return c, nil
}

func configTokenOf(m map[string]json.RawMessage, key string) (configToken, error) {
	raw, ok := m[key]
	if !ok {
		return configToken{}, nil
	}
	tok := configToken{present: true}
	if isNull(raw) {
		return tok, nil
	}
	if err := json.Unmarshal(raw, &tok.content); err == nil {
		return tok, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return tok, fmt.Errorf("%s: want a string or an object with \"content\", got %s", key, short(raw))
	}
	tok.content = *obj.Content
	return tok, nil
}

// setBOSEOS settles BOS, EOS and AddBOS from the two config files (either
// may be nil).
func (t *Tokenizer) setBOSEOS(cfg *tokenizerConfig, gen *loader.GenerationConfig) error {
	lead := -1 // the special token the post-processor puts first
	if t.post != nil {
		if ids := t.post.process(nil, true); len(ids) > 0 {
			lead = ids[0]
		}
	}
	t.bos, t.addBOS = lead, lead >= 0
	switch {
	case cfg != nil && cfg.bos.present:
		t.bos = -1
		if cfg.bos.content != "" {
			id, ok := t.tokenID(cfg.bos.content)
			if !ok {
				return fmt.Errorf("bos_token %q is not in tokenizer.json's vocabulary", cfg.bos.content)
			}
			t.bos = id
		}
	case gen != nil && gen.BOS != nil:
		t.bos = *gen.BOS
	}
	if cfg != nil && cfg.addBOSOK {
		t.addBOS = cfg.addBOS && t.bos >= 0
	}
	t.eos = nil
	switch {
	case gen != nil && len(gen.EOS) > 0:
		t.eos = append(t.eos, gen.EOS...)
	case cfg != nil && cfg.eos.content != "":
		id, ok := t.tokenID(cfg.eos.content)
		if !ok {
			return fmt.Errorf("eos_token %q is not in tokenizer.json's vocabulary", cfg.eos.content)
		}
		t.eos = []int{id}
	}
	return nil
}

// isNull reports whether a JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// short is raw JSON cut to a length fit for an error message.
func short(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// typed reads the "type" of a tokenizer.json component.
func typed(section string, raw json.RawMessage) (string, error) {
	var h struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", fmt.Errorf("%s: want an object with a \"type\", got %s", section, short(raw))
	}
	return h.Type, nil
}
