package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// preTokenizer is a tokenizer.json pre-tokenizer: it cuts pieces of
// normalized text into the words BPE encodes one by one (and may rewrite
// them, as ByteLevel does). Empty words are dropped, as in HF.
type preTokenizer interface {
	preTokenize(words []string) []string
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typed("pre_tokenizer", raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var s struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Sequence: %w", err)
		}
		seq := make(preTokenizerSeq, 0, len(s.PreTokenizers))
		for i, r := range s.PreTokenizers {
			p, err := parsePreTokenizer(r)
			if err != nil {
				return nil, fmt.Errorf("pre_tokenizer Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	case "Split":
		var s struct {
			Pattern  json.RawMessage `json:"pattern"`
			Behavior string          `json:"behavior"`
			Invert   bool            `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		re, err := parsePattern(s.Pattern)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		b, err := parseBehavior(s.Behavior)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		return &split{re: re, behavior: b, invert: s.Invert}, nil
	case "Digits":
		var d struct {
			IndividualDigits bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Digits: %w", err)
		}
		return digits{individual: d.IndividualDigits}, nil
	case "ByteLevel":
		// HF's defaults: add_prefix_space and use_regex true.
		b := struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, fmt.Errorf("pre_tokenizer ByteLevel: %w", err)
		}
		p := byteLevel{addPrefixSpace: true, useRegex: true}
		if b.AddPrefixSpace != nil {
			p.addPrefixSpace = *b.AddPrefixSpace
		}
		if b.UseRegex != nil {
			p.useRegex = *b.UseRegex
		}
		return p, nil
	}
	return nil, fmt.Errorf("pre_tokenizer type %q not supported", typ)
}

// preTokenizerSeq applies pre-tokenizers in order, each to every word the
// one before produced.
type preTokenizerSeq []preTokenizer

func (seq preTokenizerSeq) preTokenize(words []string) []string {
	for _, p := range seq {
		words = p.preTokenize(words)
	}
	return words
}

// behavior is what a split does with the matched delimiters (HF's
// SplitDelimiterBehavior).
type behavior int

const (
	removed            behavior = iota // matches are dropped
	isolated                           // matches are words of their own
	mergedWithPrevious                 // a match joins the word before it
	mergedWithNext                     // a match joins the word after it
	contiguous                         // adjacent matches form one word
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return removed, nil
	case "Isolated":
		return isolated, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("behavior %q not supported", s)
}

// span is a part of a word: its byte range and whether the pattern
// matched it.
type span struct {
	start, end int
	match      bool
}

// applyBehavior appends the words that w's spans give under behavior b
// (HF's NormalizedString::split); empty words are dropped.
func applyBehavior(w string, spans []span, b behavior, out []string) []string {
	type part struct {
		start, end int
		remove     bool
	}
	parts := make([]part, 0, len(spans))
	switch b {
	case isolated:
		for _, s := range spans {
			parts = append(parts, part{s.start, s.end, false})
		}
	case removed:
		for _, s := range spans {
			parts = append(parts, part{s.start, s.end, s.match})
		}
	case contiguous:
		prev := false
		for _, s := range spans {
			if s.match == prev && len(parts) > 0 {
				parts[len(parts)-1].end = s.end
			} else {
				parts = append(parts, part{s.start, s.end, false})
			}
			prev = s.match
		}
	case mergedWithPrevious:
		prev := false
		for _, s := range spans {
			if s.match && !prev && len(parts) > 0 {
				parts[len(parts)-1].end = s.end
			} else {
				parts = append(parts, part{s.start, s.end, false})
			}
			prev = s.match
		}
	case mergedWithNext:
		prev := false
		for i := len(spans) - 1; i >= 0; i-- {
			s := spans[i]
			if s.match && !prev && len(parts) > 0 {
				parts[len(parts)-1].start = s.start
			} else {
				parts = append(parts, part{s.start, s.end, false})
			}
			prev = s.match
		}
		for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
			parts[i], parts[j] = parts[j], parts[i]
		}
	}
	for _, p := range parts {
		if !p.remove && p.end > p.start {
			out = append(out, w[p.start:p.end])
		}
	}
	return out
}

// matchSpans covers w with the matches of re and the gaps between them.
func matchSpans(w string, re *regex) []span {
	if w == "" {
		return []span{{0, 0, false}}
	}
	var spans []span
	prev := 0
	for _, m := range re.findAll(w) {
		if m[0] != prev {
			spans = append(spans, span{prev, m[0], false})
		}
		spans = append(spans, span{m[0], m[1], true})
		prev = m[1]
	}
	if prev != len(w) {
		spans = append(spans, span{prev, len(w), false})
	}
	return spans
}

// split is the Split pre-tokenizer: a regex or a literal string, what to
// do with its matches, and invert (then the gaps count as the matches).
type split struct {
	re       *regex
	behavior behavior
	invert   bool
}

func (p *split) preTokenize(words []string) []string {
	out := make([]string, 0, len(words))
	for _, w := range words {
		spans := matchSpans(w, p.re)
		if p.invert {
			for i := range spans {
				spans[i].match = !spans[i].match
			}
		}
		out = applyBehavior(w, spans, p.behavior, out)
	}
	return out
}

// digits is the Digits pre-tokenizer: numeric characters (categories Nd,
// Nl, No) split from the rest, each alone with individual_digits, else in
// runs.
type digits struct{ individual bool }

func (p digits) preTokenize(words []string) []string {
	b := contiguous
	if p.individual {
		b = isolated
	}
	out := make([]string, 0, len(words))
	for _, w := range words {
		var spans []span
		last := 0
		for i, r := range w {
			if unicode.IsNumber(r) {
				if last < i {
					spans = append(spans, span{last, i, false})
				}
				last = i + utf8.RuneLen(r)
				spans = append(spans, span{i, last, true})
			}
		}
		if last < len(w) || len(spans) == 0 {
			spans = append(spans, span{last, len(w), false})
		}
		out = applyBehavior(w, spans, b, out)
	}
	return out
}

// byteLevel is the ByteLevel pre-tokenizer: an optional space before each
// piece, an optional split by the GPT-2 regex, then every byte mapped to the
// printable character that stands for it in the vocabulary.
type byteLevel struct{ addPrefixSpace, useRegex bool }

// gpt2Pattern is the regex ByteLevel splits by when use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

var gpt2Regex = sync.OnceValue(func() *regex {
	re, err := compileRegex(gpt2Pattern)
	if err != nil {
		panic(err) // a constant pattern
	}
	return re
})

func (p byteLevel) preTokenize(words []string) []string {
	out := make([]string, 0, len(words))
	for _, w := range words {
		if p.addPrefixSpace && !strings.HasPrefix(w, " ") {
			w = " " + w
		}
		start := len(out)
		if p.useRegex {
			out = applyBehavior(w, matchSpans(w, gpt2Regex()), isolated, out)
		} else if w != "" {
			out = append(out, w)
		}
		for i := start; i < len(out); i++ {
			out[i] = toByteLevel(out[i])
		}
	}
	return out
}

// byteRune maps each byte to the character standing for it in byte-level
// vocabularies (GPT-2's bytes_to_unicode): printable Latin-1 bytes stand for
// themselves, the others for U+0100 onwards in byte order.
var byteRune, runeByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

func toByteLevel(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteRune[s[i]])
	}
	return b.String()
}

// foldLongS rewrites the case-insensitive parts of a pattern so that s
// also matches U+017F (ſ, long s), as it does in Oniguruma, which folds case
// by Unicode case folding: regexp2 compares lowercased characters, and ſ is
// already lowercase. (The Kelvin sign, the other ASCII fold, lowercases to k
// and needs nothing.) Outside a character class a literal s or S becomes
// [sSſ]; a class holding s or S (alone or in a range) gets ſ added first.
func foldLongS(pattern string) string {
	if !strings.Contains(pattern, "(?") {
		return pattern
	}
	rs := []rune(pattern)
	var b strings.Builder
	fold := false    // case-insensitive here
	var outer []bool // fold of each enclosing group
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case c == '\\':
			i = copyEscape(&b, rs, i)
		case c == '[':
			j, hasS := scanClass(rs, i)
			if j < 0 { // unterminated: the compiler will say so
				b.WriteString(string(rs[i:]))
				return b.String()
			}
			// Put ſ first, past a '^' and a leading literal ']' or '-'.
			p := i + 1
			if rs[p] == '^' {
				p++
			}
			if rs[p] == ']' || rs[p] == '-' {
				p++
			}
			b.WriteString(string(rs[i:p]))
			if fold && hasS {
				b.WriteRune('ſ')
			}
			b.WriteString(string(rs[p : j+1]))
			i = j
		case c == '(':
			outer = append(outer, fold)
			b.WriteRune(c)
			if i+1 < len(rs) && rs[i+1] == '?' {
				// (?flags) or (?flags:...): letters and '-', then ')' or ':'.
				j := i + 2
				on := true
				f := fold
				for ; j < len(rs) && (rs[j] == '-' || ('a' <= rs[j] && rs[j] <= 'z')); j++ {
					switch rs[j] {
					case '-':
						on = false
					case 'i':
						f = on
					}
				}
				if j > i+2 && j < len(rs) && (rs[j] == ':' || rs[j] == ')') {
					b.WriteString(string(rs[i+1 : j+1]))
					if rs[j] == ')' { // applies to the rest of the enclosing group
						outer = outer[:len(outer)-1]
					}
					fold = f
					i = j
				}
			}
		case c == ')':
			b.WriteRune(c)
			if n := len(outer); n > 0 {
				fold, outer = outer[n-1], outer[:n-1]
			}
		case fold && (c == 's' || c == 'S'):
			b.WriteString("[sSſ]")
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// copyEscape copies the escape at rs[i] ('\\') and returns the index of
// its last rune.
func copyEscape(b *strings.Builder, rs []rune, i int) int {
	j := i + 1
	if j < len(rs) && (rs[j] == 'p' || rs[j] == 'P' || rs[j] == 'x') && j+1 < len(rs) && rs[j+1] == '{' {
		for j < len(rs) && rs[j] != '}' {
			j++
		}
	}
	j = min(j, len(rs)-1)
	b.WriteString(string(rs[i : j+1]))
	return j
}

// scanClass finds the ']' closing the class that opens at rs[i] (-1 if
// none) and reports whether the class holds s or S, alone or in a range.
func scanClass(rs []rune, i int) (end int, hasS bool) {
	j := i + 1
	if j < len(rs) && rs[j] == '^' {
		j++
	}
	first := true
	var prev rune = -1 // the last single character, for ranges
	for ; j < len(rs); j++ {
		c := rs[j]
		if c == ']' && !first {
			return j, hasS
		}
		first = false
		if c == '\\' {
			k := j + 1
			if k < len(rs) && (rs[k] == 'p' || rs[k] == 'P' || rs[k] == 'x') && k+1 < len(rs) && rs[k+1] == '{' {
				for k < len(rs) && rs[k] != '}' {
					k++
				}
			}
			j, prev = min(k, len(rs)-1), -1
			continue
		}
		if c == '-' && prev >= 0 && j+1 < len(rs) && rs[j+1] != ']' && rs[j+1] != '\\' {
			hi := rs[j+1]
			hasS = hasS || (prev <= 's' && 's' <= hi) || (prev <= 'S' && 'S' <= hi)
			j, prev = j+1, -1
			continue
		}
		hasS = hasS || c == 's' || c == 'S'
		prev = c
	}
	return -1, hasS
}
