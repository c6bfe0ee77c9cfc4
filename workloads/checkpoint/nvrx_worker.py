"""This process's NVRx checkpoint worker, kept across in-process restarts.

NVRx's persistent checkpoint worker is a spawned process that imports torch and the trainer.
NVRx's in-process abort (AbortPersistentCheckpointProcesses) kills it at every restart, and the
next iteration spawned a new one on the restart's critical path: 1.7 s of a 1.8 s restart setup
on 2 CPU cores (tiny preset, measured by timing the setup phases); its first save then allocated
and shipped the shared-memory staging buffers again. The in-process abort here leaves the worker
alone (killing it never unblocks the training thread: the thread waits on the worker only in
Python-level polls, which NVRx's restart exception interrupts, or in NVRx's staging handshake,
which only the worker's own answer ends), and the next iteration's writer decides, on the
training thread, once the failed iteration has unwound (`queue_for`):

- A save the failed iteration handed off may still be in the worker. Its completion would land
  on the queue the next iteration polls and be taken for the next save's. So the worker is given
  DRAIN_S to finish what it was handed (its files go to a directory nothing commits; its result,
  to the results queue the writer drains), and is reused once it has.
- It is killed instead, and a fresh one started, when it is dead, when it does not finish in
  time, or when a hand-off was cut half way (the request and NVRx's staging handshake would be
  out of step for the next save).

A reused worker keeps NVRx's staging caches (training side: FileSystemWriterAsync's
shared-memory tensors; worker side: the write items they belong to), which NVRx keys by the
shards' names, shapes and dtypes, not their offsets. The same rank saves the same shards, so they
stay valid; a rank that changed (a spare took a lost node's place and ShiftRanks moved the ranks
above it) has both caches dropped before its first save.

Every rank starts its worker at process start (`warm_up`, NVRx's pre-warm), before the Wrapper: a
hot spare waits outside the process group, and has its worker ready when a restart activates it.

Getting a worker takes one rank milliseconds (reused) and another seconds (a fresh spawn imports
torch: 9-17 s on a loaded 2-core host). The ranks agree that every worker is up on the store, with
a bound of its own, before any collective: the first collective after it (the probe's finalize,
before) waited for the slowest spawn under the process group's timeout, which on gloo is the soft
timeout, and timed out; the restart then hit the spawning rank mid-spawn, its next iteration
spawned again, and in-process restarts looped until ft_launcher took over.

NVRx registers one process-wide "drain" callback per queue (wait for the previous write before
the staging buffers are overwritten) and unregisters it when a queue closes, so a replaced
queue's close may unregister the current one's. The Checkpointer never relies on it: a save
first waits for the previous one to commit.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import signal
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nvidia_resiliency_ext.checkpointing.async_ckpt.core import (
    AsyncCallsQueue,
    AsyncRequest,
    PersistentAsyncCaller,
    abort_nvrx_checkpoint,
)

from workloads.helper_processes import let_sigterm_through, spawning_rank_helpers

# A killed worker gets SIGTERM, then SIGKILL after this long. The save it abandons is never
# committed, so nothing is lost by not finishing it; NVRx's default (30 s) lets a worker in the
# middle of its files hold up the restart for that long.
WRITER_ABORT_GRACE_S = 2.0

#: How long a restart waits for the worker to finish a save the failed iteration handed it, before
#: killing it: beyond about what spawning a new worker costs (1.7 s measured on 2 CPU cores),
#: waiting is the slower way to a usable worker.
DRAIN_S = 1.0

#: The store wait's slice while the ranks wait for each other's workers: between slices the
#: in-process restart's exception can reach the waiting thread (it cannot inside the C++ wait).
_READY_SLICE_S = 0.5

#: How the worker is spawned and stopped: cpu_shm_mode (see NvrxWriter), the abort grace.
_CALLER_OPTIONS: dict[str, Any] = {"cpu_shm_mode": True, "sigterm_timeout": WRITER_ABORT_GRACE_S}


def _abort_flag(rank_pid: int) -> Path:
    """Present while the rank with this pid aborts its workers (see _take_sigterm_only_from_rank)."""
    return Path(tempfile.gettempdir()) / f"nvrx-eks-checkpoint-abort-{rank_pid}"


@contextlib.contextmanager
def _aborting() -> Iterator[None]:
    flag = _abort_flag(os.getpid())
    flag.touch()
    try:
        yield
    finally:
        flag.unlink(missing_ok=True)


def _take_sigterm_only_from_rank() -> None:
    """Runs in the worker: a SIGTERM ends it only while its rank aborts it (NVRx's abort is SIGTERM,
    then SIGKILL after WRITER_ABORT_GRACE_S). A SIGTERM sent to every process of the node (a node
    shutdown, a process-group kill) reaches the worker too, and NVRx's own handler would end it in
    the middle of the save the rank is about to make on its way out: the stop-save would be lost."""
    flag = _abort_flag(os.getppid())

    def on_sigterm(signum: int, frame: Any) -> None:
        if flag.exists():
            raise SystemExit(128 + signum)  # as NVRx's handler: its cleanup runs on the way out

    signal.signal(signal.SIGTERM, on_sigterm)
    let_sigterm_through()  # spawned with SIGTERM blocked (workloads.helper_processes)


def _worker_ready_probe() -> None:
    """Runs in the worker; its completion proves the worker is up."""
    _take_sigterm_only_from_rank()


def _forget_cached_state() -> None:
    """Runs in the worker: drop the write items cached for another rank's shards."""
    _take_sigterm_only_from_rank()
    PersistentAsyncCaller.cleanup_worker_data_cache()


