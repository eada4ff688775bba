package main

import "testing"

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
