package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/loader"
	"github.com/fuselm/fuselm/model"
	"github.com/fuselm/fuselm/tokenizer"
)

// The session every generating command (infer, compare) opens, in its
// order: the inputs read and checked, the kernel spec chosen, the device
// and its ops opened, the model loaded.

// runInputs is what a generation needs before a device is opened: the
// device kind and kernel spec, the checkpoint, its tokenizer, every row's
// prompt ids and the weights (open; the caller closes them).
type runInputs struct {
	kind    string
	spec    kernels.Spec
	dir     string
	cfg     *loader.Config
	tok     *tokenizer.Tokenizer
	prompts [][]int // --prompts' rows, or the one prompt that every row repeats
	weights *loader.Weights
	// compiled is what building the kernels compiled (compileNote), for
	// the log: "" where every module came from the kernel cache.
	compiled string
}

// rows is every row's prompt, batch rows: --prompts' own, or the one
// prompt repeated. It is called once the model is loaded for batch rows
// (the load refuses a batch too large for the device).
func (in *runInputs) rows(batch int) [][]int {
	if len(in.prompts) == batch {
		return in.prompts
	}
	rows := make([][]int, batch)
	for i := range rows {
		rows[i] = in.prompts[0]
	}
	return rows
}

// longest is the most prompt tokens of a row.
func (in *runInputs) longest() int {
	n := 0
	for _, r := range in.prompts {
		n = max(n, len(r))
	}
	return n
}

// promptTexts reads the prompts f names: --prompts' rows, or --prompt
// or --prompt-file's one text; names[i] says where text i came from.
func (f *genFlags) promptTexts() (texts, names []string, err error) {
	switch {
	case f.promptsFile != "":
		var lines []int
		if texts, lines, err = readPromptsFile(f.promptsFile); err != nil {
			return nil, nil, err
		}
		for _, l := range lines {
			names = append(names, fmt.Sprintf("--prompts %s: line %d", f.promptsFile, l))
		}
		return texts, names, nil
	case f.promptFile != "":
		text, err := readPromptFile(f.promptFile)
		if err != nil {
			return nil, nil, err
		}
		if strings.TrimSpace(text) == "" {
			return nil, nil, usageError{errors.New("the prompt is empty")}
		}
		return []string{text}, []string{"the prompt"}, nil
	}
	if strings.TrimSpace(f.prompt) == "" {
		return nil, nil, usageError{errors.New("the prompt is empty")}
	}
	return []string{f.prompt}, []string{"the prompt"}, nil
}

// readInputs reads the prompts, picks the device and spec, and opens the
// checkpoint f names, checking what can be checked before loading. With
// --prompts it sets f.batch to the file's count of prompts.
func (f *genFlags) readInputs(cmd *cobra.Command) (*runInputs, error) {
	texts, names, err := f.promptTexts()
	if err != nil {
		return nil, err
	}
	if f.promptsFile != "" {
		if cmd.Flags().Changed("batch") && f.batch != len(texts) {
			return nil, usageError{fmt.Errorf("--batch %d, but --prompts %s holds %d prompts, one a row: leave --batch out or make it %d",
				f.batch, f.promptsFile, len(texts), len(texts))}
		}
		f.batch = len(texts)
	}
	kind, spec, err := chooseSpec(f)
	if err != nil {
		return nil, err
	}
	dir, err := loader.Resolve(f.model)
	if err != nil {
		return nil, err
	}
	cfg, err := loader.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	var prompts [][]int
	for i, text := range texts {
		ids, err := tok.Encode(text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
		if len(ids) == 0 {
			if f.promptsFile != "" {
				return nil, fmt.Errorf("%s encodes to no tokens", names[i])
			}
			return nil, usageError{errors.New("the prompt encodes to no tokens")}
		}
		if f.maxNew > cfg.MaxPositions-len(ids) { // not len(ids)+f.maxNew: that may overflow
			return nil, usageError{fmt.Errorf("%s's %d tokens + --max-new-tokens %d are more than the model's max_position_embeddings (%d)",
				names[i], len(ids), f.maxNew, cfg.MaxPositions)}
		}
		prompts = append(prompts, ids)
	}
	weights, err := loader.OpenWeights(dir)
	if err != nil {
		return nil, err
	}
	return &runInputs{kind: kind, spec: spec, dir: dir, cfg: cfg, tok: tok, prompts: prompts, weights: weights}, nil
}

// logger is the log function of a command: lines on stderr, none with
// --quiet.
func (f *genFlags) logger(cmd *cobra.Command) func(format string, a ...any) {
	w := cmd.ErrOrStderr()
	if f.quiet {
		w = io.Discard
	}
	return func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
}

// chooseSpec picks the device kind and the kernel spec: --device, else the
// kind of the --kernels sets, else CUDA when a GPU is found; --kernels, else
// the device kind's default set. It loads nothing, so a bad spec fails first.
func chooseSpec(f *genFlags) (string, kernels.Spec, error) {
	var spec kernels.Spec
	if f.kernels != "" {
		var err error
		if spec, err = kernels.ParseSpec(f.kernels); err != nil {
			return "", spec, usageError{err}
		}
	}
	kind := f.device
	if kind == "" {
		kind = "cpu"
		if f.kernels != "" {
			if k, err := spec.DeviceKind(); err == nil {
				kind = k
			}
		} else if cuda.Available() {
			kind = "cuda"
		}
	}
	if f.kernels == "" {
		def := kernels.DefaultSet(kind)
		if def == "" {
			return "", spec, fmt.Errorf("no kernel set for %s devices is built into this binary", kind)
		}
		spec, _ = kernels.ParseSpec(def)
	}
	setKind, err := spec.DeviceKind()
	if err != nil {
		return "", spec, usageError{err}
	}
	if setKind != kind {
		return "", spec, usageError{fmt.Errorf("kernel spec %q runs on %s, not on --device %s", spec, setKind, kind)}
	}
	return kind, spec, nil
}

// openDevice opens device 0 of the kind chooseSpec picked for f.
func openDevice(kind string, f *genFlags) (kernels.Device, error) {
	if kind == "cpu" {
		return cpuDevice(), nil
	}
	if err := cuda.Probe(); err != nil {
		asked := "--device cuda"
		if f.device == "" {
			asked = "--kernels " + f.kernels
		}
		return nil, fmt.Errorf("%s needs a CUDA device: %w", asked, err)
	}
	return cuda.Open(0)
}

// openRun opens the device in names, a profile of its work (CUPTI's
// kernel records where it can) and spec's ops on it; done stops the
// profile's trace and closes the device.
func openRun(f *genFlags, in *runInputs, spec kernels.Spec) (dev kernels.Device, prof *profile.Profile, ops *kernels.Dispatch, done func(), err error) {
	if dev, err = openDevice(in.kind, f); err != nil {
		return nil, nil, nil, nil, err
	}
	prof = newProfile(dev, f.cupti)
	done = func() {
		prof.Close()
		dev.Close()
	}
	t0 := time.Now()
	if ops, err = spec.Build(dev, prof); err != nil {
		done()
		return nil, nil, nil, nil, err
	}
	in.compiled = compileNote(dev, time.Since(t0))
	return dev, prof, ops, done, nil
}

// compileNote says what building a set on dev compiled, where NVRTC
// compiled anything (a first run on an empty kernel cache waits for it),
// and where the modules are kept for the runs after.
func compileNote(dev kernels.Device, took time.Duration) string {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return ""
	}
	st := d.ModuleStats()
	if st.Compiled == 0 {
		return ""
	}
	where := "the kernel cache is off"
	if dir := d.CacheDir(); dir != "" {
		where = "kept in " + dir + " for the runs after"
	}
	return fmt.Sprintf("infer: kernels built in %.1f s: NVRTC compiled %d modules (%s)", took.Seconds(), st.Compiled, where)
}

