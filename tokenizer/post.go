package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
)

// postProcessor is a tokenizer.json post-processor: it puts special
// tokens around an encoding when special tokens are asked for.
type postProcessor interface {
	process(ids []int, addSpecial bool) []int
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typed("post_processor", raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		// It only trims offsets; the ids stay as they are.
		return template{}, nil
	case "TemplateProcessing":
		return parseTemplate(raw)
	case "RobertaProcessing", "BertProcessing":
		var p struct {
			Sep []json.RawMessage `json:"sep"`
			Cls []json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("post_processor %s: %w", typ, err)
		}
		cls, err := specialPair(p.Cls)
		if err != nil {
			return nil, fmt.Errorf("post_processor %s: cls: %w", typ, err)
		}
		sep, err := specialPair(p.Sep)
		if err != nil {
			return nil, fmt.Errorf("post_processor %s: sep: %w", typ, err)
		}
		return template{before: []int{cls}, after: []int{sep}}, nil
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("post_processor Sequence: %w", err)
		}
		var seq postSeq
		for i, r := range s.Processors {
			p, err := parsePostProcessor(r)
			if err != nil {
				return nil, fmt.Errorf("post_processor Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("post_processor type %q not supported", typ)
}

// specialPair reads a ["token", id] pair.
func specialPair(p []json.RawMessage) (int, error) {
	var id int
	if len(p) != 2 || json.Unmarshal(p[1], &id) != nil {
		return 0, fmt.Errorf("want [\"token\", id]")
	}
	if err := checkID(id); err != nil {
		return 0, err
	}
	return id, nil
}

// checkID rejects an id HF's u32 ids and the kernels' i32 ones cannot hold.
func checkID(id int) error {
	if id < 0 || id > math.MaxInt32 {
		return fmt.Errorf("id %d outside [0, %d]", id, math.MaxInt32)
	}
	return nil
}

// maxTemplateIDs bounds the special tokens a template adds. A template
// names a special token, which may stand for several ids, as often as it
// likes: without a bound a small document could ask for a template of
// billions of ids. Real ones add one or two.
const maxTemplateIDs = 1024

// template puts fixed ids before and after the sequence (TemplateProcessing's
// "single" template; its "pair" template is for two sequences, never used here).
type template struct{ before, after []int }

func (p template) process(ids []int, addSpecial bool) []int {
	if !addSpecial || len(p.before)+len(p.after) == 0 {
		return ids
	}
	out := make([]int, 0, len(p.before)+len(ids)+len(p.after))
	out = append(out, p.before...)
	out = append(out, ids...)
	return append(out, p.after...)
}

func parseTemplate(raw json.RawMessage) (postProcessor, error) {
	var p struct {
		Single        json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("post_processor TemplateProcessing: %w", err)
	}
	pieces, err := templatePieces(p.Single)
	if err != nil {
		return nil, fmt.Errorf("post_processor TemplateProcessing: single: %w", err)
	}
	var t template
	seen := false // the sequence has been placed
	for _, pc := range pieces {
		if pc.sequence {
			if seen {
				return nil, fmt.Errorf("post_processor TemplateProcessing: single: the sequence appears twice")
			}
			seen = true
			continue
		}
		st, ok := p.SpecialTokens[pc.special]
		if !ok {
			return nil, fmt.Errorf("post_processor TemplateProcessing: special token %q missing from special_tokens", pc.special)
		}
		for _, id := range st.IDs {
			if err := checkID(id); err != nil {
				return nil, fmt.Errorf("post_processor TemplateProcessing: special token %q: %w", pc.special, err)
			}
		}
		if len(t.before)+len(t.after)+len(st.IDs) > maxTemplateIDs {
			return nil, fmt.Errorf("post_processor TemplateProcessing: single: more than %d special token ids", maxTemplateIDs)
		}
		if seen {
			t.after = append(t.after, st.IDs...)
		} else {
			t.before = append(t.before, st.IDs...)
		}
	}
	if !seen {
		return nil, fmt.Errorf("post_processor TemplateProcessing: single: no $A")
	}
	return t, nil
}

// templatePiece is a piece of a template: the sequence, or a special token.
type templatePiece struct {
	sequence bool
	special  string
}

// templatePieces reads a template: a list of {"SpecialToken": {"id": ...}}
// and {"Sequence": {"id": "A"}} objects. (HF's Python API also takes strings
// like "[CLS] $A [SEP]", but tokenizer.json holds the objects, and HF fails
// to load strings there.)
func templatePieces(raw json.RawMessage) ([]templatePiece, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("want a list of pieces, got %s", short(raw))
	}
	out := make([]templatePiece, 0, len(items))
	for _, it := range items {
		var obj struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		}
		if err := json.Unmarshal(it, &obj); err != nil {
			return nil, fmt.Errorf("bad piece %s", short(it))
		}
		switch {
		case obj.Sequence != nil:
			out = append(out, templatePiece{sequence: true})
		case obj.SpecialToken != nil:
			out = append(out, templatePiece{special: obj.SpecialToken.ID})
		default:
			return nil, fmt.Errorf("bad piece %s", short(it))
		}
	}
	return out, nil
}

// postSeq applies post-processors in order.
type postSeq []postProcessor

func (seq postSeq) process(ids []int, addSpecial bool) []int {
	for _, p := range seq {
		ids = p.process(ids, addSpecial)
	}
	return ids
}
