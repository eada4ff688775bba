package cuda

import (
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

func TestAsideFrom(t *testing.T) {
	for env, want := range map[string]bool{"": true, "on": true, "off": false} {
		if got, err := asideFrom(env); err != nil || got != want {
			t.Errorf("asideFrom(%q) = %v, %v; want %v", env, got, err, want)
		}
	}
	for _, env := range []string{"0", "Off", "yes"} {
		if _, err := asideFrom(env); err == nil {
			t.Errorf("asideFrom(%q) accepted", env)
		}
	}
}

// asideRound queues on d, through Aside, what TestAside checks: a is
// counted up on the first stream; beside it, b gets a's value (the side
// starts after the work before Aside), a slow cuBLAS product on the side's
// own handle, then b counted up; c is counted up on the first stream
// meanwhile; after join, out gets b (the first stream waits for the side).
func asideRound(d *Device, inc *Func, a, b, c, out, ga, gc *kernels.Tensor, n int) {
	const s = 4096
	grid, block := Dim3{X: uint32(n / 256)}, Dim3{X: 256}
	d.Launch(inc, grid, block, 0, a, int32(n))
	join := d.Aside(func() {
		d.Memcpy(d.Ptr(b), d.Ptr(a), n*4)
		for range 4 {
			d.Gemm(true, s, s, s, 1, d.Ptr(ga), kernels.BF16, s, d.Ptr(ga), kernels.BF16, s, 0, d.Ptr(gc), kernels.F32, s)
		}
		d.Launch(inc, grid, block, 0, b, int32(n))
	})
	d.Launch(inc, grid, block, 0, c, int32(n))
	join()
	d.Memcpy(d.Ptr(out), d.Ptr(b), n*4)
}

// TestAside runs work beside the stream, eagerly and in a replayed graph:
// the side starts after the work queued before Aside, the work after join
// waits for it, and the side's scratch and stream are its own.
func TestAside(t *testing.T) {
	d := openDevice(t)
	inc := incKernel(t, d)
	const n = 4096
	const s = 4096
	a, b, c, out := d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n)
	ga, gc := d.Alloc(kernels.BF16, s, s), d.Alloc(kernels.F32, s, s)
	d.Zero(ga)
	for _, x := range []*kernels.Tensor{a, b, c, out} {
		d.Zero(x)
	}
	want := func(what string, x *kernels.Tensor, v int32) {
		t.Helper()
		got, err := d.ReadI32(x)
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range got {
			if g != v {
				t.Fatalf("%s: element %d is %d, want %d", what, i, g, v)
			}
		}
	}

	first := d.Stream()
	var inside uintptr
	var keyIn, keyOut uintptr
	keyOut = d.Scratch("aside-test", 256)
	join := d.Aside(func() {
		inside = d.Stream()
		keyIn = d.Scratch("aside-test", 256)
	})
	join()
	if inside == first || inside == 0 {
		t.Errorf("inside Aside the stream is %#x, the first stream %#x: want a second stream", inside, first)
	}
	if d.Stream() != first {
		t.Errorf("after Aside the stream is %#x, want the first, %#x", d.Stream(), first)
	}
	if keyIn == keyOut {
		t.Error("Scratch inside Aside returned the first stream's buffer of the same key")
	}
	if got := d.LibraryBytes(); got != 2*cublasWorkspaceSize {
		t.Errorf("LibraryBytes with the side stream made = %d, want two cuBLAS workspaces (%d)", got, 2*cublasWorkspaceSize)
	}

	asideRound(d, inc, a, b, c, out, ga, gc, n)
	want("eager: out (b after join)", out, 2)
	want("eager: c", c, 1)

	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	asideRound(d, inc, a, b, c, out, ga, gc, n)
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 3 {
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
		// Each round: a+1, b = a+1, then +1, out = b.
		mustSync(t, d)
		want("replay: out", out, int32(3+i))
		want("replay: c", c, int32(2+i))
	}

	// A join left out is made by Sync, so that no work stays behind.
	d.Aside(func() { d.Launch(inc, Dim3{X: n / 256}, Dim3{X: 256}, 0, c, int32(n)) })
	mustSync(t, d)
	want("Sync joins", c, 5)
}

// TestAsideFirstInCapture: an Aside whose second stream would be made in a
// graph capture queues its work in order (the capture stays whole), and
// the replays compute what the eager run does.
func TestAsideFirstInCapture(t *testing.T) {
	d := openDevice(t)
	inc := incKernel(t, d)
	const n = 4096
	a, b, c, out := d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n)
	ga, gc := d.Alloc(kernels.BF16, 4096, 4096), d.Alloc(kernels.F32, 4096, 4096)
	d.Zero(ga)
	for _, x := range []*kernels.Tensor{a, b, c, out} {
		d.Zero(x)
	}
	mustSync(t, d)
	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	asideRound(d, inc, a, b, c, out, ga, gc, n)
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if d.side != nil {
		t.Error("the second stream was made during a capture")
	}
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	got, err := d.ReadI32(out)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 || got[n-1] != 2 {
		t.Errorf("out = %d … %d after one replay, want 2", got[0], got[n-1])
	}
}

// TestAsideOff: with FUSELM_ASIDE=off, Aside queues its work in order on
// the first stream and makes no second one.
func TestAsideOff(t *testing.T) {
	t.Setenv("FUSELM_ASIDE", "off")
	d := openDevice(t)
	inc := incKernel(t, d)
	const n = 4096
	a, b, c, out := d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n), d.Alloc(kernels.I32, n)
	ga, gc := d.Alloc(kernels.BF16, 4096, 4096), d.Alloc(kernels.F32, 4096, 4096)
	d.Zero(ga)
	for _, x := range []*kernels.Tensor{a, b, c, out} {
		d.Zero(x)
	}
	first := d.Stream()
	var inside uintptr
	d.Aside(func() { inside = d.Stream() })()
	if inside != first {
		t.Errorf("with FUSELM_ASIDE=off the stream inside Aside is %#x, want the first, %#x", inside, first)
	}
	asideRound(d, inc, a, b, c, out, ga, gc, n)
	got, err := d.ReadI32(out)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 || got[n-1] != 2 {
		t.Errorf("out = %d … %d, want 2", got[0], got[n-1])
	}
	if d.LibraryBytes() != cublasWorkspaceSize || d.side != nil {
		t.Error("FUSELM_ASIDE=off made a second stream")
	}
}
