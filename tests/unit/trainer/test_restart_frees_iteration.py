"""An in-process restart frees the failed iteration's model and optimizer before the next
iteration builds its own, also while an NVRx save of theirs is still in flight, and inside the
finalize already, while NVRx still holds the exception raised in a method that held them (world
size 1, gloo, in one process).

The save's finalize functions (the DCP finalize and the Checkpointer's commit) sit in the NVRx
queue, which outlives the iteration (workloads.checkpoint.nvrx_worker); through the commit they
reach the Checkpointer and the stateful objects it was built with. On a GPU that is the failed
iteration's parameters and optimizer moments, 12-16 bytes per parameter and rank, still allocated
while the next iteration allocates the same again."""

from __future__ import annotations

import contextlib
import gc
import time
import types
import weakref
from pathlib import Path

import torch

from nvrx_eks.facts.checkpoint_layout import DIGESTS_FILE
from tests.support import trainer_fixtures
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.checkpoint.nvrx_worker import checkpoint_worker
from workloads.checkpoint.train_state import ModelState, OptimizerState
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FaultInjector
from workloads.ft_integration import FaultToleranceReporter
from workloads.inprocess import RestartFinalize

single_rank = trainer_fixtures.single_rank


def _config(tmp_path: Path) -> TrainConfig:
    return TrainConfig.from_dict({}, "x", [f"run_dir={tmp_path}", "checkpoint.backend=nvrx"])


def _iteration(cfg: TrainConfig, events: EventLog, tmp_path: Path) -> dict:
    """What Trainer.setup builds and hands ProcessState.iteration_objects: a model, its optimizer
    with its moments allocated (one step taken), and a Checkpointer built with both."""
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    checkpointer = Checkpointer(
        cfg,
        events=events,
        faults=FaultInjector((), 0, tmp_path / "faults", events.emit),
        device=torch.device("cpu"),
        identity={"world_size": 1, "preset": cfg.model.preset},
        states={"model": ModelState(model), "optim": OptimizerState(model, optimizer)},
    )
    return {"model": model, "optimizer": optimizer, "checkpointer": checkpointer}


def _finalize(cfg: TrainConfig, events: EventLog, iteration_objects: dict) -> RestartFinalize:
    return RestartFinalize(
        events, FaultToleranceReporter(cfg.fault_tolerance), iteration_objects.clear, cfg.inprocess.cuda_timeout_s
    )


def _restart_finalize(cfg: TrainConfig, events: EventLog, iteration_objects: dict) -> None:
    """The Wrapper's finalize step, then its own collection (`while gc.collect(): pass`)."""
    _finalize(cfg, events, iteration_objects)(types.SimpleNamespace(fn_exception=RuntimeError("injected")))
    while gc.collect():
        pass


class _Step:
    """Stands in for the Trainer: a step that fails while its frame holds the model and optimizer
    (in `self` and in a local), as train_step's frame does when a fault lands in it."""

    def __init__(self, iteration: dict):
        self.iteration = iteration

    def run(self) -> None:
        model = self.iteration["model"]
        model(torch.randn(2, 256)).sum().backward()
        raise RuntimeError("the step failed")


def test_a_restart_with_a_save_in_flight_frees_the_failed_iterations_model_and_optimizer(single_rank, tmp_path):
    cfg, events = _config(tmp_path), EventLog(tmp_path, 0)
    failed = _iteration(cfg, events, tmp_path)
    failed["checkpointer"].maybe_save(1, force=True)  # handed off; the fault hits before a poll commits it
    assert failed["checkpointer"].pending is not None and checkpoint_worker.queue.async_calls
    failed_path = failed["checkpointer"].pending.path
    alive = {name: weakref.ref(obj) for name, obj in failed.items()}
    moment = weakref.ref(failed["optimizer"].state[failed["model"].weight]["exp_avg"])

    _restart_finalize(cfg, events, failed)

    still_alive = sorted(name for name, ref in alive.items() if ref() is not None)
    assert still_alive == [] and moment() is None, f"the failed iteration still holds {still_alive}"

    # The next iteration gets the worker the abandoned save was handed to, and saves and loads.
    # The worker finished writing the abandoned save (its digests are its last file), so the
    # next iteration reuses it, and must not take that save's completion for its own.
    digests = failed_path / DIGESTS_FILE.format(rank=0)
    deadline = time.monotonic() + 60
    while not digests.exists():
        assert time.monotonic() < deadline, "the NVRx worker never wrote the abandoned save"
        time.sleep(0.05)
    following = _iteration(cfg, events, tmp_path)
    assert following["checkpointer"].writer.worker_start == "reused"
    following["checkpointer"].maybe_save(2, force=True)
    following["checkpointer"].wait()
    loaded = following["checkpointer"].load_latest(following["checkpointer"].state_dict)
    assert loaded is not None and loaded.step == 2
    following["checkpointer"].close()


