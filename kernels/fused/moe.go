package fused

import (
	"fmt"
	"slices"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/cudaset"
)

// Launch shapes of moe.cu, named as there.
const (
	// routeWarps is ROUTE_WARPS, the tokens of a moe_route block; a lane
	// holds routePerLane experts (ROUTE_PER_LANE).
	routeWarps   = 4
	routePerLane = 8
	// maxGroups is MAX_GROUPS: the most groups group_gemm schedules and
	// experts moe_align sorts.
	maxGroups = 256
	// alignBlocks and alignThreads are ALIGN_BLOCKS and ALIGN_THREADS,
	// moe_align_count's and moe_align's grid and block; alignChunks is
	// ALIGN_CHUNKS, their warps (a chunk of the choices each).
	alignBlocks  = 16
	alignThreads = 256
	alignChunks  = alignBlocks * alignThreads / 32
	// foldMax is MOE_FOLD_MAX: the most choices (tokens × top-k) the folded
	// decode path ranks in each block.
	foldMax = 128
	// foldTiling is the tiling the folded path runs in: decode's.
	foldTiling = "m16"
	// foldCounters is how many n-tiles the folded down kernel can count
	// (one counter each): hidden sizes up to foldCounters·BN.
	foldCounters = 1024
	// foldedVariant is moe_experts' variant at foldTiling that folds
	// moe_align and moe_combine into the grouped GEMMs (see MoEExperts).
	foldedVariant = "grouped_mma_folded"
	// routedVariant is moe_routed's variant that folds moe_route into the
	// folded path's gate/up kernel too (see MoERouted); routedUnfused
	// declines the call, and the Dispatch runs moe_route and moe_experts.
	routedVariant = "route_folded"
	routedUnfused = "unfused"
	// dynTiling is the tiling whose grouped GEMMs also run on a persistent
	// grid (moe.cu's group_gemm_dyn): decode's, where the bound's grid is
	// mostly blocks that find no work. dynVariant is that variant, of
	// moe_experts (its four launches; the folded variants' past the fold
	// too) and of group_gemm; grouped_mma there is the grid a block a tile.
	dynTiling  = "m16"
	dynVariant = "grouped_mma_dyn"
	// foldDynVariant is moe_experts' variant that runs the folded path on
	// the persistent grid (moe.cu's MOE_FOLD_DYN) wherever it takes the
	// problem, and dynVariant's four launches elsewhere; foldedVariant, the
	// default, runs it past foldTokens up to foldDynTokens.
	foldDynVariant = "grouped_mma_folded_dyn"
	// oneVariant is moe_experts' variant that runs the folded path on the
	// persistent grid in one launch (moe.cu's moe_one) wherever
	// foldDynVariant would run its two, and dynVariant's four elsewhere;
	// foldedVariant, the default, runs it past foldTokens up to
	// foldDynTokens, and foldDynVariant keeps the two launches selectable.
	oneVariant = "grouped_mma_one"
	// dynStages is the ring depth of the persistent grid's kernels, which
	// otherwise run dynTiling's tiling: a grid of the blocks the SMs hold
	// streams more bytes at once with more, shallower blocks (three of
	// three stages an SM against two of four at m16's tiling; measured
	// faster at 16 tokens, bench/RESULTS.md). The folded path, a block a
	// tile, keeps the tiling's depth.
	dynStages = 3
	// dynGateUpPair, dynDownPair and dynOnePair are where in dynCounters
	// (i32) the gate/up, down and moe_one kernels' counter pairs start (the
	// group_gemm op takes down's): a 128-byte line each, so that no two
	// kernels' atomics, or their resets, share one.
	dynGateUpPair = 0
	dynDownPair   = 32
	dynOnePair    = 64
	dynCountersN  = 96
	// oneDoneN is the m-tile counters of moe_one (the most m-tiles of the
	// folded path: MOE_FOLD_MAX choices at one row a tile).
	oneDoneN = 128
)

// gemmConfig is a tiling of the grouped GEMM (moe.cu's GROUP_GEMM): BM × BN
// tiles over WarpsM × WarpsN warps, K in BK steps through Stages buffers.
type gemmConfig struct {
	Name           string
	BM, BN         int
	WarpsM, WarpsN int
	BK, Stages     int
	regime         string
}

// gemmConfigs are the tilings compiled, smallest M tile first: m16 streams
// the weights of decode's few rows per expert once, BN small so that even
// batch 1's six experts make hundreds of blocks; m64 serves some hundred
// tokens (tens of rows per expert); m128 is prefill's, bound by the tensor
// cores: warp tiles of 64×64 (32 mma per 8 fragment loads), and a
// block tile of 128×256 that reads 85 FLOP's worth per byte from L2 (a
// 128×128 tile's 64 would need ~12 TB/s of L2 at cuBLAS's 790 TFLOP/s).
var gemmConfigs = []gemmConfig{
	{Name: "m16", BM: 16, BN: 64, WarpsM: 1, WarpsN: 4, BK: 128, Stages: 4, regime: "decode: a weight stream"},
	{Name: "m64", BM: 64, BN: 128, WarpsM: 1, WarpsN: 4, BK: 64, Stages: 4, regime: "tens of rows per group"},
	{Name: "m128", BM: 128, BN: 256, WarpsM: 2, WarpsN: 4, BK: 64, Stages: 3, regime: "prefill: tensor-core bound"},
}

