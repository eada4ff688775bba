// Prefill attention, one block per (token, query head) (fuselm kernel ABI 1).
//
// The batch is packed and ragged: row b's new tokens are tokens
// [start[b], start[b+1]), its i-th at position past[b] + i. fuselm has
// appended every new key and value to the cache already; token t of row b
// at position p attends to positions [0, p] of its row (causal), or to all
// past[b] + (start[b+1] - start[b]) of them when causal is 0. Query head h
// reads kv head h / (heads/kv_heads). The cache is bf16 [batch, kv_heads,
// max_seq, head_dim], packed.
// Launch (fuselm.json): grid = (tokens, heads), shared = max_keys*4 bytes.
#include "fuselm.cuh"
#include "attend.cuh"

FUSELM_ABI(1);

FUSELM_ATTN_PREFILL(attn_prefill_simple) {
	extern __shared__ float scores[];
	const int t = blockIdx.x, h = blockIdx.y;
	int b = 0;
	while (b + 1 < batch && start[b + 1] <= t) b++;
	const int p = past[b] + (t - start[b]);
	const int n = causal ? p + 1 : past[b] + (start[b + 1] - start[b]);
	const int g = h / (heads / kv_heads);
	const long long base = ((long long)b * kv_heads + g) * max_seq * head_dim;
	attend(out + (long long)t * out_pitch + (long long)h * head_dim, q + (long long)t * q_pitch + (long long)h * head_dim,
	       k_cache + base, v_cache + base, n, head_dim, scale, scores);
}
