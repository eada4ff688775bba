package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// The "flat" variant of mla_decode (mla_flat.cu): mla_qlat, mla_flat in
// clusters that merge their splits in shared memory, and mla_out (the
// clusters' merge and W_UV), three overlapped launches and no cuBLAS. Its
// clusters are sm_90's, so it is a module of its own, compiled only where
// the device's target is hopperArch; where it cannot be built, New still
// succeeds and the variant says why.
const (
	// mlaFlatVariant is the variant's name among mla_decode's.
	mlaFlatVariant = "flat"
	// mlfCluster is MLF_CLUSTER, the splits of a cluster.
	mlfCluster = 8
	// mlfStats is MLF_STATS: each row's (max, sum).
	mlfStats = 16 * 8
	// Limits of mla_qlat and mla_out: QL_COLS, QL_ROWS, QL_MAX_DN,
	// MO_ROWS and MO_MAX_R.
	qlCols, qlRows, qlMaxNope = 32, 8, 256
	// qlThreads are mla_qlat's (and mla_qlat_rope's) threads a block.
	qlThreads                      = 256
	moRows, moMaxRank, moMaxPerRow = 16, 512, 128
)

func mlaFlatKernel(d mlaLatent, stages int) string {
	return fmt.Sprintf("mla_flat_r%d_p%d_s%d", d.Rank, d.Rope, stages)
}

// mlaFlatShared is mla_flat's dynamic shared memory with stages tiles in
// flight (MlaKeyTiles<..., true>::SHARED and MLF_STATS): the query rows in
// Tile's layout, the key tiles in MlkRows's (rows of bulkRowBytes), the p
// tile and the warps' maxima, the stages' mbarriers, the rows' cluster
// statistics.
func mlaFlatShared(d mlaLatent, stages int) int {
	w := d.Rank + d.Rope
	return 16*rowBytes(w) + stages*mlkTile*bulkRowBytes(w) + mlkExtra + (8*stages+15)/16*16 + mlfStats
}

// bulkRowBytes is MlkRows<w>::ROW_BYTES: a row of w bf16 padded to an odd
// count of 16-byte chunks, so that ldmatrix's 8 rows meet no bank twice.
func bulkRowBytes(w int) int { return (w/8 | 1) * 16 }

// mlaFlatStages is mla_flat's stage count on a device of perSM bytes of
// shared memory per SM: the most that one block an SM holds, so that a
// split's tiles are in flight at once (two blocks an SM of fewer stages
// ran slower: bench/RESULTS.md), else the fewest.
func mlaFlatStages(d mlaLatent, perSM int) int {
	for _, s := range slices.Backward(mlaKeysStageCounts) {
		if mlaFlatShared(d, s)+blockReserve <= perSM {
			return s
		}
	}
	return mlaKeysStageCounts[0]
}

// mlaFlatOpts are extra NVRTC options of the variant's module, empty but in
// tests: TestMLAFlatProbe sets -DMLF_PROBE=1 before New to build the
// timestamp probe (mla_probe.cuh).
var mlaFlatOpts []string

// mlaFlatModule is the variant's NVRTC module.
func mlaFlatModule() cudaset.Module {
	m := module("mla_flat.cu", append([]string{"mla_qlat", "mla_out"}, cudaset.Names(mlaFlatInstances(), mlaQLatRopeInstances())...))
	m.Opts = slices.Clone(mlaFlatOpts)
	return m
}

// mlaFlatKit is the flat variant on one device.
type mlaFlatKit struct {
	err      error          // why it cannot run here; nil when it can
	clusters map[string]int // per mla_flat kernel: the clusters the device runs at once
}

// newMLAFlat compiles the flat variant into k where the device allows it,
// readies each instance's shared memory, asks the driver how many of its
// clusters run at once, and launches its kernels overlapped. It never
// fails: what went wrong is kept in the kit's err.
func newMLAFlat(k *cudaset.Kit) *mlaFlatKit {
	m := &mlaFlatKit{clusters: map[string]int{}}
	what := "mla_decode " + mlaFlatVariant
	if m.err = addHopperModule(k, what, "mla_flat", mlaFlatModule()); m.err != nil {
		return m
	}
	perSM := k.D.Props().MaxSharedPerSM
	for _, d := range mlaDecodeDims {
		s := mlaFlatStages(d, perSM)
		name, shared := mlaFlatKernel(d, s), mlaFlatShared(d, s)
		if err := k.FitShared(name, shared); err != nil {
			m.err = fmt.Errorf("fused: %s: %s: %w", what, name, err)
			return m
		}
		n, err := k.Func(name).MaxActiveClusters(cuda.Dim3{X: mlfCluster}, cuda.Dim3{X: decodeWarps * 32}, shared)
		if err != nil {
			m.err = fmt.Errorf("fused: %s: %w", what, err)
			return m
		}
		if n < 1 {
			m.err = fmt.Errorf("fused: %s: the device runs no cluster of %d blocks of %s", what, mlfCluster, name)
			return m
		}
		m.clusters[name] = n
	}
	k.Overlap(mlaFlatModule().Funcs...)
	return m
}

