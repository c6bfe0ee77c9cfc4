"""The wheels a bare GPU machine needs to run `python -m nvrx_eks.ops.gpu_smoke`, carried to it in
`.gpu-wheels/` because it has its own torch, none of the project's other packages and no network.
The machine's CPython is not known in advance (3.10 to 3.13), nor its glibc beyond what its torch
needs.

`download DEST` (`make gpu-wheels`, on a machine with PyPI) fetches them into DEST: each compiled
one for every CPython of DEVICE_PYTHONS, the pure ones once, and NVRx retagged
py3-none-linux_x86_64 (scripts/nvrx_wheel.sh); then lists them. `list DIR` prints each wheel with
its size and the total, and fails when the total is over what travels with the checkout.
`install-plan DIR` (run by scripts/gpu-smoke-device.sh on the GPU machine) prints, one line per
distribution, what to install and what to keep (`install_plan`), and fails, naming why, when the
interpreter cannot be made ready from what was carried. Run as a file, with the standard library
and `packaging` (or pip's own copy of it) only: on the GPU machine nothing else is installed yet,
and it may be CPython 3.10 (no tomllib).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.tags import Tag, parse_tag, sys_tags
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare interpreter: pip, which installs the wheels, brings its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.tags import Tag, parse_tag, sys_tags
    from pip._vendor.packaging.version import InvalidVersion, Version

#: What the smoke's processes import beyond torch, torch's own requirements and numpy (the device's,
#: DEVICE_PACKAGES): measured by the smoke's dry run through scripts/gpu-smoke-device.sh in fresh
#: virtualenvs of CPython 3.11, 3.12 and 3.13 holding only torch and numpy
#: (scripts/gpu_smoke_venvs.sh). Each name says who needs it.
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
    "pyyaml": "the run's config.yaml",
    "psutil": "the local runner's process tracking and the trainer",
    "rich": "the smoke's and the local runner's console output",
}

#: Carried only for what a carried wheel being installed requires, where the device's own copy is
#: older (pydantic 2.14 needs typing-extensions >= 4.16; torch asks for >= 4.10).
FALLBACK_WHEELS = {
    "typing-extensions": "required by pydantic at a version the device's may not meet",
}

#: What the device's torch environment must bring itself: not carried. numpy is 16 MiB per CPython,
#: and every torch environment seen has it (the lent GPU machine: numpy 2.5.2).
DEVICE_PACKAGES = {
    "torch": "the device's own CUDA build",
    "numpy": "the trainer's data and checkpointed training state",
}

#: What travels to the GPU machine, the checkout included, is limited to 64 MiB; the wheels must
#: stay under that.
WHEELS_LIMIT_BYTES = 64 << 20

#: The CPythons a lent GPU machine may run. Compiled wheels are carried for each; pure ones once.
DEVICE_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: manylinux levels up to glibc 2.28, the level of torch's own Linux wheels: any machine whose torch
#: runs takes these. pip matches a --platform tag only exactly, so every level is listed.
DEVICE_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 29)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]

NVRX = "nvidia-resiliency-ext"
#: NVRx 0.7.0 is published only as cp312/cp314 manylinux_2_39 wheels; its modules are pure Python
#: but for the straggler detector's CUPTI module, which the smoke never imports. Retagged thus it
#: installs on any CPython >= 3.10 and any glibc (scripts/nvrx_wheel.sh).
NVRX_RETAG = ("py3", "none")

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(wheel: Path) -> tuple[str, str]:
    """The (normalized name, version) a wheel's file name states."""
    match = _WHEEL_NAME.match(wheel.name)
    if not match:
        raise ValueError(f"{wheel.name} is not a wheel's file name")
    return normalize(match["name"]), match["version"]


def wheel_tags(wheel: Path) -> frozenset[Tag]:
    match = _WHEEL_NAME.match(wheel.name)
    if not match:
        raise ValueError(f"{wheel.name} is not a wheel's file name")
    return frozenset(parse_tag(match["tags"]))


def requirement_specs() -> dict[str, str]:
    """The version specifier pyproject.toml gives each distribution ("==2.14.4", ">=6.0"), from the
    project's dependencies and its `trainer` extra. Read where the wheels are downloaded, never on
    the GPU machine (tomllib: CPython >= 3.11)."""
    import tomllib

    if __package__:
        from scripts.trainer_requirements import PYPROJECT
    else:  # run as a file, with scripts/ on sys.path
        from trainer_requirements import PYPROJECT

    with PYPROJECT.open("rb") as f:
        project = tomllib.load(f)["project"]
    specs = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["trainer"]]:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?\s*([^;]*)", requirement)
        if match:
            specs[normalize(match[1])] = match[3].strip()
    return specs


