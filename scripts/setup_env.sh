#!/usr/bin/env bash
# Installs everything the project needs into ./.venv and ./node_modules. Idempotent: a second run
# only checks what is there. Works offline except for the PyPI and npm registries.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv

"$PYTHON" - <<'PY' || { echo "setup: Python >= 3.11 is required (found $("$PYTHON" --version 2>&1)). Set PYTHON=/path/to/python3.11+." >&2; exit 2; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# The pins live in pyproject.toml's `trainer` extra, nowhere else.
TORCH_VERSION=$("$VENV/bin/python" scripts/trainer_requirements.py --pin torch)
NVRX_VERSION=$("$VENV/bin/python" scripts/trainer_requirements.py --pin nvidia-resiliency-ext)
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip >= 24 for `pip --python` (tests/packaging installs the wheel into a fresh virtualenv with it);
# wheel retags the NVRx wheel below. The build backend comes from pyproject's [build-system]:
# tests/packaging builds the wheel offline with it (no build isolation).
mapfile -t BUILD_REQUIRES < <("$VENV/bin/python" -c \
  'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
"${PIP[@]}" install --upgrade "pip>=24" wheel "${BUILD_REQUIRES[@]}"

# torch first and exactly pinned: an unpinned torch (or one pulled in by another package) is a
# multi-GB CUDA build. The container image installs its own CUDA torch.
"${PIP[@]}" install "torch==$TORCH_VERSION"

# nvidia-resiliency-ext 0.7.0 ships only cp312/cp314 manylinux_2_39 wheels and no sdist. Where pip
# cannot take it natively (Python 3.11, or glibc < 2.39), a plain install silently falls back to
# 0.4.1, which has the torn async-checkpoint bug. Every module we use is pure Python (the one native
# module serves the GPU-only straggler detector), so we fetch the cp312 wheel and retag it.
have_nvrx=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-resiliency-ext"))' 2>/dev/null || true)
if [ "$have_nvrx" != "$NVRX_VERSION" ]; then
  if ! "${PIP[@]}" install --only-binary=:all: "nvidia-resiliency-ext==$NVRX_VERSION" 2>/dev/null; then
    echo "setup: no native nvidia-resiliency-ext $NVRX_VERSION wheel for this Python/glibc;" \
         "installing the cp312 wheel retagged for this interpreter (pure-Python modules only)."
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "${PIP[@]}" download --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_39_x86_64 -d "$tmp" "nvidia-resiliency-ext==$NVRX_VERSION"
    tag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
    "$VENV/bin/python" -m wheel tags --remove --python-tag "$tag" --abi-tag "$tag" \
      --platform-tag linux_x86_64 "$tmp"/nvidia_resiliency_ext-"$NVRX_VERSION"-*.whl >/dev/null
    "${PIP[@]}" install "$tmp"/nvidia_resiliency_ext-"$NVRX_VERSION"-"$tag"-"$tag"-linux_x86_64.whl
  fi
fi

"${PIP[@]}" install -e ".[dev]"

# The CDK CLI, pinned in package.json / package-lock.json.
if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
for pkg in ("torch", "nvidia-resiliency-ext", "aws-cdk-lib", "cdk-nag"):
    print(f"setup: {pkg} {m.version(pkg)}")
PY

# --- checkov, in its own virtualenv -----------------------------------------------------------
# The security scanner gate (tests/infra/test_checkov.py, rules in .checkov.yaml). checkov pins versions
# that conflict with aws-cdk-lib's dependencies, so it cannot share .venv. The gate skips, saying
# so, where this virtualenv is missing; CHECKOV=0 leaves it out.
CHECKOV_VENV=.venv-checkov
CHECKOV_VERSION=3.3.30
if [ "${CHECKOV:-1}" != 0 ]; then
  [ -x "$CHECKOV_VENV/bin/python" ] || "$PYTHON" -m venv "$CHECKOV_VENV"
  "$CHECKOV_VENV/bin/python" -m pip --disable-pip-version-check -q install "checkov==$CHECKOV_VERSION"
  echo "setup: checkov $("$CHECKOV_VENV/bin/checkov" --version)"
fi
