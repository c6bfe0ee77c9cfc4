"""scripts/gpu-smoke-device.sh, the GPU smoke as run on a bare GPU machine, end to end in its CPU dry
run: the carried wheels' install step (here every wheel is already satisfied, so nothing is fetched
or installed), the environment record and import probe, the smoke within its budget, and OUT_DIR
holding the report and small logs while the runs and their checkpoints stay outside it; that one
dry run also holds the smoke's own checks (every phase passed); and a smoke past its timeout.
The script's refusals, probe and install without a trainer run:
tests/unit/ops/test_gpu_smoke_device_script.py. In fresh virtualenvs of other CPythons:
scripts/gpu_smoke_venvs.sh."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.ops.test_gpu_smoke_device_script import PROBE_TIMEOUT, SCRIPT

#: What OUT_DIR may hold: a GPU machine returns at most 8 files.
OUT_FILES = {"gpu_smoke.json", "smoke.log", "run_tails.txt", "env.txt", "install.log"}


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
    CPU with gloo. That smoke() returns what it writes: tests/unit/ops/test_gpu_smoke_budget.py."""
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
