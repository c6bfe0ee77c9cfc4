"""scripts/gpu-smoke-device.sh, the GPU smoke as run on a bare GPU machine, end to end in its CPU dry
run: the carried wheels' install step (here every wheel is already satisfied, so nothing is fetched
or installed), the environment record and import probe, the smoke within its budget, and OUT_DIR
holding the report and small logs while the runs and their checkpoints stay outside it; that one
dry run also holds the smoke's own checks (every phase passed). Without a trainer run: a failed
probe is exit 3 with its reason, and the install falls back to a folder on PYTHONPATH. In fresh
virtualenvs of other CPythons: scripts/gpu_smoke_venvs.sh."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu-smoke-device.sh"
#: What OUT_DIR may hold: a GPU machine returns at most 8 files.
OUT_FILES = {"gpu_smoke.json", "smoke.log", "run_tails.txt", "env.txt", "install.log"}
#: The probe's bound on the GPU machine is 15 s; on a CI machine's 2 shared cores importing torch
#: and NVRx can take longer.
PROBE_TIMEOUT = {"GPU_SMOKE_PROBE_TIMEOUT_S": "120"}


@dataclass(frozen=True)
class DeviceDryRun:
    """The device script's dry run, as it ended."""

    done: subprocess.CompletedProcess[str]
    took_s: float
    out: Path
    runs_parent: Path
    #: The version of the distribution whose wheel the script was handed (and must skip).
    pydantic: str

    @property
    def report(self) -> dict:
        return json.loads((self.out / "gpu_smoke.json").read_text())


