#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh here: infer compare (naive
# against fused and every single-op ablation, weights loaded once) on the
# Qwen2-7B workloads of DESIGN.md, W1 and W2 at batch 1, on a checkpoint at
# $QWEN2_7B (written by the checkpoint script when absent).
#
# Writes to $OUT (or out/): compare_<workload>.json, .png and .txt (the
# table compare prints), for bench/RESULTS.md and bench/. REPEAT timed runs
# per variant (default 1; each variant's checked run warms it up first).
#
#   scripts/compare.sh [W1] [W2-b1]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
REPEAT=${REPEAT:-1}
if [ ! -f "$QWEN2_7B/config.json" ]; then
	# The checkpoint writer is scripts/hf_checkpoint.py once issue 11 meets main.
	if [ -f scripts/hf_checkpoint.py ]; then
		python3 scripts/hf_checkpoint.py --model qwen2-7b --out "$QWEN2_7B" >&2 || exit 1
	else
		python3 scripts/hf_qwen2_7b.py --out "$QWEN2_7B" >&2 || exit 1
	fi
fi
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W2-b1)
status=0
for w in "${workloads[@]}"; do
	case $w in
	W1) args=(--prompt-file bench/prompts/input_prompt_small.txt --batch 16 --max-new-tokens 50 --min-new-tokens 50) ;;
	W2-b1) args=(--prompt-file bench/prompts/prompt_128.txt --batch 1 --max-new-tokens 100 --min-new-tokens 100) ;;
	*) echo "compare.sh: unknown workload $w (W1, W2-b1)" >&2; exit 2 ;;
	esac
	cmd=(bin/infer compare --model "$QWEN2_7B" "${args[@]}" --repeat "$REPEAT" --quiet
		--json "$out/compare_$w.json" --plot "$out/compare_$w.png")
	echo "== ${cmd[*]}" >&2
	"${cmd[@]}" | tee "$out/compare_$w.txt" || status=1
done
exit $status
