"""Trainer entry point: `python -m workloads.train --config PATH [dotted.key=value ...]`.

Started by ft_launcher (see workloads.launch), one process per rank. The training function runs
under NVRx's in-process restart Wrapper (workloads.inprocess); each call of it is one "iteration":
it builds the process group, model, optimizer, data and checkpointer from scratch, loads the newest
committed checkpoint, trains, and on completion writes summary.json.

Exit codes: 0 done; 93 (nvrx_eks.facts.exit_codes.EXIT_DO_NOT_REQUEUE) for errors no restart can fix;
143 after a SIGTERM was honoured (in-flight checkpoint finished); anything else is a failure that
ft_launcher restarts.

`--preflight --world-size N` checks, before any rank starts, everything that can be checked on the
config, the data path and the checkpoint directory, and exits 0 or 93.

The `if __name__ == "__main__"` guard matters: the helpers a rank spawns (NVRx's checkpoint worker,
the Manager of NVRx's write-results queue) re-import this module as __mp_main__
(workloads.helper_processes).
"""

# No `from __future__ import annotations` in this module: NVRx finds the parameter that receives
# its CallWrapper by the annotation object, which postponed annotations would turn into a string.

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from nvidia_resiliency_ext.inprocess import CallWrapper

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_BOUND_S, EXIT_DO_NOT_REQUEUE, EXIT_TERMINATED
from workloads.config import TrainConfig
from workloads.faults import outside_world, outside_world_problem, parse_fault_spec
from workloads.ft_integration import FaultToleranceReporter
from workloads.helper_processes import become_rank_helper
from workloads.launch import split_endpoint
from workloads.lease import RankZeroLease, RunDirectoryInUse
from workloads.numa import bind_rank_to_numa_node
from workloads.process_exit import exit_without_finalizing
from workloads.process_state import ProcessState

log = logging.getLogger("workloads.train")


class Unrecoverable(BaseException):
    """A ConfigError raised inside the wrapped function. A BaseException so the NVRx Wrapper
    terminates instead of restarting: retrying cannot fix a configuration."""


def train_attempt(process: ProcessState, call_wrapper: CallWrapper | None = None) -> dict:
    """One in-process iteration (workloads.trainer): build, load, train, finish. Returns
    {"status": ...}. The function NVRx's Wrapper calls: `call_wrapper` is found by its annotation."""
    from workloads.repeated_failure import record_failure
    from workloads.trainer import Trainer  # torch and the model: not for the checkpoint worker's import

    trainer = Trainer(process, call_wrapper)
    try:
        _follow_rank_0(process, call_wrapper)
        return trainer.run()
    except ConfigError as err:
        _leave_unrecoverable(process, str(err))
    except Exception as err:
        # Every layer's restart passes here (the Wrapper's, and a process that ends on this error);
        # a failure that repeats before the first checkpoint is deterministic.
        cfg = process.cfg
        repeated = record_failure(process.events, cfg.run_dir, cfg.checkpoint_dir, process.rank, err, trainer.step)
        if repeated is not None:
            # A peer's deterministic failure repeats on this rank too, as the error its abort
            # caused here ("connection closed by peer"): once the peer has stopped the job, this
            # rank follows with the peer's reason, not a line of its own naming the consequence.
            decided = _decided_by_another_rank(cfg)
            if decided is not None:
                _leave_unrecoverable(process, decided["reason"], announce=False)
            _leave_unrecoverable(process, repeated)
        raise


def _decided_by_another_rank(cfg: TrainConfig) -> dict | None:
    """The do-not-requeue record of this job attempt, if a rank has written it already."""
    from workloads import do_not_requeue

    attempt = do_not_requeue.attempt_id()
    return do_not_requeue.read_record(cfg.run_dir, attempt) if attempt is not None else None


def _leave_unrecoverable(process: ProcessState, reason: str, *, announce: bool = True) -> NoReturn:
    """Leave the Wrapper and the job with exit 93 (workloads.train.run prints the reason);
    `announce`: record the reason as this rank's `unrecoverable` event."""
    # From here the rank is leaving: the watchdog bounds everything the Wrapper and run() still
    # do on the way out (barriers with peers, stopping the checkpoint worker).
    arm_exit_watchdog(EXIT_DO_NOT_REQUEUE)
    if announce:
        process.events.emit("unrecoverable", reason=reason[:2000])
    _stop_the_job(process.cfg, process.rank, process.ft, reason)
    raise Unrecoverable(reason) from None


