package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedTokenDef is one entry of tokenizer.json's added_tokens.
type addedTokenDef struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"` // absent: !special
	Special    bool   `json:"special"`
}

// addedToken is an added token as matching uses it.
type addedToken struct {
	content                    string
	singleWord, lstrip, rstrip bool
	normalized, special        bool
}

// addedEntry is an added token with the string Decode gives for it: HF
// decodes a normalized=true token as its normalized content.
type addedEntry struct {
	addedToken
	decoded string
}

// addedVocab is HF's AddedVocabulary: tokens found in the text before
// normalization and BPE. Tokens with normalized=false are matched in the raw
// text; those with normalized=true in the normalized text of what is left.
type addedVocab struct {
	byID      map[int]addedEntry
	byContent map[string]int
	special   map[string]bool // contents of the special tokens
	raw, norm matcher
}

// piece is a stretch of text: an added token (id >= 0) or text still to
// be encoded (id -1).
type piece struct {
	text string
	id   int
}

// newAddedVocab adds the tokens in file order as HF's deserializer does:
// a token whose content is in the model's vocabulary takes that id, the
// others take the next free id past the vocabulary (the ids written in the
// file are not used, as in HF, which only warns when they differ).
func newAddedVocab(defs []addedTokenDef, model *bpe, n normalizer) *addedVocab {
	a := &addedVocab{byID: map[int]addedEntry{}, byContent: map[string]int{}, special: map[string]bool{}}
	var specialList, addedList []addedToken // HF's special_tokens and added_tokens, in order
	maxAdded := -1
	for _, d := range defs {
		t := addedToken{content: d.Content, singleWord: d.SingleWord, lstrip: d.LStrip, rstrip: d.RStrip,
			normalized: !d.Special, special: d.Special}
		if d.Normalized != nil {
			t.normalized = *d.Normalized
		}
		if t.special && t.content != "" && !a.special[t.content] {
			specialList = append(specialList, t)
			a.special[t.content] = true
		}
		if t.content == "" {
			continue
		}
		if id, ok := a.byContent[t.content]; ok && a.byID[id].addedToken == t {
			continue // the same token again
		}
		id, ok := a.byContent[t.content]
		if !ok {
			id, ok = model.vocab[t.content]
		}
		if !ok {
			id = len(model.vocab)
			if maxAdded >= 0 && (maxAdded >= len(model.vocab) || len(model.vocab) == 0) {
				id = maxAdded + 1
			}
		}
		maxAdded = max(maxAdded, id)
		a.byContent[t.content] = id
		e := addedEntry{addedToken: t, decoded: t.content}
		if t.normalized && n != nil {
			e.decoded = n.normalize(t.content)
		}
		a.byID[id] = e
		if !a.special[t.content] {
			addedList = append(addedList, t)
		}
	}
	var rawPats, normPats []string
	var rawIDs, normIDs []int
	for _, t := range append(specialList, addedList...) {
		id := a.byContent[t.content]
		if !t.normalized {
			rawPats, rawIDs = append(rawPats, t.content), append(rawIDs, id)
			continue
		}
		p := t.content
		if n != nil {
			p = n.normalize(p)
		}
		normPats, normIDs = append(normPats, p), append(normIDs, id)
	}
	a.raw = newMatcher(rawPats, rawIDs)
	a.norm = newMatcher(normPats, normIDs)
	return a
}

// extract splits text into added tokens and the normalized text between them
// (HF's AddedVocabulary::extract_and_normalize). Empty pieces are dropped.
func (a *addedVocab) extract(text string, n normalizer) []piece {
	var out []piece
	for _, p := range a.split(text, &a.raw, nil) {
		if p.id >= 0 {
			out = append(out, p)
			continue
		}
		s := p.text
		if n != nil {
			s = n.normalize(s)
		}
		out = a.split(s, &a.norm, out)
	}
	return out
}

// split appends the pieces of s around the tokens m finds (HF's
// AddedVocabulary::find_matches): leftmost-longest matches, each checked for
// single_word and widened by lstrip and rstrip.
func (a *addedVocab) split(s string, m *matcher, out []piece) []piece {
	if s == "" {
		return out
	}
	if len(m.pats) == 0 {
		return append(out, piece{s, -1})
	}
	done := 0 // end of the last piece
	for pos := 0; ; {
		start, stop, id, ok := m.next(s, pos)
		if !ok {
			break
		}
		pos = stop // the search goes on after the match, kept or not
		t := a.byID[id]
		if t.singleWord {
			startOK := start == 0 || !endsWithWord(s[:start])
			stopOK := stop == len(s) || !startsWithWord(s[stop:])
			if !startOK || !stopOK {
				continue
			}
		}
		if t.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), done)
		}
		if t.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if done < start {
			out = append(out, piece{s[done:start], -1})
		}
		out = append(out, piece{s[start:stop], id})
		done = stop
	}
	if done < len(s) {
		out = append(out, piece{s[done:], -1})
	}
	return out
}

// isWordChar is Rust regex's Unicode \w: Alphabetic, marks, decimal
// digits, connector punctuation and the joiners.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Pc, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// matcher finds the leftmost, then longest, of a set of strings (what
// HF's Aho-Corasick automaton with MatchKind::LeftmostLongest finds).
type matcher struct {
	pats    []string
	ids     []int
	byFirst [256][]int32 // pattern indices by first byte, longest first
}

func newMatcher(pats []string, ids []int) matcher {
	m := matcher{}
	for i, p := range pats {
		if p == "" {
			continue
		}
		m.pats = append(m.pats, p)
		m.ids = append(m.ids, ids[i])
		k := p[0]
		m.byFirst[k] = append(m.byFirst[k], int32(len(m.pats)-1))
	}
	for k := range m.byFirst {
		c := m.byFirst[k]
		sort.SliceStable(c, func(i, j int) bool { return len(m.pats[c[i]]) > len(m.pats[c[j]]) })
	}
	return m
}

// next finds the first match starting at or after from.
func (m *matcher) next(s string, from int) (start, end, id int, ok bool) {
	for i := from; i < len(s); i++ {
		for _, k := range m.byFirst[s[i]] {
			if p := m.pats[k]; strings.HasPrefix(s[i:], p) {
				return i, i + len(p), m.ids[k], true
			}
		}
	}
	return 0, 0, 0, false
}