// ready is nil where the variant runs, else why not.
func (m *mlaFlatKit) ready() error {
	if m == nil {
		return fmt.Errorf("fused: mla_decode %s: not built", mlaFlatVariant)
	}
	return m.err
}

// mlaFlatWhy is why the flat variant cannot take latents d with heads
// heads and nope dims dn.
func mlaFlatWhy(d mlaLatent, heads, dn int) string {
	var why []string
	if w := mlaLatentWhy(d, heads); w != "" {
		why = append(why, w)
	}
	if dn > qlMaxNope {
		why = append(why, fmt.Sprintf("nope dim %d: mla_qlat takes at most %d", dn, qlMaxNope))
	}
	if d.Rank > moMaxRank || d.Rank%qlCols != 0 {
		why = append(why, fmt.Sprintf("rank %d: mla_qlat and mla_out take multiples of %d up to %d", d.Rank, qlCols, moMaxRank))
	}
	return join(why...)
}

// mlaFlatDecode is MLADecode's flat variant: mla_qlat, mla_flat over every
// cluster the device runs at once shared among the rows, and mla_out; with
// nr, mla_qlat_rope, which runs rms_norm_rope's blocks beside mla_qlat's,
// in mla_qlat's place. Buffer sizes depend on the batch's rows only, so a
// graph replays it.
func (o *ops) mlaFlatDecode(op kernels.Op, a *kernels.MLAArgs, nr *normRopeCall) {
	d := mlaLatent{a.Rank, a.RopeDim}
	h, dn, dr, r := a.Heads, a.NopeDim, a.RopeDim, a.Rank
	o.Need(o.mlaFlat.ready() == nil, op, "%v", o.mlaFlat.ready())
	o.Need(mlaFlatWhy(d, h, dn) == "", op, "%s (mla=naive runs it)", mlaFlatWhy(d, h, dn))
	b := a.Batch
	stages := mlaFlatStages(d, o.D.Props().MaxSharedPerSM)
	kernel, shared := mlaFlatKernel(d, stages), mlaFlatShared(d, stages)

	perRow := min(moMaxPerRow, max(1, o.mlaFlat.clusters[kernel]/b.Rows)) // clusters a row
	qlat := o.Scratch(scrMLAQLat, kernels.BF16, b.Rows, h*r)
	part := o.Scratch(scrMLAPart, kernels.F32, b.Rows*h*perRow, r)
	stats := o.Scratch(scrMLAStats, kernels.F32, b.Rows*h*perRow, 2)
	q := o.Mat(a.Q)

	if nr == nil {
		o.mlaQLat(a, qlat)
	} else {
		qlGrid := cuda.Dim3{X: uint32(r / qlCols), Y: uint32(h), Z: uint32((b.Rows + qlRows - 1) / qlRows)}
		blocks := 2*b.Rows + int(qlGrid.X*qlGrid.Y*qlGrid.Z)
		w := o.Mat(a.WKVB)
		o.LaunchGrid(mlaQLatRopeKernel(nr.r.Interleaved, nr.w.DType), cuda.Dim3{X: uint32(blocks), Y: 1, Z: 1}, cuda.Dim3{X: qlThreads}, 0,
			append([]any{qlat.P, w.P, int32(dn), int32(a.VDim), int32(b.Rows)},
				o.normRopeArgs(a.Q, a.KV, nr.w, nr.eps, h, dn+dr, dn, nr.pos, nr.r, nr.ns)...)...)
	}
	o.LaunchGrid(kernel, cuda.Dim3{X: uint32(mlfCluster * perRow), Y: 1, Z: uint32(b.Rows)}, cuda.Dim3{X: decodeWarps * 32}, shared,
		part.P, stats.P, qlat.P, q.Sub(0, dn).P, int32(q.Pitch), int32(dn+dr), o.D.Ptr(a.KV), int32(a.KV.Pitch),
		o.D.Ptr(a.Cache), o.D.Ptr(b.PastDev), int32(h), int32(b.MaxSeq), scaleLog2(a.Scale))
	o.mlaOut(a, part, stats, perRow)
}