class CheckpointWorker:
    """The worker of this process: the queue of the current NvrxWriter (its caller owns the
    worker process), the rank its caches were filled for, and whether a hand-off is under way."""

    def __init__(self) -> None:
        self.queue: AsyncCallsQueue | None = None
        self.rank: int | None = None
        self.handing_off = False
        #: How the last queue_for got its worker: "reused", "warmed" (by warm_up) or "spawned".
        self.last_start = ""

    def warm_up(self, rank: int) -> None:
        """Start a worker now, for the first queue_for to take (NVRx's pre-warm slot)."""
        with spawning_rank_helpers():
            AsyncCallsQueue.warmup_persistent_caller(rank, **_CALLER_OPTIONS)

    def queue_for(self, rank: int, ready_key: str, ready_bound_s: float) -> AsyncCallsQueue:
        """A queue for a new NvrxWriter of `rank`, on the previous iteration's worker when it is
        usable, else on a pre-warmed or fresh one; returns once every rank's worker answered a
        probe, waiting up to `ready_bound_s` for the others on the default group's store, under
        `ready_key` (the same on every rank, new for every writer). Collective."""
        caller = self._take_previous_worker()
        probe = _worker_ready_probe
        if caller is None:
            self.last_start = "warmed" if AsyncCallsQueue._warmup_persistent_caller is not None else "spawned"
            with spawning_rank_helpers():
                AsyncCallsQueue.warmup_persistent_caller(rank, **_CALLER_OPTIONS)  # no-op when pre-warmed
        else:
            self.last_start = "reused"
            if rank != self.rank:
                from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

                FileSystemWriterAsync.cleanup_tensor_caches()
                probe = _forget_cached_state
        self.queue = AsyncCallsQueue(persistent=True, **_CALLER_OPTIONS)
        if caller is not None:
            caller.rank = rank
            self.queue.persistent_caller = caller
        self.rank = rank
        # Wait for the worker here, during setup: otherwise the first save would block for the
        # worker's start-up (seconds) and look like a hang to the in-process watchdog. This
        # rank's own first (no_dist: no collective), then every rank's.
        self.schedule(AsyncRequest(probe, (), []))
        self.queue.maybe_finalize_async_calls(blocking=True, no_dist=True)
        every_rank_arrived(ready_key, ready_bound_s)
        return self.queue

    def _take_previous_worker(self) -> Any:
        """The previous queue's caller, detached, if its worker is usable; that queue is closed
        either way (which kills a worker still attached to it)."""
        previous, self.queue = self.queue, None
        torn, self.handing_off = self.handing_off, False
        if previous is None:
            return None
        caller = previous.persistent_caller
        process = getattr(caller, "process", None)
        usable = not torn and process is not None and process.is_alive() and _drained(previous, caller)
        if usable:
            previous.persistent_caller = None
            previous.async_calls.clear()  # abandoned: nothing finalizes or commits them
        with _aborting():
            previous.close(abort=True)
        return caller if usable else None

    def schedule(self, request: AsyncRequest) -> None:
        """Hand `request` to the worker."""
        assert self.queue is not None, "queue_for first"
        self.handing_off = True
        self.queue.schedule_async_request(request)
        self.handing_off = False

    def abandon_in_flight(self) -> None:
        """At an in-process restart: forget what the failed iteration's saves would have run at
        their finalize. The queue outlives the iteration, and a request's finalize functions (the
        DCP finalize with its planner, the Checkpointer's commit) reach the Checkpointer and the
        model and optimizer it saves: on a GPU, the failed iteration's parameters and moments
        would stay allocated while the next iteration allocates its own. Nothing finalizes these
        saves any more; one empty request per save stays in the queue, for `_drained` to count."""
        if self.queue is None:
            return
        self.queue.async_calls = deque(
            call._replace(async_request=AsyncRequest(None, (), [], call_idx=call.async_request.call_idx))
            for call in self.queue.async_calls
        )

    def close(self) -> None:
        """Normal end: the queue finishes what it holds and stops the worker."""
        if self.queue is not None:
            self.queue.close()
            self.queue = None

    def stop(self) -> None:
        """On the way out: abort every worker this process has (SIGTERM, then SIGKILL after
        WRITER_ABORT_GRACE_S). Left to the interpreter, NVRx's __del__ would close them at
        shutdown by posting to the worker's queue and joining it; with the worker dead or aborted
        that join never returns (seen: Py_FinalizeEx blocked in a SemLock acquire, exit code never
        delivered)."""
        self.queue = None
        with _aborting():
            abort_nvrx_checkpoint()
            if AsyncCallsQueue._warmup_persistent_caller is not None:
                AsyncCallsQueue._warmup_persistent_caller.close(abort=True)
                AsyncCallsQueue._warmup_persistent_caller = None


