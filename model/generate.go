package model

import (
	"fmt"
	"log"
	"math"
	"slices"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/profile"
)

// GenerateOptions say how many tokens to generate and how to choose them.
type GenerateOptions struct {
	// MaxNewTokens is the most tokens generated per row (at least 1).
	MaxNewTokens int
	// MinNewTokens keeps a row from ending before it has this many new
	// tokens: until then its end-of-sequence tokens are never chosen (their
	// logits are set to -inf, as HF's min_new_tokens does).
	MinNewTokens int
	// Sampling chooses tokens; the zero value is greedy.
	Sampling Sampling
	// EOS are the end-of-sequence token ids; nil means the config's
	// eos_token_id. A row ends when it generates one of them.
	EOS []int
	// NoGraphs turns off the CUDA graph replay of decode steps on devices
	// that can record graphs (kernels.Grapher).
	NoGraphs bool
	// EagerFirstStep runs the first decode step eagerly even where the
	// graph an earlier generation kept could replay it, so that a profile
	// timed by events around each op (which times a replay whole) has a
	// decode step's ops.
	EagerFirstStep bool
	// Profile is the profile the model's ops were built with, or nil: its
	// phase and step are set as the generation goes, the prefill and each
	// decode step are recorded as host spans, a graph capture and every
	// replay are marked as such, and it is flushed at the end.
	Profile *profile.Profile
	// KeepPrefillLogits keeps the logits the prefill gave every row in
	// Generation.PrefillLogits (read back from the device once, inside the
	// timed generation).
	KeepPrefillLogits bool
	// OnStep, when set, is called after every step with the token each row
	// got.
	OnStep func(StepEvent)
	// Logf reports what the caller may want to know (a graph capture that
	// failed); nil means log.Printf.
	Logf func(format string, args ...any)
}

// Sampling is how tokens are chosen from the logits: greedy when
// Temperature is 0, else sampled on the host from softmax(logits /
// Temperature) restricted to the TopK most likely tokens (0: all) and then
// to the smallest set whose probability reaches TopP (0 or 1: all), HF's
// warper order. Each row draws from its own stream, seeded by Seed and the
// row's index, so a row's tokens depend only on its logits, Seed and index.
type Sampling struct {
	Temperature float64
	TopK        int
	TopP        float64
	Seed        uint64
}

// StepEvent is what OnStep receives: Step is the number of tokens each
// running row has now (1 after the prefill); Tokens[b] is row b's new token,
// or -1 when the row had already ended; Done[b] says whether row b has ended
// (its new token may be the end-of-sequence one).
type StepEvent struct {
	Step   int
	Tokens []int
	Done   []bool
}

// StopReason says why a row ended.
type StopReason string

// The reasons a row ends.
const (
	StopEOS    StopReason = "eos"    // it generated an end-of-sequence token
	StopLength StopReason = "length" // it reached MaxNewTokens
)

// Generation is the result of Generate.
type Generation struct {
	// Tokens are the new tokens of every row, the end-of-sequence token
	// that ended a row included.
	Tokens [][]int
	Stop   []StopReason

	PromptTokens int // all rows' prompt tokens
	NewTokens    int // all rows' new tokens
	// DecodeSteps is the number of decode steps run (the batch runs until
	// its last row ends); GraphReplays of them were CUDA graph replays.
	DecodeSteps  int
	GraphReplays int
	// GraphKept says that the replays were of the graph an earlier
	// generation of the same batch recorded and kept (takeGraph), so that
	// this one recorded none.
	GraphKept bool
	// Graph says why decode steps were not replayed as a graph: "" when
	// they were (or there were too few steps to try), else the reason.
	Graph string

	// WallMs is the whole generation, prefill included; PrefillMs runs
	// until the first new token of every row is known; DecodeMs is the
	// rest.
	WallMs, PrefillMs, DecodeMs float64

	// PrefillLogits are the logits of every row after the prefill, when
	// GenerateOptions.KeepPrefillLogits asked for them.
	PrefillLogits [][]float32
}

