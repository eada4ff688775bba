// Package reporttest checks the JSON documents and traces infer writes, for the tests
// of the commands that write them and of the report package.
package reporttest

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/chrometrace"
)

// snakeKey is the form of every key of infer's JSON documents.
var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// CheckDocument parses doc as one of infer's JSON documents and fails t
// unless it opens with the build (version ver, commit rev: "" for null),
// the date and the device (device says whether one is named), and every
// key, at every depth, is snake_case.
func CheckDocument(t testing.TB, doc, ver, rev string, device bool) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("not one JSON document: %v\n%.400s", err, doc)
	}
	if m["version"] != ver {
		t.Errorf("version %v, want %q", m["version"], ver)
	}
	if c, ok := m["commit"]; !ok || (rev == "" && c != nil) || (rev != "" && c != rev) {
		t.Errorf("commit %v (present %v), want %q or null", c, ok, rev)
	}
	if d, _ := m["date"].(string); d == "" {
		t.Errorf("date %v", m["date"])
	} else if tm, err := time.Parse(time.RFC3339, d); err != nil || time.Since(tm) > time.Hour || tm.Location() != time.UTC {
		t.Errorf("date %q: %v", d, err)
	}
	if d, ok := m["device"]; !ok || (d != nil) != device {
		t.Errorf("device %v (present %v), want named: %v", d, ok, device)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if !snakeKey.MatchString(k) {
					t.Errorf("key %q at %s is not snake_case", k, path)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		}
	}
	walk("", m)
	return m
}

// ReadTrace reads and parses the trace file at path.
func ReadTrace(t testing.TB, path string) *chrometrace.Trace {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := chrometrace.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// KernelSteps checks a parsed trace: every decode step of the host phases
// has kernels on a GPU kernel track, the op track spans hold their
// kernels. It returns the decode steps seen.
func KernelSteps(t testing.TB, tr *chrometrace.Trace) int {
	t.Helper()
	names := map[[2]int]string{}
	for _, e := range tr.TraceEvents {
		if e.Ph == "M" {
			names[[2]int{e.Pid, int(e.Tid)}] = e.Args["name"].(string)
		}
	}
	steps := map[int]bool{}
	kernelsAt := map[int]int{}
	gpuOps := 0
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		track := names[[2]int{e.Pid, int(e.Tid)}]
		step := int(e.Args["step"].(float64))
		switch {
		case track == "phases" && strings.HasPrefix(e.Name, "decode step "):
			steps[step] = true
		case strings.HasPrefix(track, "kernels (stream"):
			kernelsAt[step]++
			for _, k := range []string{"op", "set", "layer", "phase", "grid", "block", "source"} {
				if _, ok := e.Args[k]; !ok {
					t.Errorf("kernel %s lacks %s", e.Name, k)
				}
			}
		case e.Pid == chrometrace.PidGPU && track == "ops":
			gpuOps++
		}
	}
	if len(steps) == 0 {
		t.Fatal("no decode step in the host phases")
	}
	for s := range steps {
		if kernelsAt[s] == 0 {
			t.Errorf("decode step %d has no kernel on the kernel track", s)
		}
	}
	if gpuOps == 0 {
		t.Error("no op on the GPU's op track")
	}
	return len(steps)
}