// gemmKernel and gateUpKernel are the tiling's group_gemm and moe_gate_up.
func (c gemmConfig) gemmKernel() string   { return "group_gemm_" + c.Name }
func (c gemmConfig) gateUpKernel() string { return "moe_gate_up_" + c.Name }

// foldGateUpKernel and foldGemmKernel are the folded decode path's
// kernels in tiling c (moe.cu's MOE_FOLD).
func (c gemmConfig) foldGateUpKernel() string { return "moe_gate_up_" + c.Name + "_fold" }
func (c gemmConfig) foldGemmKernel() string   { return "group_gemm_" + c.Name + "_fold" }

// routeGateUpKernel is moe_routed's gate/up kernel in tiling c: the folded
// one, routing the tokens itself (moe.cu's MOE_FOLD).
func (c gemmConfig) routeGateUpKernel() string { return "moe_gate_up_" + c.Name + "_route" }

// dynGemmKernel and dynGateUpKernel are group_gemm and moe_gate_up on a
// persistent grid in tiling c (moe.cu's GROUP_GEMM_DYN).
func (c gemmConfig) dynGemmKernel() string   { return "group_gemm_" + c.Name + "_dyn" }
func (c gemmConfig) dynGateUpKernel() string { return "moe_gate_up_" + c.Name + "_dyn" }

// foldDynGateUpKernel and foldDynGemmKernel are the folded path's kernels
// on the persistent grid in tiling c (moe.cu's MOE_FOLD_DYN).
func (c gemmConfig) foldDynGateUpKernel() string { return "moe_gate_up_" + c.Name + "_fold_dyn" }
func (c gemmConfig) foldDynGemmKernel() string   { return "group_gemm_" + c.Name + "_fold_dyn" }

// oneKernel is the folded path in one launch on the persistent grid in
// tiling c (moe.cu's MOE_ONE).
func (c gemmConfig) oneKernel() string { return "moe_one_" + c.Name }

// routeDynGateUpKernel is moe_routed's gate/up kernel on the persistent
// grid in tiling c (moe.cu's MOE_FOLD_DYN).
func (c gemmConfig) routeDynGateUpKernel() string { return "moe_gate_up_" + c.Name + "_route_dyn" }

// foldConfig and dynConfig are the tilings of foldTiling and dynTiling.
func foldConfig() gemmConfig { return configNamed(foldTiling) }
func dynConfig() gemmConfig {
	c := configNamed(dynTiling)
	c.Stages = dynStages
	return c
}

func configNamed(name string) gemmConfig {
	for _, c := range gemmConfigs {
		if c.Name == name {
			return c
		}
	}
	panic("fused: no tiling " + name)
}

func (c gemmConfig) threads() int { return 32 * c.WarpsM * c.WarpsN }

// shared is the dynamic shared memory of a block, moe.cu's GemmRing: Stages
// × (BM + BN) rows of BK bf16 (Tile<BK> rows, rowBytes).
func (c gemmConfig) shared() int { return c.Stages * (c.BM + c.BN) * rowBytes(c.BK) }

// check reports what of tiling c the grouped GEMM cannot run (moe.cu's
// group_gemm_tile, whose static_asserts say the same), nil when nothing.
// The device's limit on shared memory is FitShared's, at New.
func (c gemmConfig) check() error {
	threads := c.threads()
	var why string
	switch {
	case c.BM <= 0 || c.BN <= 0 || c.WarpsM <= 0 || c.WarpsN <= 0 || c.BK <= 0:
		why = "sizes must be positive"
	case c.BK%64 != 0:
		why = fmt.Sprintf("BK %d is not a multiple of 64 (a k-tile row is whole 8-chunk swizzle groups)", c.BK)
	case c.Stages < 2:
		why = fmt.Sprintf("%d stages: the ring needs at least 2 (one landing while one is read)", c.Stages)
	case c.BM%c.WarpsM != 0 || c.BM/c.WarpsM%16 != 0:
		why = fmt.Sprintf("a warp's rows, BM/WarpsM, must be whole m16 fragments, got %d/%d", c.BM, c.WarpsM)
	case c.BN%c.WarpsN != 0 || c.BN/c.WarpsN%16 != 0:
		why = fmt.Sprintf("a warp's columns, BN/WarpsN, must be whole pairs of n8 fragments (gate and up halves), got %d/%d",
			c.BN, c.WarpsN)
	case threads > 1024:
		why = fmt.Sprintf("%d threads, more than a block holds", threads)
	case c.BM*(c.BK/8)%threads != 0 || c.BN*(c.BK/8)%threads != 0:
		why = fmt.Sprintf("a stage's 16-byte copies (%d of x, %d of w) do not divide among %d threads", c.BM*(c.BK/8),
			c.BN*(c.BK/8), threads)
	default:
		return nil
	}
	return fmt.Errorf("grouped GEMM tiling %s: %s", c.params(), why)
}

// checkGemmConfigs reports what of gemmConfigs the set cannot take: a
// tiling check refuses, M tiles not ascending (configFor takes the first
// that holds a group), or the folded path's or the persistent grid's
// tiling absent.
func checkGemmConfigs() error {
	for i, c := range gemmConfigs {
		if err := c.check(); err != nil {
			return err
		}
		if i > 0 && c.BM <= gemmConfigs[i-1].BM {
			return fmt.Errorf("grouped GEMM tilings: %s's M tile %d after %s's %d, not ascending", c.Name, c.BM,
				gemmConfigs[i-1].Name, gemmConfigs[i-1].BM)
		}
	}
	for _, name := range []string{foldTiling, dynTiling} {
		if !slices.ContainsFunc(gemmConfigs, func(c gemmConfig) bool { return c.Name == name }) {
			return fmt.Errorf("grouped GEMM tilings: no tiling %s", name)
		}
	}
	return dynConfig().check()
}