// Generate runs the prompts as one batch: a prefill of all of them, then
// decode steps, each giving every row one new token, until every row has
// ended (an end-of-sequence token, or MaxNewTokens). Rows that end early are
// still run (their tokens discarded) so that the step stays the same.
func Generate(m Model, prompts [][]int, opt GenerateOptions) (*Generation, error) {
	e := m.base()
	if err := e.checkGenerate(prompts, opt); err != nil {
		return nil, err
	}
	logf := opt.Logf
	if logf == nil {
		logf = log.Printf
	}
	prof := opt.Profile
	greedy := opt.Sampling.Temperature == 0
	eos := opt.EOS
	if eos == nil {
		eos = e.cfg.EOS
	}
	B := len(prompts)
	g := &Generation{Tokens: make([][]int, B), Stop: make([]StopReason, B)}
	past := make([]int, B)
	for b, p := range prompts {
		g.PromptTokens += len(p)
		past[b] = len(p)
	}
	ch := &chooser{e: e, B: B, greedy: greedy, eos: eos, minNew: opt.MinNewTokens, tokens: g.Tokens}
	if !greedy {
		ch.samplers = make([]*sampler, B)
		for b := range B {
			ch.samplers[b] = newSampler(opt.Sampling, b)
		}
	}
	done := make([]bool, B)
	steps := 0
	record := func(next []int) {
		steps++
		for b, t := range next {
			if done[b] {
				next[b] = -1
				continue
			}
			g.Tokens[b] = append(g.Tokens[b], t)
			switch {
			case slices.Contains(eos, t) && len(g.Tokens[b]) >= opt.MinNewTokens:
				done[b], g.Stop[b] = true, StopEOS
			case len(g.Tokens[b]) == opt.MaxNewTokens:
				done[b], g.Stop[b] = true, StopLength
			}
		}
		if opt.OnStep != nil {
			opt.OnStep(StepEvent{Step: steps, Tokens: next, Done: slices.Clone(done)})
		}
	}

	setPhase(prof, "prefill", 0)
	t0 := time.Now()
	if err := prefill(e, prompts); err != nil {
		return nil, err
	}
	if greedy {
		e.ops.Argmax(e.next.Slice(0, B), e.logits.Slice(0, B))
	}
	if opt.KeepPrefillLogits {
		rows, err := e.readLogits(B)
		if err != nil {
			return nil, err
		}
		g.PrefillLogits = rows
	}
	next, err := ch.choose(1)
	if err != nil {
		return nil, err
	}
	record(next)
	tPrefill := time.Now()
	prof.AddHostSpan("prefill", "prefill", 0, t0, tPrefill)

	grapher, canGraph := e.dev.(kernels.Grapher)
	switch {
	case opt.NoGraphs:
		g.Graph = "off (NoGraphs)"
	case !canGraph:
		g.Graph = "off (the device records no graphs)"
	}
	var graph kernels.Graph
	var key graphKey
	finished := false
	defer func() {
		if graph != nil {
			e.putGraph(graph, key, finished, prof)
		}
	}()
	// run queues decode step `step` on s's inputs, in place on the device,
	// with ahead making the next step's inputs too (decodeAhead). Every
	// step replays the graph an earlier generation kept, where there is one
	// (unless EagerFirstStep keeps the first eager): the steps' inputs are
	// in the same device buffers in every generation. Else the first step
	// runs eagerly (profiled, and warming up whatever the kernels set up on
	// first use), the second is captured, and every later one replays it.
	run := func(step int, s *step, ahead bool) error {
		one := func() { decodeOne(e, s, greedy) }
		if ahead {
			one = func() { decodeAhead(e, s) }
		}
		if graph == nil && g.Graph == "" && (step >= 2 || !opt.EagerFirstStep) {
			key = e.graphKeyOf(B, greedy, ahead)
			if graph = e.takeGraph(key, prof); graph != nil {
				g.GraphKept = true
			} else if step >= 2 {
				var err error
				if graph, err = capture(grapher, prof, one); err != nil {
					g.Graph = "off (capture failed: " + err.Error() + ")"
					logf("model: decode runs without CUDA graphs: capture failed: %v", err)
				}
			}
		}
		if graph == nil {
			one()
			return nil
		}
		if err := prof.Replay(step, graph.Replay); err != nil {
			return fmt.Errorf("model: replaying the decode graph: %w", err)
		}
		g.GraphReplays++
		return nil
	}
	if later, ok := e.dev.(kernels.LaterReader); ok && greedy {
		if err := decodeQueued(e, later, prompts, opt.MaxNewTokens, ch, done, run, record, prof); err != nil {
			return nil, err
		}
		g.DecodeSteps = steps - 1
	}
	tokens := make([][]int, B)
	for !allTrue(done) {
		step := g.DecodeSteps + 1
		tStep := time.Now()
		setPhase(prof, "decode", step)
		for b := range B {
			tokens[b] = []int{g.Tokens[b][len(g.Tokens[b])-1]}
			if !done[b] {
				past[b] = len(prompts[b]) + len(g.Tokens[b]) - 1
			}
		}
		s, err := e.newStep(0, tokens, past, true, B)
		if err != nil {
			return nil, err
		}
		if err := run(step, s, false); err != nil {
			return nil, err
		}
		g.DecodeSteps++
		next, err := ch.choose(steps + 1)
		if err != nil {
			return nil, err
		}
		record(next)
		prof.AddHostSpan(fmt.Sprintf("decode step %d", step), "decode", step, tStep, time.Now())
	}
	if err := e.dev.Sync(); err != nil {
		return nil, err
	}
	tEnd := time.Now()
	if f, ok := e.ops.(kernels.Faulter); ok {
		if err := f.Faults(); err != nil {
			return nil, fmt.Errorf("model: the generation's kernels gave up: %w", err)
		}
	}
	if prof != nil {
		if err := prof.Flush(); err != nil {
			return nil, err
		}
	}
	for _, t := range g.Tokens {
		g.NewTokens += len(t)
	}
	g.WallMs = ms(tEnd.Sub(t0))
	g.PrefillMs = ms(tPrefill.Sub(t0))
	g.DecodeMs = ms(tEnd.Sub(tPrefill))
	finished = true
	return g, nil
}

