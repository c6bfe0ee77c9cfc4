"""The node-local tier end to end when it cannot be used (`nvrx-eks local`, tiny preset, few steps):

resume with another preset   refused by the preflight before any rank starts (the FSx commit
                             names the preset), and, with no FSx commit yet, by the local copies'
                             own identity: exit 93 naming model.preset after one launcher cycle,
                             instead of a shape error in every restart until ft_launcher gives up
a root that cannot be made   the tier turns itself off (one event naming checkpoint.local.dir)
                             and the run completes on the FSx tier (the shared run variants-2x12,
                             whose local root is under /dev/null)
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import assert_nothing_left, exclusive_trainer_runs, port_pair
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def _run(run_dir: Path, *, preset: str = "tiny", resume: bool = False, **kwargs) -> tuple[int, dict, str]:
    from nvrx_eks.local.runner import LocalRun, run_local

    out = io.StringIO()
    settings = {"nodes": 2, "nproc": 1, "steps": 6, "checkpoint_interval": 3, "local_interval": 2, **kwargs}
    run = LocalRun(faults="", run_dir=run_dir, preset=preset, backend="nvrx", resume=resume, port=port_pair(),
                   **settings)  # fmt: skip
    code = run_local(run, console=Console(file=out, width=200))
    return code, json.loads((run_dir / "local_run.json").read_text()), out.getvalue()


def test_a_resume_with_another_preset_is_refused_by_the_preflight_then_by_the_local_copies(tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    with exclusive_trainer_runs(tmp_path_factory):
        code, _, _ = _run(run_dir)
        assert code == 0
        assert list((run_dir / "local-node1").glob("step_*/rank1.json"))

        # The FSx commit names the preset: the pod's preflight refuses before any rank starts.
        code, record, out = _run(run_dir, preset="small", resume=True, steps=8)
        assert code == EXIT_DO_NOT_REQUEUE, out
        assert "preset='tiny', this run has preset='small'; resume with the same model.preset" in record["stopped_by"]
        assert "preflight refused the run: no rank was started" in out
        assert record["processes_seen"] == 0
        assert not [e for e in load_run(run_dir).events if e["t"] >= record["started_at"]]

        # Only the node-local copies are left (the first FSx save not reached yet): their own
        # identity refuses the resume, in the first launcher cycle.
        shutil.rmtree(run_dir / "checkpoints")
        code, record, out = _run(run_dir, preset="small", resume=True, steps=8)
    assert code == EXIT_DO_NOT_REQUEUE, out + (run_dir / "launcher.log").read_text()[-3000:]
    assert record["stopped_by"].startswith("checkpoint.local.dir: the node-local copy "), record
    assert (
        "was written with preset='tiny', this run has preset='small'; resume with the same model.preset"
        in (record["stopped_by"])
    )
    mine = [e for e in load_run(run_dir).events if e["t"] >= record["started_at"]]
    assert {e["cycle"] for e in mine} == {0} and {e["iteration"] for e in mine} == {0}
    assert not [e for e in mine if e["event"] in ("step_end", "local_restore", "checkpoint_load")]
    assert_nothing_left(run_dir, record)


def test_a_local_root_that_cannot_be_created_turns_the_tier_off_and_the_run_completes(tmp_path_factory):
    # Under a file that is not a directory, mkdir fails (ENOTDIR) even for root, whom chmod does not stop.
    spec = RUNS["variants-2x12"]
    (root,) = [o.removeprefix("checkpoint.local.dir=") for o in spec.overrides if o.startswith("checkpoint.local.dir=")]
    assert Path(root).parent == Path("/dev/null") and "checkpoint.local.interval_steps=2" in spec.overrides
    run_dir = named_run(tmp_path_factory, "variants-2x12")
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["exit_code"] == 0, (run_dir / "launcher.log").read_text()[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["final_step"] == spec.steps
    run = load_run(run_dir)
    (disabled,) = run.of("local_tier_disabled")
    assert disabled["rank"] == 0
    assert disabled["reason"].startswith(f"rank 0: checkpoint.local.dir {root} cannot be created: ")
    assert "Not a directory" in disabled["reason"]
    assert not run.of("local_save") and run.of("checkpoint_commit")
    assert not [e for e in run.events if e["event"] == "restart_end"]
    assert_nothing_left(run_dir, record)
