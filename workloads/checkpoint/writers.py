"""One writer per checkpoint backend (checkpoint.backend): how a save's data reaches the files.

    nvrx       NvrxWriter: NVRx's persistent AsyncCallsQueue worker (cpu_shm_mode),
               FileSystemWriterAsync with shared-memory staging, save_state_dict_async_plan /
               save_state_dict_async_finalize. The training loop blocks only while the state is
               copied into shared memory, which happens before the call returns, i.e. before the
               optimizer can change a weight.
    dcp-async  DcpAsyncWriter: torch.distributed.checkpoint.async_save on its own gloo group (on
               the default group its collectives would interleave with FSDP's and deadlock).
    sync       SyncWriter: torch.distributed.checkpoint.save.

A writer hands a save off and tells when every rank finished writing it; the Checkpointer owns
the directory, the commit and the policy. Each writer hashes its rank's files as soon as they are
written where it can (the NVRx worker process, torch's writer thread), so the commit only gathers
the digests.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_eks.facts.checkpoint_layout import DIGESTS_FILE, atomic_write
from workloads.checkpoint import files as ckpt_files
from workloads.checkpoint.errors import CheckpointWriterDied
from workloads.checkpoint.groups import checkpoint_gloo_group
from workloads.helper_processes import spawning_rank_helpers


@dataclass
class PendingSave:
    """A save handed off and not yet committed."""

    step: int
    path: Path
    handed_off_t: float
    handle: Any = None  # dcp-async future
    extra: dict[str, Any] = field(default_factory=dict)


def _drop_results_of_abandoned_saves() -> None:
    """NVRx's writers report through one process-wide results queue, read once per save at its
    finalize. A save abandoned by an in-process restart may have reported (its result, or the
    error of its interrupted write) without anyone reading it; left there, it would be taken for
    the result of the next iteration's first save and fail that save. Nothing is in flight when a
    Checkpointer starts, so whatever the queue holds belongs to abandoned saves.

    Only an existing queue is drained: creating one starts a multiprocessing Manager (a spawned
    process importing the trainer, seconds), which during setup the in-process watchdog takes for
    a hang. A fresh process has none; the first save starts it (_start_results_queue), outside hang
    protection."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    results = filesystem_async._results_queue
    if results is None:
        return
    while True:
        try:
            results.get_nowait()
        except queue.Empty:
            return


def _start_results_queue() -> None:
    """NVRx's write-results queue, started here rather than inside the first save's NVRx call: its
    Manager is a helper process that a SIGTERM arriving while it starts must not end
    (workloads.helper_processes). Once the queue exists, only the hold's own cost remains (a probe
    of the resource tracker, two signal-mask calls), at each iteration's first save."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import get_write_results_queue

    with spawning_rank_helpers():
        get_write_results_queue()


def _write_then_digest(
    write_fn: Callable[..., None], directory: str, with_sha: bool, rank: int, write_buckets: Any, results_queue: Any
) -> None:
    """Runs in the NVRx checkpoint worker in place of the writer's save function (NVRx puts the
    staged data in the second argument, as it does for the save function itself): writes this
    rank's shards, then records their digests in DIGESTS_FILE. Hashing here keeps a full read of
    the shard off the training thread, which would otherwise do it at the commit."""
    write_fn(rank, write_buckets, results_queue)
    path = Path(directory)
    try:
        digests = ckpt_files.rank_digests(path, rank, with_sha)
        atomic_write(path / DIGESTS_FILE.format(rank=rank), json.dumps(digests))
    except OSError:
        # Full or read-only storage. The write function has already reported its own outcome
        # through the results queue; raising here would kill the worker, and the trainer would
        # learn only "the worker died" instead of the error. Without the digests the commit
        # hashes on the training thread, where a storage error is reported by name.
        pass


class Writer:
    """A backend. Collective methods (every rank, same order): the constructor, hand_off, poll."""

    #: The data is on disk when hand_off returns: the Checkpointer commits right after it.
    blocking = False
    #: For a writer with a worker process: how it got it (workloads.checkpoint.nvrx_worker).
    worker_start: str | None = None

    def __init__(self, *, rank: int, device: torch.device, with_sha: bool, commit: Callable[[PendingSave], None]):
        self.rank, self.device, self.with_sha, self.commit = rank, device, with_sha, commit

    def hand_off(self, pending: PendingSave, state: dict[str, Any], first: bool) -> None:
        """Start writing `state` into pending.path; returns once the caller may change it."""
        raise NotImplementedError

    def poll(self, pending: PendingSave) -> None:
        """Commit `pending` (through `commit`) if every rank finished writing it."""

    def raise_if_died(self, pending: PendingSave) -> None:
        """Raise CheckpointWriterDied when the writer can no longer finish `pending`."""

    def close(self) -> None:
        """Stop the writer (its in-flight save already committed)."""


class SyncWriter(Writer):
    """checkpoint.backend=sync: DCP's save, on the training thread."""

    blocking = True

    def hand_off(self, pending: PendingSave, state: dict[str, Any], first: bool) -> None:
        dcp.save(state, checkpoint_id=str(pending.path))