def _stop_the_job(cfg: TrainConfig, rank: int, ft: FaultToleranceReporter, reason: str) -> None:
    """Make the 93 stick beyond this rank: record the decision for this job attempt on the shared
    run dir, then ask ft_launcher to shut the workload down instead of restarting ranks
    (workloads.do_not_requeue says how the launcher's wrapper turns both into exit 93). Each
    step on its own and best effort: the exit is bounded by the watchdog already armed."""
    from workloads import do_not_requeue

    attempt = do_not_requeue.attempt_id()
    if attempt is None:
        log.info("no %s set: the decision is not recorded for the launcher's wrapper", do_not_requeue.ATTEMPT_ID_ENV)
    else:
        try:
            do_not_requeue.write_record(cfg.run_dir, attempt, reason=reason, rank=rank)
        except OSError as err:
            log.warning("could not record the do-not-requeue decision in %s: %s", cfg.run_dir, err)
    try:
        ft.request_shutdown(reason)
    except Exception:  # noqa: BLE001 - a launcher connection already gone must not block the exit
        log.exception("could not ask ft_launcher to shut the workload down")


def run(cfg: TrainConfig, store: tuple[str, int] | None) -> int:
    """The rank's process: refuse what cannot run, take the run lease if rank 0, warm up, then run
    train_attempt (inside NVRx's in-process Wrapper when that layer is on) to an exit code."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    _refuse_what_cannot_run(cfg, store, world)
    exit_bound_s(cfg)
    try:
        taken = _take_run_lease(cfg, rank)
    except RunDirectoryInUse as err:
        # Another live run writes this directory, and two writers delete each other's checkpoints.
        arm_exit_watchdog(EXIT_DO_NOT_REQUEUE)
        print(f"error: {err}", file=sys.stderr, flush=True)
        _stop_the_job(cfg, 0, FaultToleranceReporter(cfg.fault_tolerance), str(err))
        return EXIT_DO_NOT_REQUEUE
    process = ProcessState(cfg, rank, world, store)
    if taken is not None:
        process.events.emit("run_lease", how=taken)

    _exit_watchdog.start()  # before the handler that arms it (see _ExitWatchdog)
    signal.signal(signal.SIGTERM, _sigterm_handler(process))
    _warm_up(cfg, rank)
    process.events.emit(
        "run_start",
        world_size=world,
        preset=cfg.model.preset,
        backend=cfg.distributed.backend,
        checkpoint_backend=cfg.checkpoint.backend,
        steps=cfg.steps,
    )
    return _run_attempts(process, store)


def _refuse_what_cannot_run(cfg: TrainConfig, store: tuple[str, int] | None, world: int) -> None:
    for fault in outside_world(parse_fault_spec(cfg.faults), world):
        raise ConfigError(outside_world_problem(fault, world))
    if store is None and cfg.inprocess.enabled:
        raise ConfigError(
            "inprocess.enabled: the in-process restart layer needs --store HOST:PORT, the in-process store of "
            "the job's coordinator (python -m workloads.coordinator); or set inprocess.enabled=false"
        )


def _sigterm_handler(process: ProcessState):
    """The first SIGTERM asks the rank to stop after a stop-save, bounded below ft_launcher's
    SIGKILL; a second one well after the first stops it at once."""
    first_sigterm_at: float | None = None

    def on_sigterm(signum, frame):
        nonlocal first_sigterm_at
        now = time.monotonic()
        if first_sigterm_at is None:
            first_sigterm_at = now
            process.stop_requested = True
            # The stop-save is bounded from here, below ft_launcher's SIGKILL (--term-timeout), so
            # that a way out that blocks (a peer gone mid-collective) still ends in 143.
            arm_exit_watchdog(EXIT_TERMINATED, sigterm_exit_bound_s(process.cfg))
        elif now - first_sigterm_at > SIGTERM_DEBOUNCE_S:
            os._exit(EXIT_TERMINATED)  # asked again, well after the first: stop now

    return on_sigterm


def _warm_up(cfg: TrainConfig, rank: int) -> None:
    """Before the Wrapper, for a hot spare above all: it waits outside the process group and, once
    a restart activates it, trains at once instead of first importing the training modules
    (0.56 s on 2 CPU cores), torch._dynamo (which the model's first initialization on the meta
    device imports lazily: 0.6 s) and spawning its checkpoint worker
    (workloads.checkpoint.nvrx_worker). Measured with the small preset; the cost is paid at
    process start instead, where nothing waits for it."""
    import torch._dynamo  # noqa: F401 - imported for its cost, not its names

    import workloads.trainer  # noqa: F401

    if cfg.checkpoint.backend == "nvrx":
        from workloads.checkpoint.nvrx_worker import checkpoint_worker

        checkpoint_worker.warm_up(rank)


def _run_attempts(process: ProcessState, store: tuple[str, int] | None) -> int:
    """train_attempt until the run ends (in-process restarts inside the Wrapper), as an exit code;
    every way out bounded and NVRx's helpers stopped."""
    from nvidia_resiliency_ext.inprocess.exception import RestartAbort
    from nvidia_resiliency_ext.inprocess.rank_assignment import RankDiscarded

    fn, stopped_by_sigterm = _attempt_function(process, store)
    code = 1
    try:
        outcome = fn(process)
        code = EXIT_TERMINATED if outcome and outcome.get("status") == "terminated" else 0
    except Unrecoverable as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        code = EXIT_DO_NOT_REQUEUE
    except stopped_by_sigterm:
        code = EXIT_TERMINATED
    except RankDiscarded as err:
        # With spare nodes: another rank of this node was lost, so the node leaves whole
        # (workloads.spares). Not 0: the node's pod must count as failed, not as finished.
        process.events.emit("rank_discarded", reason=str(err)[:500])
        print(f"leaving with this node, which lost a rank; a spare takes its place ({err})", file=sys.stderr)
        code = 1
    except RestartAbort as err:
        print(f"in-process restart gave up: {err}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # Every way out: the exit is bounded from here, and nothing of NVRx's is left for the
        # interpreter's shutdown to tear down. Each step on its own: one failing (a monitor
        # connection already gone) must not keep the checkpoint worker alive.
        arm_exit_watchdog(code)
        from workloads.checkpoint.writers import stop_checkpoint_workers

        for step in (process.ft.shutdown, stop_checkpoint_workers, process.events.close):
            try:
                step()
            except Exception:  # noqa: BLE001 - best effort on the way out; the exit is bounded
                log.exception("on the way out: %s failed", getattr(step, "__name__", step))
    return code


def _attempt_function(
    process: ProcessState, store: tuple[str, int] | None
) -> tuple[Callable[[ProcessState], dict], tuple[type[BaseException], ...]]:
    """(train_attempt, inside NVRx's Wrapper when the in-process layer is on; the exceptions that
    mean a SIGTERM stopped it)."""
    cfg = process.cfg
    if not cfg.inprocess.enabled:
        return train_attempt, ()  # nothing to catch without the Wrapper
    from workloads.device import resolved_backend
    from workloads.inprocess import TerminationRequested, build_wrapper

    assert store is not None  # required by _refuse_what_cannot_run whenever the in-process layer is on
    fn = build_wrapper(
        cfg.inprocess,
        backend=resolved_backend(cfg),
        store=store,
        world_size=process.world_size,
        spare_nodes=cfg.distributed.spare_nodes,
        nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        run_dir=Path(cfg.run_dir),
        events=process.events,
        ft=process.ft,
        drop_iteration_state=process.drop_iteration_state,
        stop_requested=lambda: process.stop_requested,
    )(train_attempt)
    return fn, (TerminationRequested,)


#: A SIGTERM sent to every process of a node (a node shutdown, a process-group kill) reaches a rank
#: twice within milliseconds: directly, and forwarded by ft_launcher. Within this window a second
#: one is the same request, not an order to skip the stop-save.
SIGTERM_DEBOUNCE_S = 5.0
#: Room left between the exit watchdog armed at a SIGTERM and ft_launcher's SIGKILL.
SIGTERM_EXIT_MARGIN_S = 10.0


def sigterm_exit_bound_s(cfg: TrainConfig) -> float:
    """How long a rank may take from a SIGTERM to its exit: the launcher's term timeout (sized for
    the stop path's saves) less a margin, so the exit code is ours and not the launcher's SIGKILL."""
    return cfg.launcher_term_timeout_s() - SIGTERM_EXIT_MARGIN_S


def exit_bound_s(cfg: TrainConfig) -> float:
    """EXIT_BOUND_S, checked against what an orderly exit waits for: the checkpoint worker's abort
    grace and the NVRx monitor's termination grace. A bound shorter than those would turn every
    orderly exit into a watchdog kill."""
    from workloads.checkpoint.nvrx_worker import WRITER_ABORT_GRACE_S

    needs = WRITER_ABORT_GRACE_S + cfg.inprocess.termination_grace_s
    if not EXIT_BOUND_S > needs:
        raise ConfigError(
            f"inprocess.termination_grace_s: {cfg.inprocess.termination_grace_s:g}s "
            f"plus the checkpoint writer's abort grace ({WRITER_ABORT_GRACE_S:g}s) "
            f"must stay below the exit bound ({EXIT_BOUND_S:g}s); lower it"
        )
    return EXIT_BOUND_S


class _ExitWatchdog:
    """Guarantees that the process exits with the code it decided on within a bound, whatever the
    way out blocks on (a barrier with a dead peer, a checkpoint worker that ignores SIGTERM). One
    daemon thread, started before the SIGTERM handler is installed and waiting on an Event: arming
    it from the handler only sets the Event, where starting a thread could deadlock on a lock the
    interrupted main thread holds. The thread runs while the main thread waits in a lock or a
    socket. The first arming wins: the decision to leave was taken then, with the code it names."""

    def __init__(self) -> None:
        self._armed = threading.Event()
        self._code, self._bound_s = 1, EXIT_BOUND_S
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait_then_exit, name="exit-watchdog", daemon=True)
            self._thread.start()

    def arm(self, code: int, bound_s: float) -> None:
        if self._armed.is_set():
            return
        self._code, self._bound_s = code, bound_s
        self._armed.set()
        self.start()

    def _wait_then_exit(self) -> None:
        self._armed.wait()
        time.sleep(self._bound_s)
        print(
            f"exit watchdog: still here {self._bound_s:g}s after deciding to exit; exiting {self._code} now",
            file=sys.stderr,
            flush=True,
        )
        exit_without_finalizing(self._code)


