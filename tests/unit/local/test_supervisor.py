"""The decisions of `nvrx-eks local`'s supervisor, without starting a process: whether a launch
lost what no layer inside it recovers, and whether to launch again."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.local.supervisor import Launch, Supervisor, launch_lost
from workloads import do_not_requeue
from workloads.config import TrainConfig


@dataclass
class Exited:
    """A process as launch_lost sees it: still running (None) or its exit code."""

    returncode: int | None

    def poll(self) -> int | None:
        return self.returncode


def _launch(run_dir: Path, *, steps: int = 4, max_relaunches: int = 2) -> Launch:
    run_dir.mkdir(exist_ok=True)
    return Launch(
        run_dir=run_dir,
        cfg=TrainConfig(),
        nnodes=2,
        world_size=2,
        spares=0,
        launcher_argvs=lambda port: [],
        env={},
        port=20000,
        port_fixed=False,
        steps=steps,
        max_relaunches=max_relaunches,
        attempt="local-test",
        records=run_dir.parent / "records",
        started=time.monotonic(),
        started_at=time.time() - 1,
    )


@pytest.mark.parametrize(
    "coordinator,launchers,spares,lost",
    [
        (None, [None, None], 0, False),
        (0, [None, None], 0, True),  # the coordinator gone
        (None, [-9, None], 0, True),  # a node killed, no spare
        (None, [1, None], 0, False),  # a launcher that gave up by its own policy ends the run itself
        (None, [-9, None], 1, False),  # a spare takes its place
        (None, [1, -9, None], 1, True),  # with spares a failed exit is a lost node: two, one spare
    ],
)
def test_a_launch_is_lost_with_its_coordinator_or_more_nodes_than_spares(coordinator, launchers, spares, lost):
    assert launch_lost(Exited(coordinator), [Exited(c) for c in launchers], spares) is lost


def test_a_launch_that_lost_its_infrastructure_is_started_again_while_relaunches_are_left(tmp_path):
    supervisor = Supervisor(_launch(tmp_path / "run", max_relaunches=1), Console(file=io.StringIO()))
    assert supervisor.relaunch_due(True)
    assert not supervisor.relaunch_due(False)
    supervisor.relaunches = 1
    assert not supervisor.relaunch_due(True)


@pytest.mark.parametrize("why", ["stopped", "released", "completed", "do_not_requeue"])
def test_no_relaunch_after_a_stop_a_completed_run_or_a_rank_that_said_no_restart_helps(tmp_path, why):
    launch = _launch(tmp_path / "run")
    supervisor = Supervisor(launch, Console(file=io.StringIO()))
    if why == "stopped":
        supervisor.stop.received = signal.SIGTERM
    elif why == "released":
        supervisor.released = 1
    elif why == "completed":
        (launch.run_dir / "summary.json").write_text(json.dumps({"final_step": launch.steps}))
    else:
        do_not_requeue.write_record(launch.run_dir, launch.attempt, reason="bad input", rank=0)
    assert not supervisor.relaunch_due(True)


def test_a_summary_of_an_earlier_run_or_short_of_the_last_step_is_not_this_runs_completion(tmp_path):
    launch = _launch(tmp_path / "run", steps=4)
    summary = launch.run_dir / "summary.json"
    summary.write_text(json.dumps({"final_step": 3}))
    assert not launch.completed()
    summary.write_text(json.dumps({"final_step": 4}))
    assert launch.completed()
    old = launch.started_at - 60
    os.utime(summary, (old, old))
    assert not launch.completed()
