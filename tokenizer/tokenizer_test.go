package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// The real tokenizer files, gzipped under testdata/tokenizer.
var testCache = struct {
	sync.Mutex
	m map[string]*Tokenizer
}{m: map[string]*Tokenizer{}}

func testJSON(t testing.TB, name string) []byte {
	t.Helper()
	return readGzip(t, filepath.Join("..", "testdata", "tokenizer", name+".tokenizer.json.gz"))
}

// readGzip is the uncompressed content of the gzip file at path.
func readGzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return data
}

// testTokenizer is the real tokenizer "qwen2" or "deepseek-v2", parsed once.
func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	testCache.Lock()
	defer testCache.Unlock()
	if tok := testCache.m[name]; tok != nil {
		return tok
	}
	tok, err := Parse(testJSON(t, name))
	if err != nil {
		t.Fatal(err)
	}
	testCache.m[name] = tok
	return tok
}

func label(i int, text string) string { return fmt.Sprintf("text %d %q", i, cut(text)) }

func cut(s string) string {
	if len(s) <= 80 {
		return s
	}
	return s[:80] + "..."
}

func head(ids []int) string {
	if len(ids) <= 24 {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v... (%d ids)", ids[:24], len(ids))
}

// mustEncode is tok.Encode(text), failing t on an error.
func mustEncode(t testing.TB, tok *Tokenizer, text string) []int {
	t.Helper()
	ids, err := tok.Encode(text)
	if err != nil {
		t.Errorf("Encode(%q): %v", text, err)
	}
	return ids
}

// mustEncodeNoSpecial is tok.EncodeNoSpecial(text), failing t on an error.
func mustEncodeNoSpecial(t testing.TB, tok *Tokenizer, text string) []int {
	t.Helper()
	ids, err := tok.EncodeNoSpecial(text)
	if err != nil {
		t.Errorf("EncodeNoSpecial(%q): %v", text, err)
	}
	return ids
}

// check compares the ids of texts with ids derived by hand from the
// vocabulary and the pre-tokenizer regexes.
func check(t *testing.T, tok *Tokenizer, special bool, cases map[string][]int) {
	t.Helper()
	for text, want := range cases {
		var got []int
		if special {
			got = mustEncode(t, tok, text)
		} else {
			got = mustEncodeNoSpecial(t, tok, text)
		}
		if !slices.Equal(got, want) {
			t.Errorf("encode %q = %v, want %v", text, got, want)
		}
	}
}

func TestTokenizerQwen2(t *testing.T) {
	tok := testTokenizer(t, "qwen2")
	// Whole words that are vocabulary entries; Qwen2's regex takes digits one
	// at a time (\p{N}); "\n" is Ċ (198); specials are split out first.
	cases := map[string][]int{
		"hello":                             {14990},
		" world":                            {1879},
		"hello world":                       {14990, 1879},
		"Hello, world!":                     {9707, 11, 1879, 0},
		"12345":                             {16, 17, 18, 19, 20},
		"<|im_start|>user\nhi<|im_end|>":    {151644, 872, 198, 6023, 151645},
		"hi<|endoftext|><|endoftext|>hello": {6023, 151643, 151643, 14990},
		"":                                  nil,
	}
	check(t, tok, true, cases) // the ByteLevel post-processor adds nothing
	check(t, tok, false, cases)
	if got := tok.VocabSize(); got != 151665 {
		t.Errorf("VocabSize = %d, want 151665", got)
	}
	if id, ok := tok.BOS(); ok {
		t.Errorf("BOS = %d, want none", id)
	}
	for id, want := range map[int]bool{151643: true, 151645: true, 151657: false, 14990: false, -1: false} {
		if got := tok.IsSpecial(id); got != want {
			t.Errorf("IsSpecial(%d) = %v, want %v", id, got, want)
		}
	}
	ids := []int{151644, 872, 198, 6023, 151645, 151657}
	if got, want := tok.Decode(ids, false), "<|im_start|>user\nhi<|im_end|><tool_call>"; got != want {
		t.Errorf("Decode(..., false) = %q, want %q", got, want)
	}
	if got, want := tok.Decode(ids, true), "user\nhi<tool_call>"; got != want {
		t.Errorf("Decode(..., true) = %q, want %q", got, want)
	}
	if got := tok.Decode([]int{14990, 1 << 30, -5, 1879}, false); got != "hello world" {
		t.Errorf("Decode with unknown ids = %q, want %q", got, "hello world")
	}
}

func TestTokenizerDeepseekV2(t *testing.T) {
	tok := testTokenizer(t, "deepseek-v2")
	// Digits splits every digit; "ö" is an added token (100003) matched in
	// the text; the template puts BOS (100000) first.
	check(t, tok, false, map[string][]int{
		"12345":  {16, 17, 18, 19, 20},
		"Hello":  {17464},
		" world": {1843},
		"hello":  {31539},
		"ö":      {100003},
		"<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>": {100000, 4824, 100001},
		"": nil,
	})
	check(t, tok, true, map[string][]int{
		"12345":                   {100000, 16, 17, 18, 19, 20},
		"<｜begin▁of▁sentence｜>hi": {100000, 100000, 4824},
		"":                        {100000},
	})
	if id, ok := tok.BOS(); !ok || id != 100000 {
		t.Errorf("BOS = %d, %v, want 100000", id, ok)
	}
	if got := tok.VocabSize(); got != 100015 {
		t.Errorf("VocabSize = %d, want 100015", got)
	}
	// "ö" stands for byte 0xF6 in the byte-level alphabet, so HF decodes the
	// added token to U+FFFD.
	if got, want := tok.Decode([]int{100000, 31539, 100003}, false), "<｜begin▁of▁sentence｜>hello\uFFFD"; got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
	if got, want := tok.Decode([]int{100000, 31539, 100001}, true), "hello"; got != want {
		t.Errorf("Decode skipping specials = %q, want %q", got, want)
	}
}

// TestTokenizerConfigFiles checks BOS and EOS read from tokenizer_config.json
// and generation_config.json beside tokenizer.json.
func TestTokenizerConfigFiles(t *testing.T) {
	qwen := testJSON(t, "qwen2")
	qwenCfg, err := os.ReadFile(filepath.Join("..", "testdata", "tokenizer", "qwen2.tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(dir, name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	load := func(dir string) *Tokenizer {
		t.Helper()
		tok, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	dir := t.TempDir()
	write(dir, "tokenizer.json", qwen)
	write(dir, "tokenizer_config.json", qwenCfg)
	tok := load(dir)
	if got := tok.EOS(); !slices.Equal(got, []int{151645}) {
		t.Errorf("EOS from tokenizer_config.json = %v, want [151645]", got)
	}
	if id, ok := tok.BOS(); ok || tok.AddBOS() {
		t.Errorf("BOS = %d, %v, AddBOS = %v; want none (bos_token null)", id, ok, tok.AddBOS())
	}
	write(dir, "generation_config.json", []byte(`{"bos_token_id": 151643, "eos_token_id": [151645, 151643]}`))
	tok = load(dir)
	if got := tok.EOS(); !slices.Equal(got, []int{151645, 151643}) {
		t.Errorf("EOS from generation_config.json = %v, want [151645 151643]", got)
	}
	if id, ok := tok.BOS(); ok {
		t.Errorf("BOS = %d; want none: tokenizer_config.json's null wins", id)
	}

	dir = t.TempDir()
	write(dir, "tokenizer.json", qwen)
	write(dir, "tokenizer_config.json", []byte(`{"bos_token": {"content": "<|endoftext|>", "lstrip": false},
		"eos_token": "<|endoftext|>", "add_bos_token": true}`))
	tok = load(dir)
	if id, ok := tok.BOS(); !ok || id != 151643 || !tok.AddBOS() {
		t.Errorf("BOS = %d, %v, AddBOS = %v; want 151643, true, true", id, ok, tok.AddBOS())
	}
	if got := tok.EOS(); !slices.Equal(got, []int{151643}) {
		t.Errorf("EOS = %v, want [151643]", got)
	}
	write(dir, "generation_config.json", []byte(`{"eos_token_id": 151645}`))
	if got := load(dir).EOS(); !slices.Equal(got, []int{151645}) {
		t.Errorf("EOS = %v, want [151645]", got)
	}

	dir = t.TempDir()
	write(dir, "tokenizer.json", qwen)
	write(dir, "tokenizer_config.json", []byte(`{"eos_token": "<|nope|>"}`))
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("unknown eos_token: err = %v, want one naming tokenizer_config.json", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("missing tokenizer.json: err = %v", err)
	}
}

func TestTokenizerStreamDecoder(t *testing.T) {
	tok := testTokenizer(t, "qwen2")
	// Both characters are absent from the vocabulary as wholes, so BPE
	// leaves them in byte-level pieces that end mid character.
	for _, ch := range []string{"🫠", "龘", "𓀀"} {
		ids := mustEncodeNoSpecial(t, tok, ch)
		if len(ids) < 2 {
			t.Fatalf("%q encodes to %v; want it split across tokens", ch, ids)
		}
		s := tok.NewStreamDecoder(false)
		for i, id := range ids {
			got := s.Next(id)
			want := ""
			if i == len(ids)-1 {
				want = ch
			}
			if got != want {
				t.Errorf("%q: Next(%d) after %d ids = %q, want %q", ch, id, i, got, want)
			}
		}
		if rest := s.Flush(); rest != "" {
			t.Errorf("%q: Flush = %q, want empty", ch, rest)
		}
	}

	text := "<|im_start|>user\nÉmoji 🫠 and 龘𓀀 and 中文 done<|im_end|>"
	ids := mustEncode(t, tok, text)
	for _, skip := range []bool{false, true} {
		s := tok.NewStreamDecoder(skip)
		var b strings.Builder
		for _, id := range ids {
			piece := s.Next(id)
			if !utf8.ValidString(piece) {
				t.Errorf("Next returned invalid UTF-8 %q", piece)
			}
			b.WriteString(piece)
		}
		b.WriteString(s.Flush())
		if got, want := b.String(), tok.Decode(ids, skip); got != want {
			t.Errorf("stream (skip %v) = %q, want %q", skip, got, want)
		}
	}

	// A lone lead byte comes out of Flush as U+FFFD, as in Decode.
	lead, ok := tok.tokenID("ð") // byte 0xF0
	if !ok {
		t.Fatal("no token for byte 0xF0")
	}
	s := tok.NewStreamDecoder(false)
	if got := s.Next(lead); got != "" {
		t.Errorf("Next(lead byte) = %q, want empty", got)
	}
	if got := s.Next(14990); got != "\uFFFDhello" {
		t.Errorf("Next after a lead byte = %q, want %q", got, "\uFFFDhello")
	}
	s.Next(lead)
	if got := s.Flush(); got != "\uFFFD" {
		t.Errorf("Flush = %q, want U+FFFD", got)
	}
	if got := tok.Decode([]int{lead}, false); got != "\uFFFD" {
		t.Errorf("Decode(lead byte) = %q, want U+FFFD", got)
	}
}

func TestTokLossyUTF8(t *testing.T) {
	// Expected values are what Rust's String::from_utf8_lossy gives.
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xF0\x9F\x98", "\uFFFD"},
		{"a\xED\xA0\x80b", "a\uFFFD\uFFFD\uFFFDb"},
		{"\xC0\xAF", "\uFFFD\uFFFD"},
		{"\xE2\x82x", "\uFFFDx"},
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"\xF0\x9F\x98\x80\xFF", "😀\uFFFD"},
		{"\xE0\x80\xAF", "\uFFFD\uFFFD\uFFFD"},
	} {
		if got, n := lossyUTF8([]byte(c.in), true); got != c.want || n != len(c.in) {
			t.Errorf("lossyUTF8(%q) = %q, %d; want %q, %d", c.in, got, n, c.want, len(c.in))
		}
	}
	if got, n := lossyUTF8([]byte("ok\xF0\x9F"), false); got != "ok" || n != 2 {
		t.Errorf("incomplete tail: got %q, %d; want \"ok\", 2", got, n)
	}
	if got, n := lossyUTF8([]byte("ok\xF0\x41"), false); got != "ok\uFFFDA" || n != 4 {
		t.Errorf("broken sequence: got %q, %d", got, n)
	}
}

// TestTokenizerPromptSpeed encodes TileGym's 55 KB benchmark prompt with a
// cold word cache; it must take well under a second.
func TestTokenizerPromptSpeed(t *testing.T) {
	path := filepath.Join("..", "..", "shared", "prompts", "input_prompt_small.txt")
	prompt, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("%s: %v", path, err)
	}
	for _, name := range []string{"qwen2", "deepseek-v2"} {
		tok, err := Parse(testJSON(t, name)) // a fresh, empty cache
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ids := mustEncode(t, tok, string(prompt))
		took := time.Since(start)
		t.Logf("%s: %d bytes -> %d ids in %v", name, len(prompt), len(ids), took)
		if took > time.Second {
			t.Errorf("%s: encoding the prompt took %v, want < 1s", name, took)
		}
		if got := tok.Decode(mustEncodeNoSpecial(t, tok, string(prompt)), false); got != string(prompt) {
			t.Errorf("%s: the prompt does not round-trip", name)
		}
	}
}

