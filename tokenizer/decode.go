package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// decoder is a tokenizer.json decoder, reduced to what byte-level
// vocabularies need: each token turns into bytes, and the bytes of all tokens
// together are read as UTF-8.
type decoder interface {
	appendBytes(buf []byte, tok string) []byte
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typed("decoder", raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Sequence":
		var s struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("decoder Sequence: %w", err)
		}
		if len(s.Decoders) != 1 {
			return nil, fmt.Errorf("decoder Sequence of %d decoders not supported (only a single ByteLevel)", len(s.Decoders))
		}
		d, err := parseDecoder(s.Decoders[0])
		if err != nil {
			return nil, fmt.Errorf("decoder Sequence[0]: %w", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("decoder type %q not supported", typ)
}

// byteLevelDecoder maps each character of a token back to the byte it
// stands for; a token with a character outside the byte alphabet (an added
// token such as "<｜begin▁of▁sentence｜>") is taken as its UTF-8 bytes, as HF
// does.
type byteLevelDecoder struct{}

func (byteLevelDecoder) appendBytes(buf []byte, tok string) []byte {
	n := len(buf)
	for _, r := range tok {
		b, ok := runeByte[r]
		if !ok {
			return append(buf[:n], tok...)
		}
		buf = append(buf, b)
	}
	return buf
}

// StreamDecoder decodes ids one at a time, as a generation loop produces
// them: each call returns only the text completed so far, holding back the
// bytes of a character split across tokens until its last byte arrives.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte // bytes not yet returned: an incomplete character
	n           int    // tokens decoded so far
}

// NewStreamDecoder starts a stream decoder; skipSpecial leaves out special
// tokens, as in Decode. The text of all Next calls followed by Flush is
// Decode of all the ids.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial}
}

// Next decodes one more id and returns the text it completes (maybe "").
func (s *StreamDecoder) Next(id int) string {
	tok, ok := s.t.decodable(id, s.skipSpecial)
	if !ok {
		return ""
	}
	s.pending = s.t.appendTokenBytes(s.pending, tok, s.n == 0)
	s.n++
	out, used := lossyUTF8(s.pending, false)
	s.pending = s.pending[:copy(s.pending, s.pending[used:])]
	return out
}

// Flush returns what is held back, an incomplete character as U+FFFD.
func (s *StreamDecoder) Flush() string {
	out, _ := lossyUTF8(s.pending, true)
	s.pending = s.pending[:0]
	return out
}

// lossyUTF8 reads b as UTF-8, each maximal invalid subsequence becoming
// one U+FFFD (as Rust's String::from_utf8_lossy does). Unless final, a
// trailing incomplete but so far valid character is left unread. It returns
// the text and the number of bytes read.
func lossyUTF8(b []byte, final bool) (string, int) {
	if utf8.Valid(b) {
		return string(b), len(b)
	}
	out := make([]byte, 0, len(b)+8)
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			out = append(out, c)
			i++
			continue
		}
		// The length of the sequence c starts and the range of its second byte.
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case 0xC2 <= c && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case 0xE1 <= c && c <= 0xEC, c == 0xEE, c == 0xEF:
			need = 2
		case c == 0xED:
			need, hi = 2, 0x9F
		case c == 0xF0:
			need, lo = 3, 0x90
		case 0xF1 <= c && c <= 0xF3:
			need = 3
		case c == 0xF4:
			need, hi = 3, 0x8F
		default: // not a lead byte
			out = append(out, "\uFFFD"...)
			i++
			continue
		}
		k := 1
		for ; k <= need && i+k < len(b); k++ {
			x := b[i+k]
			if k > 1 {
				lo, hi = 0x80, 0xBF
			}
			if x < lo || x > hi {
				break
			}
		}
		switch {
		case k > need: // complete
			out = append(out, b[i:i+k]...)
			i += k
		case i+k == len(b) && !final: // may complete with more bytes
			return string(out), i
		default: // invalid: its valid prefix becomes one U+FFFD
			out = append(out, "\uFFFD"...)
			i += k
		}
	}
	return string(out), i
}
