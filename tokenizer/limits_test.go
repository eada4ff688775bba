package tokenizer

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// allocated is the memory f allocates, in bytes.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A token id far beyond the vocabulary's size is legal (HF keeps ids in a
// map) and must cost memory for one entry, not for every id below it.
func TestTokenizerSparseIDs(t *testing.T) {
	const far = 2_000_000_000
	var tok *Tokenizer
	var err error
	n := allocated(func() {
		tok, err = tiny(t, func(m map[string]any) {
			m["model"].(map[string]any)["vocab"].(map[string]int)["zz"] = far
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n > 64<<20 {
		t.Errorf("parsing a vocabulary with id %d allocated %d MiB", far, n>>20)
	}
	if got := tok.VocabSize(); got != far+1 {
		t.Errorf("VocabSize = %d, want %d", got, far+1)
	}
	if got := tok.Decode([]int{far, 259}, false); got != "zzhello" {
		t.Errorf("Decode = %q, want %q", got, "zzhello")
	}
}

// Ids the kernels' i32 and HF's u32 cannot hold are refused wherever the
// file gives one.
func TestTokenizerIDRange(t *testing.T) {
	template := func(ids []any, repeat int) func(m map[string]any) {
		return func(m map[string]any) {
			single := []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}}
			for range repeat {
				single = append(single, map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}})
			}
			m["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": single,
				"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": ids}}}
		}
	}
	many := make([]any, 1000)
	for i := range many {
		many[i] = 262
	}
	for _, c := range []struct {
		name  string
		patch func(m map[string]any)
		want  string
	}{
		{"vocab", func(m map[string]any) { m["model"].(map[string]any)["vocab"].(map[string]int)["zz"] = 1 << 31 },
			`vocab: token "zz" has id 2147483648`},
		{"negative", func(m map[string]any) { m["model"].(map[string]any)["vocab"].(map[string]int)["zz"] = -1 },
			`vocab: token "zz" has id -1`},
		{"template id", template([]any{-3}, 1), `special token "<s>": id -3 outside`},
		{"template size", template(many, 1000), "more than 1024 special token ids"},
		{"roberta", func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": "RobertaProcessing", "cls": []any{"<s>", 1 << 40}, "sep": []any{"<s>", 0}}
		}, "cls: id 1099511627776 outside"},
	} {
		_, err := tiny(t, c.patch)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to say %q", c.name, err, c.want)
		}
	}
}

// tokenizer.json is read only when it is a regular file: /dev/zero in its
// place fails at once.
func TestLoadNotRegular(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skip(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("tokenizer.json -> /dev/zero: %v", err)
	}
}
