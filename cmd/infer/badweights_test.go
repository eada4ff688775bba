package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// copyCheckpoint copies the model directory src to a temporary one and
// lets edit break it.
func copyCheckpoint(t *testing.T, src string, edit func(dir string)) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit(dir)
	return dir
}

// regularFiles is the name and hash of every regular file of dir.
func regularFiles(t *testing.T, dir string) string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var b strings.Builder
	for _, e := range ents {
		if !e.Type().IsRegular() {
			fmt.Fprintf(&b, "%s %v\n", e.Name(), e.Type())
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %x\n", e.Name(), sha256.Sum256(data))
	}
	return b.String()
}

// A checkpoint whose weights are cut short, malformed or missing fails
// infer and inspect, run as the command they are (so that a crash could
// not hide in the test binary's recovery), with exit 1 and one line that
// names the file and what is wrong: no panic, no stack trace, and the
// checkpoint left as it was.
func TestBadWeightsFiles(t *testing.T) {
	const tinyQwenBF16 = "../../testdata/models/qwen2-tiny-bf16"
	const shard2 = "model-00002-of-00003.safetensors"
	truncate := func(file string, size int64) func(string) {
		return func(dir string) {
			if err := os.Truncate(filepath.Join(dir, file), size); err != nil {
				t.Fatal(err)
			}
		}
	}
	// entry edits the header entry of model.norm.weight (F32 [64], the last
	// tensor of the data).
	entry := func(edit func(e map[string]any)) func(string) {
		return func(dir string) {
			patched := patchCheckpoint(t, tinyQwen, func(h map[string]any, _ []byte) { edit(h["model.norm.weight"].(map[string]any)) })
			b, err := os.ReadFile(filepath.Join(patched, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644)
		}
	}
	indexAdds := func(name, file string) func(string) {
		return func(dir string) {
			path := filepath.Join(dir, "model.safetensors.index.json")
			b, _ := os.ReadFile(path)
			var idx map[string]any
			if err := json.Unmarshal(b, &idx); err != nil {
				t.Fatal(err)
			}
			idx["weight_map"].(map[string]any)[name] = file
			b, _ = json.Marshal(idx)
			os.WriteFile(path, b, 0o644)
		}
	}
	for _, c := range []struct {
		name  string
		model string
		edit  func(dir string)
		want  string // the line, after "infer: "; %s is the model directory
	}{
		{"cut in the tensor data", tinyQwen, truncate("model.safetensors", 400_000),
			`loader: model.safetensors: tensor "model.layers.0.mlp.up_proj.weight": data [355256,400312) beyond end of file (400000 bytes): truncated?`},
		{"cut in the last byte", tinyQwen, truncate("model.safetensors", 635_831),
			`loader: model.safetensors: tensor "model.norm.weight": data [635576,635832) beyond end of file (635831 bytes): truncated?`},
		{"cut in the header", tinyQwen, truncate("model.safetensors", 1000),
			`loader: model.safetensors: header length 2736 beyond end of file (1000 bytes): truncated, or not a safetensors file?`},
		{"cut in the header length", tinyQwen, truncate("model.safetensors", 5),
			`loader: model.safetensors: file too short (5 bytes) for a safetensors header: truncated?`},
		{"header length beyond the file", tinyQwen, func(dir string) {
			f, err := os.OpenFile(filepath.Join(dir, "model.safetensors"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.Write(binary.LittleEndian.AppendUint64(nil, 1<<32))
		}, `loader: model.safetensors: header length 4294967296 beyond end of file (635832 bytes): truncated, or not a safetensors file?`},
		// The header patchCheckpoint writes is 4 bytes shorter: 8 + 2732
		// bytes, then the data, [0,633088), model.norm.weight its last 256.
		{"data_offsets beyond the file", tinyQwen, entry(func(e map[string]any) { e["data_offsets"] = []int{633088 + 1024 - 256, 633088 + 1024} }),
			`loader: model.safetensors: tensor "model.norm.weight": data [636596,636852) beyond end of file (635828 bytes): truncated?`},
		{"data_offsets overlapping", tinyQwen, entry(func(e map[string]any) { e["data_offsets"] = []int{633088 - 256 - 128, 633088 - 128} }),
			`loader: model.safetensors: tensor "model.norm.weight": data_offsets [632704,632960) overlap tensor "model.layers.1.self_attn.v_proj.weight"'s [624640,632832)`},
		{"dtype not matching the bytes", tinyQwen, entry(func(e map[string]any) { e["dtype"] = "BF16" }),
			`loader: model.safetensors: tensor "model.norm.weight": data_offsets [632832,633088) hold 256 bytes, but BF16 [64] needs 128`},
		{"weights file a directory", tinyQwen, func(dir string) {
			os.Remove(filepath.Join(dir, "model.safetensors"))
			os.Mkdir(filepath.Join(dir, "model.safetensors"), 0o755)
		}, `loader: %s/model.safetensors: a directory, not a regular file`},
		{"weights file a link to nothing", tinyQwen, func(dir string) {
			os.Remove(filepath.Join(dir, "model.safetensors"))
			os.Symlink("../../blobs/gone", filepath.Join(dir, "model.safetensors"))
		}, `loader: %s/model.safetensors: a symbolic link to ../../blobs/gone, which leads to no file`},
		{"shard missing", tinyQwenBF16, func(dir string) { os.Remove(filepath.Join(dir, shard2)) },
			`loader: ` + shard2 + `: shard missing (model.safetensors.index.json lists it for tensor "model.layers.0.input_layernorm.weight" and 11 more)`},
		{"shard a directory", tinyQwenBF16, func(dir string) {
			os.Remove(filepath.Join(dir, shard2))
			os.Mkdir(filepath.Join(dir, shard2), 0o755)
		}, `loader: %s/` + shard2 + `: a directory, not a regular file`},
		{"shard cut short", tinyQwenBF16, truncate(shard2, 50_000),
			`loader: ` + shard2 + `: tensor "model.layers.0.mlp.up_proj.weight": data [46432,68960) beyond end of file (50000 bytes): truncated?`},
		{"tensor missing from its shard", tinyQwenBF16, indexAdds("model.layers.0.extra.weight", shard2),
			`loader: ` + shard2 + `: tensor "model.layers.0.extra.weight": listed in model.safetensors.index.json but not in this file`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := copyCheckpoint(t, c.model, c.edit)
			want := c.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, dir)
			}
			before := regularFiles(t, dir)
			for _, args := range [][]string{
				{"--model", dir, "--device", "cpu", "--prompt", "hi", "--max-new-tokens", "2"},
				{"inspect", "--model", dir},
			} {
				code, stdout, stderr := inferChild(t, args...)
				if code != exitError || stdout != "" {
					t.Errorf("infer %s: exit %d, stdout %q", args[0], code, stdout)
				}
				if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine") {
					t.Errorf("infer %s crashed:\n%s", args[0], stderr)
				}
				oneLine(t, args, stderr, "infer: "+want)
			}
			if after := regularFiles(t, dir); after != before {
				t.Errorf("the checkpoint changed:\n%s\nnow\n%s", before, after)
			}
		})
	}
}

// inferChild runs infer as a process of its own (TestInferChild) and
// returns its exit status, stdout and stderr.
func inferChild(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	raw, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestInferChild$")
	cmd.Env = append(os.Environ(), "FUSELM_INFER_ARGS="+string(raw))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}
