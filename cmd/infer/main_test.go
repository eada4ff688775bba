package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels/cuda"
)

const (
	tinyQwen     = "../../testdata/models/qwen2-tiny"
	tinyDeepSeek = "../../testdata/models/deepseek-v2-tiny"
	shortPrompt  = "../../testdata/prompts/short.txt"
)

// runInfer runs the command line in process and returns its exit status,
// stdout and stderr.
func runInfer(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// oneLine fails unless stderr is exactly one "infer: " line holding want.
func oneLine(t *testing.T, args []string, stderr, want string) {
	t.Helper()
	if !strings.HasPrefix(stderr, "infer: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
		t.Errorf("infer %q: stderr %q, want one line with %q", args, stderr, want)
	}
}

// patchCheckpoint copies the model directory src to a temporary one and
// lets patch edit the JSON header of its model.safetensors and the data
// section (offsets in the header are relative to it).
func patchCheckpoint(t *testing.T, src string, patch func(header map[string]any, data []byte)) string {
	t.Helper()
	return copyCheckpoint(t, src, func(dir string) {
		path := filepath.Join(dir, "model.safetensors")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := binary.LittleEndian.Uint64(b)
		var header map[string]any
		if err := json.Unmarshal(b[8:8+n], &header); err != nil {
			t.Fatal(err)
		}
		data := b[8+n:]
		patch(header, data)
		h, err := json.Marshal(header)
		if err != nil {
			t.Fatal(err)
		}
		b = append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
		if err := os.WriteFile(path, append(b, data...), 0o644); err != nil {
			t.Fatal(err)
		}
	})
}

// tensorData is the bytes of tensor name in a patchCheckpoint data section.
func tensorData(t *testing.T, header map[string]any, data []byte, name string) []byte {
	t.Helper()
	e, ok := header[name].(map[string]any)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	offs := e["data_offsets"].([]any)
	return data[int(offs[0].(float64)):int(offs[1].(float64))]
}

// The exit status is 2 for a wrong command line, 1 for every other
// failure, and the failure is one line on stderr; --help says so.
func TestExitStatus(t *testing.T) {
	gen := []string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2", "--quiet"}
	with := func(extra ...string) []string { return append(append([]string(nil), gen...), extra...) }
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"foo"}, exitUsage, `unknown command or stray argument "foo"`},
		{with("stray"), exitUsage, `stray argument "stray"`},
		{[]string{"tokenize", "stray", "--model", tinyQwen, "--text", "a"}, exitUsage, `unexpected argument "stray"`},
		{[]string{"inspect", "--model", tinyQwen, "x"}, exitUsage, `unexpected argument "x"`},
		{[]string{"kernels", "x"}, exitUsage, `unknown command "x"`},
		{[]string{"kernels", "--arch", "hopper"}, exitUsage, `--arch "hopper": want a real architecture`},
		{[]string{"kernels", "--nvrtc", "/nonexistent/libcuda.so"}, exitError, "is not NVRTC's library"},
		{[]string{"help", "foo"}, exitUsage, `no help for "foo"`},
		{[]string{"--bogus"}, exitUsage, "unknown flag: --bogus"},
		{[]string{"tokenize", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{[]string{}, exitUsage, "--model is required"},
		{with("--temperature", "NaN"), exitUsage, "--temperature must be a finite number"},
		{with("--temperature", "+Inf"), exitUsage, "--temperature must be a finite number"},
		{with("--top-p", "NaN"), exitUsage, "--top-p must be in [0, 1], not NaN"},
		{with("--batch", "0"), exitUsage, "--batch must be at least 1"},
		{with("--batch", "x"), exitUsage, `invalid argument "x" for "--batch"`},
		{with("--max-new-tokens", "9223372036854775807"), exitUsage, "more than the model's max_position_embeddings (256)"},
		{[]string{"tokenize", "--model", tinyQwen}, exitUsage, "give exactly one of --text or --file"},
		{[]string{"--model", "/nonexistent/model", "--prompt", "hi"}, exitError, "/nonexistent/model"},
		{with("--prompt-file", "/nonexistent/prompt.txt"), exitUsage, "exactly one of --prompt, --prompt-file or --prompts"},
		{[]string{"--model", tinyQwen, "--prompt-file", "/nonexistent/prompt.txt"}, exitError, "--prompt-file: stat /nonexistent/prompt.txt: no such file"},
		{with("--batch", "1099511627776"), exitError, "but cpu"},
		{with("--batch", "10000000"), exitError, "lower --batch or --max-new-tokens"},
	} {
		code, _, stderr := runInfer(t, c.args...)
		if code != c.code {
			t.Errorf("infer %q: exit %d, want %d (stderr %q)", c.args, code, c.code, stderr)
		}
		oneLine(t, c.args, stderr, c.want)
	}

	code, stdout, _ := runInfer(t, "--help")
	if code != exitOK || !strings.Contains(stdout, "Exit status: 0 on success; 2 when the command line is wrong") {
		t.Errorf("infer --help: exit %d, no exit statuses in\n%s", code, stdout)
	}
	for _, args := range [][]string{{"help", "tokenize"}, {"inspect", "--help"}, {"inspect", "--model", tinyDeepSeek}} {
		if code, _, stderr := runInfer(t, args...); code != exitOK {
			t.Errorf("infer %q: exit %d (%s)", args, code, stderr)
		}
	}
}