func (c gemmConfig) params() string {
	return fmt.Sprintf("%s: tile %dx%dx%d, %dx%d warps, %d stages, shared=%d", c.Name, c.BM, c.BN, c.BK, c.WarpsM, c.WarpsN,
		c.Stages, c.shared())
}

// configFor is the tiling for rows spread over groups: the smallest M tile
// that holds an average group, else the largest. The choice depends on
// host shapes only, so a graph replays it whatever the groups.
func configFor(rows, groups int) gemmConfig {
	avg := (rows + groups - 1) / max(groups, 1)
	for _, c := range gemmConfigs {
		if avg <= c.BM {
			return c
		}
	}
	return gemmConfigs[len(gemmConfigs)-1]
}

// mTiles is the most m-tiles of bm rows that rows split into groups can
// take: each non-empty group wastes less than one tile, and at most
// min(groups, rows) groups are non-empty.
func mTiles(rows, groups, bm int) int {
	return (rows + min(groups, rows)*(bm-1)) / bm
}

// Scratch buffers (cudaset.Kit.Scratch), by what they hold.
const (
	scrMoESorted = "moe.sorted" // moe_align: the choice t·K+k of each padded row, -1 for padding, i32 [rows]
	scrMoESlot   = "moe.slot"   // moe_align: the padded row of each choice i32 [N·K]
	scrMoECounts = "moe.counts" // moe_align_count: each warp chunk's choices of each expert i32 [E, alignChunks]
	scrMoEAct    = "moe.act"    // moe_gate_up: silu(gate)·up of every row bf16 [rows, I]
	scrMoEY      = "moe.y"      // group_gemm (down): every row's expert output bf16 [rows, H]
	scrMoEH      = "moe.h"      // prefill (expertsCuBLAS): gate and up projections bf16 [rows, 2I]
)

// rowsAligned reports whether every matrix starts its rows on 16-byte
// boundaries (the cp.async copies and vector accesses need it).
func (o *ops) rowsAligned(ts ...*kernels.Tensor) bool {
	for _, t := range ts {
		if t.Pitch%cudaset.VecWidth != 0 || o.D.Ptr(t)%16 != 0 {
			return false
		}
	}
	return true
}

// MoERoute is moe_route: a warp per token, the softmax, the groups and the
// top-k in registers.
func (o *ops) MoERoute(idx, weight, logits *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpMoERoute
	kernels.CheckMoERoute(idx, weight, logits, r)
	n, experts := logits.Rows(), logits.Cols()
	o.needRoute(op, experts, r)
	args := []any{o.D.Ptr(idx), int32(idx.Pitch), o.D.Ptr(weight), int32(weight.Pitch), o.D.Ptr(logits),
		int32(logits.Pitch), int32(n)}
	o.Launch("moe_route", (n+routeWarps-1)/routeWarps, routeWarps*32, append(args, routeArgs(experts, r)...)...)
}

// needRoute is what moe.cu's router (route_token) takes beyond the
// contract, for op's call: at most 32·routePerLane experts, top-32, 32
// groups.
func (o *ops) needRoute(op kernels.Op, experts int, r *kernels.Routing) {
	o.Need(experts <= 32*routePerLane, op, "%d experts, at most %d", experts, 32*routePerLane)
	o.Need(r.TopK <= 32, op, "top-%d, at most 32", r.TopK)
	o.Need(r.Method != kernels.RouteGroupLimited || r.Groups <= 32, op, "%d groups, at most 32", r.Groups)
}

// routeArgs are r over experts as moe.cu's kernels take a router (its
// Route): E, K, groupLimited, groups, topkGroups, norm, scale.
func routeArgs(experts int, r *kernels.Routing) []any {
	return []any{int32(experts), int32(r.TopK), b32(r.Method == kernels.RouteGroupLimited), int32(r.Groups),
		int32(r.TopKGroups), b32(r.NormTopK), r.Scale}
}

func b32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// checkGemm is what the grouped GEMM needs beyond the contract: bf16
// weights, at most maxGroups groups, K and N in whole 16-byte chunks and
// rows on 16-byte boundaries.
func (o *ops) checkGemm(op kernels.Op, w *kernels.Tensor, n, k int, rows ...*kernels.Tensor) {
	o.Need(cudaset.IsBF16(w), op, "weights %v: the kernels read bf16", w)
	o.Need(w.Shape[0] <= maxGroups, op, "%d groups, at most %d", w.Shape[0], maxGroups)
	o.Need(n%cudaset.VecWidth == 0 && k%cudaset.VecWidth == 0, op, "N %d and K %d must be multiples of %d", n, k, cudaset.VecWidth)
	o.Need(o.rowsAligned(rows...), op, "rows of %v do not all start on 16-byte boundaries", rows)
}

