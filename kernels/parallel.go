package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Parallel calls f on consecutive chunks [lo, hi) covering [0, n), at least
// grain items each, from up to GOMAXPROCS goroutines that take chunks in turn
// (several per goroutine, so that uneven chunks still balance). With a
// single chunk f runs on the calling goroutine. The cpu set runs its
// kernels on it; the benchmarks' check converts its copies with it.
func Parallel(n, grain int, f func(lo, hi int)) {
	if n <= 0 {
		return
	}
	procs := runtime.GOMAXPROCS(0)
	chunks := min(4*procs, (n+max(grain, 1)-1)/max(grain, 1))
	if chunks <= 1 {
		f(0, n)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(procs, chunks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := int(next.Add(1) - 1); c < chunks; c = int(next.Add(1) - 1) {
				f(n*c/chunks, n*(c+1)/chunks)
			}
		}()
	}
	wg.Wait()
}
