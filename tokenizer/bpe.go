package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is the "BPE" model of tokenizer.json: a word is split into
// characters, each looked up in the vocabulary, then adjacent pairs are
// merged, lowest merge rank first (leftmost first among equal ranks), until no
// pair in the merge list remains. The merge loop keeps candidate pairs in a
// heap, as HF does, so a long word costs O(n log n).
type bpe struct {
	vocab   map[string]int
	tokens  map[int]string // id -> token: ids may leave gaps, as in HF
	maxID   int
	merges  map[uint64]merge // pair of ids -> rank and merged id
	unk     int              // -1: none (unknown characters are dropped, as in HF)
	fuseUnk bool
	// byteFallback: unknown characters become their <0xXX> byte tokens.
	byteFallback bool
	byteTokens   [256]int // ids of <0x00>..<0xFF>, -1 where absent
	prefix       string   // continuing_subword_prefix
	suffix       string   // end_of_word_suffix
	ignoreMerges bool     // a word that is a vocabulary entry is that token

	mu    sync.RWMutex
	cache map[string][]int // word -> ids
}

// merge is one merge: its rank in the merge list and the id it makes.
type merge struct{ rank, id int32 }

// cacheMax bounds the word cache; it is emptied when full.
const cacheMax = 1 << 17

// pairKey is the merges map key of the pair (a, b).
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func parseBPE(raw json.RawMessage) (*bpe, error) {
	var m struct {
		Type                    string          `json:"type"`
		UnkToken                *string         `json:"unk_token"`
		ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
		FuseUnk                 bool            `json:"fuse_unk"`
		ByteFallback            bool            `json:"byte_fallback"`
		IgnoreMerges            bool            `json:"ignore_merges"`
		Vocab                   map[string]int  `json:"vocab"`
		Merges                  json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		// Another model's vocab may not fit BPE's: name the type first.
		if typ, terr := typed("model", raw); terr == nil && typ != "BPE" && typ != "" {
			return nil, fmt.Errorf("type %q not supported (only BPE)", typ)
		}
		return nil, fmt.Errorf("want a BPE model object: %w", err)
	}
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("type %q not supported (only BPE)", m.Type)
	}
	if m.Type == "" && m.Merges == nil {
		return nil, errors.New("no type and no merges; only BPE is supported")
	}
	if m.Vocab == nil {
		return nil, errors.New("vocab missing")
	}
	b := &bpe{
		vocab:        m.Vocab,
		unk:          -1,
		fuseUnk:      m.FuseUnk,
		byteFallback: m.ByteFallback,
		ignoreMerges: m.IgnoreMerges,
		cache:        map[string][]int{},
	}
	if m.ContinuingSubwordPrefix != nil {
		b.prefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		b.suffix = *m.EndOfWordSuffix
	}
	b.maxID = -1
	b.tokens = make(map[int]string, len(m.Vocab))
	for tok, id := range m.Vocab {
		if id < 0 || id > math.MaxInt32 {
			return nil, fmt.Errorf("vocab: token %q has id %d, want one in [0, %d]", tok, id, math.MaxInt32)
		}
		b.maxID = max(b.maxID, id)
		b.tokens[id] = tok
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocab", *m.UnkToken)
		}
		b.unk = id
	}
	for i := range b.byteTokens {
		b.byteTokens[i] = -1
		if id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.byteTokens[i] = id
		}
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	b.merges = make(map[uint64]merge, len(pairs))
	for i, p := range pairs {
		a, ok := m.Vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("merges[%d]: %q is not in the vocab", i, p[0])
		}
		c, ok := m.Vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("merges[%d]: %q is not in the vocab", i, p[1])
		}
		// HF drops the prefix's length from the right part, prefix or not.
		right := p[1][min(len(b.prefix), len(p[1])):]
		id, ok := m.Vocab[p[0]+right]
		if !ok {
			return nil, fmt.Errorf("merges[%d]: the merge %q is not in the vocab", i, p[0]+right)
		}
		// A pair listed twice keeps its later rank, as HF's map does.
		b.merges[pairKey(int32(a), int32(c))] = merge{rank: int32(i), id: int32(id)}
	}
	return b, nil
}

