package main

import (
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress draws a bar on stderr when it is a terminal and --quiet is off;
// otherwise every method does nothing.
type progress struct {
	bar *progressbar.ProgressBar
}

func stderrIsTerminal() bool { return term.IsTerminal(int(os.Stderr.Fd())) }

// newProgress starts a bar of total units; bytes selects byte units.
func newProgress(quiet bool, total int64, desc string, bytes bool) *progress {
	if quiet || !stderrIsTerminal() || total <= 0 {
		return &progress{}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetPredictTime(true),
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true))
	}
	return &progress{bar: progressbar.NewOptions64(total, opts...)}
}

// Set moves the bar to n units done.
func (p *progress) Set(n int64) {
	if p.bar != nil {
		p.bar.Set64(n)
	}
}

// Done clears the bar.
func (p *progress) Done() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar.Clear()
	}
}
