package fused

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cuda"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestFlashConfigs runs the shared harness once per flash_prefill tiling
// (the kernel-set test runs the default one only).
func TestFlashConfigs(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	saved := prefillConfig
	defer func() { prefillConfig = saved }()
	for _, c := range flashConfigs {
		t.Run(c.String(), func(t *testing.T) {
			prefillConfig = c
			kerneltest.Run(t, dev, "fused", kerneltest.DefaultTolerances())
		})
	}
}

// TestDecodeSplits checks how flash-decoding cuts caches: whole key tiles,
// every position covered, about one wave of blocks.
func TestDecodeSplits(t *testing.T) {
	const wave = 2 * 132 // an H200: 132 SMs of 228 KiB, two flash_decode blocks each
	for _, c := range []struct{ pairs, maxSeq, wantSplits int }{
		{64, 10866, 4},  // W1: 16 rows × 4 kv heads, about 264 blocks
		{4, 32768, 64},  // batch 1 at 32K
		{64, 178, 3},    // short caches: at most one split per tile
		{1, 1, 1},       //
		{2000, 4096, 1}, // more pairs than a wave
		{4, 100000, 66}, //
	} {
		splits, chunk := decodeSplits(c.pairs, c.maxSeq, wave)
		if chunk%keyTile != 0 || splits*chunk < c.maxSeq || (splits-1)*chunk >= c.maxSeq || splits != c.wantSplits {
			t.Errorf("%d pairs, %d keys: %d splits of %d keys, want %d splits of whole tiles covering them",
				c.pairs, c.maxSeq, splits, chunk, c.wantSplits)
		}
	}
}

// --- Kernel benchmarks -------------------------------------------------
//
// TestKernelBench prints, when $FUSELM_KERNEL_BENCH is set, the tables a
// kernel engineer judges the fused kernels by: TFLOP/s of flash_prefill per
// tiling on TileGym's shapes, GB/s of decode attention and of the
// elementwise kernels, each against naive and against the floor (bytes /
// 4.23 TB/s, the H200's measured copy rate). Every result is first checked
// against the naive set on the same inputs. Times are CUDA events around
// repeated calls after a warm-up, the median of several groups; memory-bound
// kernels rotate over inputs larger than L2. $FUSELM_KERNEL_BENCH_OUT names
// a JSON file for the rows.

// copyRate is the measured device-to-device copy rate of the H200 (DESIGN.md).
const copyRate = 4.23e12

type benchRow struct {
	Table  string  `json:"table"`
	Shape  string  `json:"shape"`
	Set    string  `json:"set"`
	Ms     float64 `json:"ms"`
	TFLOPS float64 `json:"tflops,omitempty"`
	GBs    float64 `json:"gb_s,omitempty"`
	Floor  float64 `json:"floor_share,omitempty"` // share of the copy rate reached (memory-bound rows)
	RelErr float64 `json:"rel_err_vs_naive"`
}

type bench struct {
	t     *testing.T
	dev   *cuda.Device
	fused *ops
	naive kernels.Ops
	rng   *rand.Rand
	rows  []benchRow
	owned []*kernels.Tensor
}

func TestKernelBench(t *testing.T) {
	if os.Getenv("FUSELM_KERNEL_BENCH") == "" {
		t.Skip("set FUSELM_KERNEL_BENCH=1 to run the kernel benchmarks")
	}
	dev := kerneltest.OpenCUDA(t)
	f, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	n, err := kernels.Spec{Base: "naive"}.Build(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, dev: dev, fused: f.(*ops), naive: n, rng: rand.New(rand.NewPCG(1, 2))}
	only := os.Getenv("FUSELM_KERNEL_BENCH")
	run := func(name string, f func()) {
		if only == "1" || strings.Contains(only, name) {
			f()
		}
	}
	run("prefill", b.prefill)
	run("decode", b.decode)
	run("elementwise", b.elementwise)
	b.print()
	if out := os.Getenv("FUSELM_KERNEL_BENCH_OUT"); out != "" {
		data, _ := json.MarshalIndent(map[string]any{"device": dev.Name(), "date": time.Now().UTC().Format(time.RFC3339), "rows": b.rows}, "", " ")
		if err := os.WriteFile(filepath.Clean(out), data, 0o644); err != nil {
			t.Error(err)
		}
	}
}

