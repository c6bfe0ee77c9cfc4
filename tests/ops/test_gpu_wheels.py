"""The wheels carried to a bare GPU machine (scripts/gpu_wheels.py), without downloading any: their
versions follow the project's pins, their listing states the total and refuses one over what
travels, and the install on the machine leaves out what is already there at a compatible version."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest

from scripts import gpu_wheels
from scripts.trainer_requirements import pinned_version
from tests.support import REPO_ROOT


def _wheel(directory, name: str, size: int = 1):
    path = directory / name
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_versions_are_the_projects_pins_and_pydantic_core_the_one_pydantic_requires():
    versions = gpu_wheels.pinned_versions()
    assert list(versions) == list(gpu_wheels.GPU_WHEELS)
    assert versions["nvidia-resiliency-ext"] == pinned_version("nvidia-resiliency-ext")
    assert versions["pydantic"] == pinned_version("pydantic")
    required = [r for r in importlib.metadata.requires("pydantic") or [] if r.startswith("pydantic-core")]
    assert required == [f"pydantic-core=={versions['pydantic-core']}"]
    specs = gpu_wheels.requirement_specs()
    assert specs["rich"] == f"=={versions['rich']}"  # a pin of the project's own dependencies
    assert gpu_wheels.satisfies(versions["numpy"], specs["numpy"])  # a >= range: what this checkout runs


def test_the_listing_states_each_size_and_the_total_and_refuses_a_set_over_the_limit(tmp_path):
    wheels = [
        _wheel(tmp_path, "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl", 40 << 20),
        _wheel(tmp_path, "rich-15.0.0-py3-none-any.whl", 3 << 19),
    ]
    lines, total, fits = gpu_wheels.listing(wheels)
    assert total == (40 << 20) + (3 << 19) and fits
    assert lines == [
        "   40.00 MiB  numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl",
        "    1.50 MiB  rich-15.0.0-py3-none-any.whl",
        "   41.50 MiB  total (limit 64 MiB)",
    ]
    _wheel(tmp_path, "grpcio-1.85.3-cp312-cp312-manylinux_2_17_x86_64.whl", 23 << 20)
    assert gpu_wheels.listing(gpu_wheels.wheels_in(tmp_path))[2] is False
    done = subprocess.run(
        [sys.executable, "scripts/gpu_wheels.py", "list", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "64.50 MiB  total (limit 64 MiB)" in done.stdout
    assert re.fullmatch(r"gpu_wheels: .* is over the 64 MiB .*GPU_WHEELS in scripts/gpu_wheels.py\)\n", done.stderr)


def test_the_install_keeps_what_is_there_at_a_compatible_version(tmp_path):
    wheels = [
        _wheel(tmp_path, "pydantic-2.14.4-py3-none-any.whl"),
        _wheel(tmp_path, "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl"),
        _wheel(tmp_path, "nvidia_resiliency_ext-0.7.0-cp312-cp312-manylinux_2_39_x86_64.whl"),
        _wheel(tmp_path, "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl"),
        _wheel(tmp_path, "idna-3.20-py3-none-any.whl"),
    ]
    installed = {"pydantic": "2.14.4", "numpy": "2.5.2", "nvidia-resiliency-ext": "0.4.1", "idna": "3.7"}
    specs = {"pydantic": "==2.14.4", "numpy": ">=1.26", "nvidia-resiliency-ext": "==0.7.0"}
    plan = {wheel.name.split("-")[0]: action for wheel, action in gpu_wheels.install_plan(wheels, installed, specs)}
    assert plan == {
        "pydantic": "skip: pydantic 2.14.4 is installed",
        "numpy": "skip: numpy 2.5.2 is installed and meets >=1.26",
        "nvidia_resiliency_ext": "install",  # the pin is not met: the carried 0.7.0 replaces it
        "pydantic_core": "install",  # not there
        "idna": "install",  # another version, and the project states none: the tested set wins
    }


@pytest.mark.parametrize(
    ("installed", "spec", "met"),
    [
        ("2.11.0+cu130", ">=2.11", True),
        ("2.10.1", ">=2.11", False),
        ("6.0.4", ">=6.0,<7", False),  # a form the check does not read: install the carried wheel
        ("0.7.0", "==0.7.0", True),
        ("0.7.1", "==0.7.0", False),
        ("1.26.0", ">=1.26", True),
    ],
)
def test_specifiers(installed, spec, met):
    assert gpu_wheels.satisfies(installed, spec) is met


def test_install_plan_runs_as_a_file_and_prints_only_what_to_install(tmp_path):
    """As on the GPU machine: standard library only, the project not importable as a package."""
    have = importlib.metadata.version("pydantic")
    _wheel(tmp_path, f"pydantic-{have}-py3-none-any.whl")
    _wheel(tmp_path, "defusedxml-0.0.1-py3-none-any.whl")
    done = subprocess.run(
        [sys.executable, "-E", "scripts/gpu_wheels.py", "install-plan", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"{tmp_path / 'defusedxml-0.0.1-py3-none-any.whl'}\n"
    assert f"pydantic-{have}-py3-none-any.whl: skip: pydantic {have} is installed" in done.stderr
