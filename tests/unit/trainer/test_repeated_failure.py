"""A failure that repeats before the first checkpoint ends the job with exit 93
(workloads.repeated_failure): in one process for the in-process layer, across processes for the
launcher and the JobSet, and not for what happens once, elsewhere, or after a checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nvrx_eks.facts.checkpoint_layout import iteration_file
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.trainer_fixtures import single_rank_env
from workloads.config import TrainConfig
from workloads.events import EventLog, load_run
from workloads.repeated_failure import error_signature, record_failure

FAILING_STEP = 3


def _config(tmp_path, *settings: str) -> TrainConfig:
    return TrainConfig.from_dict(
        {},
        "x",
        [
            f"run_dir={tmp_path}",
            "steps=4",
            "distributed.backend=gloo",
            "inprocess.enabled=false",
            "checkpoint.backend=none",
            *settings,
        ],
    )


def _oom(step: int) -> torch.OutOfMemoryError:
    """A CUDA out-of-memory error as the allocator words it: its sizes differ from try to try."""
    free = time.monotonic_ns() % 1000 / 100
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB. {free:.2f} GiB is free.")


@pytest.fixture
def deterministic_oom(tmp_path, monkeypatch):
    """A single-rank trainer whose step FAILING_STEP runs out of memory every time it is reached
    (no fault marker: a batch the GPU cannot hold), and the exit codes it armed."""
    import workloads.train as train_module
    from workloads.faults import FaultInjector

    single_rank_env(monkeypatch)
    real = FaultInjector.at_step_start

    def at_step_start(self, step, *args, **kwargs):
        if step == FAILING_STEP:
            raise _oom(step)
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(FaultInjector, "at_step_start", at_step_start)
    armed: list[int] = []
    # The rank leaving with 93 arms the exit watchdog: here it would end the test process.
    monkeypatch.setattr(train_module, "arm_exit_watchdog", lambda code, *bound: armed.append(code))
    yield armed
    if dist.is_initialized():
        dist.destroy_process_group()


def _attempt(process):
    from workloads.train import train_attempt

    try:
        return train_attempt(process)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # as the in-process restart's finalize does


def test_the_same_error_at_the_same_step_twice_before_any_checkpoint_ends_the_job(tmp_path, deterministic_oom):
    from workloads.process_state import ProcessState
    from workloads.train import Unrecoverable

    process = ProcessState(_config(tmp_path), 0, 1, None)
    with pytest.raises(torch.OutOfMemoryError):
        _attempt(process)  # the first time: restarted like any fault
    with pytest.raises(Unrecoverable) as stopped:
        _attempt(process)  # the in-process restart meets it again
    reason = str(stopped.value)
    assert reason.startswith("OutOfMemoryError: CUDA out of memory.") and "\n" not in reason
    assert f"at step {FAILING_STEP}, the second time with no checkpoint committed" in reason
    assert "data.batch_size" in reason
    run = load_run(tmp_path)
    assert [e["step"] for e in run.of("iteration_failed")] == [FAILING_STEP, FAILING_STEP]
    assert run.of("unrecoverable")[0]["reason"] == reason
    assert deterministic_oom == [EXIT_DO_NOT_REQUEUE]


@pytest.mark.parametrize("layer_env", ["TORCHELASTIC_RESTART_COUNT", "JOBSET_RESTART_ATTEMPT"])
def test_a_launcher_or_jobset_restart_sees_the_failure_of_the_process_before_it(
    tmp_path, monkeypatch, deterministic_oom, layer_env
):
    """A new process (ft_launcher's next cycle, or the pod of the JobSet's next attempt) finds the
    first process's failure in the run directory's event log."""
    from workloads.process_state import ProcessState
    from workloads.train import Unrecoverable

    first = ProcessState(_config(tmp_path), 0, 1, None)
    first.events.emit("run_start")
    with pytest.raises(torch.OutOfMemoryError):
        _attempt(first)
    monkeypatch.setenv(layer_env, "1")
    restarted = ProcessState(_config(tmp_path), 0, 1, None)
    restarted.events.emit("run_start")
    with pytest.raises(Unrecoverable, match=f"at step {FAILING_STEP}, the second time"):
        _attempt(restarted)


def test_an_injected_exception_fires_once_and_its_replay_completes(tmp_path, monkeypatch):
    from workloads.faults import InjectedFault
    from workloads.process_state import ProcessState

    single_rank_env(monkeypatch)
    process = ProcessState(_config(tmp_path, f"faults=exception@{FAILING_STEP}"), 0, 1, None)
    with pytest.raises(InjectedFault):
        _attempt(process)
    assert _attempt(process) == {"status": "completed"}


def _failure_at(line: int, step: int) -> Exception:
    """An error raised from one of two lines, with its traceback."""
    try:
        if line == 1:
            raise _oom(step)
        raise _oom(step)
    except torch.OutOfMemoryError as err:
        return err


def test_the_signature_ignores_the_sizes_but_not_where_it_was_raised():
    assert error_signature(_failure_at(1, 3)) == error_signature(_failure_at(1, 3))
    assert error_signature(_failure_at(1, 3)) != error_signature(_failure_at(2, 3))
    assert error_signature(RuntimeError("a")) != error_signature(ValueError("a"))


@pytest.mark.parametrize("between", ["another step", "another error", "a committed checkpoint", "a new submission"])
def test_what_is_not_a_repeat(tmp_path, between):
    cfg = _config(tmp_path, "checkpoint.backend=sync")
    events = EventLog(tmp_path, 0)
    events.emit("run_start")  # the job's first process of rank 0

    def fail(err, step):
        return record_failure(events, cfg.run_dir, cfg.checkpoint_dir, 0, err, step)

    assert fail(_failure_at(1, 3), 3) is None
    second, step = _failure_at(1, 3), 3
    if between == "another step":
        step = 4
    elif between == "another error":
        second = _failure_at(2, 3)
    elif between == "a committed checkpoint":
        committed = Path(iteration_file(cfg.checkpoint_dir))
        committed.parent.mkdir(parents=True)
        committed.write_text("2\n")
    else:
        events.emit("run_start")  # the first process of a job submitted again into this directory
    assert fail(second, step) is None
    # The very same failure once more is a repeat, except after a commit.
    assert (fail(second, step) is None) == (between == "a committed checkpoint")