// graphKey is what a generation's decode graph depends on besides the
// device's buffers: the batch's rows, whether its steps end with the
// argmax (greedy) and make the next step's inputs (ahead), and the
// version of the ops' choice of kernels. Nothing else of a step is read
// on the host: the decode ops take lengths and positions from the
// device (kernels' Batch.PastDev), so that one graph serves every step of
// every generation of the batch.
type graphKey struct {
	rows          int
	greedy, ahead bool
	version       uint64
}

func (e *engine) graphKeyOf(rows int, greedy, ahead bool) graphKey {
	k := graphKey{rows: rows, greedy: greedy, ahead: ahead}
	if v, ok := e.ops.(kernels.Versioned); ok {
		k.version = v.Version()
	}
	return k
}

// takeGraph hands over the decode graph an earlier generation kept, when
// it was recorded for key and may still be replayed (kernels.CurrentGraph:
// no device memory given back since), else nil; a kept graph it does not
// hand over is closed.
func (e *engine) takeGraph(key graphKey, prof *profile.Profile) kernels.Graph {
	k := e.kept
	e.kept = nil
	if k == nil {
		return nil
	}
	if k.key == key && e.mayKeep(k.graph, prof) && k.graph.(kernels.CurrentGraph).Current() {
		return k.graph
	}
	k.graph.Close()
	return nil
}

// putGraph keeps the generation's decode graph for the next generation
// where the generation finished and the graph may outlive it (mayKeep),
// else closes it.
func (e *engine) putGraph(g kernels.Graph, key graphKey, finished bool, prof *profile.Profile) {
	if !finished || e.closed || !e.mayKeep(g, prof) {
		g.Close()
		return
	}
	if e.kept != nil && e.kept.graph != g {
		e.kept.graph.Close()
	}
	e.kept = &keptGraph{graph: g, key: key}
}

