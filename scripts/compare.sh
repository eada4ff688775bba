#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh here: infer compare (naive
# against fused and every single-op ablation, weights loaded once) on the
# workloads of DESIGN.md: W1 and W2 at batch 1 on the Qwen2-7B checkpoint at
# $QWEN2_7B, W3, W4 and W5 on the DeepSeek-V2-Lite one at $DSV2_LITE (each
# written by scripts/hf_checkpoint.py when absent).
#
# Writes to $OUT (or out/): compare_<workload>.json, .png and .txt (the
# tables and logs compare prints), for bench/RESULTS.md and bench/. REPEAT timed runs
# per variant (default 1; each variant's checked run warms it up first).
#
#   scripts/compare.sh [W1] [W2-b1] [W3] [W4] [W5]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
DSV2_LITE=${DSV2_LITE:-/tmp/deepseek-v2-lite}
REPEAT=${REPEAT:-1}

# checkpoint writes model $1's checkpoint to $2 unless it is there.
checkpoint() {
	[ -f "$2/config.json" ] || python3 scripts/hf_checkpoint.py --model "$1" --out "$2" --no-references >&2
}

workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W2-b1)
status=0
for w in "${workloads[@]}"; do
	case $w in
	W1) model=qwen2-7b ckpt=$QWEN2_7B args=(--prompt-file bench/prompts/input_prompt_small.txt --batch 16 --max-new-tokens 50 --min-new-tokens 50) ;;
	W2-b1) model=qwen2-7b ckpt=$QWEN2_7B args=(--prompt-file bench/prompts/prompt_128.txt --batch 1 --max-new-tokens 100 --min-new-tokens 100) ;;
	W3) model=deepseek-v2-lite ckpt=$DSV2_LITE args=(--prompt-file bench/prompts/input_prompt_small.txt --batch 1 --max-new-tokens 100 --min-new-tokens 100) ;;
	W4) model=deepseek-v2-lite ckpt=$DSV2_LITE args=(--prompt-file bench/prompts/prompt_128.txt --batch 16 --max-new-tokens 50 --min-new-tokens 50) ;;
	W5) model=deepseek-v2-lite ckpt=$DSV2_LITE args=(--prompts bench/prompts/prompts_w5.jsonl --max-new-tokens 50 --min-new-tokens 50) ;;
	*) echo "compare.sh: unknown workload $w (W1, W2-b1, W3, W4, W5)" >&2; exit 2 ;;
	esac
	checkpoint "$model" "$ckpt" || { status=1; continue; }
	# --json makes stdout the JSON document; the tables (and the logs) go
	# to stderr, kept in the .txt.
	cmd=(bin/infer compare --model "$ckpt" "${args[@]}" --repeat "$REPEAT" --json --plot "$out/compare_$w.png")
	echo "== ${cmd[*]}" >&2
	"${cmd[@]}" >"$out/compare_$w.json" 2> >(tee "$out/compare_$w.txt" >&2) || status=1
done
exit $status
