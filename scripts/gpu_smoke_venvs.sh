#!/usr/bin/env bash
# Usage: scripts/gpu_smoke_venvs.sh build VENVS_DIR [VERSION...]
#        scripts/gpu_smoke_venvs.sh dry-run VENVS_DIR OUT_DIR [VERSION...]
#   VERSION: a CPython minor version, 3.10 to 3.13 (default: 3.11 3.12 3.13)
#
# scripts/gpu-smoke-device.sh's dry run in fresh virtualenvs that hold only torch and numpy, as a
# lent GPU machine's torch environment may, on each CPython it may run: everything else the smoke
# imports must come from the carried wheels (.gpu-wheels: make gpu-wheels) through the device
# script's own install step. VENVS_DIR lies outside the checkout (torch takes GBs).
#
# build: VENVS_DIR/py<VERSION>, new each time, from `python<VERSION>` on PATH or pyenv's. torch:
#   - 3.11: torch==2.13.0, the project's pin (pip takes a CPU build where the machine's own index
#     has one; elsewhere a CUDA build with its nvidia-* wheels);
#   - any other: torch==2.11.0, the lent GPU machine's version. PyPI has only CUDA builds of it
#     for Linux, whose nvidia-* requirements are several GB. It is installed --no-deps with its
#     pure-Python requirements, beside only the CUDA libraries libtorch_cuda.so links against (a
#     CPU's `import torch` loads them and never calls them): torch's own pins of those, installed
#     once into VENVS_DIR/cuda-libs and linked into each virtualenv as site-packages/nvidia.
#   Prints what each holds and its size.
# dry-run: the device script with --dry-run in each virtualenv, into OUT_DIR/py<VERSION>; prints
#   its exit code, the install plan's actions and the checks. Run it where multi-process trainer
#   runs may use the machine's CPUs.
set -uo pipefail

usage() {
  sed -n '2,4p' "$0" >&2
  exit 2
}
[ $# -ge 2 ] || usage
command=$1 venvs=$2
shift 2
case $command in
  build) ;;
  dry-run)
    [ $# -ge 1 ] || usage
    runs=$1
    shift
    ;;
  *) usage ;;
esac
versions=("$@")
((${#versions[@]})) || versions=(3.11 3.12 3.13)
repo=$(cd "$(dirname "$0")/.." && pwd)
case "$(realpath -m "$venvs")/" in
  "$repo"/*)
    echo "error: VENVS_DIR: $venvs is inside the checkout; choose a folder outside it" >&2
    exit 2
    ;;
esac
mkdir -p "$venvs"
venvs=$(cd "$venvs" && pwd)

#: The CUDA libraries libtorch_cuda.so of torch 2.11.0+cu130 needs loadable (ldd), by the extra of
#: cuda-toolkit or the wheel that brings each; cusolver, nvrtc and nvtx are loaded only when used.
cuda_toolkit_linked=cublas,cudart,cufft,cufile,cupti,curand,cusparse,nvjitlink

# pyenv's installs first: its shims on PATH answer for versions that are not selected.
interpreter() {
  local found
  for found in $(find "${PYENV_ROOT:-$HOME/.pyenv}/versions" -maxdepth 3 -path "*/$1.*/bin/python$1" 2>/dev/null |
    sort -V | tail -n 1) "$(command -v "python$1" 2>/dev/null)"; do
    [ -n "$found" ] && "$found" -c '' 2>/dev/null && echo "$found" && return 0
  done
  return 1
}

# torch's own Requires-Dist, split for a --no-deps install: "pure" (what `import torch` needs in
# Python) or "cuda" (the nvidia-* wheels, cuda-toolkit with only the linked extras); triton and
# cuda-bindings are left out (imported only to compile or launch kernels).
torch_requirements() {
  "$1" - "$2" "$cuda_toolkit_linked" <<'PY'
import importlib.metadata
import sys

from pip._vendor.packaging.requirements import Requirement

kind, linked = sys.argv[1], sys.argv[2]
for line in importlib.metadata.requires("torch") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in ("triton", "cuda-bindings"):
        continue
    if req.name == "cuda-toolkit":
        req.extras = set(linked.split(","))
    cuda = req.name.startswith("nvidia-") or req.name == "cuda-toolkit"
    if cuda == (kind == "cuda"):
        print(req)
PY
}

build() {
  local version=$1 python venv pip
  python=$(interpreter "$version") || {
    echo "py$version: no python$version on PATH or in pyenv: skipped"
    return 1
  }
  venv=$venvs/py$version
  "$python" -m venv --clear "$venv" || return 1
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  # --ignore-installed: a venv's seeded setuptools may carry no RECORD, and torch pins another one.
  if [ "$version" = 3.11 ]; then
    "${pip[@]}" install --ignore-installed torch==2.13.0 numpy || return 1
  else
    "${pip[@]}" install --no-deps torch==2.11.0 || return 1
    mapfile -t pure < <(torch_requirements "$venv/bin/python" pure)
    "${pip[@]}" install --ignore-installed "${pure[@]}" numpy || return 1
    if [ ! -f "$venvs/cuda-libs/.complete" ]; then
      mapfile -t cuda < <(torch_requirements "$venv/bin/python" cuda)
      rm -rf "$venvs/cuda-libs"
      "${pip[@]}" install --target "$venvs/cuda-libs" "${cuda[@]}" || return 1
      printf '%s\n' "${cuda[@]}" >"$venvs/cuda-libs/.complete"
    fi
    ln -sfn "$venvs/cuda-libs/nvidia" "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia"
  fi
  echo "py$version: $("$venv/bin/python" -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)' 2>&1 | tail -n 1)"
  echo "py$version: $(du -sh "$venv" | cut -f1) in $venv; holds: $("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | tr '\n' ' ')"
}

dry_run() {
  local version=$1 venv=$venvs/py$1 out=$runs/py$1 code
  [ -x "$venv/bin/python" ] || {
    echo "py$version: no virtualenv at $venv (build it first)"
    return 1
  }
  rm -rf "$out"
  mkdir -p "$runs"
  PYTHON=$venv/bin/python GPU_WHEELS_DIR=${GPU_WHEELS_DIR:-$repo/.gpu-wheels} \
    "$repo/scripts/gpu-smoke-device.sh" "$out" --dry-run >"$out.log" 2>&1
  code=$?
  echo "=== py$version: exit $code ($out)"
  grep -E '^(python|glibc|torch|nccl|imports took|ft_launcher)' "$out/env.txt"
  echo "install plan: $(awk -F '\t' '$1 == "install" { printf "%s %s==%s; ", $1, $2, $3 }' "$out/install.log")"
  grep -E '^(installed|nothing to install)' "$out/install.log"
  "$venv/bin/python" - "$out/gpu_smoke.json" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
print("ok:", report["ok"], "complete:", report["complete"])
for name, check in report["checks"].items():
    shown = {k: v for k, v in check.items() if k in ("ok", "problems", "restarts_by_layer", "restart_begins", "resumed_from_step", "async_median_s")}
    print(f"  {name}: {shown}")
PY
  return "$code"
}

status=0
for version in "${versions[@]}"; do
  if [ "$command" = build ]; then build "$version" || status=1; else dry_run "$version" || status=1; fi
done
exit "$status"