// mlaQLat launches mla_qlat: q_lat = W_UK[h]ᵀ·q_nope of every row and head
// into qlat, bf16 [rows, heads·R].
func (o *ops) mlaQLat(a *kernels.MLAArgs, qlat cudaset.Mat) {
	h, dn, dr, dv, r, rows := a.Heads, a.NopeDim, a.RopeDim, a.VDim, a.Rank, a.Batch.Rows
	q, w := o.Mat(a.Q), o.Mat(a.WKVB)
	o.LaunchGrid("mla_qlat", cuda.Dim3{X: uint32(r / qlCols), Y: uint32(h), Z: uint32((rows + qlRows - 1) / qlRows)},
		cuda.Dim3{X: qlThreads}, 0, qlat.P, q.P, int32(q.Pitch), int32(dn+dr), w.P, int32(dn), int32(dv), int32(r), int32(h), int32(rows))
}

// mlaOut launches mla_out: per (row, head), the perRow partial o_lat of
// part, f32 [rows·heads·perRow, R], merged by their (max, sum) in stats,
// f32 [rows·heads·perRow, 2], then out = W_UV[h]·o_lat.
func (o *ops) mlaOut(a *kernels.MLAArgs, part, stats cudaset.Mat, perRow int) {
	h, dn, dv, r, rows := a.Heads, a.NopeDim, a.VDim, a.Rank, a.Batch.Rows
	w, out := o.Mat(a.WKVB), o.Mat(a.Out)
	o.LaunchGrid("mla_out", cuda.Dim3{X: uint32(h), Y: uint32((dv + moRows - 1) / moRows), Z: uint32(rows)}, cuda.Dim3{X: 128}, 0,
		out.P, int32(out.Pitch), part.P, stats.P, w.P, int32(dn), int32(dv), int32(r), int32(h), int32(perRow))
}

// normRopeCall is rms_norm_rope's part of an mla_decode_rope call: the norm
// weights, eps, positions and tables, and the norm's shape (normRopeTakes).
type normRopeCall struct {
	w, pos *kernels.Tensor
	eps    float32
	r      *kernels.Rope
	ns     normShape
}

// MLADecodeRoPE is rms_norm_rope then mla_decode with one launch fewer:
// where mla_decode would run its flat variant and rms_norm_rope's kernel
// would take the norm and ropes, mla_qlat_rope runs rms_norm_rope's blocks
// and mla_qlat's in one grid (mla_qlat reads only q's nope dims, which the
// norm and ropes leave), then mla_flat and mla_out as MLADecode launches
// them; the results are the two ops' bit for bit. It declines every other
// call, and the Dispatch runs RMSNormRoPE and MLADecode.
func (o *ops) MLADecodeRoPE(a *kernels.MLAArgs, w *kernels.Tensor, eps float32, pos *kernels.Tensor, r *kernels.Rope) {
	const op = kernels.OpMLADecodeRoPE
	kernels.CheckMLADecodeRoPE(o.D.ActDType(), a, w, pos, r)
	variant := o.mlaDecodeVariant(op, a)
	o.Need(variant == mlaFlatVariant, op, "mla_decode runs its %s variant here, not %s: rms_norm_rope and mla_decode run it",
		variant, mlaFlatVariant)
	o.Need(o.mlaFlat.ready() == nil, op, "%v", o.mlaFlat.ready())
	d := mlaLatent{a.Rank, a.RopeDim}
	o.Need(mlaFlatWhy(d, a.Heads, a.NopeDim) == "", op, "%s: rms_norm_rope and mla_decode run it", mlaFlatWhy(d, a.Heads, a.NopeDim))
	ns, threads := o.normRopeTakes(op, a.Q, a.KV, w, a.NopeDim+a.RopeDim, a.NopeDim, a.Heads, r)
	o.Need(threads <= qlThreads, op, "rms_norm_rope's blocks of %d threads: mla_qlat_rope's are %d", threads, qlThreads)
	if a.Batch.Rows == 0 {
		return
	}
	o.mlaFlatDecode(op, a, &normRopeCall{w: w, pos: pos, eps: eps, r: r, ns: ns})
}
