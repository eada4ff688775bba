package fused

import (
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/kerneltest"
)

// TestMLADecodeRoPEHost checks mla_decode_rope's host side without a GPU:
// the fused set owns and fuses the op, mla_qlat_rope's instances are in
// the flat variant's module, which is launched overlapped, and the variant
// table lists the one-launch form.
func TestMLADecodeRoPEHost(t *testing.T) {
	info, _ := kernels.Set("fused")
	if !info.Owns(kernels.OpMLADecodeRoPE) || !slices.Contains(info.Fuses, kernels.OpMLADecodeRoPE) {
		t.Errorf("fused owns mla_decode_rope: %v, fuses it: %v", info.Owns(kernels.OpMLADecodeRoPE), info.Fuses)
	}
	k := mlaQLatRopeKernel(true, kernels.BF16)
	if k != "mla_qlat_rope_interleaved_bf16" {
		t.Errorf("kernel %q", k)
	}
	if !slices.Contains(mlaFlatModule().Funcs, k) {
		t.Errorf("%s is not in %s's functions (the ones newMLAFlat launches overlapped)", k, mlaFlatModule().File)
	}
	if vs := variants(kernels.OpMLADecodeRoPE, nil, kernels.Targets["sm_90a"]); len(vs) != 1 || !vs[0].Valid() {
		t.Errorf("variants on sm_90a: %+v, want one, valid", vs)
	}
}

// mlaDecodeRoPEProblem is a decode step's MLA at DeepSeek-V2-Lite's dims
// (16 heads, nope 128, rope 64, v 128, rank 512) from the projection on,
// twice on the device (the same values): q and kv column slices of one
// q_kv_a row, a cache of maxSeq positions, the norm weights and tables.
type mlaDecodeRoPEProblem struct {
	qkva, cache, out [2]*kernels.Tensor
	a                [2]*kernels.MLAArgs
	w, pos           *kernels.Tensor
	r                *kernels.Rope
	owned            []*kernels.Tensor
}

func newMLADecodeRoPEProblem(t *testing.T, dev kernels.Device, past []int, maxSeq int, rng *rand.Rand) *mlaDecodeRoPEProblem {
	t.Helper()
	const heads, nope, rope, v, rank, positions = 16, 128, 64, 128, 512, 16384
	p := &mlaDecodeRoPEProblem{}
	rows, qw, kvw := len(past), heads*(nope+rope), rank+rope
	normals := func(n int, scale float64) []float32 { return gaussians(rng, n, scale) }
	upload, ints := keeper(t, dev, &p.owned)
	cs := make([]float32, positions*rope/2)
	p.r = &kernels.Rope{Dim: rope, Interleaved: true, Cos: upload(kernels.F32, normals(len(cs), 1), positions, rope/2),
		Sin: upload(kernels.F32, normals(len(cs), 1), positions, rope/2)}
	g := normals(rank, 0.2)
	for i := range g {
		g[i]++
	}
	p.w = upload(kernels.BF16, g, rank)
	pos, start := make([]int, rows), make([]int, rows+1)
	for b := range rows {
		pos[b], start[b+1] = past[b], b+1
	}
	p.pos = ints(pos)
	batch := &kernels.Batch{Rows: rows, Tokens: rows, Start: start, Past: past, MaxSeq: maxSeq, StartDev: ints(start), PastDev: ints(past)}
	wkvb := upload(kernels.BF16, normals(heads*(nope+v)*rank, 1/22.6), heads*(nope+v), rank)
	qkva, cache := normals(rows*(qw+kvw), 2), normals(rows*maxSeq*kvw, 1)
	for s := range 2 {
		p.qkva[s], p.cache[s] = upload(kernels.BF16, qkva, rows, qw+kvw), upload(kernels.BF16, cache, rows, maxSeq, kvw)
		p.out[s] = upload(kernels.BF16, make([]float32, rows*heads*v), rows, heads*v)
		p.a[s] = &kernels.MLAArgs{Out: p.out[s], Q: p.qkva[s].ColSlice(0, qw), KV: p.qkva[s].ColSlice(qw, qw+kvw), Cache: p.cache[s],
			WKVB: wkvb, Batch: batch, Heads: heads, NopeDim: nope, RopeDim: rope, VDim: v, Rank: rank, Scale: 0.0723}
	}
	return p
}

func (p *mlaDecodeRoPEProblem) free(dev kernels.Device) { freeAll(dev, p.owned) }