def pinned_versions() -> dict[str, str]:
    """Each carried distribution's version: the project's `==` pin where pyproject.toml has one,
    else the version this checkout's environment runs (what `make setup` resolved against those
    pins: pydantic-core is the one pydantic requires)."""
    specs = requirement_specs()
    versions = {}
    for name in [*GPU_WHEELS, *FALLBACK_WHEELS]:
        spec = specs.get(name, "")
        if spec.startswith("==") and "," not in spec:
            versions[name] = spec[2:].strip()
        else:
            versions[name] = importlib.metadata.version(name)
    return versions


@dataclass(frozen=True)
class Carried:
    """One carried distribution: its version and its wheels (one per CPython where compiled)."""

    name: str
    version: str
    wheels: tuple[Path, ...]

    def requires(self) -> tuple[str, ...]:
        """The Requires-Dist lines of its metadata (the same in each of its wheels)."""
        return wheel_requires(self.wheels[0])

    def fits(self, supported: frozenset[Tag]) -> bool:
        return any(wheel_tags(wheel) & supported for wheel in self.wheels)


def wheel_requires(wheel: Path) -> tuple[str, ...]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode("utf-8", errors="replace")
    header = text.split("\n\n", 1)[0]
    return tuple(line.split(":", 1)[1].strip() for line in header.splitlines() if line.startswith("Requires-Dist:"))


def carried_in(directory: Path) -> dict[str, Carried]:
    """The carried distributions of `directory`, by normalized name."""
    by_name: dict[str, list[Path]] = {}
    versions: dict[str, str] = {}
    for wheel in wheels_in(directory):
        name, version = wheel_distribution(wheel)
        if versions.setdefault(name, version) != version:
            raise ValueError(f"{directory} holds {name} {versions[name]} and {version}: carry one version of each")
        by_name.setdefault(name, []).append(wheel)
    return {name: Carried(name, versions[name], tuple(wheels)) for name, wheels in by_name.items()}


@dataclass(frozen=True)
class Step:
    """One line of the plan: "install" (from the carried wheels), "keep" (the interpreter's own
    copy), or "absent" (required by NVRx's metadata, neither there nor carried: nothing the smoke
    imports)."""

    action: str
    name: str
    version: str
    why: str

    def line(self) -> str:
        return f"{self.action}\t{self.name}\t{self.version}\t{self.why}"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    #: Why the interpreter cannot be made ready from the carried wheels; empty when it can.
    problems: list[str] = field(default_factory=list)

    @property
    def to_install(self) -> list[str]:
        """`name==version` of each distribution to install, for pip's --no-index --find-links."""
        return [f"{s.name}=={s.version}" for s in self.steps if s.action == "install"]


