package main

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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

// TestBenchAB runs scripts/bench.sh's A/B mode against stand-ins for infer
// (two of them, each naming itself in its records' commit) and nvidia-smi:
// the runs alternate A, B over PAIRS for each workload, their records carry
// variant and pair, the summary line names both sides, and bad PAIRS, a
// missing INFER_B or equal labels exit 2 before anything runs. Skipped
// where bash or python3 (the script's post-processing) is not found.
func TestBenchAB(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3: bench.sh writes its records with it")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "path", "nvidia-smi"), "#!/bin/sh\necho 'Stand-in GPU, 1.0'\n")
	write(filepath.Join(dir, "ckpt", "config.json"), "{}")
	stub := `#!/bin/sh
printf '{"commit": "%s", "kernels": "fused", "timings": {"new_tokens": 1, "tokens_per_s": %s, "wall_s": 1,
 "runs_wall_s": [1, 1, 1], "prefill_ms": 1, "decode_ms": 1, "graph_replays": 0},
 "rows": [{"prompt_ids": [1], "generated_ids": [2]}], "profile": []}\n' "$(basename "$(dirname "$0")")" "$TPS"
`
	for _, side := range []string{"a", "b"} {
		write(filepath.Join(dir, side, "infer"), stub)
	}
	run := func(env ...string) (string, error) {
		cmd := exec.Command(bash, filepath.Join(root, "scripts", "bench.sh"), "fused")
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "path")+":"+os.Getenv("PATH"), "QWEN2_7B="+filepath.Join(dir, "ckpt"),
			"OUT="+filepath.Join(dir, "out"), "ONLY=W2-b1 W2-b16", "INFER="+filepath.Join(dir, "a", "infer"), "TPS=100")
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("INFER_B="+filepath.Join(dir, "b", "infer"), "PAIRS=2", "LABEL=main", "LABEL_B=new")
	if err != nil {
		t.Fatalf("bench.sh A/B: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out", "bench_runs_main_vs_new.json"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []struct {
		Workload, Variant, Commit string
		Pair                      int
	}
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%s %s#%d %s", r.Workload, r.Variant, r.Pair, r.Commit))
	}
	want := []string{"W2-b16 main#1 a", "W2-b16 new#1 b", "W2-b16 main#2 a", "W2-b16 new#2 b",
		"W2-b1 main#1 a", "W2-b1 new#1 b", "W2-b1 main#2 a", "W2-b1 new#2 b"}
	if !slices.Equal(got, want) {
		t.Errorf("records %q, want %q", got, want)
	}
	if !strings.Contains(out, "W2-b1 fused A/B: main 100.0 100.0 (median 100.0), new 100.0 100.0 (median 100.0): +0.0%") {
		t.Errorf("no A/B summary for W2-b1 in:\n%s", out)
	}
	for _, bad := range [][]string{
		{"INFER_B=" + filepath.Join(dir, "b", "infer"), "PAIRS=0"},
		{"INFER_B=" + filepath.Join(dir, "none", "infer")},
		{"INFER_B=" + filepath.Join(dir, "b", "infer"), "LABEL=x", "LABEL_B=x"},
	} {
		out, err := run(bad...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%v: %v, want exit 2 and one line, got:\n%s", bad, err, out)
		}
	}
}