// The README's command works: the bundled prompt fits the tiny checkpoint.
// Logs go to stderr always (progress bars only on a terminal, which stderr
// is not here); --quiet silences them.
func TestShortPromptAndLogs(t *testing.T) {
	args := []string{"--model", tinyQwen, "--prompt-file", shortPrompt, "--max-new-tokens", "16"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitOK || !strings.Contains(stdout, "qwen2-tiny_cpu_float32 | ") {
		t.Fatalf("infer %q: exit %d\n%s%s", args, code, stdout, stderr)
	}
	if !strings.Contains(stderr, "infer: weights loaded") {
		t.Errorf("no log on stderr: %q", stderr)
	}
	code, _, stderr = runInfer(t, append(args, "--quiet")...)
	if code != exitOK || stderr != "" {
		t.Errorf("--quiet: exit %d, stderr %q", code, stderr)
	}
}

// An output path that cannot be written fails before anything is loaded;
// one that can is written without replacing what was there.
func TestProfileOutput(t *testing.T) {
	dir := t.TempDir()
	gen := []string{"--model", tinyQwen, "--prompt", "hi", "--max-new-tokens", "2"}
	for _, c := range []struct{ path, want string }{
		{dir, "is a directory"},
		{filepath.Join(dir, "missing", "p.json"), "no directory"},
		{"/proc/fuselm-profile.json", "cannot create files in /proc"},
	} {
		args := append(append([]string(nil), gen...), "--profile", c.path)
		code, stdout, stderr := runInfer(t, args...)
		if code != exitError || stdout != "" {
			t.Errorf("--profile %s: exit %d, stdout %q", c.path, code, stdout)
		}
		oneLine(t, args, stderr, c.want) // no log line: nothing was loaded
	}

	real := filepath.Join(dir, "real.json")
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink("real.json", link); err != nil {
		t.Skip(err)
	}
	os.WriteFile(real, []byte("old"), 0o644)
	if code, _, stderr := runInfer(t, append(gen, "--quiet", "--profile", link)...); code != exitOK {
		t.Fatalf("--profile through a symlink: exit %d: %s", code, stderr)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the symlink given as --profile was replaced")
	}
	var prof map[string]any
	b, _ := os.ReadFile(real)
	if json.Unmarshal(b, &prof) != nil || prof["profile"] == nil {
		t.Errorf("the symlink's target holds %q", b)
	} else if m := checkDocument(t, string(b), true); m["rows"] != nil {
		t.Errorf("the --profile file holds rows: %v", m["rows"])
	}
	// Devices are outfile's tests: a regression here, run as root, would
	// replace /dev/null.
}

// Prompt and text files are read only when they are regular files, and
// up to a bound: /dev/zero and a sparse file of 65 MiB fail at once.
func TestTextFileBound(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.txt")
	if err := os.WriteFile(big, nil, 0o644); err != nil || os.Truncate(big, 65<<20) != nil {
		t.Skip("no sparse file here")
	}
	for _, c := range []struct{ file, want string }{{"/dev/zero", "a device, not a regular file"}, {big, "more than 64 MiB"}} {
		for _, args := range [][]string{
			{"--model", tinyQwen, "--prompt-file", c.file},
			{"tokenize", "--model", tinyQwen, "--file", c.file},
		} {
			code, _, stderr := runInfer(t, args...)
			if code != exitError {
				t.Errorf("infer %q: exit %d", args, code)
			}
			oneLine(t, args, stderr, c.want)
		}
	}
}

// A checkpoint infer could not run makes inspect say why and exit 1; one
// with NaN weights makes generation stop at the first step, exit 1.
func TestBadCheckpoints(t *testing.T) {
	wrongDType := patchCheckpoint(t, tinyQwen, func(h map[string]any, _ []byte) {
		h["model.norm.weight"].(map[string]any)["dtype"] = "I32" // same size as F32
	})
	missing := patchCheckpoint(t, tinyQwen, func(h map[string]any, data []byte) {
		// Renaming keeps the data where the header says, under another name.
		h["model.norm.renamed"] = h["model.norm.weight"]
		delete(h, "model.norm.weight")
	})
	for _, c := range []struct{ dir, want string }{
		{wrongDType, `tensor "model.norm.weight" (model.safetensors): dtype I32 not supported`},
		{missing, `tensor "model.norm.weight": missing`},
	} {
		code, stdout, stderr := runInfer(t, "inspect", "--model", c.dir)
		if code != exitError || !strings.Contains(stderr, c.want) || !strings.Contains(stdout, "infer can run it  no") {
			t.Errorf("inspect of a bad checkpoint: exit %d, stderr %q, stdout\n%s", code, stderr, stdout)
		}
		if strings.Contains(stdout, "map[") {
			t.Errorf("inspect prints Go maps:\n%s", stdout)
		}
		if code, _, stderr := runInfer(t, "--model", c.dir, "--prompt", "hi", "--quiet"); code != exitError || !strings.Contains(stderr, c.want) {
			t.Errorf("infer on a bad checkpoint: exit %d, stderr %q", code, stderr)
		}
	}

	nan := patchCheckpoint(t, tinyQwen, func(h map[string]any, data []byte) {
		w := tensorData(t, h, data, "model.norm.weight")
		for i := 0; i < len(w); i += 4 {
			binary.LittleEndian.PutUint32(w[i:], math.Float32bits(float32(math.NaN())))
		}
	})
	args := []string{"--model", nan, "--prompt", "hi", "--quiet"}
	code, stdout, stderr := runInfer(t, args...)
	if code != exitError || stdout != "" {
		t.Errorf("NaN checkpoint: exit %d, stdout %q", code, stdout)
	}
	oneLine(t, args, stderr, "step 1 (prefill): row 0's logits are not finite")
}

// --kernels naive with no GPU names the problem first, in one short line.
func TestNoGPUMessage(t *testing.T) {
	if cuda.Available() {
		t.Skip("a CUDA device is here")
	}
	args := []string{"--model", tinyQwen, "--prompt", "hi", "--kernels", "naive"}
	code, _, stderr := runInfer(t, args...)
	if code != exitError {
		t.Errorf("exit %d", code)
	}
	oneLine(t, args, stderr, "infer: --kernels naive needs a CUDA device: cuda: no CUDA")
	if len(stderr) > 400 {
		t.Errorf("the message is %d characters long: %s", len(stderr), stderr)
	}
	// compare names its own flags, and what it needs.
	args = []string{"compare", "--model", tinyQwen, "--prompt", "hi"}
	code, _, stderr = runInfer(t, args...)
	if code != exitError {
		t.Errorf("compare: exit %d", code)
	}
	oneLine(t, args, stderr, "infer: compare needs a CUDA device for --baseline naive and --candidate fused (the cpu set alone leaves nothing to compare): cuda: no CUDA")
	if strings.Contains(stderr, "--kernels") || len(stderr) > 450 {
		t.Errorf("compare: %s", stderr)
	}
}

// The README states the exit statuses in the words --help uses.
func TestREADMEExitRule(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Skip(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	if rule := strings.Join(strings.Fields(exitRule), " "); !strings.Contains(readme, rule) {
		t.Errorf("README.md does not state the exit rule of --help:\n%s", rule)
	}
}

// The README's synopses name every flag each command's --help has.
func TestREADMESynopses(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Skip(err)
	}
	_, usage, ok := strings.Cut(string(b), "\n## Usage\n")
	if !ok {
		t.Fatal("README.md has no Usage section")
	}
	synopsis := map[string]string{} // command name ("" for generate) → its synopsis lines
	cmd := ""
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.HasPrefix(line, "    infer "):
			cmd = ""
			if w := strings.Fields(line)[1]; !strings.HasPrefix(w, "-") {
				cmd = w
			}
			synopsis[cmd] += line
		case strings.HasPrefix(line, "          ") && len(synopsis) > 0:
			synopsis[cmd] += line
		case len(synopsis) > 0 && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "    "):
			goto done
		}
	}
done:
	root := newRootCmd()
	root.AddCommand(newTokenizeCmd(), newInspectCmd(), newBenchCmd(), newCompareCmd(), newKernelsCmd())
	root.Version = "v"
	root.InitDefaultVersionFlag()
	for _, c := range append([]*cobra.Command{root}, root.Commands()...) {
		name := c.Name()
		if c == root {
			name = ""
		}
		syn, ok := synopsis[name]
		if !ok {
			t.Errorf("README.md has no synopsis of infer %s", name)
			continue
		}
		flags := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(c.Flags().FlagUsages(), -1)
		if len(flags) == 0 {
			t.Errorf("infer %s: no flags read from its usage", name)
		}
		for _, f := range flags {
			if f[1] != "help" && !strings.Contains(syn, "--"+f[1]) {
				t.Errorf("README.md's synopsis of infer %s lacks --%s", name, f[1])
			}
		}
	}
}
