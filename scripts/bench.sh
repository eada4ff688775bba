#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh here: the benchmark workloads
# of DESIGN.md for the kernel specs named on the command line (default:
# naive fused), on a random-weight checkpoint written by
# scripts/hf_checkpoint.py when absent (without HF's reference logits, which
# only the HF tests read): with MODEL=qwen2-7b (the default)
# W1 and W2 on $QWEN2_7B; with MODEL=deepseek-v2-lite W3, W4 and W5 (16
# distinct prompts, bench/prompts/prompts_w5.jsonl, through --prompts) on
# $DSV2_LITE. Each is one warm-up generation, then three timed ones of which
# infer reports the median. The spec "hf" runs the workload on HF
# transformers instead (scripts/hf_bench.py: the same warm-up and timed
# runs, left padding and an attention mask where rows differ in length).
#
# Writes to $OUT (or out/): bench_runs.json, one record per run in the form
# bench/runs/ keeps (command, commit, date, GPU, driver, workload, kernels,
# tokens/s, wall times, per-op times; no token ids). prompt_tokens is the
# longest row's prompt (every row's where one prompt is repeated),
# prompt_tokens_rows each row's and prompt_tokens_total their sum. Prints a
# table last.
#
#   [MODEL=deepseek-v2-lite] [ONLY="W2-b1 ..."] [INFER=bin/infer] [LABEL=name] scripts/bench.sh [SPEC... | hf]
#   INFER=A/infer INFER_B=B/infer [PAIRS=3] [LABEL=a] [LABEL_B=b] scripts/bench.sh [SPEC...]
#
# ONLY runs just the named workloads. INFER and LABEL compare builds or
# settings on one machine: INFER is the binary to run (another commit's,
# built with scripts/gpu_build.sh into another folder), LABEL names the
# variant in the records ("variant") and the table, and the records go to
# bench_runs_LABEL.json; the environment reaches infer (FUSELM_PDL=off, say).
# INFER_B makes it an A/B of two binaries: each workload runs PAIRS times
# (default 3) on each, alternating A, B, A, B, ..., so that a machine's
# drift over a call (its clocks as it warms) falls on both alike, where one
# binary's runs then the other's would put it on the second; the records
# (variant LABEL or LABEL_B, "pair" i) go to bench_runs_LABEL_vs_LABEL_B.json,
# and a line per workload gives each side's runs, their medians, the
# change and each pair's own change. The spec hf runs once (on neither binary).
set -uo pipefail
cd "$(dirname "$0")/.."
# The kernels scripts/gpu_build.sh compiled beside the binaries (infer
# kernels), where it did, copied into the kernel cache a run uses (what is
# there already kept): the first run loads them instead of compiling.
kcache=${FUSELM_KERNEL_CACHE:-${XDG_CACHE_HOME:-${HOME:-.}/.cache}/fuselm/kernels}
if [ "$kcache" != off ] && [ -d bin/kernel-cache ]; then
	mkdir -p "$kcache" && cp -n bin/kernel-cache/*.cubin "$kcache"/ 2>/dev/null
fi
out=${OUT:-out}
mkdir -p "$out"
model=${MODEL:-qwen2-7b}
case $model in
qwen2-7b)
	ckpt=${QWEN2_7B:-/tmp/qwen2-7b}
	# name | prompt file (.jsonl: one prompt a row, --prompts) | batch | new tokens
	workloads=(
		"W1|bench/prompts/input_prompt_small.txt|16|50"
		"W2-b16|bench/prompts/prompt_128.txt|16|50"
		"W2-b1|bench/prompts/prompt_128.txt|1|100"
	)
	;;
deepseek-v2-lite)
	ckpt=${DSV2_LITE:-/tmp/deepseek-v2-lite}
	workloads=(
		"W3|bench/prompts/input_prompt_small.txt|1|100"
		"W4|bench/prompts/prompt_128.txt|16|50"
		"W5|bench/prompts/prompts_w5.jsonl|16|50"
	)
	;;
*)
	echo "bench.sh: MODEL must be qwen2-7b or deepseek-v2-lite, not $model" >&2
	exit 2
	;;
esac
[ -f "$ckpt/config.json" ] || python3 scripts/hf_checkpoint.py --model "$model" --out "$ckpt" --no-references >&2 || exit 1
only=${ONLY:-}
infer=${INFER:-./bin/infer}
label=${LABEL:-}
infer_b=${INFER_B:-}
pairs=1
sides=(A)
if [ -n "$infer_b" ]; then
	pairs=${PAIRS:-3}
	[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: PAIRS must be a positive count, not $pairs" >&2; exit 2; }
	[ -x "$infer_b" ] || { echo "bench.sh: INFER_B=$infer_b is not an executable" >&2; exit 2; }
	label=${LABEL:-a}
	label_b=${LABEL_B:-b}
	[ "$label" != "$label_b" ] || { echo "bench.sh: LABEL and LABEL_B must differ (both $label)" >&2; exit 2; }
	sides=(A B)
fi
if [ -n "$only" ]; then
	kept=()
	for w in "${workloads[@]}"; do
		[[ " $only " == *" ${w%%|*} "* ]] && kept+=("$w")
	done
	workloads=("${kept[@]}")
fi
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(naive fused)
commit=$(cat "$(dirname "$infer")/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
raw=$(mktemp -d)

for spec in "${specs[@]}"; do
	for w in "${workloads[@]}"; do
		IFS='|' read -r name prompt batch new <<<"$w"
		from=--prompt-file
		[[ $prompt == *.jsonl ]] && from=--prompts
		for ((i = 1; i <= pairs; i++)); do
			for side in "${sides[@]}"; do
				[ "$spec" = hf ] && { [ "$i$side" = 1A ] || continue; }
				bin=$infer side_label=$label
				[ "$side" = B ] && bin=$infer_b side_label=$label_b
				log="$raw/${name}_${spec//[^a-z0-9_]/-}_$(printf %03d "$i")_$side.json"
				if [ "$spec" = hf ]; then
					cmd=(python3 scripts/hf_bench.py --model "$ckpt" --workload "$name" "$from" "$prompt" --batch "$batch"
						--new-tokens "$new" --warmup 1 --repeat 3)
				else
					cmd=("$bin" --model "$ckpt" "$from" "$prompt" --batch "$batch" --max-new-tokens "$new"
						--min-new-tokens "$new" --kernels "$spec" --warmup 1 --repeat 3 --json --quiet)
				fi
				"${cmd[@]}" >"$log" 2>"$log.err" || echo "{\"failed\": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()[-400:]))' "$log.err")}" >"$log"
				pair=
				[ -n "$infer_b" ] && [ "$spec" != hf ] && pair=$i
				printf '%s\n' "$name" "$spec" "$batch" "$new" "${cmd[*]}" "$side_label" "$pair" >"$log.meta"
			done
		done
	done
done

python3 - "$raw" "$out" "$commit" "$gpu" "$label" "${label_b:-}" <<'PY'
import glob, json, os, statistics, sys, datetime
raw, out, commit, gpu, label_a, label_b = sys.argv[1:7]
name, driver = [s.strip() for s in gpu.split(",")]
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
records, table = [], []


def span(lens):
    """A table cell for the rows' prompt lengths: one number, or the range."""
    return str(lens[0]) if min(lens) == max(lens) else f"{min(lens)}-{max(lens)}"


for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
    workload, spec, batch, new, cmd, label, pair = (open(path + ".meta").read().split("\n") + [""] * 7)[:7]
    r = json.load(open(path))
    rec = {"command": cmd, "commit": commit, "date": date, "gpu": name, "driver": driver,
           "machine": "device tool, nvidia-h200", "workload": workload, "kernels": spec,
           "batch": int(batch), "new_tokens_per_row": int(new)}
    if label:
        rec["variant"] = label
    if pair:
        rec["pair"] = int(pair)
        label = f"{label}#{pair}"
    if "failed" in r:
        rec["failed"] = r["failed"]
        table.append(f"| {workload} | {spec} | FAILED: {r['failed'][-120:]!r} |")
    elif r.get("kernels") == "hf":
        # scripts/hf_bench.py's record, already in this form.
        rec["_first_ids"] = r.pop("rows_first_ids")
        rec.update({k: v for k, v in r.items() if k not in ("command", "date", "gpu", "driver", "workload")})
        rec["command"] = cmd
        table.append(f"| {workload} | hf{' [' + label + ']' if label else ''} | {batch} | {span(r['prompt_tokens_rows'])} | "
                     f"{r['new_tokens']} | {r['tokens_per_s']:.1f} | {r['wall_s']:.3f} | {' '.join(f'{x:.3f}' for x in r['runs_wall_s'])} | - | - | - |")
    else:
        t = r["timings"]
        lens = [len(row["prompt_ids"]) for row in r["rows"]]
        rec["commit"] = r.get("commit") or commit
        rec.update({"model": r.get("model"), "device": r.get("device"), "kernels": r.get("kernels", spec),
                    "prompt_tokens": max(lens), "prompt_tokens_rows": lens, "prompt_tokens_total": sum(lens),
                    "new_tokens": t["new_tokens"],
                    "tokens_per_s": t["tokens_per_s"], "wall_s": t["wall_s"], "runs_wall_s": t["runs_wall_s"],
                    "prefill_ms": t["prefill_ms"], "decode_ms": t["decode_ms"], "graph_replays": t["graph_replays"], "graph_kept": t.get("graph_kept"),
                    "ttft_ms": t.get("ttft_ms"), "prefill_tokens_per_s": t.get("prefill_tokens_per_s"),
                    "decode_tokens_per_s": t.get("decode_tokens_per_s"), "tpot_ms": t.get("tpot_ms"),
                    "wall_s_spread": t.get("wall_s_spread"), "version": r.get("version"),
                    "load_s": t.get("load_s"), "compute_ms": t.get("compute_ms"),
                    "profile_note": r.get("profile_note"), "per_op": r.get("profile", [])})
        rec["_first_ids"] = [row["generated_ids"][:20] for row in r["rows"]]
        table.append(f"| {workload} | {rec['kernels']}{' [' + label + ']' if label else ''} | {batch} | {span(lens)} | {t['new_tokens']} | "
                     f"{t['tokens_per_s']:.1f} | {t['wall_s']:.3f} | {' '.join(f'{x:.3f}' for x in t['runs_wall_s'])} | "
                     f"{t['prefill_ms']:.0f} | {t['decode_ms']:.0f} | {t['graph_replays']} |")
    records.append(rec)
# How many leading greedy tokens each spec shares with the first spec's run of
# the workload, the fewest of any row (a speedup must not come from a wrong
# result).
first = {}
for rec in records:
    rows = rec.pop("_first_ids", None)
    if rows is None:
        continue
    ref = first.setdefault(rec["workload"], rows)
    rec["leading_tokens_as_first_spec"] = min(
        next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        for ids, want in zip(rows, ref))
suffix = f"_{label_a}_vs_{label_b}" if label_b else ("_" + label_a if label_a else "")
json.dump(records, open(os.path.join(out, "bench_runs" + suffix + ".json"), "w"), indent=1)
print(gpu)
print("| workload | kernels | batch | prompt tokens | new tokens | tokens/s | wall s (median) | runs (s) | prefill ms | decode ms | graph replays |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(table))
for rec in records:
    if "per_op" in rec:
        ops = " ".join(f"{o['op']}={o['total_ms']:.0f}" for o in rec["per_op"][:8])
        tag = rec.get("variant", "") + (f"#{rec['pair']}" if "pair" in rec else "")
        print(f"{rec['workload']} {rec['kernels']}{' [' + tag + ']' if tag else ''}: same first tokens {rec.get('leading_tokens_as_first_spec')}/20 (the fewest of any row); {ops}")
# An A/B's summary: each side's runs in their order, their medians, the change,
# and each pair's own change (B's run against the A run just before it): pairs
# that agree in sign say more than medians whose runs overlap.
sides = {}
for rec in records:
    if "pair" in rec and "tokens_per_s" in rec:
        sides.setdefault((rec["workload"], rec["kernels"]), {}).setdefault(rec["variant"], {})[rec["pair"]] = rec["tokens_per_s"]
for (workload, spec), by in sides.items():
    pa, pb = by.get(label_a, {}), by.get(label_b, {})
    if not pa or not pb:
        continue
    a, b = [pa[i] for i in sorted(pa)], [pb[i] for i in sorted(pb)]
    ma, mb = statistics.median(a), statistics.median(b)
    each = " ".join(f"{100 * (pb[i] / pa[i] - 1):+.1f}" for i in sorted(pa) if i in pb)
    print(f"{workload} {spec} A/B: {label_a} {' '.join(f'{x:.1f}' for x in a)} (median {ma:.1f}), "
          f"{label_b} {' '.join(f'{x:.1f}' for x in b)} (median {mb:.1f}): {100 * (mb / ma - 1):+.1f}% "
          f"(pair by pair {each}%)")
PY
