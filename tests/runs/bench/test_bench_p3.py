"""`nvrx-eks bench` through the whole command on one small real scenario (P3): ft_launcher's
restart against a full relaunch. The derived numbers, schedules and option errors:
tests/unit/bench/test_bench.py."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair, processes_mentioning


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_p3_through_the_command_ft_launcher_against_a_full_relaunch(tmp_path, tmp_path_factory):
    """One sigkill, once recovered by ft_launcher and once by relaunching the whole job: both
    recoveries are found in the real event logs, the relaunch really was a new job (new launcher,
    restart count 0 again), and the JSON, chart and acceptance lines are written."""
    from nvrx_eks.bench.suite import run_bench
    from workloads.events import load_run

    out = tmp_path / "bench"
    with exclusive_trainer_runs(tmp_path_factory), open(os.devnull, "w") as sink:
        # One rank and synchronous checkpoints (no checkpoint worker to start with each
        # process): the cheapest runs that still take both recovery paths.
        result = run_bench(
            quick=True,
            out=out,
            scenarios="p3",
            command="test",
            repeats=1,
            nproc=1,
            overrides=["checkpoint.backend=sync"],
            console=Console(file=sink),
            ports=port_pair,
        )
    assert result["errors"] == {}
    p3 = json.loads((out / "bench.json").read_text())["p3"]
    assert (out / "p3.png").stat().st_size > 10_000
    assert p3["relaunches"] == 1
    for side in ("ft_launcher", "full_relaunch"):
        (recovery,) = p3[side]["recoveries"]
        assert recovery["path"] == "new processes" and recovery["fault"] == p3["schedule"]
        assert 0 < recovery["respawn_s"] < recovery["restart_s"] < recovery["first_step_s"]
        assert recovery["resumed_from_step"] >= 1  # resumed from a checkpoint, not from scratch
    cycles = {e["cycle"] for e in load_run(out / "runs" / "p3-ft-launcher").of("run_start")}
    assert cycles == {0, 1}  # the launcher restarted its workers
    relaunched = load_run(out / "runs" / "p3-full-relaunch").of("run_start")
    assert {e["cycle"] for e in relaunched} == {0} and len({e["pid"] for e in relaunched}) == 2
    assert p3["ratio"] == pytest.approx(
        p3["full_relaunch"]["medians"]["first_step_s"] / p3["ft_launcher"]["medians"]["first_step_s"]
    )
    checks = {c["condition"]: c for c in result["checks"]}
    assert "P3: ft_launcher recovery faster than a full relaunch" in checks
    assert checks["no process left behind"]["ok"]
    assert processes_mentioning(str(out)) == []
    assert not list((out / "runs").glob("*/checkpoints"))  # dropped after the analysis
