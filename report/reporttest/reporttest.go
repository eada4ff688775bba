// Package reporttest checks the JSON documents infer writes, for the tests
// of the commands that write them and of the report package.
package reporttest

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"
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