@pytest.fixture(scope="module")
def device_dry_run(tmp_path_factory) -> DeviceDryRun:
    """One dry run of the whole script, within a 120 s budget: what the GPU machine runs, and the
    smoke's every phase on CPU, read by the tests of both."""
    import sys

    from tests.support.trainer_fixtures import exclusive_trainer_runs

    tmp_path = tmp_path_factory.mktemp("device-dry-run")
    # A wheel of a distribution this interpreter has at that version: skipped, never handed to pip
    # (it is no real wheel, so an install would fail the script with exit 3).
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pydantic = importlib.metadata.version("pydantic")
    (wheels / f"pydantic-{pydantic}-py3-none-any.whl").write_bytes(b"not installed")
    runs_parent = tmp_path / "runs"
    runs_parent.mkdir()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_WHEELS_DIR": str(wheels),
        "GPU_SMOKE_RUNS_PARENT": str(runs_parent),
        **PROBE_TIMEOUT,
    }
    with exclusive_trainer_runs(tmp_path_factory):
        began = time.monotonic()
        done = subprocess.run(
            [str(SCRIPT), str(out), "--dry-run", "--budget-s", "120"],
            cwd=tmp_path,  # the script finds the checkout itself
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        took_s = time.monotonic() - began
    return DeviceDryRun(done, took_s, out, runs_parent, pydantic)


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_the_device_scripts_dry_run_reports_into_out_dir_and_keeps_the_checkpoints_outside(device_dry_run):
    done, out, pydantic = device_dry_run.done, device_dry_run.out, device_dry_run.pydantic
    report = device_dry_run.report
    assert done.returncode == (0 if report["ok"] else 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert report["complete"] and report["budget_s"] == 120 and report["mode"].startswith("dry-run")
    assert list(report["checks"]) == ["faults", "resume", "stall", "memory"]
    assert report["checks"]["faults"]["ok"], report
    # Inside the budget and the script's own start-up (the install plan, the environment record).
    assert device_dry_run.took_s < 120 + 30, device_dry_run.took_s

    assert {p.name for p in out.iterdir()} == OUT_FILES
    install = (out / "install.log").read_text()
    assert f"keep\tpydantic\t{pydantic}\tinstalled, meets any version" in install
    assert "nothing to install" in install
    record = (out / "env.txt").read_text()
    for line in ("glibc:", "python: ", "nvidia-resiliency-ext: 0.7.0", "pydantic: ", "torch: ", "/dev/shm"):
        assert line in record, (line, record)
    assert "import workloads.train: " in record and "imports took: " in record
    assert "ft_launcher as the runner starts it: " in record
    tails = (out / "run_tails.txt").read_text()
    assert "faulted/launcher.log, last 200 lines" in tails and "events/rank0.jsonl, last 40 lines" in tails
    assert "GPU smoke: dry-run" in (out / "smoke.log").read_text()
    assert sum(p.stat().st_size for p in out.iterdir()) < 1 << 20

    # The checkpoints are in the runs' folder, none in OUT_DIR.
    (work,) = device_dry_run.runs_parent.iterdir()
    committed = [p for p in (work / "smoke" / "faulted").rglob("*") if p.name == ".metadata"]
    assert committed, "the faulted run left no checkpoint where the runs go"
    assert not [p for p in out.rglob("*") if p.is_dir()]
    assert f"runs and checkpoints in {work}" in done.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_the_dry_run_passes_every_check(device_dry_run):
    """The smoke's dry mode, run by the device script: the same code path as on a GPU machine
    (ft_launcher, the real trainer, NVRx checkpoints, faults, resume, stall and memory checks), on
    CPU with gloo. That smoke() returns what it writes: tests/ops/test_gpu_smoke_budget.py."""
    from nvrx_eks.ops.gpu_smoke import plan_for

    result = device_dry_run.report
    checks = result["checks"]
    assert result["ok"], checks
    assert checks["faults"]["inprocess_restarts"] == 2 and checks["faults"]["same_pids"]
    assert checks["faults"]["backend"] == "gloo" and checks["faults"]["wall_s"] > 0
    assert checks["resume"]["resumed_from_step"] == plan_for(True, None, None).steps
    assert checks["stall"]["async_median_s"] is not None and checks["stall"]["sync_median_s"] is not None
    # No GPU here: nothing may stand in for the measurement.
    assert checks["memory"]["peak_reserved_gib"] is None and checks["memory"]["estimate_gib"] > 0
    assert result["mode"].startswith("dry-run") and result["precision"] == "fp32"
    assert result["complete"] and result["skipped"] == []
    # Each launch's throughput is measured; MFU needs a GPU's peak, so none here.
    for name in ("faults", "resume", "stall"):
        assert checks[name]["tokens_per_s_per_rank"] > 0 and checks[name]["mfu"] is None


def _is_coordinator(pid: int) -> bool:
    import psutil

    try:
        return "workloads.coordinator" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_a_smoke_past_its_timeout_still_leaves_its_report_and_no_process(tmp_path, tmp_path_factory):
    """The script's timeout (budget + grace) stops the smoke mid-launch: the report of what ran and
    the logs still land in OUT_DIR, the exit code is timeout's, and no process of the runs is left
    on the machine (the next run needs its GPU)."""
    import sys

    from tests.support.trainer_fixtures import exclusive_trainer_runs, processes_mentioning

    runs_parent = tmp_path / "runs"
    runs_parent.mkdir()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_WHEELS_DIR": str(tmp_path / "no-wheels"),
        "GPU_SMOKE_RUNS_PARENT": str(runs_parent),
        "GPU_SMOKE_GRACE_S": "19",
        **PROBE_TIMEOUT,
    }
    with exclusive_trainer_runs(tmp_path_factory):
        done = subprocess.run(
            [str(SCRIPT), str(out), "--dry-run", "--budget-s", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        left = processes_mentioning(str(runs_parent))
        # A launch's coordinator names no run folder: the pidfile its runner wrote says which it is.
        coordinators = [int(f.read_text()) for f in runs_parent.rglob("pids/coordinator.pid")]
        left += [pid for pid in coordinators if _is_coordinator(pid)]
    # 124: the smoke stopped its launch on the SIGTERM and wrote what it had; 137: the stop took
    # longer than the SIGKILL's delay (a loaded machine), the trap then killed what was left.
    assert done.returncode in (124, 137), done.stdout[-3000:] + done.stderr[-3000:]
    assert left == []
    logs = OUT_FILES - {"gpu_smoke.json"}
    assert logs <= {p.name for p in out.iterdir()} <= OUT_FILES
    if done.returncode == 124:
        report = json.loads((out / "gpu_smoke.json").read_text())
        assert report["ok"] is False and report["complete"] is False and list(report["checks"]) == ["faults"]
    assert "nothing to install" in (out / "install.log").read_text()
    assert "faulted/launcher.log, last 200 lines" in (out / "run_tails.txt").read_text()


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
    import importlib.metadata

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
