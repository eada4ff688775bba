#!/usr/bin/env bash
# On the GPU machine, from the repository root, after scripts/gpu_build.sh here:
# every GPU test, then fuselm against HF transformers on a full-size random
# Qwen2-7B (written once to $QWEN2_7B by scripts/hf_qwen2_7b.py). Logs go to
# $OUT (or out/); a short table is printed last.
#
#   scripts/gpu_check.sh [quick]     # quick: skip the 7B checkpoint
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
logs=$(mktemp -d)
mkdir -p "$out"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
rows=()

step() {
	local name=$1
	shift
	local t0=$SECONDS
	if "$@" >"$logs/$name.log" 2>&1; then st=ok; else st=FAIL; fi
	local summary
	summary=$(grep -E '^(--- (FAIL|SKIP)|ok|FAIL|PASS)' "$logs/$name.log" | tail -3 | tr '\n' ' ' | cut -c1-110)
	rows+=("$(printf '%-18s %-5s %5ds  %s' "$name" "$st" $((SECONDS - t0)) "$summary")")
	echo "== $name: $st ($((SECONDS - t0))s)" >&2
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$logs/gpu.txt" 2>&1
# Test binaries run in their package directory, as go test runs them.
step cuda sh -c "cd kernels/cuda && ../../bin/cuda.test -test.v"
step naive sh -c "cd kernels/naive && ../../bin/naive.test -test.v"
step model-naive sh -c "cd model && FUSELM_TEST_KERNELS=naive ../bin/model.test -test.v"
if [ "${1:-}" != quick ]; then
	[ -f "$QWEN2_7B/reference_f32.json" ] || step qwen2-7b-write python3 scripts/hf_qwen2_7b.py --out "$QWEN2_7B"
	step qwen2-7b-vs-hf sh -c "cd model && FUSELM_TEST_KERNELS=naive FUSELM_HF_CHECKPOINT=$QWEN2_7B \
		../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
fi
tar czf "$out/gpu_check_logs.tgz" -C "$logs" .
cat "$logs/gpu.txt"
for f in "$logs"/*.log; do echo "---- $(basename "$f") (tail)"; tail -15 "$f"; done
echo
printf '%s\n' "${rows[@]}"
