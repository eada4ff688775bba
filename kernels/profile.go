package kernels

import (
	"fmt"
	"sort"
	"sync"
)

// Profile counts and times every op call made through the Ops that
// Spec.Build returns. Times are device times between marks queued around
// each call (wall time on the CPU, CUDA events on a GPU), resolved by Flush.
type Profile struct {
	dev     Device
	mu      sync.Mutex
	on      bool
	phase   string
	pending []span
	stats   map[Op]*OpStat
}

// OpStat is what a Profile knows about one op.
type OpStat struct {
	Op      Op                 `json:"op"`
	Set     string             `json:"set,omitempty"`
	Calls   int                `json:"calls"`
	Ms      float64            `json:"total_ms"`
	Share   float64            `json:"share"`
	PhaseMs map[string]float64 `json:"phase_ms"`
}

type span struct {
	op       Op
	set      string
	phase    string
	from, to Mark
}

// NewProfile returns an enabled profile of work on dev, in phase "prefill".
func NewProfile(dev Device) *Profile {
	return &Profile{dev: dev, on: true, phase: "prefill", stats: map[Op]*OpStat{}}
}

// SetEnabled turns recording on or off (off while a CUDA graph is captured:
// its replays are timed as a whole).
func (p *Profile) SetEnabled(on bool) {
	p.mu.Lock()
	p.on = on
	p.mu.Unlock()
}

// SetPhase names the phase later calls are counted under ("prefill", "decode").
func (p *Profile) SetPhase(phase string) {
	p.mu.Lock()
	p.phase = phase
	p.mu.Unlock()
}

func (p *Profile) begin() (Mark, bool) {
	if p == nil {
		return nil, false
	}
	p.mu.Lock()
	on := p.on
	p.mu.Unlock()
	if !on {
		return nil, false
	}
	return p.dev.Mark(), true
}

func (p *Profile) end(op Op, set string, from Mark) {
	to := p.dev.Mark()
	p.mu.Lock()
	p.pending = append(p.pending, span{op: op, set: set, phase: p.phase, from: from, to: to})
	p.mu.Unlock()
}

// Reset forgets every recorded call, so that the next run is counted alone.
func (p *Profile) Reset() {
	p.mu.Lock()
	p.pending = nil
	p.stats = map[Op]*OpStat{}
	p.mu.Unlock()
}

// Add counts time measured outside the op calls, such as a graph replay, under
// op in the current phase.
func (p *Profile) Add(op Op, calls int, ms float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statLocked(op).Calls += calls
	st := p.stats[op]
	st.Ms += ms
	st.PhaseMs[p.phase] += ms
}

func (p *Profile) statLocked(op Op) *OpStat {
	st := p.stats[op]
	if st == nil {
		st = &OpStat{Op: op, PhaseMs: map[string]float64{}}
		p.stats[op] = st
	}
	return st
}

// Flush resolves the times of all recorded calls; call it after Device.Sync.
func (p *Profile) Flush() error {
	p.mu.Lock()
	pend := p.pending
	p.pending = nil
	p.mu.Unlock()
	for _, s := range pend {
		ms, err := p.dev.Elapsed(s.from, s.to)
		if err != nil {
			return fmt.Errorf("profile: timing %s: %w", s.op, err)
		}
		p.mu.Lock()
		st := p.statLocked(s.op)
		st.Set = s.set
		st.Calls++
		st.Ms += ms
		st.PhaseMs[s.phase] += ms
		p.mu.Unlock()
	}
	return nil
}

// Table returns one row per op that ran, largest total first, with each op's
// share of the summed time.
func (p *Profile) Table() []OpStat {
	p.mu.Lock()
	defer p.mu.Unlock()
	var total float64
	rows := make([]OpStat, 0, len(p.stats))
	for _, st := range p.stats {
		total += st.Ms
		row := *st
		row.PhaseMs = map[string]float64{}
		for k, v := range st.PhaseMs {
			row.PhaseMs[k] = v
		}
		rows = append(rows, row)
	}
	for i := range rows {
		if total > 0 {
			rows[i].Share = rows[i].Ms / total
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Ms != rows[j].Ms {
			return rows[i].Ms > rows[j].Ms
		}
		return opIndex(rows[i].Op) < opIndex(rows[j].Op)
	})
	return rows
}

// TotalMs is the summed time of every op.
func (p *Profile) TotalMs() float64 {
	var t float64
	for _, r := range p.Table() {
		t += r.Ms
	}
	return t
}
