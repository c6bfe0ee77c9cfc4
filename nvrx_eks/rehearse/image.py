"""The CPU twin of the trainer image, built from the same workloads/Dockerfile as the cluster's.

The Dockerfile's `trainer` stage (Python dependencies, the code, tini as the entrypoint) is built
on a Debian base made here instead of on CUDA and EFA (`--target trainer --build-arg
TRAINER_BASE=cpu`); the `gpu` stage that follows it in the cluster's image only adds the checks
that need CUDA and EFA. Nothing is downloaded during the build: the base comes from Debian's
packages through mmdebstrap, the Python packages from a wheelhouse filled here first (torch's CPU
build for the base's Python, NVRx retagged as scripts/nvrx_wheel.sh explains).

Each image is tagged with a digest of its inputs (the Dockerfile, every file its build context
admits, the base's recipe, the requirements), so it is rebuilt only when one of them changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from nvrx_eks.facts.checkout import checkout_root
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.image_contents import BUILD_INPUTS, CODE, DOCKERFILE
from nvrx_eks.rehearse.runtime import REHEARSAL_LABEL, Podman

#: The twin's base: Debian 12 (its python3 is 3.11, as on the machines the project is tested on).
BASE_SUITE = "bookworm"
#: What the GPU image's apt layer gives the trainer layer: Python, tini, numactl.
BASE_PACKAGES = ("python3", "python3-venv", "tini", "numactl")
BASE_PYTHON = ("3.11", "cp311")
BASE_REPOSITORY = "localhost/nvrx-eks-cpu-base"
TWIN_REPOSITORY = "localhost/nvrx-eks-trainer-cpu"
#: Wheel platforms the base's glibc (2.36) runs.
_PLATFORMS = (
    "manylinux_2_36_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",  # the retagged NVRx wheel
)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def context_files(root: Path) -> list[Path]:
    """The files of the build context the Dockerfile's COPYs can see: the paths the image holds
    (nvrx_eks/facts/image_contents.py), less bytecode."""
    files: list[Path] = []
    for entry in BUILD_INPUTS + CODE:
        path = root / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return files


def trainer_requirements(root: Path) -> list[str]:
    listed = subprocess.run(
        [sys.executable, str(root / "scripts" / "trainer_requirements.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.strip() for line in listed.splitlines() if line.strip()]


def build_base(podman: Podman, cache: Path, console: Console) -> str:
    recipe = f"{BASE_SUITE} {' '.join(BASE_PACKAGES)}".encode()
    tag = f"{BASE_REPOSITORY}:{BASE_SUITE}-{_digest(recipe)}"
    if podman.image_exists(tag):
        return tag
    console.print(f"rehearse: building the twin's base {tag} (mmdebstrap, Debian {BASE_SUITE})")
    cache.mkdir(parents=True, exist_ok=True)
    rootfs = cache / "rootfs.tar"
    made = subprocess.run(
        ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE, str(rootfs)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise ConfigError(f"mmdebstrap could not build the twin's base: {made.stderr.strip()[-1500:]}")
    podman.run(["import", "--change", f"LABEL {REHEARSAL_LABEL}=base", str(rootfs), tag])
    rootfs.unlink()
    return tag


def fill_wheelhouse(root: Path, cache: Path, requirements: list[str], console: Console) -> Path:
    """Wheels of every trainer requirement for the base's Python, torch's CPU build among them
    (pip takes it where the machine keeps one; any other torch 2.13 wheel is a CUDA build)."""
    python_version, python_tag = BASE_PYTHON
    wheelhouse = cache / f"wheelhouse-{python_tag}-{_digest(chr(10).join(requirements).encode())}"
    done = wheelhouse / ".complete"
    if done.is_file():
        return wheelhouse
    console.print(f"rehearse: filling the wheelhouse {wheelhouse}")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    nvrx = [r for r in requirements if r.startswith("nvidia-resiliency-ext==")]
    others = [r for r in requirements if r not in nvrx]
    local_wheels = []
    for pin in nvrx:
        retagged = subprocess.run(
            [str(root / "scripts" / "nvrx_wheel.sh"), str(wheelhouse), pin.split("==")[1], python_tag],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            check=False,
        )
        if retagged.returncode != 0:
            raise ConfigError(f"could not fetch {pin} for the twin: {retagged.stderr.strip()[-1500:]}")
        local_wheels.append(retagged.stdout.strip().splitlines()[-1])
    platforms = [arg for p in _PLATFORMS for arg in ("--platform", p)]
    downloaded = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download", "-d", str(wheelhouse),
         "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
         "--abi", python_tag, *platforms, *others, *local_wheels],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if downloaded.returncode != 0:
        raise ConfigError(f"could not fill the twin's wheelhouse: {downloaded.stderr.strip()[-1500:]}")
    if not any(p.name.startswith("torch-") and "+cpu" in p.name for p in wheelhouse.iterdir()):
        raise ConfigError(
            f"the wheelhouse {wheelhouse} has no CPU build of torch: pip found only a CUDA build "
            "(several GB); install the pinned CPU torch first, as `make setup` does"
        )
    done.touch()
    return wheelhouse


def build_twin(podman: Podman, console: Console, cache: Path | None = None) -> str:
    """The twin image's tag, built unless an image of the same inputs exists."""
    root = checkout_root()
    cache = cache or root / "build" / "rehearse"
    requirements = trainer_requirements(root)
    base = build_base(podman, cache, console)
    inputs = [(root / DOCKERFILE).read_bytes(), base.encode(), "\n".join(requirements).encode()]
    inputs += [str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() for p in context_files(root)]
    tag = f"{TWIN_REPOSITORY}:{_digest(*inputs)}"
    if podman.image_exists(tag):
        return tag
    wheelhouse = fill_wheelhouse(root, cache, requirements, console)
    console.print(f"rehearse: building the CPU twin {tag} from {DOCKERFILE} (target trainer)")
    podman.run(
        ["build", "--format", "docker", "-f", str(root / DOCKERFILE), "--target", "trainer",
         "--build-arg", "TRAINER_BASE=cpu", "--build-arg", f"CPU_BASE_IMAGE={base}",
         "--build-arg", "PIP_INSTALL_FROM=--no-index --find-links /wheelhouse",
         "--volume", f"{wheelhouse}:/wheelhouse:ro", "--label", f"{REHEARSAL_LABEL}=image",
         "-t", tag, str(root)],
    )  # fmt: skip
    _remove_other_twins(podman, tag)
    return tag


def _remove_other_twins(podman: Podman, keep: str) -> None:
    """Older twins (other inputs) only take disk: remove them once a new one is built."""
    listed = podman.run(["images", "--format", "{{.Repository}}:{{.Tag}}", TWIN_REPOSITORY]).stdout.split()
    stale = [image for image in listed if image != keep]
    if stale:
        podman.run(["rmi", "--force", *stale], check=False)