func (b *bench) alloc(dt kernels.DType, shape ...int) *kernels.Tensor {
	x := b.dev.Alloc(dt, shape...)
	b.owned = append(b.owned, x)
	return x
}

func (b *bench) freeAll() {
	for _, x := range b.owned {
		b.dev.Free(x)
	}
	b.owned = nil
	if err := b.dev.TrimCache(); err != nil {
		b.t.Fatal(err)
	}
}

// random fills a bf16 or f32 tensor with N(0, 1) values: a random block of
// at most 8M elements uploaded once, then repeated by device copies.
func (b *bench) random(x *kernels.Tensor) *kernels.Tensor {
	n := x.Numel()
	block := min(n, 8<<20)
	es := x.DType.Size()
	data := make([]byte, block*4)
	for i := range block {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(b.rng.NormFloat64())))
	}
	head := kernels.NewTensor(x.Buf, x.DType, x.Offset, block)
	if err := b.dev.Upload(head, data, kernels.F32); err != nil {
		b.t.Fatal(err)
	}
	p := b.dev.Ptr(x)
	for at := block; at < n; at += block {
		b.dev.Memcpy(p+uintptr(at*es), p, min(block, n-at)*es)
	}
	return x
}

func (b *bench) ints(v []int32) *kernels.Tensor {
	x := b.alloc(kernels.I32, len(v))
	if err := b.dev.WriteI32(x, v); err != nil {
		b.t.Fatal(err)
	}
	return x
}

// batch is rows of n new tokens after past cached ones, in a cache of maxSeq.
func (b *bench) batch(rows, n, past, maxSeq int) *kernels.Batch {
	bt := &kernels.Batch{Rows: rows, Tokens: rows * n, MaxSeq: maxSeq}
	start, pasts := make([]int32, rows+1), make([]int32, rows)
	for r := range rows {
		bt.Start = append(bt.Start, r*n)
		bt.Past = append(bt.Past, past)
		start[r+1], pasts[r] = int32((r+1)*n), int32(past)
	}
	bt.Start = append(bt.Start, rows*n)
	bt.StartDev, bt.PastDev = b.ints(start), b.ints(pasts)
	return bt
}

// time is the median device time of one call of f, in ms: groups of calls
// between CUDA events after warm-up calls.
func (b *bench) time(f func()) float64 {
	b.t.Helper()
	f()
	b.sync()
	m0 := b.dev.Mark()
	f()
	m1 := b.dev.Mark()
	one, err := b.dev.Elapsed(m0, m1)
	if err != nil {
		b.t.Fatal(err)
	}
	calls := max(1, min(50, int(5/math.Max(one, 1e-3)))) // about 5 ms per group
	var ms []float64
	for range 7 {
		m0 := b.dev.Mark()
		for range calls {
			f()
		}
		m1 := b.dev.Mark()
		d, err := b.dev.Elapsed(m0, m1)
		if err != nil {
			b.t.Fatal(err)
		}
		ms = append(ms, d/float64(calls))
	}
	slices.Sort(ms)
	return ms[len(ms)/2]
}

func (b *bench) sync() {
	b.t.Helper()
	if err := b.dev.Sync(); err != nil {
		b.t.Fatal(err)
	}
}

// relErr is ‖got − want‖/‖want‖ of two device tensors.
func (b *bench) relErr(got, want *kernels.Tensor) float64 {
	b.t.Helper()
	g, err := b.dev.ReadF32(got)
	if err != nil {
		b.t.Fatal(err)
	}
	w, err := b.dev.ReadF32(want)
	if err != nil {
		b.t.Fatal(err)
	}
	return kerneltest.RelErr(g, w)
}

