package main

import (
	"encoding/json"
	"fmt"
	"github.com/fuselm/fuselm/report"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// threePrompts are distinct prompts of different lengths.
var threePrompts = []string{
	"Anarchism is a political philosophy and movement that is skeptical of all justifications for authority.",
	"Hello",
	"The quick brown fox\njumps over the lazy dog.",
}

// writePrompts writes texts as a --prompts file and returns its path.
func writePrompts(t *testing.T, texts ...string) string {
	t.Helper()
	var b strings.Builder
	for i, s := range texts {
		line, _ := json.Marshal(map[string]any{"text": s, "id": i})
		b.Write(append(line, '\n'))
	}
	path := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// genJSON runs infer --json and returns its rows.
func genJSON(t *testing.T, args ...string) report.Run {
	t.Helper()
	args = append(args, "--max-new-tokens", "4", "--min-new-tokens", "4", "--json", "--quiet")
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("infer %q: exit %d: %s", args, code, stderr)
	}
	var r report.Run
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// With --prompts every row runs its own prompt, whatever its length, and
// generates what that prompt generates alone.
func TestPromptsRows(t *testing.T) {
	path := writePrompts(t, threePrompts...)
	for _, model := range []string{tinyQwen, tinyDeepSeek} {
		r := genJSON(t, "--model", model, "--prompts", path)
		if r.Batch != 3 || len(r.Rows) != 3 {
			t.Fatalf("%s: batch %d, %d rows, want 3", model, r.Batch, len(r.Rows))
		}
		total := 0
		for i, row := range r.Rows {
			alone := genJSON(t, "--model", model, "--prompt", threePrompts[i])
			if !slices.Equal(row.PromptIDs, alone.Rows[0].PromptIDs) || !slices.Equal(row.GeneratedIDs, alone.Rows[0].GeneratedIDs) {
				t.Errorf("%s row %d: prompt %v generated %v; alone %v generated %v", model, i,
					row.PromptIDs, row.GeneratedIDs, alone.Rows[0].PromptIDs, alone.Rows[0].GeneratedIDs)
			}
			total += len(row.PromptIDs)
		}
		if l0, l1 := len(r.Rows[0].PromptIDs), len(r.Rows[1].PromptIDs); l0 == l1 {
			t.Errorf("%s: rows 0 and 1 have %d prompt tokens each: the test wants rows of different lengths", model, l0)
		}
		if r.Timings.PromptTokens != total {
			t.Errorf("%s: prompt_tokens %d, want every row's, %d", model, r.Timings.PromptTokens, total)
		}
	}
	// --batch equal to the file's count is accepted.
	if r := genJSON(t, "--model", tinyQwen, "--prompts", path, "--batch", "3"); len(r.Rows) != 3 {
		t.Errorf("--batch 3: %d rows", len(r.Rows))
	}
	// The text output prints every distinct row, each under its label.
	code, stdout, stderr := runInfer(t, "--model", tinyQwen, "--prompts", path, "--max-new-tokens", "3", "--quiet")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for i := range threePrompts {
		if !strings.Contains(stdout, fmt.Sprintf("--- row %d\n", i)) {
			t.Errorf("text output has no row %d:\n%s", i, stdout)
		}
	}
	// Rows of one prompt that generate one text are printed once.
	code, stdout, _ = runInfer(t, "--model", tinyQwen, "--prompts", writePrompts(t, "hello", "hello"), "--max-new-tokens", "3", "--quiet")
	if code != exitOK || !strings.Contains(stdout, "--- all 2 rows\n") {
		t.Errorf("two rows of one prompt: exit %d, output:\n%s", code, stdout)
	}
}

// compare runs --prompts' rows too, and reports each row's prompt length.
func TestComparePrompts(t *testing.T) {
	withTestSets(t)
	path := writePrompts(t, threePrompts...)
	args := []string{"compare", "--model", tinyQwen, "--prompts", path, "--max-new-tokens", "3", "--min-new-tokens", "3", "--quiet",
		"--baseline", "cpu_slow", "--candidate", "cpu", "--json"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r report.Compare
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if r.Batch != 3 || len(r.RowPromptTokens) != 3 || r.PromptTokens != slices.Max(r.RowPromptTokens) {
		t.Errorf("batch %d, row_prompt_tokens %v, prompt_tokens %d", r.Batch, r.RowPromptTokens, r.PromptTokens)
	}
}

// The command line's mistakes are usage errors; a file whose content is
// wrong fails the run; either says one line, naming the file and line.
func TestPromptsErrors(t *testing.T) {
	good := writePrompts(t, threePrompts...)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notJSON := file("notjson.jsonl", "{\"text\": \"a\"}\nplain text\n")
	noField := file("nofield.jsonl", "{\"text\": \"a\"}\n\n{\"input\": \"b\"}\n")
	empty := file("emptytext.jsonl", "{\"text\": \"  \"}\n")
	emptyFile := file("empty.jsonl", "")
	fifo := filepath.Join(dir, "fifo.jsonl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		fifo = ""
	}
	base := []string{"--model", tinyQwen, "--max-new-tokens", "2", "--quiet"}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--prompts", good, "--batch", "2"}, exitUsage, "--batch 2, but --prompts " + good + " holds 3 prompts"},
		{[]string{"--prompts", good, "--prompt", "hi"}, exitUsage, "give exactly one of --prompt, --prompt-file or --prompts"},
		{[]string{"--prompts", good, "--prompt-file", shortPrompt}, exitUsage, "give exactly one of"},
		{[]string{"--prompts", good, "--max-new-tokens", "100000"}, exitUsage, "--prompts " + good + ": line 1's"},
		{[]string{"--prompts", good, "--profile", good}, exitUsage, "is --prompts, an input of this run"},
		{[]string{"--prompts", notJSON}, exitError, "--prompts " + notJSON + ": line 2: not JSON"},
		{[]string{"--prompts", noField}, exitError, "--prompts " + noField + `: line 3: no "text" field`},
		{[]string{"--prompts", empty}, exitError, "--prompts " + empty + `: line 1: "text" is empty`},
		{[]string{"--prompts", emptyFile}, exitError, "--prompts " + emptyFile + ": no prompts"},
		{[]string{"--prompts", filepath.Join(dir, "absent.jsonl")}, exitError, "absent.jsonl: no such file"},
		{[]string{"--prompts", dir}, exitError, "a directory, not a regular file"},
	}
	if fifo != "" {
		cases = append(cases, struct {
			args []string
			code int
			want string
		}{[]string{"--prompts", fifo}, exitError, fifo + ": a FIFO, not a regular file"})
	}
	for _, c := range cases {
		for _, cmd := range [][]string{nil, {"compare"}} {
			if cmd != nil && slices.Contains(c.args, "--profile") {
				continue // compare has no --profile
			}
			args := append(append(append([]string(nil), cmd...), base...), c.args...)
			code, stdout, stderr := inferWithin(t, args...)
			if code != c.code || stdout != "" {
				t.Errorf("infer %q: exit %d (want %d), stdout %q", args, code, c.code, stdout)
			}
			oneLine(t, args, stderr, c.want)
		}
	}
}
