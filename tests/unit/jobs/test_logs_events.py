"""`nvrx-eks logs NAME --events`: the faults, restarts, checkpoint commits and the run's end out of
the pods' logs, as the trainer's own EventLog logs them (the pods' logs served by the loopback API
server), one line for a fault every rank of a node recorded, and with -f as they come."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from tests.support import cli_harness
from tests.support.cli_harness import add_job_pods, run_cli
from workloads.events import EventLog
from workloads.train import log_format

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server
deployed_cluster = cli_harness.deployed_cluster


class PodLog(logging.Handler):
    """One rank's trainer log lines, formatted as the trainer formats them."""

    def __init__(self, rank: int):
        super().__init__()
        self.setFormatter(logging.Formatter(log_format(str(rank))))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def logged(run_dir: Path, rank: int, *events: tuple[str, dict]) -> list[str]:
    """What rank `rank` logs while it emits `events` (name, fields) through its EventLog."""
    logger = logging.getLogger("workloads.train")
    handler, level = PodLog(rank), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log = EventLog(run_dir, rank)
        for name, fields in events:
            log.emit(name, **fields)
        log.close()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.lines


@pytest.fixture
def pod_logs(tmp_path):
    """Node 1 (ranks 8, 9) lost at step 15; rank 0 restarts in process and commits step 20."""
    node_loss = {"kind": "node-loss", "step": 15, "node": 1}
    rank0 = logged(
        tmp_path,
        0,
        ("step_end", {"step": 15, "loss": 2.5}),
        ("restart_begin", {"layer": "inprocess", "reason": "RankShouldRestart('peer lost')"}),
        ("restart_end", {"layer": "inprocess", "resumed_from_step": 10, "since_begin_s": 2.25}),
        ("checkpoint_commit", {"step": 20, "path": "/fsx/runs/train/checkpoints/step_20", "commit_s": 0.4}),
        ("run_end", {"status": "completed", "final_step": 30, "final_loss": 2.125}),
    )
    node1 = [
        *logged(tmp_path, 8, ("fault_injected", {**node_loss, "target_rank": 8})),
        *logged(tmp_path, 9, ("fault_injected", {**node_loss, "target_rank": 9})),
        # Rank 9's own commit view is not shown: rank 0 speaks for the job.
        *logged(tmp_path, 9, ("checkpoint_commit", {"step": 20, "path": "/x", "commit_s": 0.1})),
    ]
    return ["launcher: starting 8 ranks", *rank0, "[rank0] step 30 loss 2.1"], ["launcher: starting 8 ranks", *node1]


def shown_events(stdout: str) -> list[str]:
    """`nodeN | <event text>`: the prefix and the text after the trainer's timestamp and rank tag."""
    shown = []
    for line in stdout.splitlines():
        prefix, _, logged_line = line.partition(" | ")
        shown.append(f"{prefix} | {logged_line.split(' event: ', 1)[1]}")
    return shown


def test_events_are_the_trainers_fault_restart_commit_and_end_lines_once_each(deployed_cluster, pod_logs):
    assert run_cli("submit", "--nodes", "2").code == 0
    pods = add_job_pods(deployed_cluster, "train", 2)
    for pod, lines in zip(pods, pod_logs, strict=True):
        deployed_cluster.set_log("training", pod, lines)

    result = run_cli("logs", "train", "--events")
    assert result.code == 0, result.output
    assert shown_events(result.stdout) == [
        "node0 | restart (in-process) began: RankShouldRestart('peer lost')",
        "node0 | resumed from step 10 (in-process, 2.2 s)",
        "node0 | checkpoint step 20 committed",
        "node0 | run completed at step 30, loss 2.125",
        "node1 | fault node-loss@15:1 injected",
    ]
    # Beside --rank: that rank's event lines only.
    rank8 = run_cli("logs", "train", "--events", "--rank", "8")
    assert rank8.code == 0, rank8.output
    assert [line.split(" event: ")[1] for line in rank8.stdout.splitlines()] == ["fault node-loss@15:1 injected"]


def test_events_follow_shows_each_line_as_the_pod_logs_it(deployed_cluster, pod_logs):
    assert run_cli("submit", "--nodes", "1").code == 0
    [pod] = add_job_pods(deployed_cluster, "train", 1)
    rank0, _ = pod_logs
    commit, end = rank0[-3], rank0[-2]  # the step-20 commit and the run's end
    deployed_cluster.set_log("training", pod, rank0[:-3])

    def training_goes_on():
        deadline = time.monotonic() + 60
        while not deployed_cluster.requests_to("GET", "/log") and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        deployed_cluster.append_log("training", pod, commit)
        deployed_cluster.append_log("training", pod, "[rank0] step 25 loss 2.2")
        deployed_cluster.append_log("training", pod, end)
        time.sleep(0.2)
        deployed_cluster.objects.pop(("v1", "pods", "training", pod))

    threading.Thread(target=training_goes_on, daemon=True).start()
    result = run_cli("logs", "train", "-f", "--events")
    assert result.code == 0, result.output
    assert [line.split(" event: ")[1] for line in result.stdout.splitlines() if " event: " in line] == [
        "restart (in-process) began: RankShouldRestart('peer lost')",
        "resumed from step 10 (in-process, 2.2 s)",
        "checkpoint step 20 committed",
        "run completed at step 30, loss 2.125",
    ]
