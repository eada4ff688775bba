package main

import (
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/fuselm/fuselm/tokenizer"
)

// benchWorkload is a row of scripts/bench.sh's table:
// "name|prompt file|batch|new tokens".
var benchWorkload = regexp.MustCompile(`"(W[0-9][^|"]*)\|([^|"]+)\|([0-9]+)\|([0-9]+)"`)

// Every workload of scripts/bench.sh names a prompt file that is there, a
// JSONL one holding one prompt per row; W5 is among them, its 16 prompts
// distinct and about 128 DeepSeek-V2 tokens each.
func TestBenchWorkloads(t *testing.T) {
	root := filepath.Join("..", "..")
	script := filepath.Join(root, "scripts", "bench.sh")
	if bash, err := exec.LookPath("bash"); err == nil {
		if out, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v: %s", script, err, out)
		}
	}
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{}
	for _, m := range benchWorkload.FindAllStringSubmatch(string(b), -1) {
		found[m[1]] = m[2:]
		path := filepath.Join(root, m[2])
		if filepath.Ext(path) != ".jsonl" {
			if _, err := readPromptFile(path); err != nil {
				t.Errorf("%s: %v", m[1], err)
			}
			continue
		}
		prompts, _, err := readPromptsFile(path)
		if err != nil {
			t.Errorf("%s: %v", m[1], err)
			continue
		}
		if n, _ := strconv.Atoi(m[3]); n != len(prompts) {
			t.Errorf("%s: batch %d, but %s holds %d prompts", m[1], n, m[2], len(prompts))
		}
	}
	for _, w := range []string{"W1", "W2-b16", "W2-b1", "W3", "W4", "W5"} {
		if found[w] == nil {
			t.Errorf("scripts/bench.sh has no workload %s", w)
		}
	}
	w5 := found["W5"]
	if w5 == nil || w5[1] != "16" || w5[2] != "50" {
		t.Fatalf("W5 is %q, want 16 rows and 50 new tokens", w5)
	}
	prompts, _, err := readPromptsFile(filepath.Join(root, w5[0]))
	if err != nil {
		t.Fatal(err)
	}
	tok := deepSeekTokenizer(t)
	seen := map[string]bool{}
	for i, p := range prompts {
		if seen[p] {
			t.Errorf("W5 prompt %d repeats an earlier one", i+1)
		}
		seen[p] = true
		ids, err := tok.Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) < 112 || len(ids) > 144 {
			t.Errorf("W5 prompt %d: %d tokens, not about 128", i+1, len(ids))
		}
	}
}

// deepSeekTokenizer is DeepSeek-V2's tokenizer, gzipped in testdata.
func deepSeekTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "testdata", "tokenizer", "deepseek-v2.tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
