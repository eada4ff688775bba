package cuda

import (
	"fmt"
	"testing"
)

// fakeMem is a memBackend with a capacity, handing out made-up addresses.
type fakeMem struct {
	capacity, used int
	next           uintptr
	blocks         map[uintptr]int
	mallocs        int
}

func newFakeMem(capacity int) *fakeMem {
	return &fakeMem{capacity: capacity, next: 1 << 32, blocks: map[uintptr]int{}}
}

func (m *fakeMem) malloc(n int) (uintptr, error) {
	m.mallocs++
	if m.used+n > m.capacity {
		return 0, &Error{Call: fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n), Code: cudaErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"}
	}
	p := m.next
	m.next += uintptr(n)
	m.used += n
	m.blocks[p] = n
	return p, nil
}

func (m *fakeMem) free(p uintptr) error {
	n, ok := m.blocks[p]
	if !ok {
		return fmt.Errorf("fake: free of unknown %#x", p)
	}
	delete(m.blocks, p)
	m.used -= n
	return nil
}

func TestSizeClass(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {4096, 4096}, {4097, 8192},
		{1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20}, {2 << 20, 2 << 20}, {5<<20 + 3, 6 << 20}, {100 << 20, 100 << 20},
	} {
		if got := sizeClass(c.n); got != c.want {
			t.Errorf("sizeClass(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

func TestAllocatorReuse(t *testing.T) {
	m := newFakeMem(1 << 30)
	a := newAllocator(m)
	p1, c1, err := a.alloc(1000)
	if err != nil || c1 != 1024 {
		t.Fatalf("alloc: %v, class %d", err, c1)
	}
	if err := a.release(p1); err != nil {
		t.Fatal(err)
	}
	p2, _, _ := a.alloc(700) // same class: the cached block
	if p2 != p1 || m.mallocs != 1 {
		t.Errorf("no reuse: %#x vs %#x, %d mallocs", p2, p1, m.mallocs)
	}
	p3, _, _ := a.alloc(700) // the class is empty now
	if p3 == p1 || m.mallocs != 2 {
		t.Errorf("block handed out twice")
	}
	if err := a.release(p1); err != nil {
		t.Fatal(err)
	}
	if err := a.release(p1); err == nil {
		t.Error("double free not reported")
	}
	st := a.stats
	if st.InUse != 1024 || st.Cached != 1024 || st.Hits != 1 || st.Mallocs != 2 || st.Peak != 2048 {
		t.Errorf("stats %+v", st)
	}
	if err := a.releaseAll(); err != nil {
		t.Fatal(err)
	}
	if len(m.blocks) != 0 || a.stats.InUse != 0 || a.stats.Cached != 0 || a.stats.Frees != 2 {
		t.Errorf("after releaseAll: %d blocks, stats %+v", len(m.blocks), a.stats)
	}
}

func TestAllocatorLargeSlack(t *testing.T) {
	m := newFakeMem(1 << 34)
	a := newAllocator(m)
	p, c, _ := a.alloc(64 << 20)
	a.release(p)
	// 62 MiB may take the cached 64 MiB block (within 1/8), 40 MiB may not.
	if q, qc, _ := a.alloc(62 << 20); q != p || qc != c {
		t.Errorf("62 MiB did not reuse the 64 MiB block")
	} else {
		a.release(q)
	}
	if q, _, _ := a.alloc(40 << 20); q == p {
		t.Errorf("40 MiB took the 64 MiB block")
	}
	// Small classes are exact.
	s, _, _ := a.alloc(4096)
	a.release(s)
	if q, _, _ := a.alloc(2048); q == s {
		t.Errorf("2 KiB took a 4 KiB block")
	}
}

func TestAllocatorOOMTrims(t *testing.T) {
	m := newFakeMem(10 << 20)
	a := newAllocator(m)
	p, _, err := a.alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	a.release(p)
	// 4 MiB does not fit beside the cached 8 MiB: the cache is trimmed and the malloc retried.
	if _, _, err := a.alloc(4 << 20); err != nil {
		t.Fatalf("alloc after trim: %v", err)
	}
	if a.stats.Cached != 0 || m.used != 4<<20 {
		t.Errorf("cache not trimmed: stats %+v, used %d", a.stats, m.used)
	}
	_, _, err = a.alloc(8 << 20)
	if !IsOutOfMemory(err) {
		t.Fatalf("want out of memory, got %v", err)
	}
	if want := "cuda: cuMemAlloc_v2(8388608 bytes): CUDA_ERROR_OUT_OF_MEMORY: out of memory"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}