def _applies(requirement: Requirement) -> bool:
    """Whether a Requires-Dist line applies here: no extra asked for, this interpreter's markers."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def _describe(specs: list[tuple[SpecifierSet, str]]) -> str:
    stated = [f"{spec} ({who})" for spec, who in specs if str(spec)]
    return ", ".join(stated) if stated else "any version"


def install_plan(
    carried: dict[str, Carried], installed: dict[str, str], supported: frozenset[Tag] | None = None
) -> Plan:
    """What to install so that this interpreter runs the smoke, changing as little as possible.

    Required: each GPU_WHEELS distribution, at any version unless something states one; NVRx at the
    carried version (the project's pin); what NVRx's own Requires-Dist states; and what a carried
    wheel being installed requires. A distribution the interpreter has at a version meeting every
    requirement on it is kept, whatever version the project's tests ran: the device's torch
    environment is left as it is wherever it serves. One that is missing or fails a requirement is
    installed from the carried wheels, whose own requirements then count too. DEVICE_PACKAGES are
    never carried: missing or failing, they are a problem, as is a carried wheel that fails a
    requirement or fits no tag of this interpreter (`supported`, default: its own)."""
    supported = frozenset(sys_tags()) if supported is None else supported
    requirements: dict[str, list[tuple[SpecifierSet, str]]] = {
        name: [(SpecifierSet(), "the smoke")] for name in GPU_WHEELS
    }
    for name in DEVICE_PACKAGES:
        requirements.setdefault(name, []).append((SpecifierSet(), "the smoke"))
    if NVRX in carried:
        requirements[NVRX] = [(SpecifierSet(f"=={carried[NVRX].version}"), "the project's pin")]

    read: set[str] = set()

    def require_from(dist: Carried) -> None:
        if dist.name in read:
            return
        read.add(dist.name)
        for line in dist.requires():
            requirement = Requirement(line)
            if _applies(requirement):
                requirements.setdefault(normalize(requirement.name), []).append((requirement.specifier, dist.name))

    if NVRX in carried:
        require_from(carried[NVRX])
    decided: dict[str, Step] = {}
    while True:
        pending = [n for n in sorted(requirements) if n not in decided or decided[n].action != "install"]
        changed = False
        for name in pending:
            step = _decide(name, requirements[name], carried.get(name), installed.get(name), supported)
            if decided.get(name) != step:
                decided[name], changed = step, True
                if step.action == "install" and name in carried:
                    require_from(carried[name])
        if not changed:
            break
    plan = Plan()
    for name in sorted(decided):
        step = decided[name]
        if step.action == "problem":
            plan.problems.append(f"{name}: {step.why}")
        else:
            plan.steps.append(step)
    return plan


def _decide(
    name: str,
    specs: list[tuple[SpecifierSet, str]],
    carried: Carried | None,
    have: str | None,
    supported: frozenset[Tag],
) -> Step:
    wanted = _describe(specs)
    if have is not None and _meets(have, specs):
        return Step("keep", name, have, f"installed, meets {wanted}")
    why = "not installed" if have is None else f"{have} is installed and fails {wanted}"
    if name in DEVICE_PACKAGES:
        return Step("problem", name, have or "-", f"{why}; the device's torch environment must bring it (not carried)")
    if carried is None:
        if name in GPU_WHEELS:
            return Step("problem", name, "-", f"{why}, and no wheel of it was carried: run make gpu-wheels")
        return Step("absent", name, have or "-", f"{why}; not carried: nothing the smoke imports")
    if not _meets(carried.version, specs):
        return Step("problem", name, carried.version, f"{why}, and the carried {carried.version} fails {wanted}")
    if not carried.fits(supported):
        tags = sorted({str(tag) for wheel in carried.wheels for tag in wheel_tags(wheel)})
        return Step(
            "problem", name, carried.version, f"{why}, and no carried wheel fits this interpreter ({', '.join(tags)})"
        )
    return Step("install", name, carried.version, why)


def _meets(version: str, specs: list[tuple[SpecifierSet, str]]) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:  # a version pip could not compare either: replace it
        return False
    return all(spec.contains(parsed, prereleases=True) for spec, _ in specs)


def installed_versions() -> dict[str, str]:
    """Every distribution this interpreter can import, by normalized name; the first one on
    sys.path where two are (the one an import finds)."""
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            versions.setdefault(normalize(name), dist.version)
    return versions


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
    """Fetch the carried set at pinned_versions() into `dest`, replacing the wheels there (the
    folder is generated: one version of each, or pip on the device refuses the set)."""
    versions = pinned_versions()
    requirements = [f"{name}=={version}" for name, version in versions.items() if name != NVRX]
    platforms = [arg for platform in DEVICE_PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as fetched:
        for device_python in DEVICE_PYTHONS:
            abi = "cp" + device_python.replace(".", "")
            subprocess.run(
                [python, "-m", "pip", "--disable-pip-version-check", "download", "-q", "--no-deps"]
                + ["--only-binary=:all:", "--python-version", device_python, "--implementation", "cp"]
                + ["--abi", abi, "--abi", "abi3", "--abi", "none", *platforms, "-d", fetched, *requirements],
                check=True,
            )
        nvrx_wheel = Path(__file__).resolve().parent / "nvrx_wheel.sh"
        subprocess.run(
            ["bash", str(nvrx_wheel), fetched, versions[NVRX], *NVRX_RETAG],
            check=True,
            env={**os.environ, "PYTHON": python},
        )
        dest.mkdir(parents=True, exist_ok=True)
        for stale in wheels_in(dest):
            stale.unlink()
        for wheel in wheels_in(Path(fetched)):
            wheel.rename(dest / wheel.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("download", "list", "install-plan"):
        sub.add_parser(command).add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    if args.command == "install-plan":
        try:
            plan = install_plan(carried_in(args.directory), installed_versions())
        except ValueError as err:
            print(f"gpu_wheels: {err}", file=sys.stderr)
            return 1
        for step in plan.steps:
            print(step.line())
        for problem in plan.problems:
            print(f"gpu_wheels: cannot run the smoke with {sys.executable}: {problem}", file=sys.stderr)
        return 1 if plan.problems else 0
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