// newProfile is the profile of a run on dev: of every kernel, through the
// device's kernel trace (CUPTI), when cupti asks for it and the device has
// one; else of events around each op call, and the report's note says why.
func newProfile(dev kernels.Device, cupti bool) *profile.Profile {
	p := profile.New(dev)
	if _, ok := dev.(profile.KernelTracer); ok && cupti {
		p.TraceKernels() // on failure the report's note says why
	}
	return p
}

// loadModel uploads the weights to dev for ops, sized for f's batch and
// tokens, with a progress bar; the span is the load's, from tLoad.
func loadModel(cmd *cobra.Command, f *genFlags, in *runInputs, dev kernels.Device, ops kernels.Ops, tLoad time.Time) (model.Model, profile.HostSpan, error) {
	in.weights.Prefetch()
	bar := newProgress(cmd.ErrOrStderr(), f.quiet, in.weights.TotalBytes(), "loading weights", true)
	m, err := model.Load(in.cfg, in.weights, dev, ops, model.LoadOptions{
		MaxRows:  f.batch,
		MaxSeq:   in.longest() + f.maxNew,
		Progress: func(done, _ int64) { bar.Set(done) },
	})
	bar.Done()
	if me := (*model.MemoryError)(nil); errors.As(err, &me) {
		return nil, profile.HostSpan{}, fmt.Errorf("%w: lower --batch or --max-new-tokens", err)
	}
	if err != nil {
		return nil, profile.HostSpan{}, err
	}
	return m, profile.HostSpan{Name: "load", Start: tLoad.UnixNano(), End: time.Now().UnixNano()}, nil
}

// modelName is the model's short name for the summary line: the hub id's
// name, or the checkpoint directory's.
func modelName(arg, dir string) string {
	if fi, err := os.Stat(arg); err == nil && fi.IsDir() {
		return filepath.Base(filepath.Clean(arg))
	}
	if _, name, ok := strings.Cut(arg, "/"); ok {
		return name
	}
	return filepath.Base(dir)
}

// ignoredOnCPU says on logf which flags the cpu device ignores, when the
// command line gave them: it has no kernel trace and no graphs.
func ignoredOnCPU(cmd *cobra.Command, dev kernels.Device, logf func(string, ...any)) {
	if _, ok := dev.(*cuda.Device); ok {
		return
	}
	fl := cmd.Flags()
	if fl.Changed("cupti") {
		logf("infer: --cupti is ignored on the cpu device: it has no kernel trace, and its op times are wall time around each op")
	}
	if fl.Changed("no-graphs") {
		logf("infer: --no-graphs is ignored on the cpu device: it records no graphs, and every decode step runs eagerly")
	}
}