// GroupGemm is group_gemm over every group at once, the groups' tiles found
// from the device offsets by each block (so a graph replays it with new
// offsets), in the tiling configFor picks for the rows per group.
func (o *ops) GroupGemm(out, x, w, first *kernels.Tensor) {
	op := kernels.OpGroupGemm
	kernels.CheckGroupGemm(o.D.ActDType(), out, x, w, first)
	groups, n, k, m := w.Shape[0], w.Shape[1], w.Shape[2], x.Rows()
	o.checkGemm(op, w, n, k, out, x)
	c := configFor(m, groups)
	if o.variantFor(op, wgmmaKey(c)) == wgmmaVariant {
		o.wgmmaGemm(op, false, false, o.Mat(out), o.Mat(x), m, 0, 1, o.D.Ptr(w), o.D.Ptr(first), groups, m, n, k)
		return
	}
	dyn := o.variantFor(op, wgmmaKey(c)) == dynVariant && o.dynTakes(c)
	o.groupGemm(c, "group_gemm", dyn, mTiles(m, groups, c.BM), o.Mat(out), o.Mat(x), 0, 1, o.D.Ptr(w), o.D.Ptr(first),
		groups, m, n, k)
}

// groupGemm launches kernel (group_gemm or moe_gate_up) in tiling c over
// at most tiles m-tiles: out [m, ·] = the rows of x (through gather, when
// not 0) times their group's w [groups, n, kk]. For moe_gate_up n is 2I and
// a block writes BN/2 of the I columns. The grid is a block a tile of the
// bound, or with dyn (where dynTakes c) the kernel's persistent instance
// (group_gemm_dyn): as many blocks as the SMs hold at once, at most one a
// tile of the bound, taking the tiles from the kernel's counter pair.
func (o *ops) groupGemm(c gemmConfig, kernel string, dyn bool, tiles int, out, x cudaset.Mat, gather uintptr, gdiv int, w,
	first uintptr, groups, m, n, kk int) {
	if tiles == 0 {
		return
	}
	cols := c.BN
	if kernel == "moe_gate_up" {
		cols = c.BN / 2
		n /= 2
	}
	grid := cuda.Dim3{X: uint32((n + cols - 1) / cols), Y: uint32(tiles)}
	args := []any{out.P, int32(out.Pitch), x.P, int32(x.Pitch)}
	if kernel == "moe_gate_up" {
		args = append(args, gather, int32(gdiv))
		n *= 2
	}
	args = append(args, w, first, int32(groups), int32(m), int32(n), int32(kk))
	name, pair := c.gemmKernel(), dynDownPair
	if kernel == "moe_gate_up" {
		name, pair = c.gateUpKernel(), dynGateUpPair
	}
	if dyn {
		name = c.dynGemmKernel()
		if kernel == "moe_gate_up" {
			name = c.dynGateUpKernel()
		}
		grid = o.dynGrid(name, grid)
		args = append(args, o.D.Ptr(o.dynCounters)+uintptr(4*pair))
		c = dynConfig()
	}
	o.LaunchGrid(name, grid, cuda.Dim3{X: uint32(c.threads())}, c.shared(), args...)
}

// dynGrid is the grid of the persistent kernel name whose work is at most
// the tiles of bound: as many blocks as the SMs hold at once, at most one a
// tile.
func (o *ops) dynGrid(name string, bound cuda.Dim3) cuda.Dim3 {
	return cuda.Dim3{X: uint32(min(int(bound.X*bound.Y), o.dynPerSM[name]*o.SMs))}
}

// dynTakes reports whether tiling c runs its grouped GEMMs on the
// persistent grid where chosen: it has those kernels, and their counters
// are allocated.
func (o *ops) dynTakes(c gemmConfig) bool { return c.Name == dynTiling && o.dynCounters != nil }

