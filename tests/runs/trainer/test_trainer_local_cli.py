"""Acceptance 5 (the summary `nvrx-eks local` prints, on the shared faulted run) and SIGTERM
handling through the operator CLI (`nvrx-eks local`)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.facts.checkpoint_layout import step_of
from nvrx_eks.local.outcome import print_report
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import REPO, assert_nothing_left, exclusive_trainer_runs, port_pair
from workloads.checkpoint.files import committed_checkpoints
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

#: Ctrl-C raises KeyboardInterrupt in the command, as in a terminal, whatever the test runner's own
#: SIGINT disposition (a runner started in the background by a shell without job control ignores
#: SIGINT, and its children would inherit that).
CLI = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from nvrx_eks.cli import main; main()",
]


def test_local_run_with_exception_and_sigkill_prints_summary(tmp_path_factory):
    """What `nvrx-eks local` prints once a run ended (runner.finish: print_report on its record),
    for the shared faulted run: an exception recovered in process and a SIGKILL by ft_launcher.
    (The command's own exit code and printed summary on a completed run: test_evaluation's runs.)"""
    run_dir = named_run(tmp_path_factory, "faulted")
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["exit_code"] == 0, (run_dir / "launcher.log").read_text()[-3000:]
    out = io.StringIO()
    print_report(Console(file=out, width=200), run_dir, record["exit_code"], record["wall_s"],
                 record["killed_after_exit"], record["started_at"])  # fmt: skip
    out = out.getvalue()
    assert {"exception@7:1", "sigkill@21:1"} <= set(RUNS["faulted"].faults.split(","))
    for expected in (
        "final step",
        "fault exception@7:1",
        "recovered by inprocess",
        "fault sigkill@21:1",
        "recovered by launcher",
        "checkpoint stall",
        "s of warm-up)",  # each process's first save apart from the steady ones
        "goodput",
    ):
        assert expected in out, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_step"] == RUNS["faulted"].steps
    assert summary["restarts"]["inprocess"] >= 1 and summary["restarts"]["launcher"] >= 1
    assert_nothing_left(run_dir, record)


def test_sigterm_finishes_the_checkpoint_and_exits_cleanly(tmp_path, tmp_path_factory):
    with exclusive_trainer_runs(tmp_path_factory):
        _sigterm_mid_run(tmp_path / "run")


def _sigterm_mid_run(run_dir: Path) -> None:
    cli = subprocess.Popen(
        [
            *CLI,
            "local",
            "--nproc",
            "2",
            "--steps",
            "400",
            "--checkpoint-interval",
            "10",
            "--run-dir",
            str(run_dir),
            "--port",
            str(port_pair()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        ends = load_run(run_dir).of("step_end", rank=0) if run_dir.exists() else []
        if ends and ends[-1]["step"] >= 13:
            break
        time.sleep(0.5)
    else:
        cli.kill()
        pytest.fail("the run did not reach step 13")
    # Ctrl-C on the runner = what Kubernetes does to the pod: SIGTERM to ft_launcher, which
    # forwards it to the ranks.
    cli.send_signal(signal.SIGINT)
    out, _ = cli.communicate(timeout=240)
    run = load_run(run_dir)
    stops = run.of("run_end")
    assert {e["rank"] for e in stops} == {0, 1}
    assert all(e["status"] == "terminated" for e in stops)
    stopped_at = stops[0]["final_step"]
    assert all(e["final_step"] == stopped_at for e in stops) and stopped_at < 400
    # The in-flight save was finished and the stopping step committed.
    assert step_of(committed_checkpoints(run_dir / "checkpoints")[0]) == stopped_at
    assert not (run_dir / "summary.json").exists()
    assert_nothing_left(run_dir, json.loads((run_dir / "local_run.json").read_text()))
    assert "launcher exit" in out
