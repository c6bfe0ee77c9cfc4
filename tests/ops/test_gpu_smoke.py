"""The GPU smoke script's dry mode: the same code path as on a GPU machine (ft_launcher, the real
trainer, NVRx checkpoints, faults, resume, stall and memory checks), on CPU with gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops.gpu_smoke import plan_for, smoke

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def test_dry_run_passes_every_check_and_writes_the_json(tmp_path, tmp_path_factory):
    from rich.console import Console

    from tests.support.trainer_fixtures import exclusive_trainer_runs

    with exclusive_trainer_runs(tmp_path_factory), open(tmp_path / "console.txt", "w") as sink:
        result = smoke(out_dir=tmp_path / "smoke", dry_run=True, console=Console(file=sink))
    written = json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text())
    assert written == result
    checks = result["checks"]
    assert result["ok"], checks
    assert checks["faults"]["inprocess_restarts"] == 2 and checks["faults"]["same_pids"]
    assert checks["faults"]["backend"] == "gloo"
    assert checks["resume"]["resumed_from_step"] == plan_for(True, None, None).steps
    assert checks["stall"]["async_median_s"] is not None and checks["stall"]["sync_median_s"] is not None
    # No GPU here: nothing may stand in for the measurement.
    assert checks["memory"]["peak_reserved_gib"] is None and checks["memory"]["estimate_gib"] > 0
    assert result["mode"].startswith("dry-run") and result["precision"] == "fp32"
    assert result["complete"] and result["skipped"] == []
    # Each launch's throughput is measured; MFU needs a GPU's peak, so none here.
    for name in ("faults", "resume", "stall"):
        assert checks[name]["tokens_per_s_per_rank"] > 0 and checks[name]["mfu"] is None


def test_without_a_gpu_the_real_mode_refuses_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="--dry-run"):
        smoke(out_dir=tmp_path / "x")


def test_the_command_hands_its_budget_to_the_smoke(tmp_path):
    """`nvrx-eks gpu-smoke --budget-s` reaches the smoke's own check. A dry run within a 120 s
    budget, end to end, is tests/ops/test_gpu_smoke_device.py's (the device script runs it)."""
    from tests.support.cli_harness import run_cli

    result = run_cli("gpu-smoke", "--dry-run", "--budget-s", "0", "--out", str(tmp_path / "smoke"))
    assert result.code == 2 and "--budget-s: 0 is not above 0" in result.stderr
    assert not (tmp_path / "smoke").exists()


def test_a_smoke_killed_after_its_first_phase_leaves_that_phase_in_the_report(tmp_path, tmp_path_factory):
    from tests.support import REPO_ROOT
    from tests.support.trainer_fixtures import exclusive_trainer_runs, processes_mentioning

    out = tmp_path / "smoke"
    report_path = out / "gpu_smoke.json"
    argv = [sys.executable, "-m", "nvrx_eks.ops.gpu_smoke", "--dry-run", "--out", str(out)]
    with exclusive_trainer_runs(tmp_path_factory), open(tmp_path / "smoke.log", "w") as log:
        smoke_process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        doomed: list[psutil.Process] = []
        try:
            deadline = time.monotonic() + 240
            while not report_path.is_file() and smoke_process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert smoke_process.poll() is None, "the smoke ended before it could be killed"
            # The launchers run in their own sessions: kill them by pid too, as a killed node would.
            doomed = psutil.Process(smoke_process.pid).children(recursive=True)
            os.kill(smoke_process.pid, signal.SIGKILL)
        finally:
            smoke_process.kill()
            smoke_process.wait()
            leftovers = {p.pid: p for p in [*doomed, *processes_mentioning(str(out))]}
            for process in leftovers.values():
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(list(leftovers.values()), timeout=30)
    report = json.loads(report_path.read_text())
    assert report["complete"] is False and report["ok"] is False
    assert list(report["checks"]) == ["faults"]
    assert report["checks"]["faults"]["backend"] == "gloo" and report["checks"]["faults"]["wall_s"] > 0
    assert not (out / "gpu_smoke.json.tmp").exists()
