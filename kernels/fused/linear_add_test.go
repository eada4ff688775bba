package fused

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
)

// TestLinearAddHost checks linear_add's variants without a GPU: the
// unfused pair everywhere and stream (linear_stream with the add in its
// epilogue) on sm_90a only; the default stream exactly where linear runs
// linear_stream for the problem (its rule: DeepSeek-V2-Lite's shared
// experts' down projection up to 16 rows; or its tuning choice), and
// tuning choices that follow whether linear_stream was built.
func TestLinearAddHost(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	down := kernels.Shape{"M": 1, "N": 2048, "K": 2816}
	if got := valid(variants(kernels.OpLinearAdd, down, h200)); fmt.Sprint(got) != "[unfused stream]" {
		t.Errorf("linear_add of the shared experts' down on sm_90a: %v", got)
	}
	if got := valid(variants(kernels.OpLinearAdd, kernels.Shape{"M": 17, "N": 2048, "K": 2816}, h200)); fmt.Sprint(got) != "[unfused]" {
		t.Errorf("linear_add at 17 rows on sm_90a: %v", got)
	}
	if got := valid(variants(kernels.OpLinearAdd, down, kernels.Targets["sm_80"])); fmt.Sprint(got) != "[unfused]" {
		t.Errorf("linear_add on sm_80: %v", got)
	}
	saved := streamTarget
	defer func() { streamTarget = saved }()
	streamTarget = func(*ops) (int, int) { return h200.SMs, h200.SharedPerBlock }
	o := &ops{ls: &lsKit{}}
	for _, c := range []struct {
		k    linearKey
		want string
	}{
		{linearKey{1, 2048, 2816}, linStream}, {linearKey{16, 2048, 2816}, linStream}, {linearKey{5, 2048, 2048}, linStream},
		{linearKey{17, 2048, 2816}, linAddUnfused}, {linearKey{16, 4096, 2048}, linAddUnfused}, {linearKey{1, 2048, 200}, linAddUnfused},
		{linearKey{1, 3584, 18944}, linStream}, {linearKey{1, 102400, 2048}, linAddUnfused}, // under and over linStreamBytes
	} {
		if got := o.linearAddDefault(c.k); got != c.want {
			t.Errorf("linear_add %s runs %q by default, want %q (linear's %q)", c.k, got, c.want, o.linearFor(c.k))
		}
	}
	// A tuning choice of linear's for the problem moves linear_add's default
	// with it; one of linear_add's own overrides both.
	if err := o.UseVariant(kernels.OpLinear, "M=1,N=2048,K=2816", linCuBLAS); err != nil {
		t.Fatal(err)
	}
	if got := o.VariantFor(kernels.OpLinearAdd, "M=1,N=2048,K=2816"); got != linAddUnfused {
		t.Errorf("with linear on cuBLAS, linear_add runs %q", got)
	}
	if err := o.UseVariant(kernels.OpLinearAdd, "M=1,N=2048,K=2816", linStream); err != nil ||
		o.VariantFor(kernels.OpLinearAdd, "M=1,N=2048,K=2816") != linStream {
		t.Errorf("UseVariant stream: %v", err)
	}
	if err := o.UseVariant(kernels.OpLinearAdd, "M=17,N=2048,K=2816", linStream); err == nil {
		t.Errorf("UseVariant stream at 17 rows accepted")
	}
	none := &ops{ls: &lsKit{err: fmt.Errorf("no Hopper here")}}
	if err := none.UseVariant(kernels.OpLinearAdd, "M=1,N=2048,K=2816", linStream); err == nil {
		t.Errorf("UseVariant stream without linear_stream accepted")
	}
	if got := none.linearAddDefault(linearKey{1, 2048, 2816}); got != linAddUnfused {
		t.Errorf("without linear_stream, linear_add runs %q", got)
	}
}