_exit_watchdog = _ExitWatchdog()


#: This process's part in the run directory's lease, made by run(); None where train_attempt is
#: called without it (tools, tests).
_run_lease: RankZeroLease | None = None


def _take_run_lease(cfg: TrainConfig, rank: int) -> str | None:
    """The launcher's rank 0 takes the run directory's lease (workloads.lease) before anything of
    the run is written there; returns how it came to be held (for the event log, once there is
    one), None on any other rank. Raises RunDirectoryInUse when another live run holds it."""
    from workloads import do_not_requeue
    from workloads.coordinator import round_key

    global _run_lease
    _run_lease = RankZeroLease(
        Path(cfg.run_dir),
        attempt=do_not_requeue.attempt_id(),
        rendezvous_round=round_key(),
        command="workloads.train rank 0",
    )
    return _run_lease.follow(rank)


def _follow_rank_0(process: ProcessState, call_wrapper: CallWrapper | None) -> None:
    """At the start of each in-process iteration: the process NVRx made rank 0 holds the lease (a
    spare that took the lost rank 0's place takes it over from its own launch at once), and one
    that is rank 0 no longer stops renewing it. A refusal (another job took the lease while none
    of this launch renewed it) is a ConfigError: the job ends in 93."""
    if _run_lease is None:
        return
    rank = int(os.environ.get("RANK", "0"))  # NVRx's assignment for this iteration
    taken = _run_lease.follow(rank, ping=call_wrapper.ping if call_wrapper is not None else _no_ping)
    if taken is not None:
        process.events.rank = rank
        process.events.emit("run_lease", how=taken)


