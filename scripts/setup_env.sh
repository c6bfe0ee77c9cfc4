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

# nvidia-resiliency-ext 0.7.0: natively where pip can, else the cp312 wheel retagged for this
# interpreter (scripts/nvrx_wheel.sh says why).
have_nvrx=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-resiliency-ext"))' 2>/dev/null || true)
if [ "$have_nvrx" != "$NVRX_VERSION" ]; then
  if ! "${PIP[@]}" install --only-binary=:all: "nvidia-resiliency-ext==$NVRX_VERSION" 2>/dev/null; then
    echo "setup: no native nvidia-resiliency-ext $NVRX_VERSION wheel for this Python/glibc;" \
         "installing the cp312 wheel retagged for this interpreter (pure-Python modules only)."
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
    "${PIP[@]}" install "$(PYTHON="$VENV/bin/python" scripts/nvrx_wheel.sh "$tmp" "$NVRX_VERSION" "$tag")"
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

# --- the container runtime of `nvrx-eks rehearse` ----------------------------------------------
# podman with runc (nvrx_eks/rehearse/containers.conf says why runc), catatonit, mmdebstrap for the
# CPU twin's Debian base, numactl for the seccomp tests. Debian packages, installed where this
# runs as root with apt; elsewhere the rehearsal tests skip, saying why. REHEARSE=0 leaves it out.
if [ "${REHEARSE:-1}" != 0 ]; then
  need=()
  for tool in podman:podman runc:runc catatonit:catatonit mmdebstrap:mmdebstrap numactl:numactl; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing ${need[*]} (Debian packages) for nvrx-eks rehearse"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" uidmap >/dev/null
    else
      echo "setup: ${need[*]} missing and not installable here (needs root and apt); rehearsals will be skipped"
    fi
  fi
fi

# --- checkov, in its own virtualenv -----------------------------------------------------------
# The security scanner gate (tests/contract/infra/test_checkov.py, rules in .checkov.yaml). checkov pins versions
# that conflict with aws-cdk-lib's dependencies, so it cannot share .venv. The gate skips, saying
# so, where this virtualenv is missing; CHECKOV=0 leaves it out.
CHECKOV_VENV=.venv-checkov
CHECKOV_VERSION=3.3.30
if [ "${CHECKOV:-1}" != 0 ]; then
  [ -x "$CHECKOV_VENV/bin/python" ] || "$PYTHON" -m venv "$CHECKOV_VENV"
  "$CHECKOV_VENV/bin/python" -m pip --disable-pip-version-check -q install "checkov==$CHECKOV_VERSION"
  echo "setup: checkov $("$CHECKOV_VENV/bin/checkov" --version)"
fi