// TestMLADecodeRoPEExact holds mla_decode_rope's one launch of the norm,
// the ropes and q_lat (mla_qlat_rope, then mla_flat and mla_out) to the
// fused set's RMSNormRoPE then MLADecode (rms_norm_rope, then mla_qlat,
// mla_flat, mla_out) bit for bit: the output, q and kv normalised and
// rotated in place, and the cache with the new latents appended; at
// V2-Lite's dims with 1, 3 and 7 rows over caches of 1 to 11,042 keys.
// Skipped where no GPU is found, or where the flat variant cannot run.
func TestMLADecodeRoPEExact(t *testing.T) {
	dev, o := openHopperSet(t, "mla_flat", func(o *ops) error { return o.mlaFlat.ready() })
	useFlat(t, dev)
	rng := rand.New(rand.NewSource(31))
	for _, rows := range []int{1, 3, 7} {
		for _, keys := range []int{1, 200, 4096, 11042} {
			past := make([]int, rows)
			for b := range past {
				past[b] = max(0, keys-1-17*b)
			}
			p := newMLADecodeRoPEProblem(t, dev, past, keys, rng)
			if u, declined := kernels.Declined(func() { o.MLADecodeRoPE(p.a[0], p.w, 1e-6, p.pos, p.r) }); declined {
				t.Errorf("%d rows of %d keys: declined: %v", rows, keys, u)
				p.free(dev)
				continue
			}
			kernels.MLADecodeRoPEParts(o, p.a[1], p.w, 1e-6, p.pos, p.r)
			for _, x := range []struct {
				name string
				t    [2]*kernels.Tensor
			}{{"out", p.out}, {"q_kv_a", p.qkva}, {"cache", p.cache}} {
				got, want := read(t, dev, x.t[0]), read(t, dev, x.t[1])
				if n, first := bitsDiffer(want, got); n > 0 {
					t.Errorf("%d rows of %d keys: %d of %d elements of %s differ, the first %d: %g, rms_norm_rope and mla_decode give %g",
						rows, keys, n, len(want), x.name, first, got[first], want[first])
				}
			}
			p.free(dev)
		}
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestMLADecodeRoPEDispatch: under "fused" a decode step's MLA is one call
// of mla_decode_rope; a spec that moves rms_norm, rope or mla_decode (or
// mla, its group) elsewhere runs rms_norm_rope (whole where it can) and
// mla_decode, each on its set; a row count flat does not take (16) is
// declined to the same parts.
func TestMLADecodeRoPEDispatch(t *testing.T) {
	dev := kerneltest.OpenCUDA(t)
	for _, s := range []struct {
		spec  string
		rows  int
		calls []string
	}{
		{"fused", 1, []string{"mla_decode_rope@fused"}},
		{"fused,mla=naive", 1, []string{"rms_norm_rope@fused", "mla_decode@naive"}},
		{"fused,rope=naive", 1, []string{"rms_norm@fused", "rope@naive", "rope@naive", "mla_decode@fused"}},
		{"fused,rms_norm=naive", 1, []string{"rms_norm@naive", "rope@fused", "rope@fused", "mla_decode@fused"}},
		{"fused,rms_norm_rope=naive", 1, []string{"rms_norm_rope@naive", "mla_decode@fused"}},
		{"naive", 1, []string{"rms_norm@naive", "rope@naive", "rope@naive", "mla_decode@naive"}},
		{"fused", 16, []string{"rms_norm_rope@fused", "mla_decode@fused"}},
	} {
		d, obs := observed(t, dev, s.spec)
		p := newMLADecodeRoPEProblem(t, dev, slices.Repeat([]int{99}, s.rows), 100, rand.New(rand.NewSource(37)))
		d.MLADecodeRoPE(p.a[0], p.w, 1e-6, p.pos, p.r)
		want := s.calls
		if s.spec == "fused" && s.rows == 1 && dev.Props().Arch != hopperArch {
			want = []string{"rms_norm_rope@fused", "mla_decode@fused"} // no flat variant off Hopper
		}
		if !slices.Equal(obs.calls, want) {
			t.Errorf("%s, %d rows: calls %v, want %v", s.spec, s.rows, strings.Join(obs.calls, " "), want)
		}
		if err := dev.Sync(); err != nil {
			t.Fatal(err)
		}
		p.free(dev)
	}
}
