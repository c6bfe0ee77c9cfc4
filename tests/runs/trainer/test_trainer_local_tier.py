"""The node-local checkpoint tier end to end: `nvrx-eks local --nodes 2 --nproc 1` (two
ft_launchers, one rendezvous, a local root each), the same faults as the issue's acceptance plus
corrupt-local; and a node whose local storage fills up. Both against the shared clean run of two
nodes (clean-2x1-40: the local tier and the checkpoint interval change no numerics). A copy of the
faulted run is then resumed with another preset: refused by the preflight before any rank starts
(the FSx commit names the preset), and, with no FSx commit left, by the local copies' own identity:
exit 93 naming model.preset after one launcher cycle, instead of a shape error in every restart
until ft_launcher gives up."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.named_runs import named_run, named_summary
from tests.support.trainer_fixtures import (
    assert_nothing_left,
    exclusive_trainer_runs,
    port_pair,
)
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

FAULTS = "exception@13:1,hang@27:0,sigkill@33:0,corrupt-local@25:1"
STEPS, INTERVAL, LOCAL_INTERVAL = 40, 20, 2


def _run(
    run_dir: Path,
    faults: str = "",
    *,
    preset: str = "tiny",
    resume: bool = False,
    steps: int = STEPS,
    out: io.StringIO | None = None,
) -> tuple[int, dict]:
    from nvrx_eks.local.runner import LocalRun, run_local

    run = LocalRun(
        nodes=2,
        nproc=1,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset=preset,
        resume=resume,
        checkpoint_interval=INTERVAL,
        local_interval=LOCAL_INTERVAL,
        backend="nvrx",
        port=port_pair(),
    )
    code = run_local(run, console=Console(file=out if out is not None else io.StringIO(), width=200))
    summary = run_dir / "summary.json"
    return code, json.loads(summary.read_text()) if summary.is_file() else {}


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory) -> tuple[Path, int, dict]:
    """The run with FAULTS: its directory, exit code and summary."""
    run_dir = tmp_path_factory.mktemp("local-tier") / "faulted"
    with exclusive_trainer_runs(tmp_path_factory):
        code, summary = _run(run_dir, FAULTS)
    return run_dir, code, summary


def test_faults_recover_from_the_local_tier_and_end_bit_identical(faulted_run, tmp_path_factory):
    clean_dir = named_run(tmp_path_factory, "clean-2x1-40")
    clean = json.loads((clean_dir / "summary.json").read_text())
    clean_code = json.loads((clean_dir / "local_run.json").read_text())["exit_code"]
    run_dir, code, faulted = faulted_run
    assert clean_code == code == 0
    assert (clean["final_step"], faulted["final_step"]) == (STEPS, STEPS)
    assert faulted["state_sha256"] == clean["state_sha256"]
    assert {f["fault"]: f["lost_steps"] <= 2 for f in faulted["faults"]} == {
        f: True for f in FAULTS.split(",")
    }  # fmt: skip
    run = load_run(run_dir)
    # Each node wrote its own root: replicas crossed simulated nodes.
    for node in (0, 1):
        assert any((run_dir / f"local-node{node}").glob("step_*/rank*.json"))
    # corrupt-local: rank 1's own copy is refused by its SHA-256 and the replica held by rank 0
    # (the other node) takes over.
    skipped = run.of("local_copy_skipped", rank=1)
    assert skipped and skipped[0]["reason"] == "does not match its recorded SHA-256"
    replica = [e for e in run.of("local_restore", rank=1) if e["source"] == "replica"]
    assert replica and replica[0]["from_rank"] == 0 and replica[0]["step"] == 24
    # In-process restarts never load from FSx: every restore after a fault came from the local
    # tier, and no FSx checkpoint was loaded at all.
    inprocess = [e for e in run.of("restart_end") if e["layer"] == "inprocess"]
    assert inprocess
    assert all(e["iteration"] in {r["iteration"] for r in run.of("local_restore", rank=e["rank"])
                                  if r["cycle"] == e["cycle"]} for e in inprocess)  # fmt: skip
    assert run.of("checkpoint_load") == []
    assert_nothing_left(run_dir, json.loads((run_dir / "local_run.json").read_text()))


def test_a_full_local_disk_on_one_node_stalls_no_peer_and_costs_no_restart(tmp_path, tmp_path_factory):
    """S1: node 1's local storage is full from step 13 on (every write there fails with ENOSPC).
    Its rank still takes part in each replica exchange, saying it has no copy: nothing waits for a
    gloo timeout, so the only restart is the injected exception's, which restores step 30 from
    both ranks' host copies. The failure is one event, not one per interval."""
    clean = named_summary(tmp_path_factory, "clean-2x1-40")
    run_dir = tmp_path / "full"
    with exclusive_trainer_runs(tmp_path_factory):
        code, summary = _run(run_dir, "local-disk-full@13:1,exception@31:1")
    assert code == 0, (run_dir / "launcher.log").read_text()[-4000:]
    assert summary["state_sha256"] == clean["state_sha256"]
    assert summary["restarts"] == {"inprocess": 1, "launcher": 0}, summary["faults"]
    exception = next(f for f in summary["faults"] if f["kind"] == "exception")
    assert (exception["layer"], exception["resumed_from_step"], exception["lost_steps"]) == ("inprocess", 30, 0)
    run = load_run(run_dir)
    (failed,) = run.of("local_save_failed")
    assert (failed["rank"], failed["step"]) == (1, 14)
    assert "[Errno 28] No space left on device" in failed["reason"]
    # Rank 0 kept saving its own copies after step 13, and stored no replica of rank 1's.
    late = [e for e in run.of("local_saved", rank=0) if e["step"] > 13]
    assert late and all(e["replica_of"] is None for e in late)
    assert {e["source"] for e in run.of("local_restore")} == {"local"}
    assert_nothing_left(run_dir, json.loads((run_dir / "local_run.json").read_text()))


