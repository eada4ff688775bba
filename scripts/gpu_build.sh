#!/usr/bin/env bash
# Build, here and with no cgo, everything the GPU machine runs: the CLI and the
# test binaries of the packages that have GPU tests. Carry bin/ to the device.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
mkdir -p bin
go build -o bin/infer ./cmd/infer
for pkg in kernels/cuda kernels/naive kernels/fused kernels/kerneltest model cmd/infer; do
	[ -d "$pkg" ] || continue
	go test -c -o "bin/$(basename "$pkg").test" "./$pkg"
done
ls -la bin
