"""The wheels a bare GPU machine needs to run `python -m nvrx_eks.ops.gpu_smoke`, carried to it in
`.gpu-wheels/` because it has its own torch, none of the project's other packages and no network.

`download DEST` (`make gpu-wheels`, on a machine with PyPI) fetches them for CPython 3.12 on
manylinux x86_64 into DEST, then lists them; `list DIR` prints each wheel with its size and the
total, and fails when the total is over what travels with the checkout; `install-plan DIR` (run by
scripts/gpu-smoke-device.sh on the GPU machine) prints the wheels to install, leaving out those
whose distribution that interpreter already has at a compatible version. Standard library only and
run as a file: on the GPU machine nothing else is installed yet.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

if __package__:
    from scripts.trainer_requirements import PYPROJECT
else:  # run as a file, with scripts/ on sys.path: on the GPU machine the project is not installed
    from trainer_requirements import PYPROJECT

#: What the smoke's processes import beyond torch and torch's own requirements (filelock, fsspec,
#: jinja2, networkx, sympy, typing-extensions), measured in a fresh virtualenv holding only torch:
#: importing nvrx_eks.ops.gpu_smoke, nvrx_eks.local.runner, workloads.train, workloads.trainer,
#: workloads.coordinator, ft_launcher and NVRx's in-process and async-checkpoint modules, then the
#: smoke's CPU dry run through scripts/gpu-smoke-device.sh. Each name says who needs it.
GPU_WHEELS = {
    "nvidia-resiliency-ext": "ft_launcher, the in-process restart and the async checkpoints",
    "pydantic": "the trainer's configuration (workloads.config) and NVRx's",
    "pydantic-core": "pydantic's compiled core, at the version pydantic requires",
    "annotated-types": "imported by pydantic",
    "typing-inspection": "imported by pydantic",
    "defusedxml": "imported by NVRx's health checks (nvidia_resiliency_ext.shared_utils.health_check)",
    "httpx": "imported by NVRx's health checks",
    "idna": "imported by httpx",
    "packaging": "imported by NVRx",
    "nvidia-ml-py": "pynvml: NVRx's GPU and NVLink health checks on a GPU rank",
    "protobuf": "imported by ft_launcher (its gRPC messages)",
    "grpcio": "imported by ft_launcher",
    "numpy": "the trainer's data and checkpointed training state",
    "pyyaml": "the run's config.yaml",
    "psutil": "the local runner's process tracking and the trainer",
    "rich": "the smoke's and the local runner's console output",
}

#: What travels to the GPU machine, the checkout included, is limited to 64 MiB; the wheels must
#: stay under that.
WHEELS_LIMIT_BYTES = 64 << 20

#: The device's interpreter: CPython 3.12 on manylinux x86_64. pip matches a --platform tag only
#: exactly, so every manylinux glibc level up to NVRx's 2.39 is listed.
DEVICE_PYTHON = "3.12"
DEVICE_ABI = "cp312"
DEVICE_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")
_RELEASE = re.compile(r"^\d+(\.\d+)*")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(wheel: Path) -> tuple[str, str]:
    """The (normalized name, version) a wheel's file name states."""
    match = _WHEEL_NAME.match(wheel.name)
    if not match or not wheel.name.endswith(".whl"):
        raise ValueError(f"{wheel.name} is not a wheel's file name")
    return normalize(match["name"]), match["version"]


def pinned_versions(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Each GPU_WHEELS distribution's version: the project's `==` pin where pyproject.toml has one,
    else the version this checkout's environment runs (what `make setup` resolved against those
    pins: pydantic-core is the one pydantic requires, numpy one that satisfies `numpy>=1.26`)."""
    specs = requirement_specs(pyproject)
    versions = {}
    for name in GPU_WHEELS:
        spec = specs.get(name, "")
        if spec.startswith("==") and "," not in spec:
            versions[name] = spec[2:].strip()
        else:
            versions[name] = importlib.metadata.version(name)
    return versions


def requirement_specs(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """The version specifier pyproject.toml gives each distribution ("==2.14.4", ">=6.0"), from the
    project's dependencies and its `trainer` extra."""
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    specs = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["trainer"]]:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?\s*([^;]*)", requirement)
        if match:
            specs[normalize(match[1])] = match[3].strip()
    return specs


