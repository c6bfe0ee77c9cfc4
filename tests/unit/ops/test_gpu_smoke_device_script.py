"""scripts/gpu-smoke-device.sh, the GPU smoke as run on a bare GPU machine, without a trainer run: it
refuses OUT in its arguments, a failed import probe is exit 3 with its reason before any launch,
what a requirement refuses is installed by name into a folder on PYTHONPATH, it asks for the small
preset unless told another, and it and the virtualenv script are shellcheck clean. Its dry run end
to end: tests/runs/ops/test_gpu_smoke_device.py."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

from tests.support import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu-smoke-device.sh"
#: The probe's bound on the GPU machine is 15 s; on a CI machine's 2 shared cores importing torch
#: and NVRx can take longer.
PROBE_TIMEOUT = {"GPU_SMOKE_PROBE_TIMEOUT_S": "120"}


def test_the_device_script_refuses_out_in_its_arguments(tmp_path):
    done = subprocess.run(
        [str(SCRIPT), str(tmp_path / "out"), "--dry-run", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        env={**os.environ, "GPU_SMOKE_RUNS_PARENT": str(tmp_path)},
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: --out: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_the_device_script_is_shellcheck_clean():
    from tests.support.shell_lint import assert_shellcheck_clean

    assert_shellcheck_clean(SCRIPT.read_text(), shell="bash", name="gpu-smoke-device.sh")


def _device_script(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [str(SCRIPT), str(tmp_path / "out"), *args],
        env={
            **os.environ,
            "PYTHON": sys.executable,
            "GPU_WHEELS_DIR": str(tmp_path / "wheels"),
            "GPU_SMOKE_RUNS_PARENT": str(tmp_path),
            **PROBE_TIMEOUT,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_import_the_smoke_needs_failing_is_exit_3_with_the_reason_before_any_launch(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pydantic.py").write_text("raise ImportError('pydantic is broken here')\n")
    done = _device_script(tmp_path, "--dry-run", PYTHONPATH=str(broken))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    reason = done.stderr.strip().splitlines()[0]
    assert re.fullmatch(r"gpu-smoke-device: not ready: import \S+: ImportError: pydantic is broken here", reason)
    out = tmp_path / "out"
    assert {"env.txt", "install.log"} <= {p.name for p in out.iterdir()} and not (out / "gpu_smoke.json").exists()
    record = (out / "env.txt").read_text()
    assert "FAILED ImportError: pydantic is broken here" in record and record.rstrip().endswith(reason)
    assert not list(tmp_path.glob(".gpu-smoke-runs.*/smoke/faulted"))  # nothing launched


def _installable_wheel(directory: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A wheel pip installs: metadata only, no module (the interpreter's own copy stays the one
    imported)."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": "\n".join(
            [
                "Metadata-Version: 2.1",
                f"Name: {name}",
                f"Version: {version}",
                *[f"Requires-Dist: {r}" for r in requires],
            ]
        )
        + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_what_a_requirement_refuses_is_installed_by_name_into_a_folder_on_pythonpath(tmp_path):
    """GPU_SMOKE_INSTALL=target, as when the interpreter's environment is not writable: the carried
    NVRx's own requirement refuses the installed defusedxml, so the carried one is installed, by
    name, into a folder of the runs the smoke then finds through PYTHONPATH; nothing else is."""

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    nvrx = importlib.metadata.version("nvidia-resiliency-ext")
    _installable_wheel(wheels, "nvidia_resiliency_ext", nvrx, ["defusedxml>=99"])
    _installable_wheel(wheels, "defusedxml", "99.0")
    done = _device_script(tmp_path, "--budget-s", "0", GPU_SMOKE_INSTALL="target")
    install = (tmp_path / "out" / "install.log").read_text()
    assert "install\tdefusedxml\t99.0\t0.7.1 is installed and fails >=99 (nvidia-resiliency-ext)" in install
    assert f"keep\tnvidia-resiliency-ext\t{nvrx}\t" in install
    assert "installed (target): defusedxml==99.0" in install, install
    (site,) = tmp_path.glob(".gpu-smoke-runs.*/site")
    assert (site / "defusedxml-99.0.dist-info").is_dir()
    record = (tmp_path / "out" / "env.txt").read_text()
    assert f"PYTHONPATH: {REPO_ROOT}:{site}" in record
    # The probe passed; the smoke itself then refused --budget-s 0 (exit 2), launching nothing.
    assert done.returncode == 2 and "--budget-s: 0 is not above 0" in (tmp_path / "out" / "smoke.log").read_text()


def test_the_device_script_asks_for_the_small_preset_unless_told_another(tmp_path):
    import sys

    argv_log = tmp_path / "argv.log"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >>{argv_log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    _device_script(tmp_path, "--budget-s", "1", PYTHON=str(wrapper))
    smoke_calls = [line for line in argv_log.read_text().splitlines() if line.startswith("-m nvrx_eks.ops.gpu_smoke")]
    assert len(smoke_calls) == 1 and smoke_calls[0].endswith("--budget-s 1 --preset small")
    argv_log.unlink()
    (tmp_path / "out2").mkdir()
    subprocess.run(
        [str(SCRIPT), str(tmp_path / "out2"), "--preset", "1b", "--budget-s", "1"],
        env={**os.environ, "PYTHON": str(wrapper), "GPU_SMOKE_RUNS_PARENT": str(tmp_path), **PROBE_TIMEOUT},
        capture_output=True,
        timeout=300,
    )
    smoke_calls = [line for line in argv_log.read_text().splitlines() if line.startswith("-m nvrx_eks.ops.gpu_smoke")]
    assert smoke_calls == [f"-m nvrx_eks.ops.gpu_smoke --out {smoke_calls[0].split()[3]} --preset 1b --budget-s 1"]


def test_the_venv_script_is_shellcheck_clean():
    from tests.support.shell_lint import assert_shellcheck_clean

    script = REPO_ROOT / "scripts" / "gpu_smoke_venvs.sh"
    assert_shellcheck_clean(script.read_text(), shell="bash", name="gpu_smoke_venvs.sh")
