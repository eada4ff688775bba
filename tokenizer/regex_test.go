package tokenizer

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlclark/regexp2"
)

// splitTokenizer is the tiny tokenizer with a Split pre-tokenizer of
// pattern (isolating its matches) before ByteLevel.
func splitTokenizer(t *testing.T, pattern string) *Tokenizer {
	t.Helper()
	tok, err := tiny(t, func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}}
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A pattern with nested quantifiers, which a backtracking matcher takes
// exponential time on, runs in linear time when it needs no backtracking
// feature; with lookahead it needs one, and a match that takes too long
// fails the encoding with an error that names the pattern.
func TestRegexBounded(t *testing.T) {
	hostile := strings.Repeat("a", 40) + "!"
	for _, pattern := range []string{`(a+)+b`, `(a|aa)+c`, `(\w+\s?)+!`, `(.*a){12}`} {
		tok := splitTokenizer(t, pattern)
		start := time.Now()
		if _, err := tok.Encode(hostile); err != nil {
			t.Errorf("%s: %v", pattern, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: a %d-byte text took %v", pattern, len(hostile), d)
		}
	}

	defer func(d, perByte time.Duration) { matchTimeout, matchTimePerByte = d, perByte }(matchTimeout, matchTimePerByte)
	matchTimeout, matchTimePerByte = 50*time.Millisecond, 0
	tok := splitTokenizer(t, `(a+)+(?!a)b`)
	start := time.Now()
	_, err := tok.Encode(hostile)
	var te *MatchTimeoutError
	if !errors.As(err, &te) || !strings.HasPrefix(err.Error(), "tokenizer: tokenizer.json: regex \"(a+)+(?!a)b\": matching a 41-byte text took longer than 50ms") {
		t.Errorf("Encode: err %v, want a MatchTimeoutError", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the bounded match took %v", d)
	}
	// A pattern that rescans the rest of the text for every match (a+b|a on
	// a run of a's: each match looks for the b to the end) is quadratic on
	// either matcher; the sum of the matches is bounded too.
	run := strings.Repeat("a", 200_000)
	for _, pattern := range []string{`a+b|a`, `a+b|a(?!b)`} {
		tok := splitTokenizer(t, pattern)
		start := time.Now()
		if _, err := tok.Encode(run); !errors.As(err, &te) {
			t.Errorf("%s on %d a's: err %v, want a MatchTimeoutError", pattern, len(run), err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: the bounded matching took %v", pattern, d)
		}
	}

	// The bound grows with the text: a long run of white space is one long
	// match of \s+(?!\S), linear, and must not be taken for an explosion.
	matchTimePerByte = time.Microsecond
	spaces := strings.Repeat(" ", 4<<20) + "x"
	tok = splitTokenizer(t, `\s+(?!\S)|\S+`)
	if ids, err := tok.Encode(spaces); err != nil || len(ids) < 4<<20 {
		t.Errorf("4 MiB of spaces: %d ids, %v", len(ids), err)
	}
	matchTimePerByte = 0

	// The bound holds for a normalizer's Replace too, there at parse time
	// (added tokens are normalized) as well.
	_, err = tiny(t, func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": `(x+x+)+(?=y)y`}, "content": "z"}
		m["added_tokens"] = []any{map[string]any{"id": 300, "content": strings.Repeat("x", 40), "special": false,
			"normalized": true, "single_word": false, "lstrip": false, "rstrip": false}}
	})
	if !errors.As(err, &te) {
		t.Errorf("Parse with a hostile Replace: err %v, want a MatchTimeoutError", err)
	}
}

// The linear matcher finds exactly the matches regexp2 finds, for the
// patterns it takes: real pre-tokenizer pieces and hostile shapes, on
// random texts of the characters they care about.
func TestRegexLinearSameMatches(t *testing.T) {
	patterns := []string{
		`\p{L}+`, ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+`, `[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}`,
		`\s*[\r\n]+`, `\w+|\W`, `\d+\D`, `(a+)+b`, `(a|ab)(c|bcd)(d*)`, `a+?b|.`, `[\s,]+`,
		`(?s:.)`, `[]a]+`, `\.\*`, `x{2,3}`,
	}
	alphabet := []rune("aabbcdx 1٣\n\r\t,.*]é中\u00a0\u2028_")
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range patterns {
		r, err := compileRegex(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if r.linear == nil {
			t.Errorf("%s: not run by the linear matcher", p)
			continue
		}
		bt := regexp2.MustCompile(p, regexp2.Multiline)
		for range 200 {
			rs := make([]rune, rng.IntN(12))
			for i := range rs {
				rs[i] = alphabet[rng.IntN(len(alphabet))]
			}
			s := string(rs)
			got := r.findAll(s)
			want := (&regex{pattern: p, bt: bt}).findAll(s)
			if !slices.Equal(got, want) {
				t.Errorf("%s on %q: %v, regexp2 %v", p, s, got, want)
				break
			}
		}
	}
	// What the linear matcher does not take goes to regexp2.
	for _, p := range []string{`\s+(?!\S)`, `(a)\1`, `\bx`, `(?i)s`, `a*`, `[\S]`, `[a-z-[aeiou]]`, `[[:alpha:]]`, `x{,2}`, `^a+$`, `(?m:^x)`} {
		if r, err := compileRegex(p); err != nil || r.linear != nil {
			t.Errorf("%s: linear %v (err %v), want regexp2", p, r != nil && r.linear != nil, err)
		}
	}
}
