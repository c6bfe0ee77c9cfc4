"""The GPU smoke script's refusals, and what a smoke killed after its first phase leaves. Its dry
mode end to end (the real trainer under ft_launcher, every phase passing) is
tests/runs/ops/test_gpu_smoke_device.py's, whose device script runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops.gpu_smoke import smoke


def test_without_a_gpu_the_real_mode_refuses_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="--dry-run"):
        smoke(out_dir=tmp_path / "x")


def test_the_command_hands_its_budget_to_the_smoke(tmp_path):
    """`nvrx-eks gpu-smoke --budget-s` reaches the smoke's own check. A dry run within a 120 s
    budget, end to end, is tests/runs/ops/test_gpu_smoke_device.py's (the device script runs it)."""
    from tests.support.cli_harness import run_cli

    result = run_cli("gpu-smoke", "--dry-run", "--budget-s", "0", "--out", str(tmp_path / "smoke"))
    assert result.code == 2 and "--budget-s: 0 is not above 0" in result.stderr
    assert not (tmp_path / "smoke").exists()


#: A smoke whose launches are replaced: the faults phase returns a run of gloo ranks after 0.2 s,
#: and the resume phase's launch SIGKILLs the smoke's process, as a machine lost mid-smoke would.
KILLED_AFTER_ITS_FIRST_PHASE = """
import os, signal, sys, time
from pathlib import Path
from rich.console import Console
from nvrx_eks.ops import gpu_smoke
from workloads.events import RunEvents

def launch(plan, run_dir, *, steps, faults, backend, resume, console):
    if resume:
        os.kill(os.getpid(), signal.SIGKILL)
    run_dir.mkdir(parents=True, exist_ok=True)
    time.sleep(0.2)
    t0 = time.time()
    events = [
        {"event": "run_start", "rank": 0, "pid": 7, "t": t0, "backend": "gloo"},
        {"event": "setup_end", "rank": 0, "pid": 7, "t": t0 + 0.5, "resumed_from_step": 0},
        {"event": "step_end", "rank": 0, "pid": 7, "t": t0 + 1, "step": 1, "step_s": 0.5, "loss": 5.0,
         "tokens_per_s": 2048.0, "tokens_per_s_per_gpu": 1024.0, "mfu": None},
    ]
    return {"exit_code": 0, "run": RunEvents(events), "summary": {"checkpoints": {"median_stall_s": 0.1}}}

gpu_smoke._run = launch
with open(os.devnull, "w") as sink:
    gpu_smoke.smoke(out_dir=Path(sys.argv[1]), dry_run=True, console=Console(file=sink))
"""


def test_a_smoke_killed_after_its_first_phase_leaves_that_phase_in_the_report(tmp_path):
    from tests.support import REPO_ROOT

    out = tmp_path / "smoke"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_ITS_FIRST_PHASE, str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    report = json.loads((out / "gpu_smoke.json").read_text())
    assert report["complete"] is False and report["ok"] is False
    assert list(report["checks"]) == ["faults"]
    assert report["checks"]["faults"]["backend"] == "gloo" and report["checks"]["faults"]["wall_s"] > 0
    assert not (out / "gpu_smoke.json.tmp").exists()
