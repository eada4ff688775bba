package kernels

// NotOwned is the Ops of a set for the ops it has no kernel of its own for
// (SetInfo.Own): a set embeds it, the dispatch routes those ops to the set's
// fallback and never here, and a direct call panics saying so (its methods
// are in ops_gen.go).
type NotOwned struct{ Set string }

func (n NotOwned) panic(op Op) {
	panic("kernels: set " + n.Set + " has no kernel of its own for " + string(op) + "; its fallback runs it")
}