def test_the_finalize_frees_the_iteration_that_the_exception_still_holds(single_rank, tmp_path, monkeypatch):
    """NVRx keeps the failed iteration's exception (state.fn_exception) through finalize, and its
    traceback holds the frames of the method that raised, with the model in them: the finalize's
    own collection and CUDA drain must already see them freed, not only the Wrapper's collection
    after the drain (on a GPU their blocks would stay cached on the old FSDP streams)."""
    cfg, events = _config(tmp_path), EventLog(tmp_path, 0)
    failed = _iteration(cfg, events, tmp_path)
    alive = {name: weakref.ref(obj) for name, obj in failed.items()}
    try:
        _Step(failed).run()
    except RuntimeError as err:
        state = types.SimpleNamespace(fn_exception=err)  # as NVRx holds it while it finalizes
    del failed

    drained = []
    finalize = _finalize(cfg, events, {})
    real_collect = gc.collect

    def collect_then_look(*args):
        # What the finalize's drain would meet: the objects still alive after its collection.
        found = real_collect(*args)
        drained.append(sorted(name for name, ref in alive.items() if ref() is not None))
        return found

    monkeypatch.setattr(gc, "collect", collect_then_look)
    finalize(state)
    monkeypatch.undo()
    assert drained and drained[-1] == [], f"alive when the finalize drained the GPU: {drained[-1]}"
    assert "the step failed" in str(state.fn_exception)  # the exception itself stays, for NVRx's log


class _SetupReached(Exception):
    """Raised where the test has seen what it came for, so setup goes no further."""


def _setup_until_the_process_group(iteration: int, monkeypatch, tmp_path: Path) -> list[str]:
    """What Trainer.setup does to the device's memory before it joins the process group, in order."""
    from workloads import trainer as trainer_module

    calls: list[str] = []
    runtime = types.SimpleNamespace(is_cuda=True, backend="nccl", device=torch.device("cpu"))
    monkeypatch.setattr(trainer_module, "resolve_runtime", lambda cfg: runtime)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(trainer_module, "reset_peak_memory", lambda rt: calls.append("reset_peak_memory"))

    def stop(*args, **kwargs):
        raise _SetupReached

    monkeypatch.setattr(trainer_module, "require_efa", stop)
    cfg = _config(tmp_path)
    events = EventLog(tmp_path, 0)
    process = types.SimpleNamespace(
        cfg=cfg,
        events=events,
        ft=FaultToleranceReporter(cfg.fault_tolerance),
        faults=FaultInjector((), 0, tmp_path / "faults", events.emit),
        rank=0,
    )
    wrapper = types.SimpleNamespace(
        iteration=iteration,
        ping=lambda: None,
        atomic=contextlib.nullcontext,
        disable_hang_protection=contextlib.nullcontext,
    )
    try:
        trainer_module.Trainer(process, wrapper).setup()
    except _SetupReached:
        pass
    return calls


def test_a_restarted_iteration_returns_the_failed_ones_cached_blocks_before_its_peak_starts(tmp_path, monkeypatch):
    """On CUDA, an in-process restart's setup empties the allocator's cache (the failed
    iteration's blocks, freed by the finalize but still cached) before it resets the peak the
    memory check reads; the first iteration has nothing to return."""
    assert _setup_until_the_process_group(1, monkeypatch, tmp_path / "restart") == ["empty_cache", "reset_peak_memory"]
    assert _setup_until_the_process_group(0, monkeypatch, tmp_path / "first") == ["reset_peak_memory"]
