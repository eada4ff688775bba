#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh here: the benchmark workloads
# of DESIGN.md on a Qwen2-7B checkpoint ($QWEN2_7B, written by
# scripts/hf_qwen2_7b.py when absent), for the kernel sets named on the
# command line (default: naive). Each is one warm-up generation, then three
# timed ones of which infer reports the median. Raw JSON goes to $OUT; a table
# is printed last.
#
#   scripts/bench.sh [SPEC...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
[ -f "$QWEN2_7B/config.json" ] || python3 scripts/hf_qwen2_7b.py --out "$QWEN2_7B" >&2 || exit 1
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(naive)

# name | prompt file | batch | new tokens
workloads=(
	"W1|bench/prompts/input_prompt_small.txt|16|50"
	"W2-b16|bench/prompts/prompt_128.txt|16|50"
	"W2-b1|bench/prompts/prompt_128.txt|1|100"
)
rows=()
for spec in "${specs[@]}"; do
	for w in "${workloads[@]}"; do
		IFS='|' read -r name prompt batch new <<<"$w"
		log="$out/bench_${name}_${spec//[^a-z0-9]/_}.json"
		if ./bin/infer --model "$QWEN2_7B" --prompt-file "$prompt" --batch "$batch" \
			--max-new-tokens "$new" --min-new-tokens "$new" --kernels "$spec" --warmup 1 --repeat 3 --json --quiet >"$log" 2>"$log.err"; then
			rows+=("$(python3 - "$log" "$name" "$spec" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['batch']} | {len(r['rows'][0]['prompt_ids'])} | {t['new_tokens']} | "
      f"{t['tokens_per_s']:.1f} | {t['wall_s']:.3f} | {' '.join(f'{x:.3f}' for x in t['runs_wall_s'])} | "
      f"{t['prefill_ms']:.0f} | {t['decode_ms']:.0f} | {t['graph_replays']} |")
PY
)")
		else
			rows+=("| $name | $spec | FAILED: $(tail -1 "$log.err") |")
		fi
	done
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "| workload | kernels | batch | prompt tokens | new tokens | tokens/s | wall s (median) | runs (s) | prefill ms | decode ms | graph replays |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
