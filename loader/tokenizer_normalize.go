package loader

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// tokNormalizer is a tokenizer.json normalizer: it rewrites a piece of text
// before pre-tokenization.
type tokNormalizer interface {
	normalize(s string) string
}

func tokParseNormalizer(raw json.RawMessage) (tokNormalizer, error) {
	if tokIsNull(raw) {
		return nil, nil
	}
	typ, err := tokTyped("normalizer", raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return tokUnicodeNorm{norm.NFC}, nil
	case "NFD":
		return tokUnicodeNorm{norm.NFD}, nil
	case "NFKC":
		return tokUnicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return tokUnicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return tokLowercase{}, nil
	case "StripAccents":
		return tokStripAccents{}, nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("normalizer Strip: %w", err)
		}
		return tokStrip{left: s.Left, right: s.Right}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Prepend: %w", err)
		}
		return tokPrepend{p.Prepend}, nil
	case "Replace":
		var r struct {
			Pattern json.RawMessage `json:"pattern"`
			Content string          `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		re, err := tokParsePattern(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		return tokReplace{re: re, content: r.Content}, nil
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("normalizer Sequence: %w", err)
		}
		seq := make(tokNormalizerSeq, 0, len(s.Normalizers))
		for i, r := range s.Normalizers {
			n, err := tokParseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("normalizer Sequence[%d]: %w", i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("normalizer type %q not supported", typ)
}

// tokUnicodeNorm is NFC, NFD, NFKC or NFKD.
type tokUnicodeNorm struct{ form norm.Form }

func (n tokUnicodeNorm) normalize(s string) string { return n.form.String(s) }

// tokLowercase maps every character to its lowercase, as Rust's
// char::to_lowercase does (U+0130 becomes "i\u0307").
type tokLowercase struct{}

func (tokLowercase) normalize(s string) string {
	return strings.Map(unicode.ToLower, strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

// tokStripAccents removes nonspacing marks (category Mn).
type tokStripAccents struct{}

func (tokStripAccents) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// tokStrip removes whitespace at either end.
type tokStrip struct{ left, right bool }

func (n tokStrip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// tokPrepend puts a string before any non-empty text.
type tokPrepend struct{ prefix string }

func (n tokPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// tokReplace replaces every match of a pattern with a fixed string.
type tokReplace struct {
	re      *tokRegex
	content string
}

func (n tokReplace) normalize(s string) string {
	matches := n.re.findAll(s)
	if len(matches) == 0 {
		return s
	}
	var b strings.Builder
	prev := 0
	for _, m := range matches {
		b.WriteString(s[prev:m[0]])
		b.WriteString(n.content)
		prev = m[1]
	}
	b.WriteString(s[prev:])
	return b.String()
}

// tokNormalizerSeq applies normalizers in order.
type tokNormalizerSeq []tokNormalizer

func (seq tokNormalizerSeq) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}