// MoEExperts runs the routed experts in four launches (two or one at
// decode, see below), none of which reads anything on the host:
//
//  1. moe_align sorts the choices by expert, each expert's rows padded to
//     the tiling's M tile (one block);
//  2. moe_gate_up: the grouped GEMM of every expert's gate and up
//     projections over its rows, the tokens gathered from x as the tiles
//     load, silu(gate)·up written once;
//  3. group_gemm: the down projections of those rows;
//  4. moe_combine: each token's K expert outputs weighted and summed.
//
// The tiling follows N·K/E, the rows per expert (configFor). Grids are
// sized for the worst case, N·K rows plus less than a tile of padding per
// expert; blocks past the work exit. At decode's tiling (dynTiling) the
// GEMMs run by default on persistent grids instead (dynVariant, and the
// folded variant past the fold): as many blocks as the SMs hold, which
// take the tiles of the work from a counter, where a block a tile of the
// bound leaves thousands of blocks to launch, wait and exit (16 tokens on
// the same 6 of 64 experts: 264 of 2,904 gate/up blocks with work; the
// grid a block a tile stays grouped_mma). The weighted sum is a separate,
// deterministic pass rather than f32 atomics in the down GEMM's epilogue:
// at the 11K-token prefill the atomics would read and write an f32
// accumulator of N·H (90 MB, larger than the L2) once per choice in random
// token order, then zero it and convert it, against the combine's one
// write and one read of the bf16 rows (0.54 GB, 0.13 ms at the copy rate);
// at decode both are a few µs, and the combine keeps HF's order of the sum.
//
// At decode (tiling foldTiling, at most foldTokens tokens, the variant
// foldedVariant) steps 1 and 4 fold into 2 and 3, whose launches were most
// of their cost: every moe_gate_up block ranks the choices itself, and the
// last block of each of group_gemm's n-tiles sums that tile's columns of
// every token (moe.cu's MOE_FOLD). Same rows, same sums, same result. Past
// foldTokens, up to foldDynTokens (or wherever foldDynVariant or
// oneVariant is chosen), the folded path runs on the persistent grid
// instead: the blocks rank the choices, then take their tiles from a
// counter, and the last tile of each down n-tile sums its columns
// (foldPath); by default in one launch, moe_one, whose down tiles wait on
// their rows' gate/up tiles, and with foldDynVariant in two (MOE_FOLD_DYN,
// the second grid waiting on the whole first; oneRuns).
func (o *ops) MoEExperts(out, x, idx, weight, gateUp, down *kernels.Tensor) {
	op := kernels.OpMoEExperts
	kernels.CheckMoEExperts(o.D.ActDType(), out, x, idx, weight, gateUp, down)
	n, hidden, k := x.Rows(), x.Cols(), idx.Cols()
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	o.checkGemm(op, gateUp, 2*inter, hidden, out, x)
	o.checkGemm(op, down, hidden, inter)
	if n == 0 {
		return
	}
	choices := n * k
	c := configFor(choices, experts)
	tiles, rows, first, sorted, slot, act, y := o.moeScratch(c, choices, experts, inter, hidden)
	variant := o.variantFor(op, wgmmaKey(c))
	if fold, dyn := o.foldPath(variant, c, n, choices, hidden); fold {
		o.expertsFolded(c, dyn, oneRuns(variant, dyn), tiles, out, x, idx, weight, gateUp, down, first, sorted, slot, act, y, rows)
		return
	}
	o.align(first, sorted, slot, o.D.Ptr(idx), idx.Pitch, n, k, experts, c.BM)
	if variant == wgmmaVariant {
		// group_wgmma: gate/up over the rows gathered by its producer, or
		// packed first (into y, spent before down writes it), then down.
		if wgmmaGather {
			o.wgmmaGemm(op, true, false, act, o.Mat(x), n, sorted.P, k, o.D.Ptr(gateUp), first.P, experts, rows, 2*inter, hidden)
		} else {
			o.CopyRows(y, slot.P, o.Mat(x), 0, k, n, choices, hidden)
			o.wgmmaGemm(op, true, false, act, y, rows, 0, 1, o.D.Ptr(gateUp), first.P, experts, rows, 2*inter, hidden)
		}
		o.wgmmaGemm(op, false, wgmmaTMAOut, y, act, rows, 0, 1, o.D.Ptr(down), first.P, experts, rows, hidden, inter)
	} else if c.Name == prefillTiling {
		if !o.expertsCuBLAS(slot, act, y, x, gateUp, down, n, k, rows) {
			return
		}
	} else {
		dyn := (variant == dynVariant || variant == foldedVariant || variant == foldDynVariant || variant == oneVariant) &&
			o.dynTakes(c)
		o.groupGemm(c, "moe_gate_up", dyn, tiles, act, o.Mat(x), sorted.P, k, o.D.Ptr(gateUp), first.P, experts, rows, 2*inter, hidden)
		o.groupGemm(c, "group_gemm", dyn, tiles, y, act, 0, 1, o.D.Ptr(down), first.P, experts, rows, hidden, inter)
	}
	o.CombineRows(o.Mat(out), y, slot.P, weight, n, k, hidden)
}

// align launches moe_align_count, then moe_align: the choices of idx (i32
// [n, k] of pitch ip) over experts sorted by expert into first, sorted and
// slot, each expert's rows padded to whole m-tiles of bm rows, in
// ascending choice order within an expert.
func (o *ops) align(first, sorted, slot cudaset.Mat, idx uintptr, ip, n, k, experts, bm int) {
	counts := o.Scratch(scrMoECounts, kernels.I32, experts, alignChunks)
	o.Launch("moe_align_count", alignBlocks, alignThreads, counts.P, idx, int32(ip), int32(n), int32(k), int32(experts))
	o.Launch("moe_align", alignBlocks, alignThreads, first.P, sorted.P, slot.P, counts.P, idx, int32(ip), int32(n), int32(k),
		int32(experts), int32(bm))
}

// foldTokens is the most tokens the folded path takes by default: alone
// on an H200 it measured faster at 1, 3 and 5 tokens and slower at 16 of
// distinct routing (bench/RESULTS.md, MoE), where every one of its
// thousands of gate/up blocks counts the choices before most exit. A
// variable, so that the tests can fold every case the kernels can take.
var foldTokens = 8

// foldDynTokens is the most tokens the folded path takes on the persistent
// grid by default (foldedVariant past foldTokens): decode's batches of 9 to
// 16 tokens, where the grid a block a tile of the bound is thousands of
// blocks of which a few hundred have work, and the four launches pay two
// hops more on the step's chain. A variable, as foldTokens.
var foldDynTokens = 16

// foldTakes reports whether the folded path runs tokens (choices of them
// with top-k) in tiling c with hidden columns out.
func (o *ops) foldTakes(c gemmConfig, tokens, choices, hidden int) bool {
	return tokens <= foldTokens && o.foldFits(c, choices, hidden)
}

// foldFits reports whether the folded path's kernels take choices in
// tiling c with hidden columns out: every block ranks them (foldMax), and
// each down n-tile has a counter.
func (o *ops) foldFits(c gemmConfig, choices, hidden int) bool {
	return c.Name == foldTiling && choices <= foldMax && (hidden+c.BN-1)/c.BN <= foldCounters && o.moeCounters != nil
}