// A tiny byte-level BPE for tests of the parts the real files leave out.
func tiny(t *testing.T, patch func(m map[string]any)) (*Tokenizer, error) {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteRune[b])] = b
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"}
	for i, m := range merges {
		vocab[strings.ReplaceAll(m, " ", "")] = 256 + i
	}
	m := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": []any{
			map[string]any{"id": 262, "content": "<s>", "special": true, "normalized": false,
				"single_word": false, "lstrip": false, "rstrip": false},
		},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	if patch != nil {
		patch(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Parse(data)
}

func TestTokenizerErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		patch func(m map[string]any)
		want  string
	}{
		{"pre_tokenizer", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Foo"} },
			`tokenizer: tokenizer.json: pre_tokenizer type "Foo" not supported`},
		{"nested", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Metaspace"}}}
		}, `tokenizer: tokenizer.json: pre_tokenizer Sequence[0]: pre_tokenizer type "Metaspace" not supported`},
		{"normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "BertNormalizer"} },
			`tokenizer: tokenizer.json: normalizer type "BertNormalizer" not supported`},
		{"decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} },
			`tokenizer: tokenizer.json: decoder type "WordPiece" not supported`},
		{"post_processor", func(m map[string]any) { m["post_processor"] = map[string]any{"type": "Foo"} },
			`tokenizer: tokenizer.json: post_processor type "Foo" not supported`},
		{"model", func(m map[string]any) { m["model"] = map[string]any{"type": "Unigram", "vocab": []any{}} },
			`tokenizer: tokenizer.json: model: type "Unigram" not supported (only BPE)`},
		{"merge", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []string{"x y"} },
			`tokenizer: tokenizer.json: model: merges[0]: the merge "xy" is not in the vocab`},
		{"merge part", func(m map[string]any) { m["model"].(map[string]any)["merges"] = [][]string{{"x", "Q!"}} },
			`tokenizer: tokenizer.json: model: merges[0]: "Q!" is not in the vocab`},
		{"regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(("}, "behavior": "Isolated"}
		}, `tokenizer: tokenizer.json: pre_tokenizer Split: regex "((": `},
		{"behavior", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}
		}, `tokenizer: tokenizer.json: pre_tokenizer Split: behavior "Sideways" not supported`},
		{"truncation", func(m map[string]any) { m["truncation"] = map[string]any{"max_length": 8} },
			`tokenizer: tokenizer.json: truncation is set`},
		{"template", func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": "TemplateProcessing",
				"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<bos>", "type_id": 0}},
					map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{}}
		}, `tokenizer: tokenizer.json: post_processor TemplateProcessing: special token "<bos>" missing`},
	} {
		_, err := tiny(t, c.patch)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := Parse([]byte("{")); err == nil || !strings.HasPrefix(err.Error(), "tokenizer: tokenizer.json: not valid JSON") {
		t.Errorf("bad JSON: err = %v", err)
	}
}