// mayKeep says whether graph may serve a later generation: it can tell
// whether it is still current, the ops count their changes of kernels
// (kernels.Versioned), and the profile does not attribute a replay's
// kernels to the calls captured in its own generation (CUPTI's, which
// Reset forgets between generations).
func (e *engine) mayKeep(g kernels.Graph, prof *profile.Profile) bool {
	_, current := g.(kernels.CurrentGraph)
	_, versioned := e.ops.(kernels.Versioned)
	return current && versioned && (prof == nil || prof.Source() != "cupti")
}

// keptGraph is the decode graph a generation left for the next (takeGraph).
type keptGraph struct {
	graph kernels.Graph
	key   graphKey
}

// checkGenerate rejects what the model cannot run, naming the prompt and
// token at fault.
func (e *engine) checkGenerate(prompts [][]int, opt GenerateOptions) error {
	if e.closed {
		return fmt.Errorf("model: Generate on a closed model")
	}
	if len(prompts) == 0 {
		return fmt.Errorf("model: no prompts")
	}
	if len(prompts) > e.maxRows {
		return fmt.Errorf("model: %d prompts, but the model was loaded for at most %d (LoadOptions.MaxRows)", len(prompts), e.maxRows)
	}
	if opt.MaxNewTokens < 1 {
		return fmt.Errorf("model: MaxNewTokens is %d, want at least 1", opt.MaxNewTokens)
	}
	if opt.MinNewTokens < 0 {
		return fmt.Errorf("model: MinNewTokens %d is negative", opt.MinNewTokens)
	}
	if sp := opt.Sampling; sp.Temperature < 0 || math.IsNaN(sp.Temperature) || sp.TopK < 0 || !(sp.TopP >= 0 && sp.TopP <= 1) {
		return fmt.Errorf("model: sampling temperature %g, top-k %d, top-p %g: want temperature ≥ 0, top-k ≥ 0, top-p in [0, 1]",
			sp.Temperature, sp.TopK, sp.TopP)
	}
	V := e.cfg.VocabSize
	for i, p := range prompts {
		if len(p) == 0 {
			return fmt.Errorf("model: prompt %d is empty", i)
		}
		for j, t := range p {
			if t < 0 || t >= V {
				return fmt.Errorf("model: prompt %d: token %d at position %d is outside the vocabulary [0, %d)", i, t, j, V)
			}
		}
		// len(p) + MaxNewTokens may overflow: subtract instead.
		if opt.MaxNewTokens > e.cfg.MaxPositions-len(p) {
			return fmt.Errorf("model: prompt %d: %d tokens + %d new ones exceed max_position_embeddings (%d)",
				i, len(p), opt.MaxNewTokens, e.cfg.MaxPositions)
		}
		if opt.MaxNewTokens > e.maxSeq-len(p) {
			return fmt.Errorf("model: prompt %d: %d tokens + %d new ones exceed the cache's %d per row (LoadOptions.MaxSeq)",
				i, len(p), opt.MaxNewTokens, e.maxSeq)
		}
	}
	// The last new token is never fed back: a row holds at most
	// len(p) + MaxNewTokens - 1 tokens in the cache.
	return nil
}

// capture records run as a graph; the profile marks its calls as
// captured.
func capture(gr kernels.Grapher, prof *profile.Profile, run func()) (kernels.Graph, error) {
	if prof != nil {
		prof.BeginCapture()
		defer prof.EndCapture()
	}
	if err := gr.BeginCapture(); err != nil {
		return nil, err
	}
	run()
	return gr.EndCapture()
}

// chooser picks every row's next token from the logits of the last step.
type chooser struct {
	e        *engine
	B        int
	greedy   bool
	samplers []*sampler // per row, when not greedy
	eos      []int
	minNew   int
	tokens   [][]int // the tokens generated so far, per row
}

// suppressEOS reports whether row b may not end with its next token: it has
// fewer than MinNewTokens (HF's MinNewTokensLengthLogitsProcessor masks the
// end-of-sequence tokens while new_tokens_length < min_new_tokens).
func (c *chooser) suppressEOS(b int) bool {
	return len(c.eos) > 0 && len(c.tokens[b]) < c.minNew
}

