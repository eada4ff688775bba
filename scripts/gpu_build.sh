#!/usr/bin/env bash
# Build, here and with no cgo, everything the GPU machine runs: the CLI and the
# test binaries of the packages that have GPU tests, stripped of symbols (what
# the device tool carries is limited to 64 MiB with the tree). Carry bin/ to
# the device.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
mkdir -p bin
# The commit infer --version and every JSON document name ("+dirty" when the
# tree holds uncommitted changes); the toolchain's own VCS stamp is not
# relied on (GOFLAGS may turn it off, and worktrees may not carry it).
rev=$(git rev-parse HEAD 2>/dev/null || true)
if [ -n "$rev" ] && ! git diff --quiet HEAD 2>/dev/null; then rev="$rev+dirty"; fi
ver=$(git describe --tags --dirty 2>/dev/null || echo devel)
strip=(-ldflags "-s -w -X main.version=$ver -X main.commit=$rev")
go build "${strip[@]}" -o bin/infer ./cmd/infer
for pkg in kernels/cuda kernels/naive kernels/fused kernels/kerneltest kernels/userset model cmd/infer; do
	[ -d "$pkg" ] || continue
	go test -c "${strip[@]}" -o "bin/$(basename "$pkg").test" "./$pkg"
done
git rev-parse --short HEAD >bin/COMMIT 2>/dev/null || true
# The kernels' cubins for the GPU machine, where NVRTC is found here
# ($FUSELM_NVRTC, else as a run finds it; infer kernels needs no GPU), in
# bin/kernel-cache (the current sources' alone: --prune), which bench.sh and
# gpu_check.sh copy into the machine's kernel cache: its first run loads
# them instead of compiling them, if this NVRTC and its headers are the
# machine's (scripts/nvrtc_pack.sh). Without NVRTC here the machine
# compiles them as before. XP_CACHE_ENV (e.g. "FUSELM_XP_NAME=1")
# adds the cubins of an experiment that builds its modules with other
# options, compiled under that environment beside the default ones.
nv=()
[ -n "${FUSELM_NVRTC:-}" ] && nv=(--nvrtc "$FUSELM_NVRTC")
if ! bin/infer kernels --cache bin/kernel-cache --prune "${nv[@]}" 2>bin/kernel-cache.log; then
	echo "gpu_build.sh: no kernel cache built (the GPU machine compiles on its first run): $(tail -1 bin/kernel-cache.log)" >&2
elif [ -n "${XP_CACHE_ENV:-}" ]; then
	read -ra xp <<<"$XP_CACHE_ENV"
	if ! env "${xp[@]}" bin/infer kernels --cache bin/kernel-cache "${nv[@]}" 2>>bin/kernel-cache.log; then
		echo "gpu_build.sh: the experiment's kernels ($XP_CACHE_ENV) not built: $(tail -1 bin/kernel-cache.log)" >&2
	fi
fi
ls -la bin