// TestTokenizerTiny checks the merge loop on a small vocabulary where the
// ids follow from the merge list by hand: bytes are ids 0-255 ('h' = 104),
// the merges make he 256, ll 257, hell 258, hello 259, Ġw 260, Ġwo 261, and
// the added token <s> takes the next id, 262.
func TestTokenizerTiny(t *testing.T) {
	tok, err := tiny(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(t, tok, true, map[string][]int{
		"hello":       {259},
		"hell":        {258},
		"hel":         {256, 108},
		"lhello":      {108, 259}, // l h e l l o -> l he ll o -> l hell o -> l hello
		" wo":         {261},
		" w w":        {260, 260},
		"<s>hello<s>": {262, 259, 262},
		"x<s>":        {120, 262},
	})
}

func TestTokFoldLongS(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`(?i:'s|'t|'re)|\s+|[^\s\p{L}]`, `(?i:'[sSſ]|'t|'re)|\s+|[^\s\p{L}]`},
		{`(?i)[a-z]+s[^S]\S`, `(?i)[ſa-z]+[sSſ][^ſS]\S`},
		{`s(?i:x)s(?-i:s)(?i:(s)s)`, `s(?i:x)s(?-i:s)(?i:([sSſ])[sSſ])`},
		{`(?:s)(?=s)\p{Ls}[\]s]`, `(?:s)(?=s)\p{Ls}[\]s]`},
		{`(?i)\x{73}[\p{L}s-]`, `(?i)\x{73}[ſ\p{L}s-]`},
		{`(?i)[-s][]s]`, `(?i)[-ſs][]ſs]`},
		{`(?i)[s`, `(?i)[s`},
	} {
		if got := foldLongS(c.in); got != c.want {
			t.Errorf("foldLongS(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestTokenizerConcurrent encodes from several goroutines at once (the word
// cache is shared); run with -race.
func TestTokenizerConcurrent(t *testing.T) {
	tok, err := Parse(testJSON(t, "qwen2"))
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"hello world, hello again", "def f(x):\n    return x * 2\n", "今天天气很好 12345"}
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i] = mustEncode(t, tok, s)
	}
	tok.model.mu.Lock()
	clear(tok.model.cache)
	tok.model.mu.Unlock()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 20; r++ {
				for i, s := range texts {
					if got := mustEncode(t, tok, s); !slices.Equal(got, want[i]) {
						t.Errorf("Encode(%q) = %v, want %v", s, got, want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
