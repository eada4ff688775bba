package fused

import (
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestOverlapKernelsWait holds every kernel the set launches to overlap the
// one before it to its side of the bargain: it must call grid_wait before
// it touches another kernel's data, or it would read what that kernel has
// not written yet. The check reads the sources: the kernel's macro (or its
// own body, for a kernel defined without one) calls grid_wait, or calls a
// device function that does.
func TestOverlapKernelsWait(t *testing.T) {
	var src strings.Builder
	err := fs.WalkDir(sources, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sources, path)
		src.Write(b)
		src.WriteString("\n")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	text := src.String()
	macroOf := map[string]string{}
	for _, f := range instances() {
		for _, k := range f.Kernels {
			for _, n := range k.Names {
				macroOf[n] = f.Macro
			}
		}
	}
	// body is the text of the definition that starts at the first match
	// of re: a macro's continued lines, or a function up to its closing
	// brace at the start of a line.
	body := func(re *regexp.Regexp) string {
		loc := re.FindStringIndex(text)
		if loc == nil {
			return ""
		}
		rest := text[loc[0]:]
		if strings.HasPrefix(rest, "#define") {
			end := 0
			for _, line := range strings.SplitAfter(rest, "\n") {
				end += len(line)
				if !strings.HasSuffix(strings.TrimRight(line, "\n"), "\\") {
					break
				}
			}
			return rest[:end]
		}
		if end := strings.Index(rest, "\n}"); end >= 0 {
			return rest[:end]
		}
		return rest
	}
	calls := regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\s*(?:<[^;]*>)?\s*\(`) // a call, of a template or not
	for _, k := range slices.Concat(overlapKernels(), mlaFlatModule().Funcs, swModule().Funcs) {
		var def string
		if m, ok := macroOf[k]; ok {
			def = body(regexp.MustCompile(`#define ` + m + `\(`))
		} else {
			def = body(regexp.MustCompile(`__global__[^{;]*\b` + k + `\(`))
		}
		if def == "" {
			t.Errorf("%s: its definition is not in the sources", k)
			continue
		}
		if strings.Contains(def, "grid_wait()") {
			continue
		}
		waits := false
		for _, c := range calls.FindAllStringSubmatch(def, -1) {
			fn := body(regexp.MustCompile(`__device__[^;{]*\b` + c[1] + `\(`))
			waits = waits || strings.Contains(fn, "grid_wait()")
		}
		if !waits {
			t.Errorf("%s is launched to overlap the kernel before it but does not call grid_wait", k)
		}
	}
}
