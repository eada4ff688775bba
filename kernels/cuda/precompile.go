package cuda

import (
	"os"
	"runtime"
	"sync"
	"time"
)

// Build is a program and the options it gets after the device's: one
// module to compile.
type Build struct {
	P    Program
	Opts []string
}

// compiled is what compileEach made of one Build.
type compiled struct {
	img  []byte
	err  error
	took time.Duration
}

// compileEach compiles every build with base options, then its own, on up
// to workers goroutines at once (NVRTC compiles distinct programs
// concurrently), and returns the results in the builds' order.
func (n *nvrtcAPI) compileEach(bs []Build, base []string, cubin bool, workers int) []compiled {
	out := make([]compiled, len(bs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(1, min(workers, len(bs))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				start := time.Now()
				img, err := n.compile(bs[i].P, append(append([]string(nil), base...), bs[i].Opts...), cubin)
				out[i] = compiled{img: img, err: err, took: time.Since(start)}
			}
		}()
	}
	for i := range bs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// CompileEach is compileEach for c's architecture: cubins, as Compile
// makes them.
func (c *Compiler) CompileEach(bs []Build, workers int) (imgs [][]byte, errs []error) {
	for _, r := range c.n.compileEach(bs, c.opts, true, workers) {
		imgs, errs = append(imgs, r.img), append(errs, r.err)
	}
	return imgs, errs
}

// Precompile compiles, several at once (one a CPU), the builds that
// neither the device's loaded modules nor the kernel cache hold, so that
// the ProgramModule calls that follow load them instead of compiling one
// after another: a set of many modules on an empty cache compiles in about
// the time of its largest. Each image goes into the kernel cache, where
// there is one, and is kept in memory until ProgramModule takes it. A
// build that fails is not reported here: ProgramModule compiles it again
// and reports it, with NVRTC's log.
func (d *Device) Precompile(bs []Build) {
	base := d.CompileOptions()
	keys := make([]string, len(bs))
	var todo []int
	d.mu.Lock()
	closed := d.closed
	for i, b := range bs {
		keys[i] = cacheKey(b.P, append(append([]string(nil), base...), b.Opts...), d.props.Arch, d.nvrtc.version())
		if d.modules[keys[i]] == nil && d.prepared[keys[i]] == nil {
			todo = append(todo, i)
		}
	}
	d.mu.Unlock()
	if closed {
		return
	}
	var need []Build
	var needKeys []string
	for _, i := range todo {
		if d.cacheDir != "" {
			if st, err := os.Stat(cachePath(d.cacheDir, keys[i], d.cubin)); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
				continue // ProgramModule reads it from the cache
			}
		}
		need = append(need, bs[i])
		needKeys = append(needKeys, keys[i])
	}
	if len(need) == 0 {
		return
	}
	done := d.nvrtc.compileEach(need, base, d.cubin, runtime.GOMAXPROCS(0))
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	for i, r := range done {
		if r.err != nil {
			continue
		}
		d.prepared[needKeys[i]] = r.img
		d.modStats.Compiled++
		d.modStats.CompileTime += r.took
	}
	d.mu.Unlock()
	if d.cacheDir == "" {
		return
	}
	for i, r := range done {
		if r.err == nil && writeFileAtomic(cachePath(d.cacheDir, needKeys[i], d.cubin), r.img) != nil {
			d.mu.Lock()
			d.modStats.CacheErrors++
			d.mu.Unlock()
		}
	}
}