// checked fails the benchmark when a fused result is not within bf16's
// tolerance of naive's.
func (b *bench) checked(what string, err float64) float64 {
	if !(err <= 2e-2) {
		b.t.Errorf("%s: fused is %.3g from naive", what, err)
	}
	return err
}

func (b *bench) add(r benchRow) { b.rows = append(b.rows, r) }

// prefill: TileGym's bench_fused_attention shapes, B=4 H=32 D=128, causal
// and not, every tiling; naive (materialized, causal only) beside it. Each
// tiling's output is checked against naive's: the causal one everywhere,
// the non-causal one on each row's last token (which sees every key either
// way).
func (b *bench) prefill() {
	const B, H, D = 4, 32, 128
	for _, n := range []int{1024, 2048, 4096, 8192, 16384} {
		bt := b.batch(B, n, 0, n)
		q := b.random(b.alloc(kernels.BF16, B*n, H*D))
		kc := b.random(b.alloc(kernels.BF16, B, H, n, D))
		vc := b.random(b.alloc(kernels.BF16, B, H, n, D))
		out, ref := b.alloc(kernels.BF16, B*n, H*D), b.alloc(kernels.BF16, B*n, H*D)
		a := &kernels.AttnArgs{Out: out, Q: q, K: q, V: q, KCache: kc, VCache: vc,
			Batch: bt, Heads: H, KVHeads: H, HeadDim: D, Scale: float32(1 / math.Sqrt(D))}
		// naive appends the new keys and values to the cache first: give
		// it the cache's own rows as the new ones, so that it stays.
		kNew, vNew := b.alloc(kernels.BF16, B*n, H*D), b.alloc(kernels.BF16, B*n, H*D)
		b.gatherNew(kNew, kc, B, H, n, D)
		b.gatherNew(vNew, vc, B, H, n, D)
		na := *a
		na.Out, na.K, na.V = ref, kNew, vNew
		naiveMs := b.time(func() { b.naive.AttentionPrefill(&na) })
		// rows samples every stride-th token row (all rows up to 512 per
		// batch row), so that checks read tens of MB, not a GB.
		stride := max(1, n/512)
		rows := func(x *kernels.Tensor) *kernels.Tensor {
			v := *x
			v.Shape, v.Pitch = []int{B * n / stride, H * D}, stride*x.Pitch
			return &v
		}
		lastRows := func(x *kernels.Tensor) *kernels.Tensor {
			v := *x // every n-th row: row r·n + n-1
			v.Shape, v.Offset, v.Pitch = []int{B, H * D}, x.Offset+(n-1)*x.Pitch, n*x.Pitch
			return &v
		}
		for _, causal := range []bool{true, false} {
			flops := 4 * float64(B) * H * float64(n) * float64(n) * D
			if causal {
				flops /= 2
			}
			shape := fmt.Sprintf("B=%d H=%d D=%d N=%d causal=%v", B, H, D, n, causal)
			if causal {
				b.add(benchRow{Table: "attn_prefill", Shape: shape, Set: "naive", Ms: naiveMs, TFLOPS: flops / naiveMs / 1e9})
			}
			for _, c := range flashConfigs {
				b.dev.Zero(out)
				b.fused.flashPrefill(c, a, n, causal)
				var relErr float64
				if causal {
					relErr = b.relErr(rows(out), rows(ref))
				} else {
					relErr = b.relErr(lastRows(out), lastRows(ref))
				}
				b.checked(shape+" "+c.String(), relErr)
				ms := b.time(func() { b.fused.flashPrefill(c, a, n, causal) })
				b.add(benchRow{Table: "attn_prefill", Shape: shape, Set: "fused " + c.String(), Ms: ms, TFLOPS: flops / ms / 1e9, RelErr: relErr})
			}
		}
		b.freeAll()
	}
}

// gatherNew copies the cache [B, H, n, D] into new-token rows [B·n, H·D].
func (b *bench) gatherNew(dst, cache *kernels.Tensor, B, H, n, D int) {
	for r := range B {
		for h := range H {
			src := b.fused.Mat(cache).Sub((r*H+h)*n, 0)
			b.fused.CopyRows(b.fused.Mat(dst).Sub(r*n, h*D), 0, src, 0, 1, n, n, D)
		}
	}
}