// foldPath is which path moe_experts runs under variant for tokens
// (choices of them) with hidden columns out in tiling c: folded (two
// launches, or one: oneRuns) or not (fold), and then on the persistent grid (dyn) or a
// block a tile. foldedVariant folds a block a tile up to foldTokens and
// on the persistent grid up to foldDynTokens; foldDynVariant and
// oneVariant fold on the persistent grid wherever the kernels take it;
// none folds past them (the four launches, on the persistent grid).
// Where it folds on the persistent grid, oneRuns says in how many
// launches.
func (o *ops) foldPath(variant string, c gemmConfig, tokens, choices, hidden int) (fold, dyn bool) {
	fits := o.foldFits(c, choices, hidden)
	switch {
	case variant == foldedVariant && fits && tokens <= foldTokens:
		return true, false
	case (variant == foldedVariant && tokens <= foldDynTokens || variant == foldDynVariant || variant == oneVariant) && fits &&
		o.dynTakes(c):
		return true, true
	}
	return false, false
}

// oneRuns reports whether the folded path on the persistent grid (dyn)
// runs in one launch, moe_one, under variant: by default and with
// oneVariant chosen; in two with foldDynVariant chosen (what one launch
// bought: bench/RESULTS.md, Decode).
func oneRuns(variant string, dyn bool) bool { return dyn && variant != foldDynVariant }

// expertsFolded is MoEExperts folded: in two launches, moe_gate_up_fold (the
// alignment in every block, block 0 writing first, sorted and slot), then
// foldDown; with dyn, both on the persistent grid (MOE_FOLD_DYN, the gate/up
// kernel taking its tiles from dynGateUpPair's counters), or with one in
// one launch (moe_one, its tickets dynOnePair's counters, its m-tiles'
// counts oneDone).
func (o *ops) expertsFolded(c gemmConfig, dyn, one bool, tiles int, out, x, idx, weight, gateUp, down *kernels.Tensor,
	first, sorted, slot, act, y cudaset.Mat, rows int) {
	n, hidden, k := x.Rows(), x.Cols(), idx.Cols()
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	args := []any{act.P, int32(act.Pitch), o.D.Ptr(x), int32(x.Pitch), o.D.Ptr(idx), int32(idx.Pitch), int32(n), int32(k),
		o.D.Ptr(gateUp), first.P, sorted.P, slot.P, int32(experts), int32(rows), int32(2 * inter), int32(hidden)}
	if one {
		d := dynConfig()
		name := d.oneKernel()
		upTiles, downTiles := (inter+d.BN/2-1)/(d.BN/2), (hidden+d.BN-1)/d.BN
		grid := o.dynGrid(name, cuda.Dim3{X: uint32(upTiles + downTiles), Y: uint32(tiles)})
		om := o.Mat(out)
		args = append(args, y.P, int32(y.Pitch), o.D.Ptr(down), om.P, int32(om.Pitch), o.D.Ptr(weight),
			int32(weight.Pitch), o.D.Ptr(o.moeCounters), o.D.Ptr(o.oneDone), o.D.Ptr(o.dynCounters)+uintptr(4*dynOnePair))
		o.LaunchGrid(name, grid, cuda.Dim3{X: uint32(d.threads())}, d.shared(), args...)
		return
	}
	o.launchFolded(c, dyn, gemmConfig.foldGateUpKernel, gemmConfig.foldDynGateUpKernel, tiles, inter, args,
		out, weight, down, first, slot, act, y, rows)
}

// launchFolded launches the folded path's gate/up kernel (name's, a block
// a tile of the bound; dynName's on the persistent grid where dyn, with its
// ticket pair after args), then the down kernel that combines.
func (o *ops) launchFolded(c gemmConfig, dyn bool, name, dynName func(gemmConfig) string, tiles, inter int, args []any,
	out, weight, down *kernels.Tensor, first, slot, act, y cudaset.Mat, rows int) {
	kernel, grid := name(c), foldGateUpGrid(c, tiles, inter)
	if dyn {
		c = dynConfig()
		kernel = dynName(c)
		grid = o.dynGrid(kernel, grid)
		args = append(args, o.D.Ptr(o.dynCounters)+uintptr(4*dynGateUpPair))
	}
	o.LaunchGrid(kernel, grid, cuda.Dim3{X: uint32(c.threads())}, c.shared(), args...)
	o.foldDown(c, dyn, tiles, out, weight, down, first, slot, act, y, rows)
}

// foldGateUpGrid is the grid of the folded path's gate/up kernels in
// tiling c: BN/2 of the inter columns by tiles m-tiles.
func foldGateUpGrid(c gemmConfig, tiles, inter int) cuda.Dim3 {
	return cuda.Dim3{X: uint32((inter + c.BN/2 - 1) / (c.BN / 2)), Y: uint32(tiles)}
}

