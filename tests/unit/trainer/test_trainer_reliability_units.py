"""Fast checks of the rules that keep checkpoints safe and exits bounded: which directories
retention may delete, how a missing or corrupt pointer is read, how a refused save is named, the
pod preflight on a bad pointer, the exit watchdog, and RNG state without pickle."""

from __future__ import annotations

import errno
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.trainer_fixtures import REPO
from workloads.checkpoint.errors import CheckpointWriterDied, storage_failure


def _commit(root: Path, step: int, token: str = "a.0.0.1", payload: bytes = b"x" * 100) -> str:
    name = layout.step_dir_name(step, token)
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(payload)
    manifest = {"step": step, "files": {"__0_0.distcp": [len(payload), None]}, "world_size": 2, "preset": "tiny"}
    (directory / layout.COMMIT_FILE).write_text(json.dumps(manifest))
    return name


def _pointer(root: Path, committed: list[str]) -> None:
    (root / layout.POINTER_FILE).write_text(layout.pointer_text(committed))


def test_missing_pointer_is_rebuilt_from_verified_commit_records(tmp_path):
    old, new = _commit(tmp_path, 10), _commit(tmp_path, 20)
    broken = _commit(tmp_path, 30)
    (tmp_path / broken / "__0_0.distcp").write_bytes(b"short")  # size differs from the record
    (tmp_path / layout.step_dir_name(40, "b.0.0.1")).mkdir()  # a save that never committed
    state = layout.commit_state(tmp_path)
    assert state.source == "rebuilt" and state.committed == [new, old]
    assert "latest.json is missing" in state.warning and new in state.warning


def test_corrupt_pointer_is_rebuilt_or_reported_as_lost(tmp_path):
    (tmp_path / layout.POINTER_FILE).write_text('{"latest": "step_0000')
    with pytest.raises(layout.PointerUnreadable, match="latest.json"):
        layout.read_pointer(tmp_path)
    lost = layout.commit_state(tmp_path)
    assert lost.source == "lost" and lost.committed == []
    assert "remove latest.json to start the run over" in lost.warning
    name = _commit(tmp_path, 10)
    assert layout.commit_state(tmp_path).committed == [name]
    assert layout.commit_state(tmp_path).source == "rebuilt"


@pytest.mark.parametrize(
    "record",
    ["[1]", "7", '"step"', "[" * 100_000 + "]" * 100_000, '{"step": 10, "files": [1]}'],
    ids=["a list", "a number", "a string", "nested past the parser", "files a list"],
)
def test_a_commit_record_of_another_shape_is_not_a_commit(tmp_path, record):
    """A hostile or damaged commit.json is no commit (the run falls back to the others or starts
    over), never an exception that ends the preflight with a traceback instead of 93."""
    good = _commit(tmp_path, 10)
    bad = _commit(tmp_path, 20)
    (tmp_path / bad / layout.COMMIT_FILE).write_text(record)
    assert layout.verified_commit(tmp_path / bad) is None
    assert layout.commit_state(tmp_path).committed == [good]
    (tmp_path / layout.POINTER_FILE).write_text(record)
    with pytest.raises(layout.PointerUnreadable, match="latest.json"):
        layout.read_pointer(tmp_path)


def test_retention_deletes_committed_checkpoints_only_on_a_pointer_it_read(tmp_path):
    c10, c20, c30 = _commit(tmp_path, 10), _commit(tmp_path, 20), _commit(tmp_path, 30)
    abandoned = tmp_path / layout.step_dir_name(35, "b.0.0.1")
    abandoned.mkdir()
    keep = [c30, c20]
    # No pointer (deleted): the commits it would have named survive; the uncommitted save goes.
    rebuilt = layout.commit_state(tmp_path)
    assert not layout.may_delete(tmp_path / c10, rebuilt, keep)
    assert layout.may_delete(abandoned, rebuilt, keep)
    # A pointer that was read and names newer commits: retention applies.
    _pointer(tmp_path, [c20, c10])
    read = layout.commit_state(tmp_path)
    assert layout.may_delete(tmp_path / c10, read, keep)
    # A commit the pointer never named (killed between commit.json and the pointer) and newer
    # than what the pointer names is not proven superseded.
    assert not layout.may_delete(tmp_path / c30, read, [c20])
    # A directory without a commit record but named by the pointer is never "abandoned".
    (tmp_path / c10 / layout.COMMIT_FILE).unlink()
    assert not layout.may_delete(tmp_path / c10, read, keep)


def test_storage_refusals_are_named(tmp_path):
    ckpt = tmp_path / "checkpoints"
    wrapped = CheckpointException("plan", {0: (OSError(errno.EROFS, "Read-only file system"), None)})
    assert storage_failure(wrapped, ckpt, 10).startswith(f"checkpoint.dir {ckpt} is read-only")
    denied = OSError(errno.EACCES, "Permission denied")
    assert "is not writable by this process" in storage_failure(denied, ckpt, 10)
    full = RuntimeError("write failed")
    full.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert storage_failure(full, ckpt, 2_500_000_000).startswith("no space left on ")
    assert "a checkpoint needs ~2.5 GB" in storage_failure(full, ckpt, 2_500_000_000)
    # NVRx reports a writer's ENOSPC as a string; judged by the free space now.
    opaque = CheckpointException("write", {0: (RuntimeError("Worker failure: [Errno 28]"), None)})
    assert "no space left on" in storage_failure(opaque, ckpt, 10**18)
    assert storage_failure(opaque, ckpt, 10) is None  # room enough: a fault a restart may fix
    assert "no space left on" in storage_failure(CheckpointWriterDied("gone"), ckpt, 10**18)
    assert storage_failure(RuntimeError("peer died"), ckpt, 10**18) is None