// decode: Qwen2-7B's heads (28 over 4 of 128), batch 1 and 16, contexts 1K
// to 32K: bytes of the cache read per step over time.
func (b *bench) decode() {
	const H, KVH, D = 28, 4, 128
	for _, rows := range []int{1, 16} {
		for _, ctx := range []int{1024, 4096, 8192, 16384, 32768} {
			bt := b.batch(rows, 1, ctx-1, ctx)
			q := b.random(b.alloc(kernels.BF16, rows, (H+2*KVH)*D))
			kc := b.random(b.alloc(kernels.BF16, rows, KVH, ctx, D))
			vc := b.random(b.alloc(kernels.BF16, rows, KVH, ctx, D))
			out, ref := b.alloc(kernels.BF16, rows, H*D), b.alloc(kernels.BF16, rows, H*D)
			a := &kernels.AttnArgs{Out: out, Q: q.ColSlice(0, H*D), K: q.ColSlice(H*D, (H+KVH)*D),
				V: q.ColSlice((H+KVH)*D, (H+2*KVH)*D), KCache: kc, VCache: vc, Batch: bt, Heads: H, KVHeads: KVH,
				HeadDim: D, Scale: float32(1 / math.Sqrt(D))}
			na := *a
			na.Out = ref
			bytes := float64(rows) * KVH * float64(ctx) * D * 2 * 2
			shape := fmt.Sprintf("B=%d H=%d/%d D=%d ctx=%d", rows, H, KVH, D, ctx)
			fms := b.time(func() { b.fused.AttentionDecode(a) })
			nms := b.time(func() { b.naive.AttentionDecode(&na) })
			relErr := b.checked(shape, b.relErr(out, ref))
			for _, r := range []struct {
				set string
				ms  float64
			}{{"naive", nms}, {"fused", fms}} {
				b.add(benchRow{Table: "attn_decode", Shape: shape, Set: r.set, Ms: r.ms, GBs: bytes / r.ms / 1e6,
					Floor: bytes / copyRate * 1e3 / r.ms, RelErr: relErr})
			}
			b.freeAll()
		}
	}
}