// foldDown is the folded path's second launch, group_gemm_fold: the down
// projections of the rows of act (first's groups) into y, and out [N, H],
// each token's rows (slot) weighted by weight [N, K] and summed, by each
// n-tile's last tile; with dyn on the persistent grid (c then dynConfig's,
// its tickets dynDownPair's counters).
func (o *ops) foldDown(c gemmConfig, dyn bool, tiles int, out, weight, down *kernels.Tensor, first, slot, act, y cudaset.Mat, rows int) {
	n, k, hidden := out.Rows(), weight.Cols(), out.Cols()
	experts, inter := down.Shape[0], down.Shape[2]
	om := o.Mat(out)
	args := []any{y.P, int32(y.Pitch), act.P, int32(act.Pitch), o.D.Ptr(down), first.P, int32(experts), int32(rows), int32(hidden),
		int32(inter), om.P, int32(om.Pitch), slot.P, o.D.Ptr(weight), int32(weight.Pitch), int32(n), int32(k),
		o.D.Ptr(o.moeCounters)}
	name, grid := c.foldGemmKernel(), cuda.Dim3{X: uint32((hidden + c.BN - 1) / c.BN), Y: uint32(tiles)}
	if dyn {
		name = c.foldDynGemmKernel()
		grid = o.dynGrid(name, grid)
		args = append(args, o.D.Ptr(o.dynCounters)+uintptr(4*dynDownPair))
	}
	o.LaunchGrid(name, grid, cuda.Dim3{X: uint32(c.threads())}, c.shared(), args...)
}

// MoERouted is moe_route and the folded decode path of MoEExperts in that
// path's two launches, the first right after the router's logits:
//
//  1. moe_gate_up_route: every block routes the tokens itself from their
//     logits (moe_route's code, a warp a token: the same routes bit for
//     bit), counts and ranks the choices as moe_gate_up_fold does, and
//     runs its GEMM over them; block (0, 0) also writes idx and weight
//     and the tables;
//  2. group_gemm_fold (foldDown): down, and the combine, which reads
//     weight after its grid_wait, once the first launch has finished.
//
// So one launch fewer than moe_route then moe_experts, whose outputs
// these are bit for bit. At one token the default, splitVariant, runs
// moe_routed_split instead where it can (moe_split.go): one launch. Both run on the grid moe_experts' folded path
// would run them on (foldPath: a block a tile, or the persistent grid's
// MOE_FOLD_DYN past foldTokens or with foldDynVariant chosen). It declines
// (the Dispatch then runs moe_route and moe_experts) where moe_experts
// would not run the folded path (past foldDynTokens, another tiling,
// another variant chosen for it), past routeFoldTokens unless
// routedVariant is chosen, or where moe_routed's variant is routedUnfused.
// routeFoldTokens is the most tokens moe_routed routes in its gate/up
// blocks: every block routes every token before its first weight load,
// which alone on an H200 paid at one token and cost more than the launch
// it saves from three (bench/RESULTS.md, MoE); a tuning choice of
// routedVariant takes every count the fold takes. A variable, so that the
// tests can run every case the kernels take.
var routeFoldTokens = 1

func (o *ops) MoERouted(out, idx, weight, x, logits, gateUp, down *kernels.Tensor, r *kernels.Routing) {
	op := kernels.OpMoERouted
	kernels.CheckMoERouted(o.D.ActDType(), out, idx, weight, x, logits, gateUp, down, r)
	n, hidden, k := x.Rows(), x.Cols(), r.TopK
	experts, inter := gateUp.Shape[0], gateUp.Shape[1]/2
	o.needRoute(op, experts, r)
	o.checkGemm(op, gateUp, 2*inter, hidden, out, x)
	o.checkGemm(op, down, hidden, inter)
	choices := n * k
	c := configFor(choices, experts)
	key := wgmmaKey(c)
	v, ev := o.variantFor(op, key), o.variantFor(kernels.OpMoEExperts, key)
	picked := o.choice[choiceKey{op, key}] // a tuning choice or infer bench's --variants
	if v == splitVariant && (n <= routeSplitTokens || picked == splitVariant) && o.routedSplit(out, idx, weight, x, logits, gateUp, down, r) {
		return
	}
	if v == splitVariant {
		v = routedVariant // more tokens, or none it can take: the folded path's two launches
	}
	chosen := picked == routedVariant
	fold, dyn := o.foldPath(ev, c, n, choices, hidden)
	o.Need(v == routedVariant && fold && n > 0 && (n <= routeFoldTokens || chosen), op,
		"%d tokens, %s (variant %s; moe_experts' %s): moe_route then moe_experts run it", n, key, v, ev)
	tiles, rows, first, sorted, slot, act, y := o.moeScratch(c, choices, experts, inter, hidden)
	args := []any{act.P, int32(act.Pitch), o.D.Ptr(x), int32(x.Pitch), o.D.Ptr(logits), int32(logits.Pitch), int32(n)}
	args = append(append(args, routeArgs(experts, r)...), o.D.Ptr(idx), int32(idx.Pitch), o.D.Ptr(weight),
		int32(weight.Pitch), o.D.Ptr(gateUp), first.P, sorted.P, slot.P, int32(rows), int32(2*inter), int32(hidden))
	o.launchFolded(c, dyn, gemmConfig.routeGateUpKernel, gemmConfig.routeDynGateUpKernel, tiles, inter, args,
		out, weight, down, first, slot, act, y, rows)
}

// prefillTiling is the tiling of prefill's hundreds of rows per expert, where
// the grouped GEMM on mma.sync (about 270 TFLOP/s on W3's shapes) loses to
// cuBLAS's per-expert GEMMs on Hopper's wgmma (about 450; bench/RESULTS.md,
// MoE and group GEMM): there MoEExperts reads the expert offsets back (a
// sync, as naive's and HF's loops do; prefill is never inside a graph) and
// runs expertsCuBLAS.
const prefillTiling = "m128"

