package main

import (
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