// elementwise: add_rms_norm and rms_norm over M=4096 rows of N (TileGym's
// norm shapes) and W1's rows; rope and swiglu at Qwen2-7B's widths. Inputs
// rotate over copies that together exceed L2 four times.
func (b *bench) elementwise() {
	l2 := b.dev.Props().L2Bytes
	copiesFor := func(bytes int) int { return max(1, min(16, (4*l2+bytes-1)/bytes)) }
	type shape struct{ m, n int }
	for _, s := range []shape{{4096, 1024}, {4096, 4096}, {4096, 8192}, {4096, 16384}, {16 * 10816 / 4, 3584}, {16, 3584}} {
		for _, add := range []bool{false, true} {
			passes := 2 // rms_norm reads x, writes out
			if add {
				passes = 4 // reads resid and x, writes resid and out
			}
			bytes := passes * s.m * s.n * 2
			k := copiesFor(bytes)
			w := b.random(b.alloc(kernels.BF16, s.n))
			var xs, rs, os_, refs []*kernels.Tensor
			for range k {
				xs = append(xs, b.random(b.alloc(kernels.BF16, s.m, s.n)))
				rs = append(rs, b.random(b.alloc(kernels.BF16, s.m, s.n)))
				os_ = append(os_, b.alloc(kernels.BF16, s.m, s.n))
			}
			refs = append(refs, b.alloc(kernels.BF16, s.m, s.n))
			name, i := "rms_norm", 0
			if add {
				name = "add_rms_norm"
			}
			call := func(o kernels.Ops, out *kernels.Tensor, j int) {
				if add {
					o.AddRMSNorm(out, rs[j], xs[j], w, 1e-6)
				} else {
					o.RMSNorm(out, xs[j], w, 1e-6)
				}
			}
			// Check once (the add moves resid: both sets start from a copy).
			saved := b.alloc(kernels.BF16, s.m, s.n)
			b.dev.Memcpy(b.dev.Ptr(saved), b.dev.Ptr(rs[0]), s.m*s.n*2)
			call(b.naive, refs[0], 0)
			b.dev.Memcpy(b.dev.Ptr(rs[0]), b.dev.Ptr(saved), s.m*s.n*2)
			call(b.fused, os_[0], 0)
			relErr := b.checked(name, b.relErr(os_[0], refs[0]))
			shapeName := fmt.Sprintf("M=%d N=%d", s.m, s.n)
			for _, set := range []struct {
				name string
				o    kernels.Ops
			}{{"naive", b.naive}, {"fused", b.fused}} {
				ms := b.time(func() { call(set.o, os_[i%k], i%k); i++ })
				b.add(benchRow{Table: name, Shape: shapeName, Set: set.name, Ms: ms, GBs: float64(bytes) / ms / 1e6,
					Floor: float64(bytes) / copyRate * 1e3 / ms, RelErr: relErr})
			}
			b.freeAll()
		}
	}
	// RoPE of Qwen2-7B's q and k heads (28 + 4 of 128) at T tokens, in place.
	for _, T := range []int{16, 16384} {
		const heads, D, maxPos = 32, 128, 32768
		width := (heads + 8) * D // the qkv row: q, k, v
		bytes := 2 * T * heads * D * 2
		k := copiesFor(bytes)
		cos, sin := b.random(b.alloc(kernels.F32, maxPos, D/2)), b.random(b.alloc(kernels.F32, maxPos, D/2))
		r := &kernels.Rope{Dim: D, Cos: cos, Sin: sin}
		pos := make([]int32, T)
		for i := range pos {
			pos[i] = int32(i % maxPos)
		}
		p := b.ints(pos)
		var xs []*kernels.Tensor
		for range k {
			xs = append(xs, b.random(b.alloc(kernels.BF16, T, width)))
		}
		ref := b.alloc(kernels.BF16, T, width)
		b.dev.Memcpy(b.dev.Ptr(ref), b.dev.Ptr(xs[0]), T*width*2)
		b.naive.RoPE(ref, heads, D, 0, p, r)
		b.fused.RoPE(xs[0], heads, D, 0, p, r)
		relErr := b.checked("rope", b.relErr(xs[0], ref))
		i := 0
		for _, set := range []struct {
			name string
			o    kernels.Ops
		}{{"naive", b.naive}, {"fused", b.fused}} {
			ms := b.time(func() { set.o.RoPE(xs[i%k], heads, D, 0, p, r); i++ })
			b.add(benchRow{Table: "rope", Shape: fmt.Sprintf("T=%d heads=%d D=%d", T, heads, D), Set: set.name, Ms: ms,
				GBs: float64(bytes) / ms / 1e6, Floor: float64(bytes) / copyRate * 1e3 / ms, RelErr: relErr})
		}
		b.freeAll()
	}
	// SwiGLU at Qwen2-7B's intermediate size 18944.
	for _, n := range []int{16, 16384} {
		const inter = 18944
		bytes := 3 * n * inter * 2
		k := copiesFor(bytes)
		var gus, outs []*kernels.Tensor
		for range k {
			gus = append(gus, b.random(b.alloc(kernels.BF16, n, 2*inter)))
			outs = append(outs, b.alloc(kernels.BF16, n, inter))
		}
		ref := b.alloc(kernels.BF16, n, inter)
		b.naive.SwiGLU(ref, gus[0])
		b.fused.SwiGLU(outs[0], gus[0])
		relErr := b.checked("swiglu", b.relErr(outs[0], ref))
		i := 0
		for _, set := range []struct {
			name string
			o    kernels.Ops
		}{{"naive", b.naive}, {"fused", b.fused}} {
			ms := b.time(func() { set.o.SwiGLU(outs[i%k], gus[i%k]); i++ })
			b.add(benchRow{Table: "swiglu", Shape: fmt.Sprintf("N=%d I=%d", n, inter), Set: set.name, Ms: ms,
				GBs: float64(bytes) / ms / 1e6, Floor: float64(bytes) / copyRate * 1e3 / ms, RelErr: relErr})
		}
		b.freeAll()
	}
}

