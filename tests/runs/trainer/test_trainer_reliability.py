"""Errors no restart can fix, end to end under the real ft_launcher (`nvrx-eks local --resume` on a
copy of the shared clean run, with committed checkpoints at steps 25 and 30):

  read-only checkpoint dir   a read-only bind mount over checkpoints/
  full disk                  a tmpfs over checkpoints/ with less room than one more checkpoint
  all checkpoints corrupt    every committed shard truncated

The storage turns read-only or full once the launchers started: before, the preflight that
`nvrx-eks local` runs as the pod does refuses the run already, and these cases are about the
trainer meeting it. Each ends with exit 93 after ONE launcher cycle (the deciding rank shuts the workload down, the
runner finds its do-not-requeue record), within the bound after the first rank's decision, naming
the cause in one line, with no process left and every committed file unchanged. A deleted or corrupt latest.json
resumes from the newest committed step and deletes nothing committed (end to end for a corrupt
one; a deleted one takes the same path after checkpoint_layout.commit_state, whose rebuild and
retention on a missing pointer test_trainer_reliability_units holds).

The mounts need root (CAP_SYS_ADMIN); without it those two tests are skipped and say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.exit_codes import EXIT_BOUND_S, EXIT_DO_NOT_REQUEUE
from nvrx_eks.local.runner import LOCAL_CPU_PROFILE
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import (
    REPO,
    assert_nothing_left,
    exclusive_trainer_runs,
    port_pair,
)
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]
# The old trainer never exited at all; a finished run takes ~15-30 s here.
RUN_TIMEOUT_S = 420
# From the first rank's decision to the launcher's exit: every rank's own exit (EXIT_BOUND_S, the
# watchdog), then one launcher shutdown: it stops the ranks still running (workers_stop_timeout_s
# before SIGKILL), handles the shutdown request at its next rendezvous, and as the store host
# waits NVRx's fixed 3 s for other nodes before it exits; 10 s covers that wait, its monitor
# interval and the rendezvous round. A restart instead of the shutdown would add a whole cycle.
LAUNCHER_SHUTDOWN_S = LOCAL_CPU_PROFILE["fault_tolerance"]["workers_stop_timeout_s"] + 10


#: The shared run the tests copy and damage (read only: the copies are resumed), its last step and
#: the one committed before it.
BASE = "clean"
LAST, PREVIOUS = RUNS[BASE].steps, RUNS[BASE].steps - RUNS[BASE].interval
#: Where a resume that must fail is asked to go: past the next save, as a run that meets its
#: storage failing would.
FAILING_STEPS = LAST + 8


@pytest.fixture(scope="session")
def committed(tmp_path_factory) -> Path:
    run_dir = named_run(tmp_path_factory, BASE)
    assert [layout.step_of(n) for n in layout.commit_state(run_dir / "checkpoints").committed] == [LAST, PREVIOUS]
    return run_dir


def _copy(base: Path, dest: Path) -> Path:
    shutil.copytree(base, dest, ignore=shutil.ignore_patterns("local_run.json", "pids", "launcher.log"))
    return dest


def _committed_files(ckpt: Path) -> dict[str, str]:
    """sha256 of every file of every committed checkpoint."""
    digests = {}
    for name in layout.scan_commits(ckpt):
        for path in sorted((ckpt / name).iterdir()):
            digests[f"{name}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def _resume(
    run_dir: Path, steps: int, tmp_path_factory, once_launched: Callable[[], None] = lambda: None
) -> tuple[subprocess.CompletedProcess, dict]:
    """`nvrx-eks local --resume`; `once_launched` runs when the preflight passed and the launcher
    started (its log appears), seconds before a rank touches checkpoint.dir."""
    argv = [*CLI, "local", "--nproc", str(RUNS[BASE].nproc), "--steps", str(steps),
            "--checkpoint-interval", str(RUNS[BASE].interval),
            "--run-dir", str(run_dir), "--resume", "--port", str(port_pair())]  # fmt: skip
    with exclusive_trainer_runs(tmp_path_factory):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        while not (run_dir / "launcher.log").exists() and proc.poll() is None:
            time.sleep(0.05)
        once_launched()
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    return result, json.loads((run_dir / "local_run.json").read_text())


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def _mounted(target: Path, *args: str) -> Iterator[None]:
    _mount(*args, str(target))
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _assert_unrecoverable_exit(run_dir: Path, result: subprocess.CompletedProcess, record: dict, cause: str) -> None:
    log = (run_dir / "launcher.log").read_text(errors="replace")
    assert result.returncode == EXIT_DO_NOT_REQUEUE, result.stdout[-3000:] + log[-3000:]
    # No rank went through interpreter shutdown, where NVRx's __del__ can block for good.
    assert "Python is likely shutting down" not in log
    # Named in one line: the trainer's error line, the runner's record and its table.
    assert record["stopped_by"] is not None and cause in record["stopped_by"], record
    assert "\n" not in record["stopped_by"] and f"error: {record['stopped_by']}" in log
    assert "stopped" in result.stdout and "do not requeue (rank " in result.stdout, result.stdout
    # One launcher cycle: nothing started again after the first decision.
    run = load_run(run_dir)
    since = record["started_at"]
    mine = [e for e in run.events if e["t"] >= since]
    decisions = [e for e in mine if e["event"] == "unrecoverable"]
    assert decisions
    first = min(e["t"] for e in decisions)
    assert {e["cycle"] for e in mine} == {0}, sorted({e["cycle"] for e in mine})
    assert not [e for e in mine if e["event"] == "run_start" and e["t"] > first]
    assert "launcher 0" in result.stdout, result.stdout
    # The 93 is the runner's, from the deciding rank's record: the launcher itself exited 1 on
    # the rendezvous the rank's shutdown request closed.
    assert record["launcher_exit_code"] == 1, record
    # Bounded: the launcher ended within the ranks' exit bound plus one launcher shutdown.
    assert record["launcher_ended_at"] - first < EXIT_BOUND_S + LAUNCHER_SHUTDOWN_S, (first, record)
    # The table reports this run, not the state digest of the earlier run in this directory.
    assert "state_sha256" not in result.stdout
    assert_nothing_left(run_dir, record)


@pytest.mark.skipif(not _can_mount(), reason="a read-only bind mount needs root")
def test_read_only_checkpoint_dir_exits_93_naming_it(committed, tmp_path, tmp_path_factory):
    run_dir = _copy(committed, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    before = _committed_files(ckpt)
    with _mounted(ckpt, "--bind", str(ckpt)):
        result, record = _resume(
            run_dir, FAILING_STEPS, tmp_path_factory, lambda: _mount("-o", "remount,ro,bind", str(ckpt))
        )
        after = _committed_files(ckpt)
    _assert_unrecoverable_exit(run_dir, result, record, f"checkpoint.dir {ckpt} is read-only (file system at {ckpt})")
    assert after == before


@pytest.mark.skipif(not _can_mount(), reason="a size-limited tmpfs needs root")
def test_full_disk_exits_93_naming_it_and_removes_only_the_failed_save(committed, tmp_path, tmp_path_factory):
    run_dir = _copy(committed, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    before = _committed_files(ckpt)
    saved = tmp_path / "saved-checkpoints"
    ckpt.rename(saved)
    ckpt.mkdir()
    used_kib = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file()) // 1024
    # Room for what is committed plus half a checkpoint once the run started: the next save
    # cannot fit.
    with _mounted(ckpt, "-t", "tmpfs", "-o", f"size={used_kib + 9000}k", "tmpfs"):
        shutil.copytree(saved, ckpt, dirs_exist_ok=True)
        result, record = _resume(
            run_dir, FAILING_STEPS, tmp_path_factory, lambda: _mount("-o", f"remount,size={used_kib + 900}k", str(ckpt))
        )
        after = _committed_files(ckpt)
        left = sorted(p.name for p in layout.checkpoint_dirs(ckpt))
    _assert_unrecoverable_exit(run_dir, result, record, "no space left on ")
    assert "free): a checkpoint needs ~" in record["stopped_by"]
    assert after == before
    assert left == sorted({key.split("/")[0] for key in before})  # the failed save was removed


def test_all_committed_checkpoints_corrupt_exits_93(committed, tmp_path, tmp_path_factory):
    run_dir = _copy(committed, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    for shard in ckpt.glob("step_*/__0_0.distcp"):
        with open(shard, "r+b") as f:
            f.truncate(100)
    damaged = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ckpt.rglob("*")) if p.is_file()}
    result, record = _resume(run_dir, FAILING_STEPS, tmp_path_factory)
    _assert_unrecoverable_exit(run_dir, result, record, "none of the committed checkpoints")
    # Nothing was deleted or rewritten, not even what failed verification.
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in damaged} == damaged


def test_resume_on_a_corrupt_pointer_continues_from_the_newest_commit(committed, tmp_path, tmp_path_factory):
    run_dir = _copy(committed, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    before = _committed_files(ckpt)
    pointer = ckpt / layout.POINTER_FILE
    pointer.write_text(pointer.read_text()[:40])
    result, record = _resume(run_dir, LAST + 2, tmp_path_factory)
    assert result.returncode == 0, result.stdout[-3000:] + (run_dir / "launcher.log").read_text()[-3000:]
    run = load_run(run_dir)
    mine = [e for e in run.events if e["t"] >= record["started_at"]]
    assert {e["resumed_from_step"] for e in mine if e["event"] == "setup_end"} == {LAST}
    warnings = [e for e in mine if e["event"] == "checkpoint_pointer_rebuilt"]
    assert warnings and "rebuilt it from the commit records" in warnings[0]["reason"]
    assert "checkpoint pointer" in result.stdout
    # The commit at the resumed run's last step was made on a rebuilt pointer: it deleted nothing
    # committed.
    assert all(_committed_files(ckpt)[k] == v for k, v in before.items())
    assert [layout.step_of(n) for n in layout.commit_state(ckpt).committed] == [LAST + 2, LAST]
    assert_nothing_left(run_dir, record)
