// Package measure times generations as infer reports them: untimed
// warm-up runs, then timed runs, each profiled alone, the one of median
// wall time reported.
package measure

import (
	"sort"

	"github.com/fuselm/fuselm/kernels/profile"
	"github.com/fuselm/fuselm/model"
)

// Run is one timed generation and its profile.
type Run struct {
	Gen    *model.Generation
	Report *profile.Report
	Trace  profile.Recording // when asked for
}

// Generations runs warmup untimed generations, then repeat timed ones,
// each profiled alone. It returns the timed runs by wall time, the median
// one at len/2, and their wall times in seconds in the order they ran.
// progress gives the OnStep of run i and what to call when it ends.
func Generations(m model.Model, prompts [][]int, opts model.GenerateOptions, prof *profile.Profile, warmup, repeat int,
	keepTrace bool, progress func(i int, timed bool) (func(model.StepEvent), func())) ([]Run, []float64, error) {
	var runs []Run
	var walls []float64
	for i := range warmup + repeat {
		timed := i >= warmup
		if err := prof.Reset(); err != nil {
			return nil, nil, err
		}
		prof.SetEnabled(timed)
		onStep, done := progress(i, timed)
		opts.OnStep = onStep
		gen, err := model.Generate(m, prompts, opts)
		done()
		if err != nil {
			return nil, nil, err
		}
		if !timed {
			continue
		}
		r := Run{Gen: gen, Report: prof.Report()}
		if keepTrace {
			r.Trace = prof.Recording()
		}
		runs = append(runs, r)
		walls = append(walls, gen.WallMs/1000)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Gen.WallMs < runs[j].Gen.WallMs })
	return runs, walls, nil
}
