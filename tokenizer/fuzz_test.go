package tokenizer

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The fuzz targets hold the tokenizer to what bad input may never do: panic,
// or allocate out of proportion to its size.
//
//	go test -fuzz=FuzzEncode -fuzztime=3m ./tokenizer/
//	go test -fuzz=FuzzDecode -fuzztime=3m ./tokenizer/
//	go test -fuzz=FuzzParse -fuzztime=3m ./tokenizer/

// fuzzTexts seed the text targets: scripts, special tokens, bytes that are
// not UTF-8, white space runs.
var fuzzTexts = []string{
	"", "Hello world", "  leading and trailing  ", "line\nbreaks\r\n\ttabs",
	"数字 123 и кириллица", "emoji 🙂👍🏽", "<|endoftext|>hi<|im_start|>", "<｜begin▁of▁sentence｜>x",
	"don't we'll I'M", "\xff\xfe invalid \xc3", strings.Repeat("a", 300), "ſ S s",
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

// FuzzParse parses arbitrary tokenizer.json documents, seeded with the tiny
// checkpoints' real files: no panic, no allocation out of proportion to the
// document, and a tokenizer that parses encodes and decodes.
func FuzzParse(f *testing.F) {
	for _, m := range []string{"qwen2-tiny", "deepseek-v2-tiny"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", "models", m, "tokenizer.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 2000000000, "b": 1}, "merges": []}}`))
	f.Add([]byte(`{"model": {"vocab": {}, "merges": null}, "post_processor": {"type": "TemplateProcessing",
		"single": [{"SpecialToken": {"id": "x"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"x": {"ids": [1, 2, 3]}}}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
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
