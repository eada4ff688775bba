package kerneltest

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

// recorder is a tester that notes failures instead of failing.
type recorder struct {
	name   string
	log    *failures
	failed bool
}

type failures struct {
	mu  sync.Mutex
	msg map[string][]string // by subtest name
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) { runtime.Goexit() }

func (r *recorder) fail(msg string) {
	r.failed = true
	r.log.mu.Lock()
	r.log.msg[r.name] = append(r.log.msg[r.name], msg)
	r.log.mu.Unlock()
}

func (r *recorder) Run(name string, f func(t tester)) bool {
	child := &recorder{name: name, log: r.log}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(child)
	}()
	<-done
	return !child.failed
}

// faulty is the cpu set with one op broken in one way.
type faulty struct {
	kernels.Ops
	dev   *cpu.Device
	fault string
}

func (f *faulty) Embedding(out, table, ids *kernels.Tensor) {
	if f.fault != "embedding off by one" {
		f.Ops.Embedding(out, table, ids)
		return
	}
	shifted := f.dev.Alloc(kernels.I32, ids.Numel())
	for i, id := range cpu.I32(ids) {
		cpu.I32(shifted)[i] = (id + 1) % int32(table.Rows())
	}
	f.Ops.Embedding(out, table, shifted)
}

func (f *faulty) Linear(out, x, w, bias *kernels.Tensor) {
	if f.fault == "linear ignores the output pitch" {
		packed := *out
		packed.Pitch = out.Cols()
		out = &packed
	}
	f.Ops.Linear(out, x, w, bias)
}

func (f *faulty) RMSNorm(out, x, w *kernels.Tensor, eps float32) {
	if f.fault == "rms_norm eps 1" {
		eps = 1
	}
	f.Ops.RMSNorm(out, x, w, eps)
}

func (f *faulty) AddRMSNorm(out, resid, x, w *kernels.Tensor, eps float32) {
	if f.fault == "rms_norm eps 1" {
		eps = 1
	}
	f.Ops.AddRMSNorm(out, resid, x, w, eps)
}

func (f *faulty) RoPE(x *kernels.Tensor, heads, headStride, offset int, pos *kernels.Tensor, r *kernels.Rope) {
	if f.fault == "rope pairs the other way" {
		swapped := *r
		swapped.Interleaved = !r.Interleaved
		r = &swapped
	}
	f.Ops.RoPE(x, heads, headStride, offset, pos, r)
}

// AttentionPrefill, broken, takes each row to hold one more cached token
// than it does (where the cache has room): a NaN position leaks in.
func (f *faulty) AttentionPrefill(a *kernels.AttnArgs) {
	if f.fault == "prefill reads one position too many" {
		b := *a.Batch
		b.Past = slices.Clone(b.Past)
		for r := range b.Past {
			if b.Past[r]+b.Start[r+1]-b.Start[r] < b.MaxSeq {
				b.Past[r]++
			}
		}
		c := *a
		c.Batch = &b
		a = &c
	}
	if f.fault == "prefill is always causal" {
		c := *a
		c.NonCausal = false
		a = &c
	}
	if f.fault == "prefill declines f16" && a.Q.DType == kernels.F16 {
		panic(kernels.Unsupported{Set: "faulty", Op: kernels.OpAttnPrefill, Why: "no f16 kernel"})
	}
	f.Ops.AttentionPrefill(a)
}

// AttentionDecode, broken, reads the host Past (stale in the harness).
func (f *faulty) AttentionDecode(a *kernels.AttnArgs) {
	if f.fault == "decode reads the host Past" {
		f.Ops.AttentionPrefill(a)
		return
	}
	f.Ops.AttentionDecode(a)
}

func (f *faulty) MLADecode(a *kernels.MLAArgs) {
	if f.fault == "mla decode scale off by 1%" {
		c := *a
		c.Scale *= 1.01
		a = &c
	}
	f.Ops.MLADecode(a)
}

func (f *faulty) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	if f.fault == "route ignores groups" {
		greedy := *r
		greedy.Method = kernels.RouteGreedy
		r = &greedy
	}
	f.Ops.MoERoute(idx, weight, logits, r)
	if f.fault == "route in ascending order" { // not a fault: the order is free
		k := idx.Cols()
		ix, w := cpu.I32(idx), cpu.F32(weight)
		for t := range idx.Rows() {
			slices.Reverse(ix[t*k : (t+1)*k])
			slices.Reverse(w[t*weight.Pitch : t*weight.Pitch+k])
		}
	}
}

// MoEExperts, broken, drops each token's last expert.
func (f *faulty) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	if f.fault == "experts drop the last choice" {
		w := f.dev.Alloc(kernels.F32, weight.Rows(), weight.Cols())
		copy(cpu.F32(w), cpu.F32(weight))
		for t := range w.Rows() {
			cpu.F32(w)[t*w.Cols()+w.Cols()-1] = 0
		}
		weight = w
	}
	f.Ops.MoEExperts(out, x, idx, weight, gateUp, down)
}

// Argmax, broken, takes the last of tied maxima; into a [B,2] out it
// writes the chosen logit's bits beside each index, as the sets do.
func (f *faulty) Argmax(out, logits *kernels.Tensor) {
	if f.fault != "argmax takes the last tie" {
		f.Ops.Argmax(out, logits)
		return
	}
	v, n := cpu.F32(logits), logits.Cols()
	res := cpu.I32(out)
	stride := len(res) / logits.Rows()
	for b := range logits.Rows() {
		row := v[b*logits.Pitch : b*logits.Pitch+n]
		best := 0
		for j, x := range row {
			if x >= row[best] {
				best = j
			}
		}
		res[b*stride] = int32(best)
		if stride == 2 {
			res[b*stride+1] = int32(math.Float32bits(row[best]))
		}
	}
}