def _no_ping() -> None:
    return None


def arm_exit_watchdog(code: int, bound_s: float = EXIT_BOUND_S) -> None:
    """Exit with `code` within bound_s from now at the latest (see _ExitWatchdog)."""
    _exit_watchdog.arm(code, bound_s)


def preflight(cfg: TrainConfig, world_size: int) -> int:
    """Checks that need no rank: fault ranks, data path, model.init_from, checkpoint compatibility."""
    problems = []
    problems += [outside_world_problem(f, world_size) for f in outside_world(parse_fault_spec(cfg.faults), world_size)]
    try:
        cfg.data.accumulation(world_size)
    except ConfigError as err:
        problems.append(str(err))
    if cfg.data.source == "memmap":
        from workloads.shards import PREFLIGHT_HASH_BYTES, shard_files

        try:
            shard_files(cfg.data, cfg.model.shape.vocab_size, hash_bytes=PREFLIGHT_HASH_BYTES)
        except ConfigError as err:
            problems.append(str(err))
    if cfg.model.init_from is not None:
        from workloads.hf_format import open_checkpoint

        try:
            open_checkpoint(cfg.model.init_from, cfg.model.shape, cfg.model.noun, cfg.model.rope_scaling_settings)
        except ConfigError as err:
            problems.append(str(err))
    if cfg.checkpoint.backend != "none":
        problems += _checkpoint_dir_problems(cfg, world_size)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_DO_NOT_REQUEUE if problems else 0


