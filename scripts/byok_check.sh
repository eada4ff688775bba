#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh here: the user-kernel
# examples of examples/kernels (docs/KERNEL_ABI.md) checked and timed.
#
#   scripts/byok_check.sh [tests] [errors] [compare] [bench] [runs]
#
#   tests    kernels/userset's GPU tests: each example passes its ops'
#            kerneltest cases and builds; each broken example gives its error
#            (the illegal address and the endless kernel in processes of
#            their own)
#   errors   each broken example through infer, as a user meets it: exit
#            status and the error line
#   compare  infer compare on W2 batch 1 (Qwen2-7B at $QWEN2_7B, written when
#            absent): fused against fused with the three examples, then
#            against fused with the example attention
#   bench    infer bench of rms_norm, add_rms_norm, swiglu and rope (default shapes) and of
#            the attention at W2's shapes: naive, fused and the examples
#   runs     scripts/bench.sh's W2-b1 records (bench/runs) for naive, fused
#            and the examples
#
# No word runs tests and errors. Writes to $OUT/byok (or out/byok).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}/byok
mkdir -p "$out"
QWEN2_7B=${QWEN2_7B:-/tmp/qwen2-7b}
ex=examples/kernels
mine="$ex/rms_norm_cuda:$ex/swiglu_ptx:$ex/rope_simple:$ex/attention_simple"
three=fused,rms_norm=my_rms,add_rms_norm=my_rms,swiglu=ptx_swiglu,rope=simple_rope
w2b1=(--prompt-file bench/prompts/prompt_128.txt --batch 1 --max-new-tokens 100 --min-new-tokens 100)
words=("$@")
[ ${#words[@]} -gt 0 ] || words=(tests errors)
status=0

checkpoint() {
	[ -f "$QWEN2_7B/config.json" ] || python3 scripts/hf_checkpoint.py --model qwen2-7b --out "$QWEN2_7B" --no-references >&2
}

for w in "${words[@]}"; do
	case $w in
	tests)
		(cd kernels/userset && ../../bin/userset.test -test.v -test.run 'OnGPU' -test.timeout 8m) 2>&1 |
			tee "$out/tests.txt" || status=1
		;;
	errors)
		: >"$out/errors.txt"
		# directory | op | shape
		for c in "compile_error|rms_norm|M=5,N=300" "missing_entry|swiglu|N=5,I=300" "wrong_abi|rms_norm|M=5,N=300" \
			"wrong_signature|swiglu|N=5,I=300" "illegal_address|rms_norm|M=5,N=300" \
			"too_many_threads|rms_norm|M=5,N=300" "never_ends|rms_norm|M=5,N=300" "wrong_result|rms_norm|M=5,N=300"; do
			IFS='|' read -r dir op shape <<<"$c"
			start=$(date +%s)
			FUSELM_WATCHDOG=5s timeout 300 bin/infer --kernel-dir "$ex/broken/$dir" bench "$op" --shape "$shape" \
				>/dev/null 2>"$out/err_$dir.txt"
			code=$?
			{
				echo "== broken/$dir: exit $code after $(($(date +%s) - start)) s"
				cat "$out/err_$dir.txt"
			} | tee -a "$out/errors.txt"
			[ $code -eq 1 ] || status=1
		done
		;;
	compare)
		checkpoint || { status=1; continue; }
		for c in "three|$three|rms_norm,add_rms_norm,swiglu,rope" "attn|fused,attn=simple_attn|attn"; do
			IFS='|' read -r name cand ops <<<"$c"
			cmd=(bin/infer compare --model "$QWEN2_7B" "${w2b1[@]}" --baseline fused --candidate "$cand" --ops "$ops"
				--json --plot "$out/compare_W2-b1_$name.png")
			echo "== FUSELM_KERNEL_PATH=$mine ${cmd[*]}" >&2
			FUSELM_KERNEL_PATH=$mine "${cmd[@]}" >"$out/compare_W2-b1_$name.json" \
				2> >(tee "$out/compare_W2-b1_$name.txt" >&2) || status=1
		done
		;;
	bench)
		sets=naive,fused,my_rms,ptx_swiglu,simple_rope
		FUSELM_KERNEL_PATH=$mine bin/infer bench rms_norm add_rms_norm swiglu rope --sets "$sets" --plot "$out/kernels_byok.png" \
			2>&1 | tee "$out/bench_elementwise.txt" || status=1
		FUSELM_KERNEL_PATH=$mine bin/infer bench attn_prefill --sets naive,fused,simple_attn \
			--shape "B=1,H=28,KVH=4,D=128,N=128,causal=1" 2>&1 | tee "$out/bench_attn_prefill.txt" || status=1
		FUSELM_KERNEL_PATH=$mine bin/infer bench attn_decode --sets naive,fused,simple_attn \
			--shape "B=1,H=28,KVH=4,D=128,ctx=228" 2>&1 | tee "$out/bench_attn_decode.txt" || status=1
		;;
	runs)
		checkpoint || { status=1; continue; }
		FUSELM_KERNEL_PATH=$mine ONLY=W2-b1 LABEL=byok OUT="$out" scripts/bench.sh naive fused "$three" fused,attn=simple_attn ||
			status=1
		;;
	*)
		echo "byok_check.sh: unknown word $w (tests, errors, compare, bench, runs)" >&2
		exit 2
		;;
	esac
done
exit $status