// parseMerges reads merges written as "a b" strings or as ["a", "b"] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err == nil {
		pairs := make([][2]string, len(lines))
		for i, l := range lines {
			a, c, ok := strings.Cut(l, " ")
			if !ok || strings.Contains(c, " ") {
				return nil, fmt.Errorf("merges[%d]: %q is not two tokens separated by one space", i, l)
			}
			pairs[i] = [2]string{a, c}
		}
		return pairs, nil
	}
	var lists [][]string
	if err := json.Unmarshal(raw, &lists); err != nil {
		return nil, fmt.Errorf("merges: want a list of \"a b\" strings or of [a, b] pairs, got %s", short(raw))
	}
	pairs := make([][2]string, len(lists))
	for i, l := range lists {
		if len(l) != 2 {
			return nil, fmt.Errorf("merges[%d]: want a pair, got %d tokens", i, len(l))
		}
		pairs[i] = [2]string{l[0], l[1]}
	}
	return pairs, nil
}

// token is the vocabulary entry of id.
func (b *bpe) token(id int) (string, bool) {
	tok, ok := b.tokens[id]
	return tok, ok
}

// tokenize appends the ids of one pre-tokenized word to ids.
func (b *bpe) tokenize(word string, ids []int) []int {
	if word == "" {
		return ids
	}
	if b.ignoreMerges {
		if id, ok := b.vocab[word]; ok {
			return append(ids, id)
		}
	}
	b.mu.RLock()
	hit, ok := b.cache[word]
	b.mu.RUnlock()
	if ok {
		return append(ids, hit...)
	}
	out := b.merge(word)
	b.mu.Lock()
	if len(b.cache) >= cacheMax {
		clear(b.cache)
	}
	b.cache[word] = out
	b.mu.Unlock()
	return append(ids, out...)
}

// symbol is one part of a word during merging: a doubly linked list over
// the initial characters; size 0 marks a part merged into its left neighbour.
type symbol struct {
	id         int32
	prev, next int32
	size       int32 // bytes of the word it covers
}

// merge is HF's BPE::merge_word followed by Word::merge_all (no dropout).
func (b *bpe) merge(word string) []int {
	syms := make([]symbol, 0, len(word))
	add := func(id, size int) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: int32(id), prev: n - 1, next: n + 1, size: int32(size)})
	}
	unkID, unkSize := -1, 0 // a pending unknown run (fuse_unk)
	for i, r := range word {
		size := utf8.RuneLen(r)
		s := word[i : i+size]
		if i > 0 && b.prefix != "" {
			s = b.prefix + s
		}
		if i+size == len(word) && b.suffix != "" {
			s += b.suffix
		}
		if id, ok := b.vocab[s]; ok {
			if unkID >= 0 {
				add(unkID, unkSize)
				unkID = -1
			}
			add(id, size)
			continue
		}
		if b.byteFallback {
			all := true
			for j := 0; j < len(s); j++ {
				all = all && b.byteTokens[s[j]] >= 0
			}
			if all {
				for j := 0; j < len(s); j++ {
					add(b.byteTokens[s[j]], 1)
				}
				continue
			}
		}
		if b.unk < 0 {
			continue // no unk token: HF drops the character
		}
		switch {
		case unkID >= 0 && b.fuseUnk:
			unkSize += size
		case unkID >= 0:
			add(unkID, unkSize)
			unkSize = size
		default:
			unkID, unkSize = b.unk, size
		}
	}
	if unkID >= 0 {
		add(unkID, unkSize)
	}
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1

	var q mergeHeap
	for i := 0; i+1 < len(syms); i++ {
		if m, ok := b.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = append(q, candidate{rank: m.rank, pos: int32(i), id: m.id})
		}
	}
	q.init()
	for len(q) > 0 {
		top := q.pop()
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		// Skip entries made stale by an earlier merge.
		if m, ok := b.merges[pairKey(cur.id, right.id)]; !ok || m.id != top.id {
			continue
		}
		cur.id = top.id
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if m, ok := b.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				q.push(candidate{rank: m.rank, pos: cur.prev, id: m.id})
			}
		}
		if cur.next >= 0 {
			if m, ok := b.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				q.push(candidate{rank: m.rank, pos: top.pos, id: m.id})
			}
		}
	}
	out := make([]int, 0, len(syms))
	for _, s := range syms {
		if s.size != 0 {
			out = append(out, int(s.id))
		}
	}
	return out
}

// candidate is a pair that may be merged: the left part's position, the
// merge's rank and the id it makes.
type candidate struct{ rank, pos, id int32 }

// mergeHeap is a binary min-heap of candidates by (rank, pos).
type mergeHeap []candidate

func (h mergeHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}

func (h mergeHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *mergeHeap) push(c candidate) {
	*h = append(*h, c)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *mergeHeap) pop() candidate {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	*h = q[:n]
	h.down(0)
	return top
}

func (h mergeHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
