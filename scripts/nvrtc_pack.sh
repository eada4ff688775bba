#!/usr/bin/env bash
# NVRTC for a machine without CUDA (the one that builds the binaries), copied
# from the GPU machine's Python wheel, so that NVRTC compiles here: the
# compile checks (FUSELM_NVRTC, go test -run Compiles) and the kernel cache
# scripts/gpu_build.sh fills for the GPU machine (infer kernels), which it
# loads only when NVRTC here and its headers are the ones it has. A GPU
# machine whose runs find another NVRTC first (a CUDA toolkit on its
# LD_LIBRARY_PATH or in /usr/local/cuda) needs that one instead.
#
#   on the GPU machine:  scripts/nvrtc_pack.sh pack "$OUT"      # parts of 15 MB: nvrtc.tar.xz.aa, .ab, ...
#   here:                scripts/nvrtc_pack.sh unpack DIR DEST  # DIR holds the parts; prints the environment to set
set -euo pipefail
case ${1:-} in
pack)
	out=${2:?pack OUTDIR}
	# The newest wheel's (cu13 before cu12), as a run prefers NVRTC 13.
	lib=$(python3 -c 'import glob, os, site; print(next(d for d in sorted((d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, "nvidia", "cu1*", "lib"))), reverse=True) if glob.glob(os.path.join(d, "libnvrtc.so.*"))))')
	root=$(dirname "$lib")
	cd "$root"
	tar -cf - lib/libnvrtc.so.* lib/libnvrtc-builtins.so.* include | xz -T0 -6 | split -b 15M - "$out/nvrtc.tar.xz."
	ls -la "$out"/nvrtc.tar.xz.*
	;;
unpack)
	dir=${2:?unpack DIR DEST}
	dest=${3:?unpack DIR DEST}
	mkdir -p "$dest"
	dest=$(realpath "$dest")
	cat "$dir"/nvrtc.tar.xz.* | xz -d | tar -xf - -C "$dest"
	so=$(ls "$dest"/lib/libnvrtc.so.* | head -1)
	echo "export FUSELM_NVRTC=$so LD_LIBRARY_PATH=$dest/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
	;;
*)
	echo "usage: scripts/nvrtc_pack.sh pack OUTDIR | unpack DIR DEST" >&2
	exit 2
	;;
esac