// expertsCuBLAS is the experts of a prefill: the tokens gathered into their
// padded rows (moe_align's slots), one cuBLAS GEMM per expert for gate/up,
// fused's swiglu over all rows, one cuBLAS GEMM per expert for down. Padding
// rows hold whatever the scratch held; every row is computed on its own and
// moe_combine reads only the chosen ones. It reports false when reading the
// offsets failed (the error is the device's).
func (o *ops) expertsCuBLAS(slot, act, y cudaset.Mat, x, gateUp, down *kernels.Tensor, n, k, rows int) bool {
	hidden, inter := x.Cols(), gateUp.Shape[1]/2
	at, err := o.D.ReadI32(o.moeFirst)
	if err != nil {
		o.D.Fail(err)
		return false
	}
	xs := y // the gathered tokens are spent once gate_up has read them
	o.CopyRows(xs, slot.P, o.Mat(x), 0, k, n, n*k, hidden)
	h := o.Scratch(scrMoEH, kernels.BF16, rows, 2*inter)
	o.GemmGroups(at, xs, o.Mat(gateUp), h, 2*inter, hidden)
	o.swiglu(act, h, rows, inter)
	o.GemmGroups(at, act, o.Mat(down), y, hidden, inter)
	return true
}

// moeScratch is the routed experts' buffers for choices (token, expert)
// pairs over experts of intermediate inter and hidden columns in tiling c:
// the m-tiles' bound and its rows (every expert's rows padded to c.BM),
// the expert offsets, the sorted choices and each choice's row, the
// SwiGLU activations and the down projections of those rows.
func (o *ops) moeScratch(c gemmConfig, choices, experts, inter, hidden int) (tiles, rows int, first, sorted, slot, act, y cudaset.Mat) {
	tiles = mTiles(choices, experts, c.BM)
	rows = tiles * c.BM
	return tiles, rows, o.moeFirstFor(experts), o.Scratch(scrMoESorted, kernels.I32, rows, 1),
		o.Scratch(scrMoESlot, kernels.I32, choices, 1), o.Scratch(scrMoEAct, kernels.BF16, rows, inter),
		o.Scratch(scrMoEY, kernels.BF16, rows, hidden)
}

// moeFirstFor is moe_align's output of each expert's first padded row, i32
// [E+1]: a tensor of its own, not scratch, so that a prefill can read it
// back. Allocated at the first MoE call (a prefill, before any graph
// capture) and regrown for more experts.
func (o *ops) moeFirstFor(experts int) cudaset.Mat {
	if o.moeFirst == nil || o.moeFirst.Numel() != experts+1 {
		if o.moeFirst != nil {
			o.D.Free(o.moeFirst)
		}
		o.moeFirst = o.D.Alloc(kernels.I32, experts+1)
	}
	return o.Mat(o.moeFirst)
}

// moeOpts are extra NVRTC options of moe.cu's module, empty but in tests:
// TestMoEFoldProbe sets -DMOE_PROBE=1 before New to build the folded path's
// timestamp probe.
var moeOpts []string

// moeModule is moe.cu's NVRTC module.
func moeModule() cudaset.Module {
	m := module("moe.cu", moeFuncs())
	m.Opts = slices.Clone(moeOpts)
	return m
}

// moeFuncs are moe.cu's kernels.
func moeFuncs() []string {
	return append(append([]string{"moe_route", "moe_align_count", "moe_align"}, cudaset.Names(groupGemmInstances(), groupGemmDynInstances())...),
		cudaset.Names(moeFoldInstances(), moeFoldDynInstances(), moeOneInstances())...)
}

// initMoE allocates the counters of the folded path and of the persistent
// grids, zeroed once here (every launch leaves them at zero, so that a
// captured graph replays the kernels with no memset), and reads how many
// blocks of each persistent kernel an SM holds from what the compiler made
// of it.
func (o *ops) initMoE() error {
	o.moeCounters = newCounters(o.Kit, foldCounters)
	o.dynPerSM = map[string]int{}
	c := dynConfig()
	for _, name := range cudaset.Names(groupGemmDynInstances(), moeFoldDynInstances(), moeOneInstances()) {
		a, err := o.Func(name).Attrs()
		if err != nil {
			return fmt.Errorf("fused: %s: %w", name, err)
		}
		o.dynPerSM[name] = o.residentBlocks(a, c.threads(), c.shared())
	}
	o.dynCounters = newCounters(o.Kit, dynCountersN)
	o.oneDone = newCounters(o.Kit, oneDoneN)
	return nil
}

// gemmShared lists the grouped GEMM kernels with their dynamic shared
// memory, for New to allow.
func gemmShared() map[string]int {
	m := map[string]int{}
	for _, c := range gemmConfigs {
		m[c.gemmKernel()] = c.shared()
		m[c.gateUpKernel()] = c.shared()
	}
	d := dynConfig()
	m[d.dynGemmKernel()] = d.shared()
	m[d.dynGateUpKernel()] = d.shared()
	m[d.foldDynGateUpKernel()] = d.shared()
	m[d.foldDynGemmKernel()] = d.shared()
	m[d.routeDynGateUpKernel()] = d.shared()
	m[d.oneKernel()] = d.shared()
	c := foldConfig()
	m[c.foldGateUpKernel()] = c.shared()
	m[c.foldGemmKernel()] = c.shared()
	m[c.routeGateUpKernel()] = c.shared()
	return m
}
