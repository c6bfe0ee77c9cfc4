"""A run whose directory refuses writes (made read-only mid-run, or full): the rank that stops it
cannot put its do-not-requeue record there, and `nvrx-eks local` cannot write local_run.json.
The record goes to the fallback directory the command gives its ranks (the pods' /dev/shm), so
the run still ends 93, and the run record that cannot be written costs one line, not a traceback
and exit 1.

A regular file where a directory goes (and a directory where a file goes) stands for the
read-only run directory: writes there fail whoever runs the test, root included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.local import runner, supervisor
from tests.support.cli_harness import run_cli
from workloads import do_not_requeue

REASON = "cannot continue: checkpoint.dir /x is read-only (file system at /x)"
#: A launcher whose rank stops the job, as the trainer's _stop_the_job does, then exits 1 as
#: ft_launcher does after the shutdown request.
STOPPING_LAUNCHER = f"""
import sys
from workloads import do_not_requeue
do_not_requeue.write_record(sys.argv[1], do_not_requeue.attempt_id(), reason={REASON!r}, rank=0)
sys.exit(1)
"""
COORDINATOR = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(120)"


def _refusing_writes(run_dir: Path) -> Path:
    run_dir.mkdir()
    (run_dir / do_not_requeue.RECORD_DIR).write_text("")
    (run_dir / "local_run.json").mkdir()
    return run_dir


def test_write_record_falls_back_and_read_record_finds_it_there(tmp_path):
    run_dir, fallback = _refusing_writes(tmp_path / "run"), tmp_path / "node"
    with pytest.raises(OSError):  # no fallback: the caller's, as before
        do_not_requeue.write_record(run_dir, "a-1", reason="r", rank=3)
    written = do_not_requeue.write_record(run_dir, "a-1", reason="r", rank=3, fallback=fallback)
    assert written is not None and written.parent == fallback
    assert do_not_requeue.write_record(run_dir, "a-1", reason="later", rank=4, fallback=fallback) is None
    record = do_not_requeue.read_record(run_dir, "a-1", fallback=fallback)
    assert record is not None and (record["reason"], record["rank"]) == ("r", 3)
    assert do_not_requeue.read_record(run_dir, "a-2", fallback=fallback) is None  # another attempt's
    assert do_not_requeue.read_record(run_dir, "a-1") is None  # only where the wrapper looks


def test_local_ends_93_in_one_line_when_the_run_dir_refuses_writes(tmp_path, monkeypatch):
    run_dir = _refusing_writes(tmp_path / "run")

    def start_launch(cfg, nnodes, launcher_argvs, env, run_dir, port, tracker):
        start = {"env": env, "start_new_session": True}
        coordinator = subprocess.Popen([sys.executable, "-c", COORDINATOR], **start)
        return coordinator, [subprocess.Popen([sys.executable, "-c", STOPPING_LAUNCHER, str(run_dir)], **start)]

    monkeypatch.setattr(runner, "preflight", lambda *_: [])
    monkeypatch.setattr(supervisor, "start_launch", start_launch)
    run = runner.LocalRun(
        nproc=1, steps=2, faults="", run_dir=run_dir, preset="tiny", checkpoint_interval=1, backend="nvrx", resume=True
    )
    with open(tmp_path / "console.txt", "w") as sink:
        code = runner.run_local(run, console=Console(file=sink, width=400), print_summary=False)
    assert code == EXIT_DO_NOT_REQUEUE
    lines = (tmp_path / "console.txt").read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert [line for line in lines if "local_run.json" in line] == [
        f"could not write {run_dir / 'local_run.json'} (Is a directory); the run ended with exit 93 all the same"
    ]
    assert not any(line.startswith("the launch lost") for line in lines)  # the record stopped a relaunch


def test_local_refuses_a_run_dir_it_cannot_write_in_one_line(tmp_path):
    """Not writable from the start (here: its parent is a file): exit 2 naming --run-dir, where
    making the directory or taking its lease ended in an OSError traceback."""
    (tmp_path / "file").write_text("")
    run_dir = tmp_path / "file" / "run"
    result = run_cli("local", "--nproc", "1", "--steps", "2", "--run-dir", str(run_dir))
    assert result.code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line == f"error: --run-dir: cannot write in {run_dir} (Not a directory); give a writable directory"
