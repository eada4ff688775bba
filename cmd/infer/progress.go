package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress draws a bar on w (stderr) when it is a terminal and --quiet is
// off; otherwise every method does nothing.
type progress struct {
	bar *progressbar.ProgressBar
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newProgress starts a bar of total units on w; bytes selects byte units.
func newProgress(w io.Writer, quiet bool, total int64, desc string, bytes bool) *progress {
	if quiet || !isTerminal(w) || total <= 0 {
		return &progress{}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
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

// SetMax changes the bar's total to n units.
func (p *progress) SetMax(n int64) {
	if p.bar != nil {
		p.bar.ChangeMax64(n)
	}
}

// Done clears the bar.
func (p *progress) Done() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar.Clear()
	}
}
