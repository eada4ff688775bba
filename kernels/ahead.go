package kernels

// Aheader is a set that can ask the device's memory for a tensor ahead of
// the op that reads it: a decode step's cuBLAS projection, which cannot
// start before the kernel ahead of it ends, finds its weights in L2 when
// an earlier kernel asked for them while the memory had room. A hint: no
// result changes, and a set may ignore it.
type Aheader interface {
	// Ahead names t as the tensor the set's next kernels may ask for, until
	// the next call of Ahead; nil ends the ask. A set asks at most once
	// per call of Ahead, from a kernel of its own choosing.
	Ahead(t *Tensor)
}

// Ahead tells o of t (Aheader) where o takes such hints; elsewhere it does
// nothing.
func Ahead(o Ops, t *Tensor) {
	if a, ok := o.(Aheader); ok {
		a.Ahead(t)
	}
}

// Ahead tells every set d has built of t: whichever runs the next calls
// may ask for it.
func (d *Dispatch) Ahead(t *Tensor) {
	for _, o := range d.built {
		Ahead(o, t)
	}
}