class WorkersNotReady(RuntimeError):
    """Some rank did not get as far within the bound (its worker, its first hand-off): a fault
    (restart)."""


def every_rank_arrived(key: str, bound_s: float) -> None:
    """A barrier on the default process group's store: every rank adds itself, the last one
    marks the key complete, each waits for the mark in slices until `bound_s`."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    world = dist.get_world_size()
    done = f"{key}/all"
    if store.add(key, 1) >= world:
        store.set(done, "1")
    deadline = time.monotonic() + bound_s
    while True:
        try:
            store.wait([done], datetime.timedelta(seconds=_READY_SLICE_S))
            return
        except dist.DistStoreError:
            if time.monotonic() > deadline:
                arrived = store.add(key, 0)
                raise WorkersNotReady(f"{arrived} of {world} ranks reached {key} within {bound_s:g}s") from None


def _drained(previous: AsyncCallsQueue, caller: Any) -> bool:
    """Wait up to DRAIN_S for the worker to report done every request `previous` handed it (the
    caller may hold one report already, read by a poll that had not yet seen every rank done)."""
    outstanding = len(previous.async_calls) - (caller.cur_item is not None)
    deadline = time.monotonic() + DRAIN_S
    while outstanding > 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            caller.comp_q.get(timeout=remaining)
        except queue.Empty:
            return False
        outstanding -= 1
    caller.cur_item = None
    return True


#: The one worker of this process.
checkpoint_worker = CheckpointWorker()
