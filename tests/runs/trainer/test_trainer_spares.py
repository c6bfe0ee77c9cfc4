"""Acceptance 1 and 2 of hot spares on CPU: 2 simulated nodes plus 2 spares under ft_launcher recover
a killed rank and then a lost node in process, each time with a spare node, bit-identical to 2 nodes
without faults; with 2 ranks per node, a killed rank takes its node-mate along and the spare node's
two ranks replace both, their state received from the node-local tier's replicas on a surviving
node."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.named_runs import named_summary
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

STEPS = 40
#: The two-ranks-per-node pair: the kill at 14 restores the local step 12; what follows only has
#: to reach the end, as bit-identical as the clean run's.
STEPS_2X2 = 20


def _run(
    run_dir: Path,
    *,
    nodes: int,
    spare_nodes: int = 0,
    faults: str = "",
    nproc: int = 1,
    local_interval: int | None = None,
    steps: int = STEPS,
) -> dict:
    from nvrx_eks.local.runner import LocalRun, run_local

    run = LocalRun(
        nproc=nproc,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset="tiny",
        checkpoint_interval=10,
        backend="nvrx",
        nodes=nodes,
        spare_nodes=spare_nodes,
        local_interval=local_interval,
        port=port_pair(),
    )
    code = run_local(run, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    assert code == 0, (run_dir / "launcher.log").read_text()[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    return named_summary(tmp_path_factory, "clean-2x1-40")  # the same as _run(..., nodes=2)


#: Two nodes lost one after the other, each replaced by a spare node in process: a killed rank
#: (14, resumed from the step-10 checkpoint) and then, on the first spare now holding that rank,
#: its whole node (25, after the step-20 checkpoint committed); then an ordinary exception.
FAULTS = "sigkill@14:1,node-loss@25:1,exception@29:0"


def test_a_spare_node_replaces_the_lost_one_in_process_bit_identically(clean, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("spares")
    with exclusive_trainer_runs(tmp_path_factory):
        summary = _run(run_dir, nodes=2, spare_nodes=2, faults=FAULTS)
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["lost_nodes"] == 2 and record["killed_after_exit"] == []
    outcomes = {f["fault"]: f["layer"] for f in summary["faults"]}
    assert outcomes == dict.fromkeys(FAULTS.split(","), "inprocess"), summary["faults"]
    assert max(e["cycle"] for e in map(json.loads, _events(run_dir))) == 0  # no launcher restart
    assert summary["state_sha256"] == clean["state_sha256"]


def _events(run_dir: Path) -> list[str]:
    return [line for path in sorted((run_dir / "events").glob("*.jsonl")) for line in path.read_text().splitlines()]


def test_with_two_ranks_per_node_a_killed_rank_takes_its_node_along(tmp_path_factory):
    with exclusive_trainer_runs(tmp_path_factory):
        clean = _run(tmp_path_factory.mktemp("clean-2x2"), nodes=2, nproc=2, steps=STEPS_2X2)
        run_dir = tmp_path_factory.mktemp("spares-2x2")
        summary = _run(
            run_dir, nodes=2, spare_nodes=1, nproc=2, faults="sigkill@14:3", local_interval=2, steps=STEPS_2X2
        )
    assert summary["faults"][0]["layer"] == "inprocess" and summary["restarts"]["inprocess"] == 1, summary
    events = [json.loads(line) for line in _events(run_dir)]
    # Rank 2, rank 3's node-mate, joined the restart and was discarded with its node.
    assert [e["rank"] for e in events if e["event"] == "rank_discarded"] == [2]
    assert max(e["cycle"] for e in events) == 0
    # The spare node's processes (started as ranks 4 and 5) take the lost node's ranks 2 and 3 and
    # start with an empty local root: their shards come from the replicas node 0 holds, of the
    # newest local step (12), not from the FSx checkpoint (10).
    restores = {
        started_as: e
        for started_as in (4, 5)
        for e in map(json.loads, (run_dir / "events" / f"rank{started_as}.jsonl").read_text().splitlines())
        if e["event"] == "local_restore"
    }
    assert {r: (e["rank"], e["source"], e["from_rank"], e["step"]) for r, e in restores.items()} == {
        4: (2, "replica", 0, 12),
        5: (3, "replica", 1, 12),
    }
    assert summary["final_step"] == clean["final_step"] == STEPS_2X2
    assert summary["state_sha256"] == clean["state_sha256"]
