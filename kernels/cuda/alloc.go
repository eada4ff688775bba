package cuda

import (
	"fmt"
	"math/bits"
)

// memBackend is where the allocator gets device memory: cuMemAlloc_v2 and
// cuMemFree_v2 on a device, a fake in tests.
type memBackend interface {
	malloc(bytes int) (uintptr, error)
	free(ptr uintptr) error
}

// Size classes of the caching allocator.
const (
	minClass      = 512     // the smallest block
	smallLimit    = 1 << 20 // up to this, blocks are powers of two
	largeGranule  = 2 << 20 // above it, multiples of this
	maxReuseSlack = 8       // a large request may take a cached block up to 1/8 larger
)

// sizeClass is the block size that serves a request of n bytes.
func sizeClass(n int) int {
	switch {
	case n <= minClass:
		return minClass
	case n <= smallLimit:
		return 1 << bits.Len(uint(n-1))
	default:
		return (n + largeGranule - 1) / largeGranule * largeGranule
	}
}

// MemStats is what the caching allocator holds.
type MemStats struct {
	InUse   int64 // bytes in blocks handed out (block sizes, not requests)
	Cached  int64 // bytes in free blocks kept for reuse
	Peak    int64 // the most InUse+Cached has been
	Mallocs int   // cuMemAlloc calls
	Frees   int   // cuMemFree calls
	Hits    int   // requests served from the cache
}

// allocator caches device memory in size classes, so that a step's
// temporaries reuse the blocks of the last step instead of calling
// cuMemAlloc and cuMemFree (which synchronise the device). Freed blocks go
// back to their class; memory returns to the driver only on trim (tried
// once when an allocation runs out of memory) and releaseAll. It is not
// safe for concurrent use: the Device's lock guards it.
type allocator struct {
	be    memBackend
	free  map[int][]uintptr // class → cached blocks
	live  map[uintptr]int   // block → class, for blocks handed out
	stats MemStats
	// released counts the blocks given back (release, releaseAll): a
	// graph recorded before the last of them may hold an address that is
	// no longer its buffer's (Graph.Current).
	released uint64
}

func newAllocator(be memBackend) *allocator {
	return &allocator{be: be, free: map[int][]uintptr{}, live: map[uintptr]int{}}
}

// alloc returns a block of at least n bytes and its size.
func (a *allocator) alloc(n int) (uintptr, int, error) {
	if n < 0 {
		return 0, 0, fmt.Errorf("cuda: allocation of %d bytes", n)
	}
	c := sizeClass(n)
	if p, cls, ok := a.take(c); ok {
		a.live[p] = cls
		a.stats.Cached -= int64(cls)
		a.stats.InUse += int64(cls)
		a.stats.Hits++
		return p, cls, nil
	}
	p, err := a.be.malloc(c)
	if err != nil && IsOutOfMemory(err) && a.stats.Cached > 0 {
		if terr := a.trim(); terr != nil {
			return 0, 0, terr
		}
		p, err = a.be.malloc(c)
	}
	if err != nil {
		return 0, 0, err
	}
	a.stats.Mallocs++
	a.live[p] = c
	a.stats.InUse += int64(c)
	a.stats.Peak = max(a.stats.Peak, a.stats.InUse+a.stats.Cached)
	return p, c, nil
}

// take finds a cached block for class c: that class, or for a large class
// the smallest cached class at most 1/maxReuseSlack larger.
func (a *allocator) take(c int) (uintptr, int, bool) {
	pop := func(cls int) (uintptr, bool) {
		l := a.free[cls]
		if len(l) == 0 {
			return 0, false
		}
		p := l[len(l)-1]
		if len(l) == 1 {
			delete(a.free, cls)
		} else {
			a.free[cls] = l[:len(l)-1]
		}
		return p, true
	}
	if p, ok := pop(c); ok {
		return p, c, true
	}
	if c <= smallLimit {
		return 0, 0, false
	}
	for cls := c + largeGranule; cls <= c+c/maxReuseSlack; cls += largeGranule {
		if p, ok := pop(cls); ok {
			return p, cls, true
		}
	}
	return 0, 0, false
}

// release returns a block handed out by alloc to the cache.
func (a *allocator) release(p uintptr) error {
	c, ok := a.live[p]
	if !ok {
		return fmt.Errorf("cuda: free of %#x, which the allocator did not hand out (double free?)", p)
	}
	delete(a.live, p)
	a.released++
	a.free[c] = append(a.free[c], p)
	a.stats.InUse -= int64(c)
	a.stats.Cached += int64(c)
	return nil
}

// trim gives every cached block back to the driver.
func (a *allocator) trim() error {
	var first error
	for c, l := range a.free {
		for _, p := range l {
			if err := a.be.free(p); err != nil && first == nil {
				first = err
			}
			a.stats.Frees++
			a.stats.Cached -= int64(c)
		}
		delete(a.free, c)
	}
	return first
}

// releaseAll gives every block, cached or handed out, back to the driver.
func (a *allocator) releaseAll() error {
	first := a.trim()
	for p, c := range a.live {
		if err := a.be.free(p); err != nil && first == nil {
			first = err
		}
		a.stats.Frees++
		a.stats.InUse -= int64(c)
		delete(a.live, p)
		a.released++
	}
	return first
}
