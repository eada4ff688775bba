#!/usr/bin/env bash
# Build, here and with no cgo, everything the GPU machine runs: the CLI and the
# test binaries of the packages that have GPU tests, stripped of symbols (what
# the device tool carries is limited to 64 MiB with the tree). Carry bin/ to
# the device.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
mkdir -p bin
strip=(-ldflags "-s -w")
go build "${strip[@]}" -o bin/infer ./cmd/infer
for pkg in kernels/cuda kernels/naive kernels/fused kernels/kerneltest model cmd/infer; do
	[ -d "$pkg" ] || continue
	go test -c "${strip[@]}" -o "bin/$(basename "$pkg").test" "./$pkg"
done
git rev-parse --short HEAD >bin/COMMIT 2>/dev/null || true
ls -la bin
