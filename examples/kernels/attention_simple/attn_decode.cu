// Decode attention, one block per (row, query head) (fuselm kernel ABI 1).
//
// Row b's new token is token b: its query head h at q + b*q_pitch +
// h*head_dim, its output at out + b*out_pitch + h*head_dim. fuselm has
// appended the new key and value to the cache already, so row b attends to
// positions [0, past[b]] of kv head h / (heads/kv_heads). The cache is
// bf16 [batch, kv_heads, max_seq, head_dim], packed. past is read here, on
// the device, so that a CUDA graph replays the kernel with new lengths.
// Launch (fuselm.json): grid = (batch, heads), shared = max_seq*4 bytes.
#include "fuselm.cuh"
#include "attend.cuh"

FUSELM_ABI(1);

FUSELM_ATTN_DECODE(attn_decode_simple) {
	extern __shared__ float scores[];
	const int b = blockIdx.x, h = blockIdx.y;
	const int g = h / (heads / kv_heads);
	const long long base = ((long long)b * kv_heads + g) * max_seq * head_dim;
	const int n = min(past[b] + 1, max_seq);
	attend(out + (long long)b * out_pitch + (long long)h * head_dim, q + (long long)b * q_pitch + (long long)h * head_dim,
	       k_cache + base, v_cache + base, n, head_dim, scale, scores);
}