func (b *bench) print() {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-13s %-36s %-12s %10s %9s %9s %7s %9s\n", "table", "shape", "set", "ms", "TFLOP/s", "GB/s", "floor%", "err")
	for _, r := range b.rows {
		fmt.Fprintf(&sb, "%-13s %-36s %-12s %10.4f %9.1f %9.1f %6.1f%% %9.2g\n", r.Table, r.Shape, r.Set, r.Ms, r.TFLOPS, r.GBs, 100*r.Floor, r.RelErr)
	}
	b.t.Log(sb.String())
}

// TestVariants checks the tilings fused offers, valid or not and why, and
// that a tuning choice changes the tiling AttentionPrefill launches.
func TestVariants(t *testing.T) {
	h200 := kernels.Targets["sm_90a"]
	valid := func(vs []kernels.Variant) (names []string) {
		for _, v := range vs {
			if v.Valid() {
				names = append(names, v.Name)
			}
		}
		return names
	}
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, h200)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2", "w8_m2"}) {
		t.Errorf("D=128 on sm_90a: valid tilings %v", got)
	}
	for _, v := range variants(kernels.OpAttnPrefill, kernels.Shape{"D": 48}, h200) {
		if !strings.Contains(v.Why, "head dim 48") {
			t.Errorf("D=48: %+v, want refused for its head dim", v)
		}
	}
	small := h200
	small.SharedPerBlock = 96 << 10
	if got := valid(variants(kernels.OpAttnPrefill, kernels.Shape{"D": 128}, small)); !slices.Equal(got, []string{"w4_m1", "w8_m1", "w4_m2"}) {
		t.Errorf("D=128 with 96 KiB a block: valid tilings %v (w8_m2 needs 128 KiB)", got)
	}
	if vs := variants(kernels.OpAttnDecode, kernels.Shape{"D": 128, "H": 64, "KVH": 2}, h200); len(vs) != 1 || vs[0].Valid() {
		t.Errorf("decode with 32 query heads per kv head: %+v, want refused", vs)
	}
	if vs := variants(kernels.OpRoPE, nil, kernels.Target{Arch: "sm_75"}); len(vs) != 1 || !strings.Contains(vs[0].Why, "sm_80") {
		t.Errorf("rope on sm_75: %+v, want refused for the architecture", vs)
	}

	o := &ops{prefill: map[string]flashConfig{}}
	key := o.TuningKey(kernels.OpAttnPrefill, kernels.Shape{"D": 128, "N": 4096})
	if key != "D=128" || o.VariantFor(kernels.OpAttnPrefill, key) != prefillConfig.String() {
		t.Fatalf("key %q, variant %q before tuning", key, o.VariantFor(kernels.OpAttnPrefill, key))
	}
	if err := o.UseVariant(kernels.OpAttnPrefill, key, "w8_m2"); err != nil || o.prefillFor(key) != (flashConfig{8, 2}) {
		t.Errorf("UseVariant w8_m2: %v, now %v", err, o.prefillFor(key))
	}
	if o.prefillFor("D=64") != prefillConfig {
		t.Errorf("a choice for D=128 changed D=64's tiling")
	}
	for _, bad := range []struct {
		op        kernels.Op
		key, name string
	}{{kernels.OpAttnPrefill, "D=128", "w3_m7"}, {kernels.OpAttnPrefill, "D=48", "w4_m1"}, {kernels.OpRoPE, "", "w4_m1"}} {
		if err := o.UseVariant(bad.op, bad.key, bad.name); err == nil {
			t.Errorf("UseVariant(%s, %q, %q) accepted", bad.op, bad.key, bad.name)
		}
	}
	if err := o.UseVariant(kernels.OpRoPE, "", "token_per_block"); err != nil {
		t.Errorf("rope's one variant refused: %v", err)
	}
}
