"""The wheels carried to a bare GPU machine (scripts/gpu_wheels.py), without downloading any: what
is carried (every compiled wheel for each CPython the machine may run, NVRx for any, no numpy),
their listing against what travels, and the install plan on the machine: only what the interpreter
lacks or has at a version something refuses, never a replacement of a copy that serves."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.tags import Tag

from scripts import gpu_wheels
from scripts.trainer_requirements import pinned_version
from tests.support import REPO_ROOT

#: NVRx 0.7.0's Requires-Dist, as its wheel states it (the parts the plan reads).
NVRX_REQUIRES = [
    "defusedxml",
    "fastapi (>=0.100.0)",
    "grpcio (>=1.76.0,<2.0.0)",
    "httpx (>=0.24.0)",
    'mcp (>=1.28.1,<2.0.0) ; extra == "attribution"',
    "numpy (>=1.26)",
    "nvidia-ml-py (>=12.570.86)",
    "packaging",
    "protobuf (>=4.22.0)",
    "psutil (>=6.0.0)",
    "pydantic (>=2.0.0)",
    "torch (>=2.3.0)",
]
PYDANTIC_REQUIRES = ["annotated-types>=0.6.0", "pydantic-core==2.50.5", "typing-extensions>=4.16.0"]
#: What this test's interpreter accepts: CPython 3.12 on manylinux 2.28 and older.
CP312 = frozenset(
    Tag(interpreter, abi, platform)
    for interpreter, abi in (("cp312", "cp312"), ("cp312", "abi3"), ("cp312", "none"), ("py3", "none"))
    for platform in ("linux_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
)


def _wheel(directory: Path, filename: str, requires: list[str] = (), size: int = 0) -> Path:
    """A wheel file with the METADATA the plan reads (name, version, Requires-Dist)."""
    name, version = filename.split("-")[:2]
    path = directory / filename
    with zipfile.ZipFile(path, "w") as archive:
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {line}" for line in requires]
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n\nA description.\n")
        if size:
            archive.writestr("padding", b"\0" * size)
    return path


@pytest.fixture
def carried(tmp_path):
    """A carried set as make gpu-wheels lays it out: NVRx retagged for any CPython, compiled wheels
    once per CPython, pure ones once."""
    _wheel(tmp_path, "nvidia_resiliency_ext-0.7.0-py3-none-linux_x86_64.whl", NVRX_REQUIRES)
    _wheel(tmp_path, "pydantic-2.14.4-py3-none-any.whl", PYDANTIC_REQUIRES)
    for abi in ("cp310", "cp311", "cp312", "cp313"):
        _wheel(tmp_path, f"pydantic_core-2.50.5-{abi}-{abi}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
        _wheel(tmp_path, f"grpcio-1.85.4-{abi}-{abi}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    pure = ("annotated_types-0.8.0", "typing_inspection-0.4.5", "idna-3.21", "defusedxml-0.7.1", "rich-15.0.0")
    for wheel in (*pure, "typing_extensions-4.16.0"):
        _wheel(tmp_path, f"{wheel}-py3-none-any.whl")
    return gpu_wheels.carried_in(tmp_path)


#: A device's torch environment: torch, numpy and packages the lent machine's image holds (KINDS.md
#: lists their names; these versions are made up), no pydantic, no NVRx.
DEVICE = {
    "torch": "2.11.0+cu130",
    "numpy": "2.5.2",
    "grpcio": "1.78.0",
    "idna": "3.7",
    "typing-extensions": "4.12.2",
    "rich": "13.9.4",
    "defusedxml": "0.7.1",
    "packaging": "24.2",
    "httpx": "0.28.1",
    "nvidia-ml-py": "13.580.82",
    "protobuf": "5.29.3",
    "psutil": "7.0.0",
    "pyyaml": "6.0.2",
}


def _actions(plan: gpu_wheels.Plan) -> dict[str, str]:
    return {step.name: f"{step.action} {step.version}" for step in plan.steps}


def test_a_device_copy_that_meets_every_requirement_is_kept_whatever_version_the_tests_ran(carried):
    """grpcio 1.78 meets NVRx's >=1.76,<2; idna 3.7 and rich 13 meet what anything states of them:
    none is replaced by the carried 1.85.4, 3.21 or 15.0.0 (the old plan replaced each version it
    did not carry)."""
    plan = gpu_wheels.install_plan(carried, DEVICE, CP312)
    actions = _actions(plan)
    assert actions["grpcio"] == "keep 1.78.0" and actions["idna"] == "keep 3.7" and actions["rich"] == "keep 13.9.4"
    assert actions["torch"] == "keep 2.11.0+cu130" and actions["numpy"] == "keep 2.5.2"
    why = {step.name: step.why for step in plan.steps}
    assert why["grpcio"] == "installed, meets <2.0.0,>=1.76.0 (nvidia-resiliency-ext)"


def test_what_is_missing_is_installed_with_what_its_own_metadata_then_requires(carried):
    plan = gpu_wheels.install_plan(carried, DEVICE, CP312)
    actions = _actions(plan)
    assert actions["nvidia-resiliency-ext"] == "install 0.7.0"
    assert actions["pydantic"] == "install 2.14.4" and actions["pydantic-core"] == "install 2.50.5"
    # pydantic, being installed, needs typing-extensions >= 4.16: the device's 4.12.2 is replaced.
    assert actions["typing-extensions"] == "install 4.16.0"
    assert plan.problems == []
    assert plan.to_install == [
        "annotated-types==0.8.0",
        "nvidia-resiliency-ext==0.7.0",
        "pydantic==2.14.4",
        "pydantic-core==2.50.5",
        "typing-extensions==4.16.0",
        "typing-inspection==0.4.5",
    ]
    # NVRx's requirements the smoke never imports are listed, neither carried nor installed.
    assert actions["fastapi"] == "absent -" and "mcp" not in actions  # an extra's: not required


def test_a_device_copy_that_fails_nvrxs_requirement_is_replaced(carried):
    plan = gpu_wheels.install_plan(carried, {**DEVICE, "grpcio": "1.70.0"}, CP312)
    step = next(s for s in plan.steps if s.name == "grpcio")
    assert (step.action, step.version) == ("install", "1.85.4")
    assert step.why == "1.70.0 is installed and fails <2.0.0,>=1.76.0 (nvidia-resiliency-ext)"


def test_the_device_must_bring_torch_and_numpy_itself(carried):
    plan = gpu_wheels.install_plan(carried, {k: v for k, v in DEVICE.items() if k != "numpy"}, CP312)
    assert plan.problems == [
        "numpy: not installed; the device's torch environment must bring it (not carried)",
    ]
    old_torch = gpu_wheels.install_plan(carried, {**DEVICE, "torch": "2.2.0"}, CP312)
    assert old_torch.problems == [
        "torch: 2.2.0 is installed and fails >=2.3.0 (nvidia-resiliency-ext); the device's torch environment "
        "must bring it (not carried)"
    ]


def test_a_cpython_the_carried_compiled_wheels_do_not_cover_is_named(carried):
    cp314 = frozenset(Tag("cp314", abi, "linux_x86_64") for abi in ("cp314", "none")) | {Tag("py3", "none", "any")}
    cp314 |= {Tag("py3", "none", "linux_x86_64")}
    problems = gpu_wheels.install_plan(carried, DEVICE, cp314).problems
    assert len(problems) == 1 and problems[0].startswith("pydantic-core: not installed, and no carried wheel fits")
    assert "cp313-cp313-manylinux_2_17_x86_64" in problems[0]


def test_a_distribution_the_smoke_imports_but_nobody_carried_is_a_problem(tmp_path):
    _wheel(tmp_path, "rich-15.0.0-py3-none-any.whl")
    problems = gpu_wheels.install_plan(gpu_wheels.carried_in(tmp_path), DEVICE, CP312).problems
    assert "pydantic: not installed, and no wheel of it was carried: run make gpu-wheels" in problems


def test_the_carried_set_is_each_compiled_wheel_for_every_cpython_nvrx_retagged_and_no_numpy(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(gpu_wheels.subprocess, "run", lambda argv, **kwargs: calls.append(argv))
    gpu_wheels.download(tmp_path / "wheels")
    downloads, (retag,) = calls[:-1], calls[-1:]
    assert [argv[argv.index("--python-version") + 1] for argv in downloads] == ["3.10", "3.11", "3.12", "3.13"]
    assert [argv[argv.index("--abi") + 1] for argv in downloads] == ["cp310", "cp311", "cp312", "cp313"]
    platforms = {argv[i + 1] for argv in downloads for i, a in enumerate(argv) if a == "--platform"}
    # No wheel needs a newer glibc than torch's own (manylinux_2_28).
    assert "manylinux_2_28_x86_64" in platforms and "manylinux_2_29_x86_64" not in platforms
    requested = {a.split("==")[0] for a in downloads[0] if "==" in a}
    assert requested == set(gpu_wheels.GPU_WHEELS) - {"nvidia-resiliency-ext"} | set(gpu_wheels.FALLBACK_WHEELS)
    assert "numpy" not in requested
    assert Path(retag[1]).name == "nvrx_wheel.sh" and retag[3:] == ["0.7.0", "py3", "none"]


def test_versions_are_the_projects_pins_and_pydantic_core_the_one_pydantic_requires():
    import importlib.metadata

    versions = gpu_wheels.pinned_versions()
    assert list(versions) == [*gpu_wheels.GPU_WHEELS, *gpu_wheels.FALLBACK_WHEELS]
    assert versions["nvidia-resiliency-ext"] == pinned_version("nvidia-resiliency-ext")
    assert versions["pydantic"] == pinned_version("pydantic")
    required = [r for r in importlib.metadata.requires("pydantic") or [] if r.startswith("pydantic-core")]
    assert required == [f"pydantic-core=={versions['pydantic-core']}"]


def test_the_listing_states_each_size_and_the_total_and_refuses_a_set_over_the_limit(tmp_path):
    wheels = [
        _wheel(tmp_path, "grpcio-1.85.4-cp312-cp312-manylinux_2_17_x86_64.whl", size=40 << 20),
        _wheel(tmp_path, "rich-15.0.0-py3-none-any.whl", size=3 << 19),
    ]
    lines, total, fits = gpu_wheels.listing(wheels)
    assert total == sum(w.stat().st_size for w in wheels) and fits
    assert lines[-1] == f"{total / (1 << 20):8.2f} MiB  total (limit 64 MiB)"
    _wheel(tmp_path, "grpcio-1.85.4-cp313-cp313-manylinux_2_17_x86_64.whl", size=23 << 20)
    assert gpu_wheels.listing(gpu_wheels.wheels_in(tmp_path))[2] is False
    done = subprocess.run(
        [sys.executable, "scripts/gpu_wheels.py", "list", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert re.fullmatch(r"gpu_wheels: .* is over the 64 MiB .*GPU_WHEELS in scripts/gpu_wheels.py\)\n", done.stderr)


def test_two_versions_of_one_distribution_are_refused(tmp_path):
    _wheel(tmp_path, "rich-15.0.0-py3-none-any.whl")
    _wheel(tmp_path, "rich-14.0.0-py3-none-any.whl")
    with pytest.raises(ValueError, match="holds rich 14.0.0 and 15.0.0: carry one version of each"):
        gpu_wheels.carried_in(tmp_path)


def test_install_plan_runs_as_a_file_without_tomllib_or_packaging(tmp_path):
    """As on the GPU machine, which may run CPython 3.10 (no tomllib) and lack packaging (pip's own
    copy stands in): the plan for this interpreter, one tab-separated line per distribution."""
    import importlib.metadata

    have = importlib.metadata.version("pydantic")
    _wheel(tmp_path, f"pydantic-{have}-py3-none-any.whl")
    _wheel(tmp_path, "rich-15.0.0-py3-none-any.whl")
    blocked = (
        "import runpy, sys; sys.modules['tomllib'] = sys.modules['packaging'] = None; "
        f"sys.argv = ['gpu_wheels.py', 'install-plan', {str(tmp_path)!r}]; "
        "runpy.run_path('scripts/gpu_wheels.py', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-E", "-c", blocked], cwd=REPO_ROOT, capture_output=True, text=True)
    # Nothing else was carried: the distributions the smoke imports that this venv has are kept,
    # and none is missing here.
    assert done.returncode == 0, done.stderr
    assert f"keep\tpydantic\t{have}\tinstalled, meets any version\n" in done.stdout
    assert all(line.count("\t") == 3 for line in done.stdout.splitlines())
