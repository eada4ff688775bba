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

// asideBufs are TestAside's buffers, zeroed: four counters of n int32 and
// a cuBLAS product's operands, on d with the inc kernel.
type asideBufs struct {
	d                    *Device
	inc                  *Func
	a, b, c, out, ga, gc *kernels.Tensor
}

const asideN, asideGemm = 4096, 4096

func newAsideBufs(t *testing.T, d *Device) *asideBufs {
	t.Helper()
	x := &asideBufs{d: d, inc: incKernel(t, d)}
	for _, p := range []**kernels.Tensor{&x.a, &x.b, &x.c, &x.out} {
		*p = d.Alloc(kernels.I32, asideN)
		d.Zero(*p)
	}
	x.ga, x.gc = d.Alloc(kernels.BF16, asideGemm, asideGemm), d.Alloc(kernels.F32, asideGemm, asideGemm)
	d.Zero(x.ga)
	mustSync(t, d)
	return x
}

// captureRound records one round on d as a graph.
func (x *asideBufs) captureRound(t *testing.T, d *Device) kernels.Graph {
	t.Helper()
	return capture(t, d, x.round)
}

// capture records what record queues on d as a graph.
func capture(t *testing.T, d *Device, record func()) kernels.Graph {
	t.Helper()
	if err := d.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	record()
	g, err := d.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// round queues on d, through Aside, what the tests check: a is counted up
// on the first stream; beside it, b gets a's value (the side starts after
// the work before Aside), a slow cuBLAS product on the side's own handle,
// then b counted up; c is counted up on the first stream meanwhile; after
// join, out gets b (the first stream waits for the side).
func (x *asideBufs) round() {
	d, n, s := x.d, asideN, asideGemm
	grid, block := Dim3{X: uint32(n / 256)}, Dim3{X: 256}
	d.Launch(x.inc, grid, block, 0, x.a, int32(n))
	join := d.Aside(func() {
		d.Memcpy(d.Ptr(x.b), d.Ptr(x.a), n*4)
		for range 4 {
			d.Gemm(true, s, s, s, 1, d.Ptr(x.ga), kernels.BF16, s, d.Ptr(x.ga), kernels.BF16, s, 0, d.Ptr(x.gc), kernels.F32, s)
		}
		d.Launch(x.inc, grid, block, 0, x.b, int32(n))
	})
	d.Launch(x.inc, grid, block, 0, x.c, int32(n))
	join()
	d.Memcpy(d.Ptr(x.out), d.Ptr(x.b), n*4)
}

// want checks that every element of buf is v.
func (x *asideBufs) want(t *testing.T, what string, buf *kernels.Tensor, v int32) {
	t.Helper()
	got, err := x.d.ReadI32(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if g != v {
			t.Fatalf("%s: element %d is %d, want %d", what, i, g, v)
		}
	}
}

// TestAside runs work beside the stream, eagerly and in a replayed graph:
// the side starts after the work queued before Aside, the work after join
// waits for it, and the side's scratch and stream are its own.
func TestAside(t *testing.T) {
	d := openDevice(t)
	x := newAsideBufs(t, d)
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

	x.round()
	x.want(t, "eager: out (b after join)", x.out, 2)
	x.want(t, "eager: c", x.c, 1)

	g := x.captureRound(t, d)
	defer g.Close()
	for i := range 3 {
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
		// Each round: a+1, b = a+1, then +1, out = b.
		mustSync(t, d)
		x.want(t, "replay: out", x.out, int32(3+i))
		x.want(t, "replay: c", x.c, int32(2+i))
	}

	// A join left out is made by Sync, so that no work stays behind.
	d.Aside(func() { d.Launch(x.inc, Dim3{X: asideN / 256}, Dim3{X: 256}, 0, x.c, int32(asideN)) })
	mustSync(t, d)
	x.want(t, "Sync joins", x.c, 5)
}

// TestAsideFirstInCapture: an Aside whose second stream would be made in a
// graph capture queues its work in order (the capture stays whole), and
// the replays compute what the eager run does.
func TestAsideFirstInCapture(t *testing.T) {
	d := openDevice(t)
	x := newAsideBufs(t, d)
	g := x.captureRound(t, d)
	defer g.Close()
	if d.side != nil {
		t.Error("the second stream was made during a capture")
	}
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	x.want(t, "out after one replay", x.out, 2)
}

// TestAsideOff: with FUSELM_ASIDE=off, Aside queues its work in order on
// the first stream and makes no second one.
func TestAsideOff(t *testing.T) {
	t.Setenv("FUSELM_ASIDE", "off")
	d := openDevice(t)
	x := newAsideBufs(t, d)
	first := d.Stream()
	var inside uintptr
	d.Aside(func() { inside = d.Stream() })()
	if inside != first {
		t.Errorf("with FUSELM_ASIDE=off the stream inside Aside is %#x, want the first, %#x", inside, first)
	}
	x.round()
	x.want(t, "out", x.out, 2)
	if d.LibraryBytes() != cublasWorkspaceSize || d.side != nil {
		t.Error("FUSELM_ASIDE=off made a second stream")
	}
}