def test_a_resume_with_another_preset_is_refused_by_the_preflight_then_by_the_local_copies(
    faulted_run, tmp_path, tmp_path_factory
):
    run_dir = tmp_path / "run"
    shutil.copytree(faulted_run[0], run_dir)  # the faulted run's own directory stays as its tests read it
    assert list((run_dir / "local-node1").glob("step_*/rank1.json"))
    with exclusive_trainer_runs(tmp_path_factory):
        # The FSx commit names the preset: the pod's preflight refuses before any rank starts.
        out = io.StringIO()
        code, _ = _run(run_dir, preset="small", resume=True, steps=STEPS + 8, out=out)
        record = json.loads((run_dir / "local_run.json").read_text())
        assert code == EXIT_DO_NOT_REQUEUE, out.getvalue()
        assert "preset='tiny', this run has preset='small'; resume with the same model.preset" in record["stopped_by"]
        assert "preflight refused the run: no rank was started" in out.getvalue()
        assert record["processes_seen"] == 0
        assert not [e for e in load_run(run_dir).events if e["t"] >= record["started_at"]]

        # Only the node-local copies are left (as before the first FSx save): their own identity
        # refuses the resume, in the first launcher cycle.
        shutil.rmtree(run_dir / "checkpoints")
        out = io.StringIO()
        code, _ = _run(run_dir, preset="small", resume=True, steps=STEPS + 8, out=out)
        record = json.loads((run_dir / "local_run.json").read_text())
    assert code == EXIT_DO_NOT_REQUEUE, out.getvalue() + (run_dir / "launcher.log").read_text()[-3000:]
    assert record["stopped_by"].startswith("checkpoint.local.dir: the node-local copy "), record
    assert (
        "was written with preset='tiny', this run has preset='small'; resume with the same model.preset"
        in (record["stopped_by"])
    )
    mine = [e for e in load_run(run_dir).events if e["t"] >= record["started_at"]]
    assert {e["cycle"] for e in mine} == {0} and {e["iteration"] for e in mine} == {0}
    assert not [e for e in mine if e["event"] in ("step_end", "local_restore", "checkpoint_load")]
    assert_nothing_left(run_dir, record)
