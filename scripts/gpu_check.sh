#!/usr/bin/env bash
# On the GPU machine, from the repository root, after scripts/gpu_build.sh here:
#
#   scripts/gpu_check.sh [quick | full | units | fused | none] [qwen] [deepseek] [kbench]
#
# One tier of GPU tests (full when none is named):
#   quick  every kernel of every set once: the shared kernel test (TestSets
#          with -test.short, so without its 16K-key cases) over cpu, naive
#          and fused, which also replays each CUDA set's decode graph; then
#          the tiny checkpoints against HF with FUSELM_TEST_KERNELS=fused.
#          Aimed at 3 minutes or less on the H200.
#   full   every GPU test of every package: kernels/cuda (CUPTI on a line of
#          its own), the shared kernel test with its long cases, naive's and
#          fused's own tests (every tiling, variant and Hopper instance, the
#          *Long timings, the compile reports), the model tests on naive and
#          on fused, and infer's CUPTI and compare tests on the tiny
#          checkpoint. It has outgrown one device call (fused's own tests
#          alone may pass ten minutes): run it as
#   units  the full tier but fused's own tests, and
#   fused  fused's own tests (its mma.sync kernels, then the Hopper ones:
#          a call cut off at its limit still brings back each step's log).
#   none   no unit tests, only what the words below ask for.
# The full-size checks, each a device call of its own:
#   qwen      fuselm against HF transformers on a full-size random Qwen2-7B
#             ($QWEN2_7B, written once by scripts/hf_checkpoint.py) for
#             naive, fused and every single-op ablation, and fused with the
#             prompts twice over in one batch (16 rows); then W1 traced by
#             CUPTI, its trace file parsed, and its kernel time held against
#             the CUDA events of a --no-graphs run.
#   deepseek  the same on a full-size random DeepSeek-V2-Lite ($DSV2_LITE;
#             writing it takes minutes and 31 GB) for naive, fused and the
#             MLA and MoE ablations, and fused at 16 rows as for qwen, also
#             with add_add_rms_norm_linear (the op 16 rows fuse) on naive.
#   kbench    the kernel benchmarks (bin/infer bench, every op and set on the
#             default shapes: $OUT/kernel_bench.json and .png), then
#             --optimize on attn_prefill and linear and an infer run that
#             must say which tuning choices it applied.
#   deepseek-only is `none deepseek`.
# Each step's log is written to $OUT/gpu_check/ (or out/gpu_check/) as it
# runs, so a call cut off at its limit still brings back what ran; all of
# them, with the W1 trace and profiles, go into $OUT/gpu_check_logs.tgz at
# the end, and a table of the steps (status, seconds) is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
# The kernels scripts/gpu_build.sh compiled beside the binaries (infer
# kernels), where it did, copied into the kernel cache a run uses (what is
# there already kept): the first run loads them instead of compiling.
kcache=${FUSELM_KERNEL_CACHE:-${XDG_CACHE_HOME:-${HOME:-.}/.cache}/fuselm/kernels}
if [ "$kcache" != off ] && [ -d bin/kernel-cache ]; then
	mkdir -p "$kcache" && cp -n bin/kernel-cache/*.cubin "$kcache"/ 2>/dev/null
fi
root=$(pwd)
out=${OUT:-out}
logs=$out/gpu_check
work=$(mktemp -d)
rm -rf "$logs"
mkdir -p "$logs"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
DSV2_LITE=${DSV2_LITE:-/tmp/deepseek-v2-lite}
tier=full kbench=false deepseek=false qwen=false
for a in "$@"; do
	case $a in
	quick | full | units | fused | none) tier=$a ;;
	qwen) qwen=true ;;
	kbench) kbench=true ;;
	deepseek) deepseek=true ;;
	deepseek-only) deepseek=true tier=none ;;
	*) echo "gpu_check.sh: unknown argument $a (tiers: quick, full, units, fused, none; checks: qwen, deepseek, kbench)" >&2; exit 2 ;;
	esac
done
rows=()

step() {
	local name=$1
	shift
	local t0=$SECONDS
	if "$@" >"$logs/$name.log" 2>&1; then st=ok; else st=FAIL; fi
	local summary
	summary=$(grep -E '^(--- (FAIL|SKIP)|ok|FAIL|PASS)' "$logs/$name.log" | tail -3 | tr '\n' ' ' | cut -c1-110)
	rows+=("$(printf '%-26s %-5s %5ds  %s' "$name" "$st" $((SECONDS - t0)) "$summary")")
	echo "== $name: $st ($((SECONDS - t0))s)" >&2
}

# pkgtest runs a package's test binary in its directory, as go test does,
# with go test's default limit of 10 minutes unless the arguments set one: a
# test binary run directly has none, and a hung kernel would hold the step.
pkgtest() {
	local pkg=$1
	shift
	(cd "kernels/$pkg" && "$root/bin/$pkg.test" -test.v -test.timeout 10m "$@")
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$logs/gpu.txt" 2>&1
if [ $tier = quick ]; then
	# Every op of every set on the harness's cases but the long ones, and
	# the decode graph of naive and fused (TestSets runs both per set).
	step kerneltest-short pkgtest kerneltest -test.short -test.run '^TestSets$'
	# One HF check: the tiny checkpoints (Qwen2, DeepSeek-V2, its q-LoRA
	# form, bf16 and f32) against HF's logits, on fused.
	step model-fused-hf sh -c "cd model && FUSELM_TEST_KERNELS=fused ../bin/model.test -test.v -test.run '^TestHFReference' -test.timeout 5m"
fi
full_units=false full_fused=false
case $tier in full) full_units=true full_fused=true ;; units) full_units=true ;; fused) full_fused=true ;; esac
if $full_units; then
	step cuda pkgtest cuda
	# CUPTI on its own line: the kernel trace (graph replays, cuBLAS), the
	# record layout against the installed header and library.
	step cupti pkgtest cuda -test.run 'CUPTI|KernelLayout'
	step kerneltest pkgtest kerneltest
	step naive pkgtest naive
fi
if $full_fused; then
	# fused's own tests in two steps, so that the step table says which
	# half takes the time: the mma.sync kernels' tilings and variants, then
	# the Hopper kernels (flash_hopper, mla_hopper, group_wgmma,
	# linear_wgmma, linear_stream, linear_swap, mla_decode flat).
	step fused pkgtest fused -test.skip 'Hopper|Wgmma|Stream|Flat|Swap'
	step fused-hopper pkgtest fused -test.run 'Hopper|Wgmma|Stream|Flat|Swap'
fi
if $full_units; then
	step model-naive sh -c "cd model && FUSELM_TEST_KERNELS=naive ../bin/model.test -test.v -test.timeout 10m"
	step model-fused sh -c "cd model && FUSELM_TEST_KERNELS=fused ../bin/model.test -test.v -test.timeout 10m"
	# infer with CUPTI on the tiny checkpoint (every decode step traced, the
	# kernel sum against the busy time, the events' fallback) and compare
	# (its traced per-op table holding the gain, and the events' (no op)).
	step infer-cupti sh -c "cd cmd/infer && ../../bin/infer.test -test.v -test.run 'TestCUPTIGeneration|TestCompareOnGPU'"
fi
if $kbench; then
	step kernel-bench sh -c "bin/infer bench --quiet --json --plot $out/kernel_bench.png >$out/kernel_bench.json && \
		python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); [print(x[\"op\"], x[\"shape\"], x[\"set\"], x[\"variant\"], x[\"ms\"] and round(x[\"ms\"],4), round(x[\"tflop_s\"] or x[\"gb_s\"] or 0,1), x[\"checked\"], x[\"error\"] or \"\") for x in r[\"rows\"]]' $out/kernel_bench.json"
	step bench-optimize sh -c "bin/infer bench attn_prefill linear --optimize --quiet && \
		bin/infer --model testdata/models/qwen2-tiny-bf16 --prompt-file testdata/prompts/short.txt --max-new-tokens 4 2>&1 | grep 'tuning:'"
fi
if $qwen; then
	[ -f "$QWEN2_7B/reference_f32.json" ] || step qwen2-7b-write python3 scripts/hf_checkpoint.py --model qwen2-7b --out "$QWEN2_7B"
	# naive, fused, then fused with one op on naive and naive with one op
	# on fused: every op fused owns, alone.
	specs=(naive fused)
	for op in attn add_rms_norm rms_norm rope swiglu linear; do
		specs+=("fused,$op=naive" "naive,$op=fused")
	done
	for spec in "${specs[@]}"; do
		step "7b-vs-hf-${spec//[^a-z0-9_]/-}" sh -c "cd model && FUSELM_TEST_KERNELS=$spec FUSELM_HF_CHECKPOINT=$QWEN2_7B \
			../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
	done
	# fused with the prompts twice over: 16 rows, whose decode runs linear_swap.
	step 7b-vs-hf-fused-x2 sh -c "cd model && FUSELM_TEST_KERNELS=fused FUSELM_HF_CHECKPOINT=$QWEN2_7B FUSELM_HF_BATCH_REPEAT=2 \
		../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
	# W1 with --trace: a Chrome trace whose kernel track holds every decode
	# step (TestTraceFile parses it), and its ms CUDA against the events
	# around every op of a --no-graphs run without --cupti (TestProfileAgreement).
	w1="--model $QWEN2_7B --prompt-file bench/prompts/input_prompt_small.txt --batch 16 --max-new-tokens 50 --min-new-tokens 50 --kernels fused --warmup 1 --quiet"
	step w1-trace sh -c "bin/infer $w1 --cupti --trace $work/w1_trace.json --profile $work/w1_profile.json >$work/w1_trace.out"
	step w1-trace-check sh -c "cd cmd/infer && FUSELM_TRACE_CHECK=$work/w1_trace.json ../../bin/infer.test -test.v -test.run TestTraceFile"
	step w1-events sh -c "bin/infer $w1 --no-graphs --profile $work/w1_events.json >$work/w1_events.out"
	step w1-cuda-vs-events sh -c "cd cmd/infer && FUSELM_PROFILE_CUPTI=$work/w1_profile.json FUSELM_PROFILE_EVENTS=$work/w1_events.json \
		../../bin/infer.test -test.v -test.run TestProfileAgreement"
fi
if $deepseek; then
	[ -f "$DSV2_LITE/reference_f32.json" ] || step dsv2-lite-write python3 scripts/hf_checkpoint.py --model deepseek-v2-lite --out "$DSV2_LITE"
	# naive, fused, and each of MLA and MoE alone on the other set.
	for spec in naive fused fused,mla=naive naive,mla=fused fused,moe=naive naive,moe=fused; do
		step "dsv2-vs-hf-${spec//[^a-z0-9_]/-}" sh -c "cd model && FUSELM_TEST_KERNELS=$spec FUSELM_HF_CHECKPOINT=$DSV2_LITE \
			../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
	done
	# fused with the prompts twice over: 16 rows (the MoE's persistent grid, mla_decode keys).
	step dsv2-vs-hf-fused-x2 sh -c "cd model && FUSELM_TEST_KERNELS=fused FUSELM_HF_CHECKPOINT=$DSV2_LITE FUSELM_HF_BATCH_REPEAT=2 \
		../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
	# The same with the MoE's join, the norm and q+kv_a (fused at 16 rows) on naive.
	step dsv2-vs-hf-fused-x2-join-naive sh -c "cd model && FUSELM_TEST_KERNELS=fused,add_add_rms_norm_linear=naive FUSELM_HF_CHECKPOINT=$DSV2_LITE \
		FUSELM_HF_BATCH_REPEAT=2 ../bin/model.test -test.v -test.run TestHFCheckpoint -test.timeout 20m"
fi
tar czf "$out/gpu_check_logs.tgz" -C "$logs" . -C "$work" .
cat "$logs/gpu.txt"
for f in "$logs"/*.log; do echo "---- $(basename "$f") (tail)"; tail -12 "$f"; done
echo
printf '%s\n' "${rows[@]}"
aim=
case $tier in quick) aim=" (the quick tier aims at 180 s)" ;; units | fused) aim=" (each aims at under 600 s, a device call)" ;; esac
echo "tier $tier: ${SECONDS}s in all$aim"
