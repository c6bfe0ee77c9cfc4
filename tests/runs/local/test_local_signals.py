"""SIGTERM to `nvrx-eks local` (a CI timeout, `kill`) stops the whole run as Ctrl-C does: the
ranks finish their in-flight checkpoint, nothing of the run is left, the command exits 143, and a
resume ends where an uninterrupted run does. Before, the command died alone and its launchers
trained on unattended.

Both ways a SIGTERM arrives are tried on one run, one after the other: the command alone, then
(on its resume) every process of the run at once; the second resume runs to the end, whose state
holds both stops."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.named_runs import named_run
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair, processes_mentioning
from workloads.events import RunEvents, load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]
#: From the signal to the command's exit: the ranks' stop-save and exit, the launchers' shutdown,
#: and the wait for NVRx's monitor daemons (inprocess.barrier_timeout_s + 10 at most); seen: 7 s.
STOP_BOUND_S = 60
#: Steps the resumed run trains past the first stop before the second: a few, so that most of the
#: 30 steps are still to go when the signal lands (once warm, the tiny preset runs 5 steps in
#: about 0.3 s here).
SECOND_STOP_AFTER = 3


def _local(run_dir: Path, *extra: str) -> list[str]:
    return [*CLI, "local", "--nproc", "2", "--steps", "30", "--checkpoint-interval", "5",
            "--run-dir", str(run_dir), "--port", str(port_pair()), *extra]  # fmt: skip


def _started_past(run_dir: Path, step: int, *extra: str) -> tuple[subprocess.Popen, float]:
    """`nvrx-eks local` on run_dir, once its own rank 0 ended `step`; and when it started."""
    started = time.time()
    cli = subprocess.Popen(_local(run_dir, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if [e for e in load_run(run_dir).started_since(started).of("step_end", rank=0) if e["step"] >= step]:
            break
        assert cli.poll() is None, "the run ended before the signal"
        time.sleep(0.2)
    return cli, started


@dataclass
class Stopped:
    """One launch of the run, stopped by SIGTERM."""

    code: int
    stopped_s: float
    left: list[psutil.Process]  # processes naming the run dir once the command exited
    record: dict  # its local_run.json
    events: RunEvents  # those of the processes this launch started


def _stop(run_dir: Path, cli: subprocess.Popen, started: float, targets: list[psutil.Process]) -> Stopped:
    signalled = time.monotonic()
    for process in targets:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    code = cli.wait(timeout=STOP_BOUND_S)
    stopped_s = time.monotonic() - signalled
    left = processes_mentioning(str(run_dir))
    record = json.loads((run_dir / "local_run.json").read_text())
    return Stopped(code, stopped_s, left, record, load_run(run_dir).started_since(started))


@dataclass
class StoppedTwice:
    to_command: Stopped
    to_every_process: Stopped
    resumed: subprocess.CompletedProcess
    final: dict  # summary.json after the last resume
    clean: dict  # summary.json of the same run never stopped


def stop_twice(run_dir: Path) -> tuple[Stopped, Stopped]:
    """The run stopped past step 12 (two commits in) by SIGTERM to the command alone; resumed and
    stopped SECOND_STOP_AFTER steps past the first stop by SIGTERM to every process of the run at
    once (a node shutdown, a process-group kill). Also repeated by scripts/repeat_local_stops.py."""
    cli, started = _started_past(run_dir, 12)
    first = _stop(run_dir, cli, started, [psutil.Process(cli.pid)])
    stopped_at = max((e["final_step"] for e in first.events.of("run_end")), default=12)
    cli, started = _started_past(run_dir, stopped_at + SECOND_STOP_AFTER, "--resume")
    everyone = [psutil.Process(cli.pid), *psutil.Process(cli.pid).children(recursive=True)]
    return first, _stop(run_dir, cli, started, everyone)


@pytest.fixture(scope="module")
def stopped_twice(tmp_path_factory) -> StoppedTwice:
    """stop_twice, then resumed to the end."""
    clean = json.loads((named_run(tmp_path_factory, "clean") / "summary.json").read_text())
    run_dir = tmp_path_factory.mktemp("signals") / "run"
    with exclusive_trainer_runs(tmp_path_factory):
        first, second = stop_twice(run_dir)
        resumed = subprocess.run(_local(run_dir, "--resume"), capture_output=True, text=True, timeout=420)
    final = json.loads((run_dir / "summary.json").read_text()) if resumed.returncode == 0 else {}
    return StoppedTwice(first, second, resumed, final, clean)


def _assert_resumed_to_the_clean_state(run: StoppedTwice) -> None:
    assert run.resumed.returncode == 0, run.resumed.stdout[-3000:]
    assert run.final["state_sha256"] == run.clean["state_sha256"]


def test_sigterm_stops_the_whole_run_and_a_resume_ends_bit_identical(stopped_twice):
    stop = stopped_twice.to_command
    assert stop.code == 128 + signal.SIGTERM, stop.code
    assert stop.left == [], f"left running after {stop.stopped_s:.1f} s"
    assert stop.record["killed_after_exit"] == []
    _assert_resumed_to_the_clean_state(stopped_twice)


def test_sigterm_to_every_process_of_the_run_still_ends_with_the_stop_save(stopped_twice):
    """A node shutdown or a process-group kill sends SIGTERM to every process at once: the ranks
    get it twice (directly and forwarded by ft_launcher) and ft_launcher's rank-monitor servers
    stop while the ranks still report to them. Before, the second SIGTERM ended each rank at once
    and the lost monitor connection turned into a restart: no stop-save, and a surviving peer
    could hang until the launcher's SIGKILL. Now both ranks save the step they stop at."""
    stop = stopped_twice.to_every_process
    assert stop.code == 128 + signal.SIGTERM, stop.code
    assert stop.left == [], f"left running after {stop.stopped_s:.1f} s"
    stops = stop.events.of("run_end")
    assert {e["rank"] for e in stops} == {0, 1} and {e["status"] for e in stops} == {"terminated"}, stops
    stopped_at = stops[0]["final_step"]
    assert all(e["final_step"] == stopped_at for e in stops)
    assert stopped_at in {e["step"] for e in stop.events.of("checkpoint_commit")}
    _assert_resumed_to_the_clean_state(stopped_twice)
