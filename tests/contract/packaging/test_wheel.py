"""The wheel built from the repository installs and runs outside the checkout: `nvrx-eks render`
prints the same valid JobSet as the checkout, and the commands that drive the CDK app say that they
need the checkout (exit 2) instead of failing on a missing file.

Offline: the wheel is built with this virtualenv's setuptools (no build isolation, no index) from
a copy of the tracked files, and installed without dependencies into a fresh virtualenv that sees
this one's third-party packages through a .pth file, which adds their folder but not the editable
install's finder, so only the wheel can provide the project's own packages.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT, checkout_files

# One worker builds the wheel once for the whole module.
pytestmark = pytest.mark.xdist_group("wheel")

#: The project's top-level packages, as they sit in the checkout and in the wheel.
CODE_FOLDERS = ("nvrx_eks", "infra", "workloads")
#: How the checkout's folders land in the wheel (pyproject's package-dir).
PACKAGE_DATA = {"templates": "nvrx_eks/templates", "infra/profiles": "infra/profiles"}
OUTSIDE_CHECKOUT_MESSAGE = "needs the nvrx-eks repository checkout"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    bin: Path
    env: dict[str, str]


def _pip(*args: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    # What a fresh clone holds: the build must not depend on build/ or egg-info left in the checkout.
    source = root / "source"
    for path in checkout_files():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / path, source / path)
    dist = root / "dist"
    _pip("wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist))
    (wheel,) = dist.glob("nvrx_eks-*.whl")

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A directory named in a .pth joins sys.path, but the .pth files inside it are not run: the
    # editable install's finder (a .pth in this virtualenv) stays out of the fresh one.
    ours = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (Path(purelib) / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    _pip("--python", str(python), "install", "--no-deps", "--no-index", str(wheel))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return Installed(wheel=wheel, bin=venv / "bin", env=env)


def _run(installed: Installed, *argv: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(installed.bin / argv[0]), *argv[1:]],
        cwd=cwd,
        env=installed.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_wheel_holds_every_module_template_and_profile(installed):
    """pyproject lists the packages by name (templates/ is mapped into nvrx_eks): a package or
    data file left out of that list would be missing from the installed product."""
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = set()
    for path in checkout_files():
        if path.startswith(tuple(f"{folder}/" for folder in CODE_FOLDERS)) and path.endswith(".py"):
            expected.add(path)
        for folder, packaged in PACKAGE_DATA.items():
            if path.startswith(f"{folder}/") and not path.endswith(".py"):
                expected.add(packaged + path[len(folder) :])
    assert {p for p in expected if p.startswith("nvrx_eks/templates/")}, "no template in the checkout?"
    assert expected - names == set(), f"missing from the wheel: {sorted(expected - names)}"


def test_the_installed_packages_come_from_the_wheel(installed, tmp_path):
    modules = ["infra", "nvrx_eks", "nvrx_eks.templates", "workloads"]
    probe = f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules!r}))"
    result = _run(installed, "python", "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for module_file in result.stdout.split():
        assert not Path(module_file).is_relative_to(REPO_ROOT), f"{module_file} is the checkout's, not the wheel's"


def test_render_from_the_wheel_prints_the_checkouts_valid_jobset(installed, tmp_path):
    rendered = _run(installed, "nvrx-eks", "render", "--nodes", "2", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert "JobSet" in kinds, kinds
    checkout = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.cli", "render", "--nodes", "2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rendered.stdout == checkout.stdout, "the wheel renders another manifest than the checkout"
    validated = _run(installed, "nvrx-eks", "validate", "-", cwd=tmp_path, stdin=rendered.stdout)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "valid" in validated.stdout


@pytest.mark.parametrize("command", [["synth"], ["teardown", "--yes"]])
def test_cdk_commands_from_the_wheel_say_they_need_the_checkout(installed, tmp_path, command):
    """Both run the CDK app (cdk.json, node_modules): outside the checkout they stop before doing
    anything, with exit 2 and the fix, not a traceback or a half-done teardown."""
    result = _run(installed, "nvrx-eks", *command, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert OUTSIDE_CHECKOUT_MESSAGE in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
