"""SIGTERM to `nvrx-eks local` (a CI timeout, `kill`) stops the whole run as Ctrl-C does: the
ranks finish their in-flight checkpoint, nothing of the run is left, the command exits 143, and a
resume ends where an uninterrupted run does. Before, the command died alone and its launchers
trained on unattended."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.named_runs import named_run
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair, processes_mentioning
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]
#: From the signal to the command's exit: the ranks' stop-save and exit, the launchers' shutdown,
#: and the wait for NVRx's monitor daemons (inprocess.barrier_timeout_s + 10 at most); seen: 7 s.
STOP_BOUND_S = 60


def _local(run_dir: Path, *extra: str) -> list[str]:
    return [*CLI, "local", "--nproc", "2", "--steps", "30", "--checkpoint-interval", "5",
            "--run-dir", str(run_dir), "--port", str(port_pair()), *extra]  # fmt: skip


def _started_past_step_12(run_dir: Path) -> subprocess.Popen:
    """`nvrx-eks local` on run_dir, once its rank 0 ended step 12 (two commits in)."""
    cli = subprocess.Popen(_local(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not [e for e in load_run(run_dir).of("step_end") if e["step"] >= 12]:
        assert cli.poll() is None, "the run ended before the signal"
        time.sleep(0.2)
    return cli


def test_sigterm_stops_the_whole_run_and_a_resume_ends_bit_identical(tmp_path, tmp_path_factory):
    clean = named_run(tmp_path_factory, "clean")
    run_dir = tmp_path / "run"
    with exclusive_trainer_runs(tmp_path_factory):
        cli = _started_past_step_12(run_dir)
        signalled = time.monotonic()
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(timeout=STOP_BOUND_S)
        stopped_s = time.monotonic() - signalled
        assert code == 128 + signal.SIGTERM, code
        assert processes_mentioning(str(run_dir)) == [], f"left running after {stopped_s:.1f} s"
        assert json.loads((run_dir / "local_run.json").read_text())["killed_after_exit"] == []
        resumed = subprocess.run(_local(run_dir, "--resume"), capture_output=True, text=True, timeout=420)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["state_sha256"] == json.loads((clean / "summary.json").read_text())["state_sha256"]


def test_sigterm_to_every_process_of_the_run_still_ends_with_the_stop_save(tmp_path, tmp_path_factory):
    """A node shutdown or a process-group kill sends SIGTERM to every process at once: the ranks
    get it twice (directly and forwarded by ft_launcher) and ft_launcher's rank-monitor servers
    stop while the ranks still report to them. Before, the second SIGTERM ended each rank at once
    and the lost monitor connection turned into a restart: no stop-save, and a surviving peer
    could hang until the launcher's SIGKILL. Now both ranks save the step they stop at."""
    import psutil

    clean = named_run(tmp_path_factory, "clean")
    run_dir = tmp_path / "run"
    with exclusive_trainer_runs(tmp_path_factory):
        cli = _started_past_step_12(run_dir)
        everyone = [psutil.Process(cli.pid), *psutil.Process(cli.pid).children(recursive=True)]
        signalled = time.monotonic()
        for process in everyone:
            try:
                process.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        code = cli.wait(timeout=STOP_BOUND_S)
        stopped_s = time.monotonic() - signalled
        assert code == 128 + signal.SIGTERM, code
        assert processes_mentioning(str(run_dir)) == [], f"left running after {stopped_s:.1f} s"
        run = load_run(run_dir)
        stops = run.of("run_end")
        assert {e["rank"] for e in stops} == {0, 1} and {e["status"] for e in stops} == {"terminated"}, stops
        stopped_at = stops[0]["final_step"]
        assert all(e["final_step"] == stopped_at for e in stops)
        assert stopped_at in {e["step"] for e in run.of("checkpoint_commit")}
        resumed = subprocess.run(_local(run_dir, "--resume"), capture_output=True, text=True, timeout=420)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["state_sha256"] == json.loads((clean / "summary.json").read_text())["state_sha256"]
