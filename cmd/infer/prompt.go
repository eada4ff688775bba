package main

import (
	"fmt"
	"os"
	"strings"
)

// readPromptFile reads a prompt the way TileGym's benchmarks do: every line
// stripped of surrounding white space, the lines joined with newlines.
func readPromptFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("prompt file: %w", err)
	}
	return stripLines(string(b)), nil
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
