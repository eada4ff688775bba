package tokenizer

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The fuzz targets hold the tokenizer to what bad input may never do: panic,
// or allocate out of proportion to its size.
//
//	go test -run "^$" -fuzz "^FuzzEncode$" -fuzztime 60s ./tokenizer/
//	go test -run "^$" -fuzz "^FuzzDecode$" -fuzztime 60s ./tokenizer/
//	go test -run "^$" -fuzz "^FuzzParse$" -fuzztime 60s ./tokenizer/

// fuzzTextLimit is the longest input FuzzEncode and FuzzDecode try: the
// fuzzer minimizes every input it finds interesting, and a long text costs
// every execution a backtracking match over it, so that a minute's run
// spends itself on a few long inputs; the code paths are reached by short
// ones (the golden tests hold the long texts).
const fuzzTextLimit = 256

// fuzzTexts seed the text targets: scripts, special tokens, bytes that are
// not UTF-8, white space runs.
var fuzzTexts = []string{
	"", "Hello world", "  leading and trailing  ", "line\nbreaks\r\n\ttabs",
	"数字 123 и кириллица", "emoji 🙂👍🏽", "<|endoftext|>hi<|im_start|>", "<｜begin▁of▁sentence｜>x",
	"don't we'll I'M", "\xff\xfe invalid \xc3", strings.Repeat("a", 250), "ſ S s",
}

// FuzzEncode encodes arbitrary text with both real tokenizers: every id is
// in the vocabulary, and decoding gives the text back as the normalizer
// (Qwen2: NFC; DeepSeek-V2: none) and the U+FFFD of invalid bytes leave it,
// unless it holds an added token made of byte-level characters.
func FuzzEncode(f *testing.F) {
	for _, s := range fuzzTexts {
		f.Add(s)
	}
	qwen, deepseek := testTokenizer(f, "qwen2"), testTokenizer(f, "deepseek-v2")
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > fuzzTextLimit {
			return
		}
		valid := strings.ToValidUTF8(text, "\uFFFD")
		for _, c := range []struct {
			name string
			tok  *Tokenizer
			want string
		}{{"qwen2", qwen, norm.NFC.String(valid)}, {"deepseek-v2", deepseek, valid}} {
			ids := mustEncodeNoSpecial(t, c.tok, text)
			for _, id := range ids {
				if id < 0 || id >= c.tok.VocabSize() {
					t.Fatalf("%s: id %d outside [0, %d)", c.name, id, c.tok.VocabSize())
				}
			}
			if hasByteAddedToken(c.tok, valid) {
				continue // such a token decodes to the bytes it spells, as in HF
			}
			if got := c.tok.Decode(ids, false); got != c.want {
				t.Errorf("%s: Decode(Encode(%q)) = %q, want %q", c.name, text, got, c.want)
			}
		}
	})
}

// FuzzDecode decodes arbitrary ids (out of range, special, splitting
// characters across tokens): Decode gives valid UTF-8, and the stream
// decoder gives the same text piece by piece.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{}, false)
	f.Add(binary.LittleEndian.AppendUint32(nil, 151643), true)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0, 0xe8, 0x03, 0, 0}, false)
	qwen, deepseek := testTokenizer(f, "qwen2"), testTokenizer(f, "deepseek-v2")
	f.Fuzz(func(t *testing.T, raw []byte, skipSpecial bool) {
		if len(raw) > fuzzTextLimit {
			return
		}
		ids := make([]int, len(raw)/4)
		for i := range ids {
			// Small ids most of the time, any int32 now and then.
			v := int32(binary.LittleEndian.Uint32(raw[4*i:]))
			if v >= 0 && v&(1<<30) == 0 {
				v %= 160_000
			}
			ids[i] = int(v)
		}
		for _, tok := range []*Tokenizer{qwen, deepseek} {
			whole := tok.Decode(ids, skipSpecial)
			if !utf8.ValidString(whole) {
				t.Fatalf("Decode(%v) = %q is not UTF-8", ids, whole)
			}
			sd := tok.NewStreamDecoder(skipSpecial)
			var b strings.Builder
			for _, id := range ids {
				b.WriteString(sd.Next(id))
			}
			b.WriteString(sd.Flush())
			if b.String() != whole {
				t.Errorf("stream decode of %v = %q, Decode %q", ids, b.String(), whole)
			}
		}
	})
}

// parseAllocFactor bounds what parsing a tokenizer.json and encoding a short
// text with it allocate: this many bytes per byte of the document, plus
// parseAllocBase. encoding/json and the regex compiler take a few tens.
const (
	parseAllocFactor = 256
	parseAllocBase   = 8 << 20
)

