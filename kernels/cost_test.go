package kernels

import "testing"

// TestMLACost counts DeepSeek-V2-Lite's latent attention the way infer
// bench does: attention plus kv_b_proj's work, decompressing every latent
// attended to (prefill) or absorbing into q and expanding the output
// (decode).
func TestMLACost(t *testing.T) {
	const h, nope, rope, v, rank = 16, 128, 64, 128, 512
	args := func(tokens, past int) *MLAArgs {
		b := &Batch{Rows: 1, Tokens: tokens, Start: []int{0, tokens}, Past: []int{past}, MaxSeq: past + tokens}
		return &MLAArgs{Q: &Tensor{DType: BF16, Shape: []int{tokens, h * (nope + rope)}}, WKVB: &Tensor{DType: BF16, Shape: []int{h * (nope + v), rank}},
			Batch: b, Heads: h, NopeDim: nope, RopeDim: rope, VDim: v, Rank: rank}
	}
	// 3 new tokens after 5: 3·5 + 6 keys attended, 8 latents decompressed.
	got := mlaCost(args(3, 5), false).FLOPs
	want := float64(2*h*(nope+rope+v)*(3*5+6) + 2*h*rank*(nope+v)*8)
	if got != want {
		t.Errorf("prefill FLOPs %g, want %g", got, want)
	}
	// One new token after 99: 100 keys in the absorbed form, one row absorbed.
	got = mlaCost(args(1, 99), true).FLOPs
	want = float64(2*h*(2*rank+rope)*100 + 2*h*rank*(nope+v))
	if got != want {
		t.Errorf("decode FLOPs %g, want %g", got, want)
	}
}

func TestCostAt(t *testing.T) {
	b := &Batch{Rows: 2, Tokens: 2, Start: []int{0, 1, 2}, Past: []int{9, 4}}
	q := &Tensor{DType: BF16, Shape: []int{2, 4 * 8}, Pitch: 32}
	a := &AttnArgs{Q: q, Batch: b, Heads: 4, KVHeads: 2, HeadDim: 8}
	c := attnCost(a, true)
	// 10 + 5 keys, 4 heads of 8: 4·32·15 FLOPs
	if c.FLOPs != 4*32*15 || c.StepFLOPs != 4*32*2 {
		t.Errorf("decode cost %+v", c)
	}
	later := c.At(3)
	if later.FLOPs != 4*32*21 || later.StepFLOPs != 0 {
		t.Errorf("three steps later: %+v", later)
	}
	// Prefill of 3 new tokens after 2 cached: 3·2 + 1+2+3 attended pairs.
	p := &Batch{Rows: 1, Tokens: 3, Start: []int{0, 3}, Past: []int{2}}
	if n := keysAttended(p, false); n != 12 {
		t.Errorf("causal pairs %g, want 12", n)
	}
	if n := keysAttended(p, true); n != 15 {
		t.Errorf("non-causal pairs %g, want 15", n)
	}
}

// TestLinearNormLinearCost: a call across a block boundary costs its
// parts' FLOPs and the bytes of one pass, as infer bench counts them: x,
// w0, resid (twice), norm, w, bias and out, mid written once; neither h nor
// mid's read back.
func TestLinearNormLinearCost(t *testing.T) {
	const n, k0, k, m = 2, 5, 4, 3
	bf := func(shape ...int) *Tensor { return &Tensor{DType: BF16, Shape: shape, Pitch: shape[len(shape)-1]} }
	mid, x, w0, resid, h, norm := bf(n, k), bf(n, k0), bf(k, k0), bf(n, k), bf(n, k), bf(k)
	var c Cost
	costOf{&c}.LinearAddRMSNormLinear(mid, x, w0, nil, bf(n, m), h, resid, norm, 1e-6, bf(m, k), bf(m))
	if want := (Cost{FLOPs: 2*n*k*k0 + 5*n*k + 2*n*m*k, Bytes: 2 * (n*k0 + k*k0 + 3*n*k + k + m*k + m + n*m)}); c != want {
		t.Errorf("linear_add_rms_norm_linear: %+v, want %+v", c, want)
	}
	costOf{&c}.LinearAddRMSNormLinearSwiGLU(mid, x, w0, nil, bf(n, m), h, resid, norm, 1e-6, bf(2*m, k))
	if want := (Cost{FLOPs: 2*n*k*k0 + 5*n*k + 2*n*2*m*k + 6*n*m, Bytes: 2 * (n*k0 + k*k0 + 3*n*k + k + 2*m*k + n*m)}); c != want {
		t.Errorf("linear_add_rms_norm_linear_swiglu: %+v, want %+v", c, want)
	}
}