// choose returns the next token of every row for step step (1: the one
// after the prefill). Greedy reads back the device's argmax of every row
// with the logit it chose (e.next, one transfer for the batch), and
// re-picks on the host only for a row whose argmax is an end-of-sequence
// token it may not choose yet; sampling reads back the logits.
//
// A row whose chosen logit (the largest, under greedy) is NaN or infinite,
// or whose logits are all -inf, stops the generation with an error: the
// model's numbers have broken down (a NaN weight, an overflow) and what
// they choose is noise. Greedy checks only the chosen logit, one float per
// row, so that the check costs no pass over the logits.
func (c *chooser) choose(step int) ([]int, error) {
	e := c.e
	if c.greedy {
		// One transfer: each row's argmax and its logit (Argmax's [B, 2] out).
		choice, err := e.dev.ReadI32(e.next.Slice(0, c.B))
		if err != nil {
			return nil, err
		}
		next, _, err := c.fromChoice(choice, step, true)
		return next, err
	}
	next := make([]int, c.B)
	logits, err := e.dev.ReadF32(e.logits.Slice(0, c.B))
	if err != nil {
		return nil, err
	}
	V := e.cfg.VocabSize
	for b := range c.B {
		row := logits[b*V : (b+1)*V]
		if c.suppressEOS(b) {
			c.maskEOS(row)
		}
		if next[b] = c.samplers[b].sample(row); next[b] < 0 {
			return nil, nonFinite(step, b, row[argmax(row)])
		}
	}
	return next, nil
}

// fromChoice is greedy choose's answer from choice, the device's argmax of
// every row and its logit (Argmax's [B, 2] out) for step step. Where a row
// may not end yet and its argmax is an end-of-sequence token, the host
// re-picks from the row's logits, which it reads only where logits says
// they are still this step's; else it returns redo, and no tokens.
func (c *chooser) fromChoice(choice []int32, step int, logits bool) (next []int, redo bool, err error) {
	e, V := c.e, c.e.cfg.VocabSize
	next = make([]int, c.B)
	for b := range c.B {
		next[b] = int(choice[2*b])
		if next[b] < 0 || next[b] >= V {
			return nil, false, fmt.Errorf("model: step %d: row %d: argmax gave token %d, outside the vocabulary [0, %d)", step, b, next[b], V)
		}
		chosen := math.Float32frombits(uint32(choice[2*b+1]))
		if c.suppressEOS(b) && slices.Contains(c.eos, next[b]) {
			if !logits {
				return nil, true, nil
			}
			row, err := e.dev.ReadF32(e.logits.Slice(b, b+1))
			if err != nil {
				return nil, false, err
			}
			c.maskEOS(row)
			next[b] = argmax(row)
			chosen = row[next[b]]
		}
		if math.IsNaN(float64(chosen)) || math.IsInf(float64(chosen), 0) {
			return nil, false, nonFinite(step, b, chosen)
		}
	}
	return next, false, nil
}

