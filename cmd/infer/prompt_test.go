package main

import (
	"slices"
	"strings"
	"testing"
)

func TestStripLines(t *testing.T) {
	cases := map[string]string{
		"a\n":             "a",
		"a\n\n":           "a\n",
		"  a  \n\tb\t\n":  "a\nb",
		"a\nb":            "a\nb",
		"":                "",
		"x \r\n y \r\n":   "x\ny",
		"one\n\n\ntwo\n ": "one\n\n\ntwo\n",
	}
	for in, want := range cases {
		if got := stripLines(in); got != want {
			t.Errorf("stripLines(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParsePrompts(t *testing.T) {
	in := "\ufeff{\"text\": \"one\"}\r\n\n  \n{\"prompt\": \"two\\nlines\", \"id\": 2}\n{\"text\": \" three \", \"meta\": {\"a\": [1]}}\n"
	got, lines, err := parsePrompts(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"one", "two\nlines", " three "}
	if !slices.Equal(got, want) || !slices.Equal(lines, []int{1, 4, 5}) {
		t.Errorf("parsePrompts = %q at lines %v, want %q at 1, 4, 5", got, lines, want)
	}
	bad := map[string]string{
		"":                                   "no prompts",
		"\n  \n":                             "no prompts",
		"{\"text\": \"a\"}\nnot json\n":      "line 2: not JSON",
		"{\"text\": \"a\"}{\"text\": \"b\"}": "line 1: not JSON",
		"{\"text\": \"a\"\n}":                "line 1: not JSON",
		"\"a bare string\"":                  "line 1: a JSON string, not an object",
		"[{\"text\": \"a\"}]":                "line 1: a JSON array, not an object",
		"null":                               "line 1: null",
		"{\"id\": 1}":                        `line 1: no "text" field`,
		"{\"text\": 5}":                      `line 1: "text" is not a string`,
		"{\"text\": null}":                   `line 1: "text" is not a string`,
		"{\"prompt\": [\"a\"]}":              `line 1: "prompt" is not a string`,
		"{\"text\": \"\"}":                   `line 1: "text" is empty`,
		"{\"text\": \"a\"}\n{\"text\": \" \\n\"}": `line 2: "text" is empty`,
		"{\"text\": \"a\", \"prompt\": \"b\"}":    `line 1: both "text" and "prompt"`,
	}
	for in, want := range bad {
		if _, _, err := parsePrompts(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parsePrompts(%q): error %v, want one with %q", in, err, want)
		}
	}
}
