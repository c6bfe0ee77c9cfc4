#!/usr/bin/env bash
# Usage: scripts/nvrx_wheel.sh DEST_DIR VERSION PYTHON_TAG [ABI_TAG]
#   e.g. cp311 (ABI_TAG defaults to PYTHON_TAG), or py3 none for any CPython
#
# nvidia-resiliency-ext 0.7.0 ships only cp312/cp314 manylinux_2_39 wheels and no sdist. Where pip
# cannot take it natively (Python 3.11, or glibc < 2.39), a plain install silently falls back to
# 0.4.1, which has the torn async-checkpoint bug. Every module we use is pure Python (the one native
# module serves the GPU-only straggler detector), so this fetches the cp312 wheel and retags it for
# PYTHON_TAG-ABI_TAG-linux_x86_64, then prints the retagged wheel's path. Used by setup_env.sh (the
# project's virtualenv), by the CPU twin image's wheelhouse (nvrx_eks/rehearse/image.py), and by
# `make gpu-wheels` (py3-none: the GPU machine's CPython is not known in advance).
set -euo pipefail
dest=$1 version=$2 tag=$3 abi=${4:-$3}
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_39_x86_64 -d "$tmp" "nvidia-resiliency-ext==$version"
"$python" -m wheel tags --remove --python-tag "$tag" --abi-tag "$abi" --platform-tag linux_x86_64 \
  "$tmp"/nvidia_resiliency_ext-"$version"-*.whl >/dev/null
mkdir -p "$dest"
mv "$tmp"/nvidia_resiliency_ext-"$version"-"$tag"-"$abi"-linux_x86_64.whl "$dest"/
echo "$dest/nvidia_resiliency_ext-$version-$tag-$abi-linux_x86_64.whl"
