package fused

import (
	"math"
	"slices"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
)

// mlaFlatCPOpt builds mla_flat.cu with its key tiles loaded by cp.async
// (MLF_CP), the reference TestMLAFlatBulk holds the bulk copies to.
const mlaFlatCPOpt = "-DMLF_CP=1"

// mlaFlatNewAt is where mla_flat finds the new latent of a row of n keys
// split splits ways: its position in the last split that holds keys, as
// mla_flat counts it (chunk, k0, newAt).
func mlaFlatNewAt(n, splits int) int {
	chunk := (n + splits - 1) / splits
	return n - 1 - (n-1)/chunk*chunk
}

// mlaFlatLens are keys and, for each of the new latent's places in its
// tile of mlkTile (its first row, its middle, its last), the longest
// length below keys that puts it there, where one does within 2,048.
func mlaFlatLens(keys, splits int) []int {
	lens := []int{keys}
	for _, at := range []int{0, mlkTile / 2, mlkTile - 1} {
		for n := keys; n >= max(1, keys-2048); n-- {
			if mlaFlatNewAt(n, splits)%mlkTile == at {
				if !slices.Contains(lens, n) {
					lens = append(lens, n)
				}
				break
			}
		}
	}
	return lens
}

// useFlat makes flat mla_decode's default for the rest of the test and
// returns its kernel at V2-Lite's latent dims (mlaHopperDims) on dev, with
// the stages that kernel has there.
func useFlat(t *testing.T, dev *cuda.Device) (kernel string, stages int) {
	saved := mlaDecodeDefault
	t.Cleanup(func() { mlaDecodeDefault = saved })
	mlaDecodeDefault = mlaFlatVariant
	lat := mlaLatent{mlaHopperDims.rank, mlaHopperDims.rope}
	stages = mlaFlatStages(lat, dev.Props().MaxSharedPerSM)
	return mlaFlatKernel(lat, stages), stages
}

// TestMLAFlatBulk holds mla_flat's bulk copies of its key tiles to its
// cp.async build (mlaFlatCPOpt) bit for bit: two sets on one device, the
// second built with MLF_CP, run MLADecode's flat variant on the same inputs
// at V2-Lite's dims (16 heads, rank 512, rope 64) with 1, 3 and 7 rows of 1
// to 11,042 keys, each length also moved down so that the new latent is
// the first, a middle or the last row of its tile (mlaFlatLens), and their
// outputs must be the same bits. At 3 and 7 rows a split has more tiles
// than stages, so tiles loaded in the loop, and the new latent in one of
// them, are covered.
func TestMLAFlatBulk(t *testing.T) {
	dev, bulk := openHopperSet(t, "mla_flat", func(o *ops) error { return o.mlaFlat.ready() })
	saved := mlaFlatOpts
	mlaFlatOpts = []string{mlaFlatCPOpt}
	set, err := New(dev)
	mlaFlatOpts = saved
	if err != nil {
		t.Fatal(err)
	}
	cp := set.(*ops)
	if err := cp.mlaFlat.ready(); err != nil {
		t.Fatalf("mla_flat's cp.async build: %v", err)
	}
	kernel, _ := useFlat(t, dev)
	d := mlaHopperDims
	const heads = 16
	if bulk.mlaFlat.clusters[kernel] != cp.mlaFlat.clusters[kernel] {
		t.Fatalf("%s: %d clusters at once, %d in the cp.async build", kernel, bulk.mlaFlat.clusters[kernel], cp.mlaFlat.clusters[kernel])
	}
	for _, rows := range []int{1, 3, 7} {
		splits := mlfCluster * min(moMaxPerRow, max(1, bulk.mlaFlat.clusters[kernel]/rows))
		for i, keys := range []int{1, 33, 200, 4096, 11042} {
			past := make([]int, rows)
			for b := range past {
				past[b] = keys - 1
			}
			ones := slices.Repeat([]int{1}, rows)
			prob := newMLAHopperProblem(t, dev, mlaHopperCase{lens: ones, past: past, heads: heads, maxSeq: keys}, int64(400+10*rows+i))
			for _, n := range mlaFlatLens(keys, splits) {
				batch := *prob.batch
				batch.Past = slices.Repeat([]int{n - 1}, rows)
				batch.PastDev = intsOn(t, dev, batch.Past)
				a := prob.args()
				a.Batch = &batch
				run := func(o *ops, what string) []float32 {
					dev.MemsetD8(dev.Ptr(prob.o), 0xff, prob.o.Numel()*2) // NaN: an output not written shows
					o.MLADecode(a)
					out, err := dev.ReadF32(prob.o)
					if err != nil {
						t.Fatalf("%d rows of %d keys, %s: %v", rows, n, what, err)
					}
					return out
				}
				want, got := run(cp, "cp.async"), run(bulk, "bulk")
				newAt := mlaFlatNewAt(n, splits)
				where := func() string {
					return kernels.Shape{"B": rows, "keys": n, "splits": splits, "newAt": newAt, "tile": newAt / mlkTile,
						"row": newAt % mlkTile}.String()
				}
				bad := 0
				for j := range want {
					if math.IsNaN(float64(want[j])) {
						t.Fatalf("%s: the cp.async build's output %d is NaN", where(), j)
					}
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						if bad < 4 {
							t.Errorf("%s: output %d (row %d) is %g, the cp.async build's %g", where(), j, j/(heads*d.v), got[j], want[j])
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d outputs differ", where(), bad, len(want))
				} else {
					t.Logf("%s: %d outputs identical", where(), len(want))
				}
				dev.Free(batch.PastDev)
			}
			for _, x := range []*kernels.Tensor{prob.q, prob.kv, prob.wkvb, prob.cache, prob.o, prob.batch.StartDev, prob.batch.PastDev} {
				dev.Free(x)
			}
			if err := dev.Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