// decodeQueued runs a greedy generation's decode steps on a device that
// reads a result without waiting for the work after it: each step makes
// the next one's inputs on the device (decodeAhead), and the host queues
// step k+1 before it reads step k's choice, so that the device does not
// wait for the host between steps. Every row moves one position a step,
// ended or not (an ended row's tokens are discarded; no row passes its
// prompt plus MaxNewTokens - 1 positions, which the cache holds). Where the
// host overrides a choice (an end-of-sequence token a row may not take
// yet) the step queued after it took the wrong token: decodeQueued waits
// for the device, runs the step again from the host's inputs (its cache
// positions rewritten with the same values) and reads its logits, and
// queues the next from the host's inputs. The tokens are those of choose's
// loop, one step at a time. run queues a step (graph.go's capture and
// replay); record takes a step's tokens, and done says which rows ended.
func decodeQueued(e *engine, later kernels.LaterReader, prompts [][]int, maxNew int, ch *chooser, done []bool,
	run func(step int, s *step, ahead bool) error, record func([]int), prof *profile.Profile) error {
	B := len(prompts)
	// inputs are step's host-side inputs: each row's step-th new token
	// (an ended row's last) at the position after its prompt's and the
	// tokens before it.
	inputs := func(step int) ([][]int, []int) {
		tokens, past := make([][]int, B), make([]int, B)
		for b := range B {
			t := ch.tokens[b]
			tokens[b] = []int{t[min(step, len(t))-1]}
			past[b] = len(prompts[b]) + step - 1
		}
		return tokens, past
	}
	type queued struct {
		step int
		read func() ([]int32, error)
		t    time.Time
	}
	var pending []queued
	// drain waits for the reads of the queued steps, which frees their
	// buffers, and forgets the steps.
	drain := func() {
		for _, q := range pending {
			_, _ = q.read() // the steps are void; an error of the device stays for its next call
		}
		pending = nil
	}
	defer drain()
	queue := func(n int, fresh bool) error {
		setPhase(prof, "decode", n)
		t := time.Now()
		tokens, past := inputs(n)
		var s *step
		if fresh {
			var err error
			if s, err = e.newStep(0, tokens, past, true, B); err != nil {
				return err
			}
		} else {
			s, _ = e.stepOf(0, tokens, past, true, B)
		}
		if err := run(n, s, true); err != nil {
			return err
		}
		read, err := later.ReadI32Later(e.next.Slice(0, B))
		if err != nil {
			return err
		}
		pending = append(pending, queued{n, read, t})
		return nil
	}
	// The last step a generation may need; the last queued; whether the
	// next one queued takes its inputs from the host (the first, and the
	// one after a step run again) rather than from the step before it.
	last, queuedTo, fresh := maxNew-1, 0, true
	for !allTrue(done) {
		for len(pending) < 2 && queuedTo < last {
			queuedTo++
			if err := queue(queuedTo, fresh); err != nil {
				return err
			}
			fresh = false
		}
		if len(pending) == 0 {
			return fmt.Errorf("model: decode step %d of at most %d: rows still running", queuedTo, last)
		}
		q := pending[0]
		pending = pending[1:]
		choice, err := q.read()
		if err != nil {
			return err
		}
		next, redo, err := ch.fromChoice(choice, q.step+1, len(pending) == 0)
		if err != nil {
			return err
		}
		if redo {
			drain()
			if err := queue(q.step, true); err != nil {
				return err
			}
			choice, err := pending[0].read()
			pending, queuedTo, fresh = nil, q.step, true
			if err != nil {
				return err
			}
			if next, _, err = ch.fromChoice(choice, q.step+1, true); err != nil {
				return err
			}
		}
		record(next)
		prof.AddHostSpan(fmt.Sprintf("decode step %d", q.step), "decode", q.step, q.t, time.Now())
	}
	return nil
}

// nonFinite is choose's error for row b of step step, whose chosen logit
// is x.
func nonFinite(step, b int, x float32) error {
	phase := "decode"
	if step == 1 {
		phase = "prefill"
	}
	return fmt.Errorf("model: step %d (%s): row %d's logits are not finite (the largest is %v); generation stopped", step, phase, b, x)
}

func (c *chooser) maskEOS(row []float32) {
	for _, t := range c.eos {
		if t >= 0 && t < len(row) {
			row[t] = float32(math.Inf(-1))
		}
	}
}

func setPhase(p *profile.Profile, phase string, step int) {
	if p != nil {
		p.SetPhase(phase)
		p.SetStep(step)
	}
}

// readLogits reads back the logits of rows [0, B).
func (e *engine) readLogits(B int) ([][]float32, error) {
	flat, err := e.dev.ReadF32(e.logits.Slice(0, B))
	if err != nil {
		return nil, err
	}
	V := e.cfg.VocabSize
	rows := make([][]float32, B)
	for b := range rows {
		rows[b] = flat[b*V : (b+1)*V]
	}
	return rows, nil
}

func allTrue(v []bool) bool {
	for _, x := range v {
		if !x {
			return false
		}
	}
	return true
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
