package model

import (
	"fmt"
	"math"

	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/loader"
)

// The rotary tables follow transformers 5.17 step by step, in float32 as
// torch computes them (src/transformers/modeling_rope_utils.py and the
// models' *RotaryEmbedding), so that the angles match HF's to the last bit
// wherever float32 arithmetic is correctly rounded:
//
//	inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))   (default)
//	freqs = inv_freq[:, None] @ position_ids[None, :]                                (float32)
//	cos, sin = freqs.cos() * attention_scaling, freqs.sin() * attention_scaling
//
// Qwen2 rotates with rotate_half (pairs i, i+dim/2); DeepSeek-V2 with
// view_as_complex (pairs 2i, 2i+1) and freqs_cis = polar(1, freqs) *
// attention_scaling, which is the same table.

// ropeInvFreq returns inv_freq (dim/2 values) and attention_factor
// (attention_scaling) for rope r over dim rotated dimensions.
func ropeInvFreq(r *loader.Rope, dim int) ([]float32, float64, error) {
	if dim <= 0 || dim%2 != 0 {
		return nil, 0, fmt.Errorf("rope: rotated dimension %d is not a positive even number", dim)
	}
	base := r.Theta
	// pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
	posFreqs := make([]float32, dim/2)
	for i := range posFreqs {
		e := float32(2*i) / float32(dim)
		posFreqs[i] = float32(math.Pow(base, float64(e)))
	}
	switch r.Type {
	case loader.RopeDefault, "":
		inv := make([]float32, dim/2)
		for i, p := range posFreqs {
			inv[i] = 1 / p
		}
		return inv, 1, nil
	case loader.RopeYarn:
		return yarnInvFreq(r, dim, posFreqs)
	}
	return nil, 0, fmt.Errorf("rope: type %q is not supported (want %s or %s)", r.Type, loader.RopeDefault, loader.RopeYarn)
}

// yarnGetMscale is get_mscale of _compute_yarn_parameters (and
// yarn_get_mscale of modeling_deepseek_v2.py, the same function).
func yarnGetMscale(scale, mscale float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*mscale*math.Log(scale) + 1
}

// yarnInvFreq is _compute_yarn_parameters of transformers 5.17:
//
//	factor = rope_parameters["factor"]  (None: max_position_embeddings / original_max_position_embeddings,
//	                                     which the loader fills in)
//	attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)  if mscale and mscale_all_dim
//	                   else get_mscale(factor)                                            (unless attention_factor is set)
//	low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
//	inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
//	inv_freq = inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
//	           + inv_freq_extrapolation * inv_freq_extrapolation_factor
func yarnInvFreq(r *loader.Rope, dim int, posFreqs []float32) ([]float32, float64, error) {
	factor := r.Factor
	if factor <= 0 {
		return nil, 0, fmt.Errorf("rope: yarn factor %g is not positive", factor)
	}
	origMax := float64(r.OriginalMaxPositions)
	if origMax <= 0 {
		return nil, 0, fmt.Errorf("rope: yarn original_max_position_embeddings %d is not positive", r.OriginalMaxPositions)
	}

	var attentionFactor float64
	switch {
	case r.AttentionFactor != nil:
		attentionFactor = *r.AttentionFactor
	case r.HasMScale && r.MScale != 0 && r.HasMScaleAllDim && r.MScaleAllDim != 0:
		attentionFactor = yarnGetMscale(factor, r.MScale) / yarnGetMscale(factor, r.MScaleAllDim)
	default:
		attentionFactor = yarnGetMscale(factor, 1)
	}

	// beta_fast = rope_parameters.get("beta_fast") or 32, likewise beta_slow or 1.
	betaFast, betaSlow := r.BetaFast, r.BetaSlow
	if betaFast == 0 {
		betaFast = 32
	}
	if betaSlow == 0 {
		betaSlow = 1
	}
	base := r.Theta
	findCorrectionDim := func(numRotations float64) float64 {
		return (float64(dim) * math.Log(origMax/(numRotations*2*math.Pi))) / (2 * math.Log(base))
	}
	low, high := findCorrectionDim(betaFast), findCorrectionDim(betaSlow)
	if r.Truncate == nil || *r.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = math.Max(low, 0), math.Min(high, float64(dim-1))

	// linear_ramp_factor(min, max, dim // 2), in float32 like torch.
	if low == high {
		high += 0.001 // prevent singularity
	}
	lo32, span32 := float32(low), float32(high-low)
	f32 := float32(factor)
	inv := make([]float32, dim/2)
	for i, p := range posFreqs {
		ramp := (float32(i) - lo32) / span32
		ramp = min(max(ramp, 0), 1)
		extraFactor := 1 - ramp
		extrapolation := 1 / p
		interpolation := 1 / float32(f32*p)
		// The conversions keep each product rounded, as torch's separate
		// kernels do (no fused multiply-add).
		inv[i] = float32(interpolation*(1-extraFactor)) + float32(extrapolation*extraFactor)
	}
	return inv, attentionFactor, nil
}