// fuzzDocLimit is the largest document FuzzParse tries. The fuzzer spends
// its time minimizing each new input it finds interesting, and a mutation
// of a real tokenizer.json (tens of KB) takes it minutes; small documents
// that use every section reach the same code.
const fuzzDocLimit = 4096

// fuzzDocs seed FuzzParse: small tokenizer.json documents in the shapes of
// the real ones (Qwen2's NFC and Split before ByteLevel, DeepSeek-V2's
// Split, Digits and ByteLevel with a BOS template, a SentencePiece-like
// Prepend and Replace with byte fallback), each section a kind Parse takes.
var fuzzDocs = []string{
	`{"version": "1.0", "truncation": null, "padding": null,
	"added_tokens": [{"id": 7, "content": "<|endoftext|>", "special": true, "normalized": false, "single_word": false, "lstrip": false, "rstrip": false}],
	"normalizer": {"type": "NFC"},
	"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
		{"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
		{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
	"post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	"decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	"model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
		"vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "He": 5, "ll": 6, "Ġw": 8, "w": 9}, "merges": ["H e", "l l", "Ġ w"]}}`,
	`{"version": "1.0",
	"added_tokens": [{"id": 0, "content": "<｜begin▁of▁sentence｜>", "special": true, "normalized": true, "single_word": false, "lstrip": false, "rstrip": false}],
	"normalizer": {"type": "Sequence", "normalizers": []},
	"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
		{"type": "Split", "pattern": {"Regex": "[\\r\\n]"}, "behavior": "Isolated", "invert": false},
		{"type": "Split", "pattern": {"Regex": "\\s?\\p{L}+"}, "behavior": "Isolated", "invert": false},
		{"type": "Digits", "individual_digits": true},
		{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
	"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
		"pair": [], "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0], "tokens": ["<｜begin▁of▁sentence｜>"]}}},
	"decoder": {"type": "ByteLevel"},
	"model": {"type": "BPE", "vocab": {"a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġab": 5, "1": 6}, "merges": [["a", "b"], ["Ġ", "ab"]]}}`,
	`{"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
		{"type": "Lowercase"}, {"type": "NFKD"}, {"type": "StripAccents"}, {"type": "Strip", "strip_left": true, "strip_right": false}]},
	"pre_tokenizer": null,
	"decoder": null,
	"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
		"vocab": {"<unk>": 0, "<0x41>": 1, "▁": 2, "h": 3, "i": 4, "▁h": 5, "▁hi": 6}, "merges": ["▁ h", "▁h i"]}}`,
}

// FuzzParse parses arbitrary tokenizer.json documents of up to
// fuzzDocLimit bytes: no panic, no allocation out of proportion to the
// document, and a tokenizer that parses encodes (failing only on a match
// that takes too long) and decodes.
func FuzzParse(f *testing.F) {
	for _, doc := range fuzzDocs {
		if _, err := Parse([]byte(doc)); err != nil {
			f.Fatalf("a seed does not parse: %v\n%s", err, doc)
		}
		f.Add([]byte(doc))
	}
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 2000000000, "b": 1}, "merges": []}}`))
	f.Add([]byte(`{"model": {"vocab": {}, "merges": null}, "post_processor": {"type": "TemplateProcessing",
		"single": [{"SpecialToken": {"id": "x"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"x": {"ids": [1, 2, 3]}}}}`))
	// A pattern the mutations make explode stops the encoding soon.
	defer func(d time.Duration) { matchTimeout = d }(matchTimeout)
	matchTimeout = 100 * time.Millisecond
	f.Fuzz(func(t *testing.T, doc []byte) {
		if len(doc) > fuzzDocLimit {
			return
		}
		n := allocated(func() {
			tok, err := Parse(doc)
			if err != nil {
				return
			}
			ids, err := tok.Encode("Hello, world! 123 \xff")
			if err != nil {
				if !errors.As(err, new(*MatchTimeoutError)) {
					t.Errorf("Encode: %v", err)
				}
				return
			}
			tok.Decode(ids, false)
			tok.Decode([]int{0, 1, -1, 1 << 31, tok.VocabSize() - 1}, true)
		})
		if limit := uint64(parseAllocFactor*len(doc) + parseAllocBase); n > limit {
			t.Errorf("a %d-byte document took %d bytes (limit %d)", len(doc), n, limit)
		}
	})
}
