package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/fuselm/fuselm/infile"
)

// maxTextBytes bounds a text read from a file: far more than any context
// window holds (a million tokens are a few MB), and little enough memory that
// /dev/zero or a wrong file fails at once.
const maxTextBytes = 64 << 20

// readText reads a whole text file of at most maxTextBytes; anything but
// a regular file is refused.
func readText(path string) (string, error) {
	b, err := infile.Read(path, maxTextBytes)
	if tl := (*infile.TooLargeError)(nil); errors.As(err, &tl) {
		return "", fmt.Errorf("%s: more than %d MiB, more text than any model's context holds", path, maxTextBytes>>20)
	}
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// readPromptFile reads a prompt the way TileGym's benchmarks do: every line
// stripped of surrounding white space, the lines joined with newlines.
func readPromptFile(path string) (string, error) {
	s, err := readText(path)
	if err != nil {
		return "", fmt.Errorf("--prompt-file: %w", err)
	}
	return stripLines(s), nil
}

// stripLines iterates lines as Python's file iteration does (a final newline
// ends the last line rather than starting an empty one), strips each and
// joins them with "\n".
func stripLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "\n")
}

// promptsRule is how --help states where the rows' prompts come from.
const promptsRule = `The prompt: --prompt S or --prompt-file F (lines stripped, joined with
newlines, as TileGym reads it) is repeated on each of the --batch rows.
--prompts F.jsonl gives each row its own prompt: JSONL, one JSON object a
line whose "text" field (or "prompt") is the prompt, as it is:
  {"text": "The first prompt"}
  {"text": "A second one,\nover two lines", "id": 7}
Other fields are ignored and blank lines skipped; the rows are the file's
prompts in order, of any lengths, and --batch, if given, must be their
count. A line that is not such an object, or whose prompt is empty, fails
the run, naming the file and the line.`

// readPromptsFile reads the prompts of --prompts: JSONL, one JSON object a
// line whose "text" (or "prompt") field, a string, is one row's prompt,
// used as it is (JSON escapes its newlines). Other fields are ignored and
// blank lines skipped; every other departure fails, naming the line.
// It returns the prompts and the line of each.
func readPromptsFile(path string) (prompts []string, lines []int, err error) {
	s, err := readText(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--prompts: %w", err)
	}
	if prompts, lines, err = parsePrompts(s); err != nil {
		return nil, nil, fmt.Errorf("--prompts %s: %w", path, err)
	}
	return prompts, lines, nil
}

// parsePrompts is readPromptsFile's parser, over the file's text.
func parsePrompts(s string) (prompts []string, lines []int, err error) {
	s = strings.TrimPrefix(s, "\ufeff") // a byte-order mark some editors write
	for i, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		text, err := promptOfLine(line)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		prompts, lines = append(prompts, text), append(lines, i+1)
	}
	if len(prompts) == 0 {
		return nil, nil, errors.New(`no prompts: one JSON object a line, such as {"text": "..."}, is expected`)
	}
	return prompts, lines, nil
}

// promptOfLine is the prompt of one JSONL line.
func promptOfLine(line string) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &obj); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return "", fmt.Errorf(`a JSON %s, not an object with a "text" field`, te.Value)
		}
		return "", fmt.Errorf("not JSON: %v", err)
	}
	if obj == nil { // the line is null
		return "", errors.New(`null, not an object with a "text" field`)
	}
	raw, field := obj["text"], "text"
	if p, ok := obj["prompt"]; ok {
		if raw != nil {
			return "", errors.New(`both "text" and "prompt": give one`)
		}
		raw, field = p, "prompt"
	}
	if raw == nil {
		return "", errors.New(`no "text" field (nor "prompt")`)
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil || string(raw) == "null" {
		return "", fmt.Errorf("%q is not a string", field)
	}
	if strings.TrimSpace(text) == "" {
		return "", fmt.Errorf("%q is empty", field)
	}
	return text, nil
}