// ropeTables returns the cos and sin tables [maxPos, dim/2] of inv_freq,
// scaled by attentionFactor.
func ropeTables(inv []float32, attentionFactor float64, maxPos int) (cos, sin []float32) {
	half := len(inv)
	cos = make([]float32, maxPos*half)
	sin = make([]float32, maxPos*half)
	scale := float32(attentionFactor)
	for p := range maxPos {
		for i, f := range inv {
			angle := f * float32(p) // float32, as the matmul in the rotary forward
			cos[p*half+i] = float32(math.Cos(float64(angle))) * scale
			sin[p*half+i] = float32(math.Sin(float64(angle))) * scale
		}
	}
	return cos, sin
}

// yarnSoftmaxScale is the softmax scale of DeepSeek-V2 attention in
// transformers 5.17 (modeling_deepseek_v2.py, DeepseekV2Attention.__init__):
//
//	self.scaling = yarn_apply_mscale(config.rope_parameters, self.qk_head_dim ** (-0.5))
//
// which multiplies qk_head_dim^-0.5 by yarn_get_mscale(factor, mscale_all_dim)²
// when the rope type is not "default" and mscale_all_dim is non-zero, as
// DeepSeek's own modeling code does.
func yarnSoftmaxScale(r *loader.Rope, qkHeadDim int) float64 {
	scale := math.Pow(float64(qkHeadDim), -0.5)
	if r.Type != loader.RopeDefault && r.Type != "" && r.HasMScaleAllDim && r.MScaleAllDim != 0 {
		m := yarnGetMscale(r.Factor, r.MScaleAllDim)
		scale *= m * m
	}
	return scale
}

// newRope computes the rotary tables of r over dim dimensions for positions
// [0, maxPos) and uploads them to dev; the returned tensors are the caller's
// to free.
func newRope(dev kernels.Device, r *loader.Rope, dim, maxPos int, interleaved bool) (*kernels.Rope, []*kernels.Tensor, error) {
	inv, attentionFactor, err := ropeInvFreq(r, dim)
	if err != nil {
		return nil, nil, err
	}
	cos, sin := ropeTables(inv, attentionFactor, maxPos)
	rope := &kernels.Rope{Dim: dim, Interleaved: interleaved}
	rope.Cos = dev.Alloc(kernels.F32, maxPos, dim/2)
	rope.Sin = dev.Alloc(kernels.F32, maxPos, dim/2)
	owned := []*kernels.Tensor{rope.Cos, rope.Sin}
	if err := dev.Upload(rope.Cos, f32Bytes(cos), kernels.F32); err != nil {
		return nil, owned, fmt.Errorf("rope: %w", err)
	}
	if err := dev.Upload(rope.Sin, f32Bytes(sin), kernels.F32); err != nil {
		return nil, owned, fmt.Errorf("rope: %w", err)
	}
	return rope, owned, nil
}

// f32Bytes is v as little-endian bytes.
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		u := math.Float32bits(x)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b
}