def _preflight(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workloads.train", "--config", str(config), "--preflight", "--world-size", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_preflight_on_a_corrupt_pointer_rebuilds_or_exits_93_with_the_fix(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"run_dir: {tmp_path}\nmodel: {{preset: tiny}}\n")
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / layout.POINTER_FILE).write_text('{"latest": "st')
    lost = _preflight(config)
    assert lost.returncode == EXIT_DO_NOT_REQUEUE, lost.stderr
    assert "remove latest.json to start the run over" in lost.stderr and "Traceback" not in lost.stderr
    _commit(ckpt, 10)
    rebuilt = _preflight(config)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "warning: checkpoint.dir:" in rebuilt.stderr and "rebuilt it from the commit records" in rebuilt.stderr


def test_exit_watchdog_ends_a_process_blocked_on_a_lock_with_its_code():
    code = (
        "import multiprocessing, workloads.train as t\n"
        "t.arm_exit_watchdog(93, bound_s=1.0)\n"
        "lock = multiprocessing.get_context('spawn').Lock(); lock.acquire(); lock.acquire()\n"
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == EXIT_DO_NOT_REQUEUE, result.stderr
    assert time.monotonic() - started < 30
    assert "exit watchdog" in result.stderr


def test_rng_state_is_tensors_only_and_restores_exactly():
    from workloads.checkpoint.train_state import RngState

    random.seed(1)
    np.random.seed(2)
    random.gauss(0, 1)  # leaves a cached Gaussian in both generators' state
    np.random.standard_normal()
    state = RngState(cuda=False).state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    expected = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(), torch.rand(1))
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    RngState(cuda=False).load_state_dict(state)
    again = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(), torch.rand(1))
    assert expected[:4] == again[:4] and torch.equal(expected[4], again[4])


def test_exit_bound_is_checked_against_the_grace_periods_it_must_cover():
    from nvrx_eks.facts.errors import ConfigError
    from nvrx_eks.facts.exit_codes import EXIT_BOUND_S
    from workloads.config import TrainConfig
    from workloads.train import exit_bound_s

    assert exit_bound_s(TrainConfig()) == EXIT_BOUND_S
    with pytest.raises(ConfigError, match="inprocess.termination_grace_s"):
        exit_bound_s(TrainConfig.from_dict({"inprocess": {"termination_grace_s": EXIT_BOUND_S}}))


# --- the do-not-requeue record ------------------------------------------------------------------


def test_do_not_requeue_record_first_writer_wins_per_attempt(tmp_path):
    from workloads import do_not_requeue as dnr

    first = dnr.write_record(tmp_path, "uid-1-0", reason="checkpoint.dir is read-only", rank=1)
    assert first == tmp_path / dnr.RECORD_DIR / "uid-1-0.json"
    assert dnr.write_record(tmp_path, "uid-1-0", reason="a later rank", rank=0) is None
    record = dnr.read_record(tmp_path, "uid-1-0")
    assert (record["reason"], record["rank"]) == ("checkpoint.dir is read-only", 1)
    # No temporary file left behind by either writer.
    assert sorted(p.name for p in (tmp_path / dnr.RECORD_DIR).iterdir()) == ["uid-1-0.json"]
    # Another attempt (the next JobSet restart, another local run) has no record.
    assert dnr.read_record(tmp_path, "uid-1-1") is None
    # A record older than the reader (an earlier submission under the same name) is not its own.
    assert dnr.read_record(tmp_path, "uid-1-0", since=record["time"] + 1) is None
    assert dnr.read_record(tmp_path, "uid-1-0", since=record["time"] - 1) == record
    # The id is one path component whatever it holds.
    assert dnr.record_path(tmp_path, "../x/y").parent == tmp_path / dnr.RECORD_DIR


def test_do_not_requeue_check_prints_the_reason_in_one_line(tmp_path):
    from workloads import do_not_requeue as dnr

    def check(attempt: str | None) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin"} | ({dnr.ATTEMPT_ID_ENV: attempt} if attempt else {})
        argv = dnr.check_argv(str(tmp_path), python=sys.executable)
        return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=60)

    assert check("uid-1-0").returncode == 1
    dnr.write_record(tmp_path, "uid-1-0", reason="no space left on /fsx:\n need ~2 GB", rank=3)
    found = check("uid-1-0")
    assert found.returncode == 0
    assert found.stderr == "nvrx-eks: do not requeue (rank 3): no space left on /fsx: need ~2 GB\n"
    assert (check("uid-1-1").returncode, check(None).returncode) == (1, 1)
    assert (check("uid-1-1").stderr, check(None).stderr) == ("", "")