def _checkpoint_dir_problems(cfg: TrainConfig, world_size: int) -> list[str]:
    """What the trainer would meet in checkpoint.dir: a pointer it cannot trust, a newest
    checkpoint from another world size or preset, storage that refuses the next save."""
    from nvrx_eks.facts import checkpoint_layout as layout

    root = Path(cfg.checkpoint_dir)
    state = layout.commit_state(root)
    if state.source == "lost":
        assert state.warning is not None  # commit_state says why nothing can be trusted
        return [state.warning]
    if state.source == "rebuilt":
        # The trainer rebuilds the pointer the same way (and says so in its log and events).
        print(f"warning: checkpoint.dir: {state.warning}", file=sys.stderr)
    problems = []
    newest = root / state.committed[0] if state.committed else None
    manifest = layout.verified_commit(newest) if newest is not None else None
    identity = layout.run_identity(world_size, cfg.model.preset, cfg.model.shape_changes)
    problem = layout.incompatibility(manifest, identity, layout_may_differ=True) if manifest else None
    if problem is not None:
        problems.append(f"checkpoint.dir: the newest checkpoint {problem}")
    # The next save needs about as much as the newest one took (nothing to go by on a fresh run).
    need = layout.committed_bytes(newest) if newest is not None else 0
    refusal = layout.storage_refusal_now(root, need)
    if refusal is not None:
        problems.append(layout.storage_refusal_message(refusal, root, need))
    return problems


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="TrainConfig YAML")
    parser.add_argument(
        "--store",
        type=split_endpoint,
        default=None,
        metavar="HOST:PORT",
        help="the in-process restart store, served by the job's coordinator (workloads.coordinator)",
    )
    parser.add_argument("--preflight", action="store_true", help="only check config, data and checkpoint compatibility")
    parser.add_argument("--world-size", type=int, default=None, help="with --preflight")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    # Before torch is imported: NVRx's store polling makes c10d log a warning per wait timeout.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format=log_format(os.environ.get("RANK", "0")))
    try:
        cfg = TrainConfig.from_yaml(args.config, args.overrides)
        if args.preflight:
            if args.world_size is None:
                raise ConfigError("--preflight needs --world-size (nnodes x nproc-per-node)")
            return preflight(cfg, args.world_size)
        if bound := bind_rank_to_numa_node():
            log.info(bound)
        return run(cfg, args.store)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_DO_NOT_REQUEUE
    except Exception:  # noqa: BLE001 - any failure that reached here ends the rank
        _leave_after_failure()


def log_format(rank: str) -> str:
    """Every log line tagged `[rankR]`: `nvrx-eks logs --rank` and the event and metrics lines
    (nvrx_eks.facts.training_metrics) are found by it."""
    return f"%(asctime)s [rank{rank}] %(message)s"


def _leave_after_failure() -> NoReturn:
    """Exit 1 without finalizing the interpreter.

    A rank fails this way when a peer died in the middle of a collective (no in-process layer to
    catch it). Finalizing would then garbage-collect the gloo process group, whose destructor
    waits on the dead peer for the whole process-group timeout; the rank ignores ft_launcher's
    SIGTERM meanwhile (it is not in the training loop to honour it), so every launcher restart
    waited workers_stop_timeout_s for the SIGKILL. Nothing is left to finish: events are written
    line by line, the ft client was shut down by run(), the checkpoint worker dies with this
    process (parent-death signal)."""
    traceback.print_exc()
    exit_without_finalizing(1)


def _main_then_exit() -> None:
    """main(), then end the process with its code (workloads.process_exit), whatever way main
    ends (an exception the NVRx Wrapper re-raises may be a BaseException, e.g. DCP's
    CheckpointException)."""
    try:
        code = main()
    except SystemExit as err:  # argparse
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - the process ends here either way
        traceback.print_exc()
        code = 1
    exit_without_finalizing(code)


if __name__ == "__main__":
    _main_then_exit()
elif __name__ == "__mp_main__":
    become_rank_helper()  # a helper this rank spawned: its checkpoint worker, or a Manager