class DcpAsyncWriter(Writer):
    """checkpoint.backend=dcp-async: torch's async_save on its own gloo group."""

    def __init__(self, *, group_timeout_s: float, **kwargs: Any):
        super().__init__(**kwargs)
        self._group = checkpoint_gloo_group(group_timeout_s)

    def hand_off(self, pending: PendingSave, state: dict[str, Any], first: bool) -> None:
        response = dcp.async_save(state, checkpoint_id=str(pending.path), process_group=self._group)
        pending.handle = getattr(response, "upload_completion", response)
        self._digest_when_written(pending)

    def _digest_when_written(self, pending: PendingSave) -> None:
        """Hash the rank's shards in the writer's thread as soon as the write is done (hashlib and
        file reads release the GIL), so the commit only gathers the digests."""
        digested = pending.extra["digested"] = threading.Event()

        def digest(future: Any) -> None:
            try:
                if not future.cancelled() and future.exception() is None:
                    pending.extra["digests"] = ckpt_files.rank_digests(pending.path, self.rank, self.with_sha)
            finally:
                digested.set()

        pending.handle.add_done_callback(digest)

    def poll(self, pending: PendingSave) -> None:
        written = pending.handle.done() and pending.extra["digested"].is_set()
        done = torch.tensor([1 if written else 0], device=self.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if int(done.item()):
            pending.handle.result()  # raises the writer's error, if any
            self.commit(pending)


class NvrxWriter(Writer):
    """checkpoint.backend=nvrx: NVRx's persistent checkpoint worker, shared-memory staging."""

    def __init__(
        self,
        *,
        unguarded: Callable[[], AbstractContextManager[Any]],
        write_threads: int,
        ready_key: str,
        ready_bound_s: float,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.unguarded = unguarded
        self.write_threads = write_threads
        self.ready_key, self.ready_bound_s = ready_key, ready_bound_s
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import CheckpointMetadataCache

        from workloads.checkpoint.nvrx_worker import checkpoint_worker
        from workloads.cuda_compat import install_cpu_checkpoint_shim

        install_cpu_checkpoint_shim(dist.get_backend())
        # cpu_shm_mode: the worker stages through shared CPU memory and never touches CUDA. On
        # CPU this is the only mode that works (the default queue's worker dies on
        # `rank % torch.cuda.device_count()` and the trainer waits forever); on GPU it avoids
        # CUDA IPC handles entirely. Kept on p5 too, by choice: the CUDA-IPC path
        # (use_cpu_shm_for_gpu_tensors=False) gives the worker references to the live training
        # tensors (filesystem_async.py, "GPU IPC path caches only stable GPU allocations") that
        # it copies out with a pinned D2H after the hand-off, so the hand-off would have to wait
        # for that copy before optimizer.step may change them, and each of the 8 workers per
        # node would hold a CUDA context (~0.5 GB of the GPU it reads from). The price of shm
        # staging is a pageable D2H copy (NVRx syncs every 8 tensors): nvrx_eks/planning/model.py assumes
        # 10 GB/s for it, and the GPU smoke script measures the real stall. The worker outlives
        # in-process restarts (workloads.checkpoint.nvrx_worker).
        self._worker = checkpoint_worker
        # Unguarded: a worker the failed iteration left busy is waited for, or killed and
        # replaced, and a peer's worker may be spawning, all of which the in-process watchdog
        # would take for a hang; the ft `setup` section still bounds it.
        with unguarded():
            self._queue: Any = checkpoint_worker.queue_for(self.rank, ready_key, ready_bound_s)
        _drop_results_of_abandoned_saves()  # after queue_for let a busy worker finish, or stopped it
        self.worker_start = checkpoint_worker.last_start
        self._metadata_cache = CheckpointMetadataCache()

    def hand_off(self, pending: PendingSave, state: dict[str, Any], first: bool) -> None:
        if first:
            # The first NVRx save of an iteration plans, allocates the shared-memory staging
            # buffers and ships them to the worker: seconds on a busy host, which the in-process
            # watchdog would take for a hang. It runs without hang protection; the ft
            # `checkpointing` section still bounds it. Later saves reuse plan and buffers. A rank
            # whose buffers the reused worker still holds is done in milliseconds, a rank that
            # allocates them (a fresh worker, a spare that took a lost rank's place) seconds
            # later: the ranks wait for each other here, within the workers' bound, not in the
            # next step's collective under the process group's timeout (seen: 4.9 s against
            # gloo's 5 s, a restart).
            from workloads.checkpoint.nvrx_worker import every_rank_arrived

            with self.unguarded():
                _start_results_queue()
                self._hand_off(pending, state)
                every_rank_arrived(f"{self.ready_key}/first-save", self.ready_bound_s)
        else:
            self._hand_off(pending, state)

    def _hand_off(self, pending: PendingSave, state: dict[str, Any]) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (
            save_state_dict_async_finalize,
            save_state_dict_async_plan,
        )

        # thread_count (torch's FileSystemWriter argument, which NVRx's passes on): the worker
        # splits the rank's tensors by size over that many threads, each writing its own
        # __<rank>_<n>.distcp (filesystem_async.py write_preloaded_data_multithread); the digest
        # and the commit's checks cover every such file of the rank (files.rank_digests).
        writer = FileSystemWriterAsync(
            pending.path,
            use_cpu_shm_for_gpu_tensors=True,
            use_cached_data_structure=True,
            thread_count=self.write_threads,
        )
        writer, metadata, dist_wrapper = save_state_dict_async_plan(
            state, writer, None, enable_cache=True, metadata_cache=self._metadata_cache
        )
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        if save_fn is not None:
            save_fn = partial(_write_then_digest, save_fn, str(pending.path), self.with_sha)
        finalize = [
            partial(save_state_dict_async_finalize, writer, metadata, dist_wrapper),
            partial(self.commit, pending),
        ]
        self._worker.schedule(AsyncRequest(save_fn, save_args, finalize, preload_fn=preload_fn))

    def poll(self, pending: PendingSave) -> None:
        # Runs the finalize functions (.metadata, then the commit) once all ranks are done.
        self._queue.maybe_finalize_async_calls(blocking=False)

    def raise_if_died(self, pending: PendingSave) -> None:
        caller = getattr(self._queue, "persistent_caller", None) if self._queue else None
        process = getattr(caller, "process", None)
        if process is not None and not process.is_alive():
            raise CheckpointWriterDied(
                f"the checkpoint worker exited (code {process.exitcode}) while writing step {pending.step}"
            )

    def close(self) -> None:
        if self._queue is not None:
            self._worker.close()
            self._queue = None


def build_writer(
    backend: str,
    *,
    rank: int,
    device: torch.device,
    with_sha: bool,
    commit: Callable[[PendingSave], None],
    unguarded: Callable[[], AbstractContextManager[Any]],
    group_timeout_s: float,
    write_threads: int,
    attempt: str,
) -> Writer | None:
    """The writer of checkpoint.backend; None for `none`. `group_timeout_s` bounds the
    collectives of a writer's own gloo group (workloads.checkpoint.groups), and the wait for every
    rank's NVRx worker; `write_threads` is checkpoint.write_threads; `attempt` is the same on
    every rank and new for every writer (the Checkpointer's token). Collective."""
    common: dict[str, Any] = {"rank": rank, "device": device, "with_sha": with_sha, "commit": commit}
    if backend == "nvrx":
        return NvrxWriter(
            unguarded=unguarded,
            write_threads=write_threads,
            ready_key=f"nvrx-eks/checkpoint-workers-ready/{attempt}",
            ready_bound_s=group_timeout_s,
            **common,
        )
    if backend == "dcp-async":
        return DcpAsyncWriter(group_timeout_s=group_timeout_s, **common)
    if backend == "sync":
        return SyncWriter(**common)
    return None


def stop_checkpoint_workers() -> None:
    """Stop every NVRx checkpoint worker this process still has (workloads.checkpoint.nvrx_worker);
    after a normal end they are already closed and this does nothing. A process that never
    imported NVRx's checkpointing has none, and does not import it now."""
    if "workloads.checkpoint.nvrx_worker" not in sys.modules:
        return
    from workloads.checkpoint.nvrx_worker import checkpoint_worker

    checkpoint_worker.stop()


def abandon_in_flight_saves() -> None:
    """At an in-process restart: the NVRx queue drops the failed iteration's finalize functions,
    so its model and optimizer can be freed (CheckpointWorker.abandon_in_flight). A process that
    never imported NVRx's checkpointing has no queue, and does not import it now."""
    if "workloads.checkpoint.nvrx_worker" not in sys.modules:
        return
    from workloads.checkpoint.nvrx_worker import checkpoint_worker

    checkpoint_worker.abandon_in_flight()