def _release(version: str) -> tuple[int, ...]:
    match = _RELEASE.match(version)
    return tuple(int(part) for part in match[0].split(".")) if match else ()


def satisfies(installed: str, spec: str) -> bool:
    """Whether `installed` meets a pyproject specifier of the forms it uses: ==X, >=X, or both
    joined by commas. Compared by release numbers (a local tag such as +cu130 is ignored)."""
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        if clause.startswith("=="):
            if _release(installed) != _release(clause[2:].strip()):
                return False
        elif clause.startswith(">="):
            if _release(installed) < _release(clause[2:].strip()):
                return False
        else:
            return False  # a form this check does not read: install the carried wheel
    return True


def install_plan(wheels: list[Path], installed: dict[str, str], specs: dict[str, str]) -> list[tuple[Path, str]]:
    """Each wheel with what to do: "install", or why it is skipped. A distribution already there is
    kept when it is the wheel's version or meets the project's specifier for it; any other version
    is replaced, since the carried set is the one the project's tests ran together."""
    plan = []
    for wheel in wheels:
        name, version = wheel_distribution(wheel)
        have = installed.get(name)
        if have is not None and _release(have) == _release(version):
            plan.append((wheel, f"skip: {name} {have} is installed"))
        elif have is not None and name in specs and specs[name] and satisfies(have, specs[name]):
            plan.append((wheel, f"skip: {name} {have} is installed and meets {specs[name]}"))
        else:
            plan.append((wheel, "install"))
    return plan


def installed_versions() -> dict[str, str]:
    """Every distribution this interpreter can import, by normalized name."""
    return {normalize(d.metadata["Name"]): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}


def listing(wheels: list[Path], limit: int = WHEELS_LIMIT_BYTES) -> tuple[list[str], int, bool]:
    """Lines of name and size in MiB, the total in bytes, and whether it fits `limit`."""
    sizes = sorted(((w.stat().st_size, w.name) for w in wheels), reverse=True)
    total = sum(size for size, _ in sizes)
    lines = [f"{size / (1 << 20):8.2f} MiB  {name}" for size, name in sizes]
    lines.append(f"{total / (1 << 20):8.2f} MiB  total (limit {limit / (1 << 20):g} MiB)")
    return lines, total, total <= limit


def wheels_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.whl")) if directory.is_dir() else []


def download(dest: Path, python: str = sys.executable) -> None:
    """Fetch GPU_WHEELS at pinned_versions() for the device into `dest`, replacing the wheels there
    (the folder is generated: one version of each, or pip on the device refuses the set)."""
    requirements = [f"{name}=={version}" for name, version in pinned_versions().items()]
    platforms = [arg for platform in DEVICE_PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as fetched:
        subprocess.run(
            [python, "-m", "pip", "--disable-pip-version-check", "download", "-q", "--no-deps"]
            + ["--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp"]
            + ["--abi", DEVICE_ABI, "--abi", "abi3", "--abi", "none", *platforms, "-d", fetched, *requirements],
            check=True,
        )
        dest.mkdir(parents=True, exist_ok=True)
        for stale in wheels_in(dest):
            stale.unlink()
        for wheel in wheels_in(Path(fetched)):
            wheel.rename(dest / wheel.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("download", "list", "install-plan"):
        sub.add_parser(command).add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    if args.command == "install-plan":
        for wheel, action in install_plan(wheels_in(args.directory), installed_versions(), requirement_specs()):
            if action == "install":
                print(wheel)
            else:
                print(f"{wheel.name}: {action}", file=sys.stderr)
        return 0
    if args.command == "download":
        download(args.directory)
    lines, _, fits = listing(wheels_in(args.directory))
    print("\n".join(lines))
    if not fits:
        print(
            f"gpu_wheels: {args.directory} is over the {WHEELS_LIMIT_BYTES >> 20} MiB that travels to the GPU "
            "machine; carry fewer wheels (GPU_WHEELS in scripts/gpu_wheels.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