// TestLinearAddStreamExact holds linear_stream with the add in its
// epilogue against the pair the fused set runs without it, linear_stream
// then fused's add, bit for bit: at DeepSeek-V2-Lite's shared experts'
// down projection (N = 2,048, K = 2,816) and at K = 2,048, at every row
// count from 1 to 16, and at N of no tile (1,001: a block's last tile
// partial; 77: a row a block), with and without a bias, out a tensor of
// its own (NaN-poisoned, so that an element left unwritten shows) or
// addend itself; N of no tile also with out and addend column slices of
// wider matrices. It times both at 1 and 16 rows, for a first look (infer
// bench linear_add is the measurement).
func TestLinearAddStreamExact(t *testing.T) {
	dev, o := openHopperSet(t, "linear_stream", func(o *ops) error { return o.ls.err })
	normal := normalOn(t, dev, rand.New(rand.NewSource(29)))
	for _, s := range []struct {
		n, k    int
		pitched bool
	}{{2048, 2816, false}, {2048, 2048, false}, {1001, 544, true}, {77, 96, true}} {
		w := normal(kernels.BF16, 1/math.Sqrt(float64(s.k)), s.n, s.k)
		b := normal(kernels.BF16, 0.5, s.n)
		cols := s.n
		if s.pitched {
			cols = s.n + 24
		}
		for m := 1; m <= linMaxRows; m++ {
			x := normal(kernels.BF16, 1, m, s.k)
			lin := dev.Alloc(kernels.BF16, m, s.n)
			wholeA := normal(kernels.BF16, 1, m, cols)
			start := read(t, dev, wholeA)
			view := func(whole *kernels.Tensor) *kernels.Tensor {
				if s.pitched {
					return whole.ColSlice(8, 8+s.n)
				}
				return whole
			}
			for _, c := range []struct {
				bias    *kernels.Tensor
				inPlace bool
			}{{nil, false}, {b, false}, {nil, true}, {b, true}} {
				what := fmt.Sprintf("M=%d N=%d K=%d bias=%v out=addend %v pitched %v", m, s.n, s.k, c.bias != nil, c.inPlace, s.pitched)
				wholeWant := tensorOn(t, dev, kernels.BF16, start, m, cols)
				if !o.stream(lin, x, w, c.bias) {
					t.Fatalf("%s: linear_stream refuses it", what)
				}
				o.Add(view(wholeWant), view(wholeA), lin)
				wholeGot := tensorOn(t, dev, kernels.BF16, start, m, cols)
				addend := wholeA
				if c.inPlace {
					addend = wholeGot
				} else {
					dev.MemsetD8(dev.Ptr(wholeGot), 0xff, m*cols*2) // NaN: an element the kernel does not write shows
				}
				if !o.streamAdd(view(wholeGot), x, w, c.bias, view(addend)) {
					t.Fatalf("%s: linear_stream with the add refuses it", what)
				}
				if err := o.linearStreamWaits(); err != nil {
					t.Fatal(err)
				}
				want, got := read(t, dev, wholeWant), read(t, dev, wholeGot)
				if !c.inPlace && s.pitched { // the columns about out's slice must keep their poison
					for i := range want {
						if j := i % cols; (j < 8 || j >= 8+s.n) && math.IsNaN(float64(got[i])) {
							want[i] = got[i]
						}
					}
				}
				if n, at := bitsDiffer(want, got); n > 0 {
					t.Errorf("%s: %d of %d outputs differ from linear_stream then add, the first [%d,%d]", what, n, m*s.n, at/cols, at%cols)
				}
				if !slices.Equal(read(t, dev, wholeA), start) {
					t.Errorf("%s: addend changed", what)
				}
				if (m == 1 || m == linMaxRows) && !c.inPlace && c.bias == nil {
					sms, shared := streamTarget(o)
					p, _ := planStream(m, s.n, s.k, sms, shared)
					ms := msPerCall(t, dev, func() { o.streamAdd(view(wholeGot), x, w, nil, view(wholeA)) })
					pairMs := msPerCall(t, dev, func() {
						o.stream(lin, x, w, nil)
						o.Add(view(wholeWant), view(wholeA), lin)
					})
					t.Logf("M=%d N=%d K=%d %v: %.2f µs, linear_stream + add %.2f µs", m, s.n, s.k, p, ms*1e3, pairMs*1e3)
				}
				dev.Free(wholeWant)
				dev.Free(wholeGot)
			}
			for _, a := range []*kernels.Tensor{x, lin, wholeA} {
				dev.Free(a)
			}
		}
		dev.Free(w)
		dev.Free(b)
	}
}