// DecodeAdvance, broken, gives pos the old length, the position of the
// token just decoded.
func (f *faulty) DecodeAdvance(ids, pos, past, choice *kernels.Tensor) {
	if f.fault != "decode_advance gives pos the old length" {
		f.Ops.DecodeAdvance(ids, pos, past, choice)
		return
	}
	id, p, n, c := cpu.I32(ids), cpu.I32(pos), cpu.I32(past), cpu.I32(choice)
	for b := range n {
		id[b], p[b] = c[2*b], n[b]
		n[b]++
	}
}

// TestHarnessFails breaks one op of the cpu set at a time and checks that
// exactly the cases the fault shows in fail, and that harmless deviations
// (an MLA prefill left correct, routing entries in another order) pass.
func TestHarnessFails(t *testing.T) {
	for _, c := range []struct {
		op    kernels.Op
		fault string
		fails func(name string) bool // which cases must fail; the others must pass
	}{
		{kernels.OpEmbedding, "embedding off by one", always},
		{kernels.OpLinear, "linear ignores the output pitch", has("pitched out")},
		{kernels.OpRMSNorm, "rms_norm eps 1", always},
		{kernels.OpAddRMSNorm, "rms_norm eps 1", always},
		{kernels.OpRoPE, "rope pairs the other way", always},
		{kernels.OpAttnPrefill, "prefill reads one position too many", not(has("one token, cache 1"))},
		{kernels.OpAttnPrefill, "prefill is always causal", has("non-causal")},
		{kernels.OpAttnPrefill, "prefill declines f16", never}, // the f16 cases are declinable: skipped
		{kernels.OpAttnDecode, "decode reads the host Past", not(has("cache 1"))},
		{kernels.OpMLAPrefill, "none", never},
		{kernels.OpMLADecode, "mla decode scale off by 1%", always},
		{kernels.OpMoERoute, "route ignores groups", has("group-limited")},
		{kernels.OpMoERoute, "route in ascending order", never},
		{kernels.OpMoEExperts, "experts drop the last choice", always},
		{kernels.OpArgmax, "argmax takes the last tie", func(n string) bool { return has("ties")(n) || has("nan")(n) }},
		{kernels.OpDecodeAdvance, "decode_advance gives pos the old length", always},
		{kernels.OpSwiGLU, "none", never},
		{kernels.OpAdd, "none", never},
	} {
		t.Run(c.fault+" in "+string(c.op), func(t *testing.T) {
			dev := cpu.NewDevice()
			ops, err := cpu.New(dev)
			if err != nil {
				t.Fatal(err)
			}
			log := &failures{msg: map[string][]string{}}
			top := &recorder{name: "", log: log}
			top.Run("harness", func(r tester) {
				only := func(o kernels.Op) bool { return o == c.op }
				runOps(r, dev, &faulty{Ops: ops, dev: dev, fault: c.fault}, DefaultTolerances(), only, false)
			})
			if msgs := log.msg["harness"]; len(msgs) > 0 {
				t.Fatalf("harness failed outside a case: %v", msgs)
			}
			ran := 0
			for _, oc := range cases([]kernels.DType{kernels.BF16, kernels.F32}) {
				if oc.op != c.op || oc.long {
					continue
				}
				ran++
				name := string(oc.op) + "/" + oc.name
				msgs := log.msg[name]
				switch {
				case c.fails(oc.name) && len(msgs) == 0:
					t.Errorf("%s passed", name)
				case !c.fails(oc.name) && len(msgs) > 0:
					t.Errorf("%s failed: %s", name, strings.Join(msgs, "; "))
				}
			}
			if ran == 0 {
				t.Fatalf("no cases for %s", c.op)
			}
		})
	}
}

func always(string) bool { return true }

func never(string) bool { return false }

func has(s string) func(string) bool {
	return func(name string) bool { return strings.Contains(name, s) }
}

func not(f func(string) bool) func(string) bool { return func(name string) bool { return !f(name) } }

// Check, the gate before a set is timed, passes the cpu set and names the
// case, and by how much, that a broken op fails; the ops it was not asked
// about are not run.
func TestCheckReports(t *testing.T) {
	host := cpu.NewDevice()
	good, err := cpu.New(host)
	if err != nil {
		t.Fatal(err)
	}
	rms := func(op kernels.Op) bool { return op == kernels.OpRMSNorm }
	rep := Check(host, good, rms, DefaultTolerances())
	if rep.Err() != nil || rep.Cases == 0 {
		t.Fatalf("cpu set: %d cases, %v", rep.Cases, rep.Err())
	}
	bad := &faulty{Ops: good, dev: host, fault: "rms_norm eps 1"}
	rep = Check(host, bad, rms, DefaultTolerances())
	err = rep.Err()
	if err == nil || !strings.HasPrefix(err.Error(), "kerneltest case rms_norm/") || !strings.Contains(err.Error(), "relative error") {
		t.Errorf("a scaled rms_norm: %v, want its case and its relative error", err)
	}
	for _, f := range rep.Failures {
		if !strings.HasPrefix(f.Case, "rms_norm/") {
			t.Errorf("case %s ran: only rms_norm was asked for", f.Case)
		}
	}
}
