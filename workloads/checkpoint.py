"""Checkpoints: DCP format, written by NVRx async checkpointing (or torch's async_save, or
synchronously), committed atomically, verified and restored.

Layout and commit rules: nvrx_eks.facts.checkpoint_layout.

A checkpoint counts only once it is listed in latest.json, which rank 0 replaces atomically
(write, fsync, rename) after writing the directory's commit.json, which itself is written only
after the global finalize saw every rank's data on disk. A rank killed mid-save therefore leaves a
directory that nothing ever loads. (Without a usable latest.json the list is rebuilt from the
commit records that verify, with a warning.) Each save goes to a fresh directory (the attempt token differs
per restart), so an abandoned save is never overwritten in place, and nothing is deleted before a
newer checkpoint committed: at each commit rank 0 keeps the newest `keep` committed checkpoints and
removes what the pointer it read proves superseded (older commits, abandoned saves, and commits
from a timeline that a fallback abandoned, i.e. at or after the new step; see
ckpt_layout.may_delete).

commit.json records every file's size and, with checkpoint.verify=sha256, its SHA-256 (each rank's
files are hashed by whoever wrote them: for the async backends the writer does it right after
writing, in the NVRx worker process or torch's writer thread, so the commit on the training thread
only gathers the digests instead of reading the rank's whole shard back; sync saves hash at the
commit). Loading re-checks them (each rank the files it reads, except those this same process
committed and nobody touched since: see Checkpointer._verify_share) and refuses, with a
ConfigError, a checkpoint from another world size or model preset; a checkpoint that fails the
check or fails to load is skipped with a warning and the previous committed one is used.

A save the storage refuses (read-only, not permitted, full: CheckpointStorageError) ends the run
with the cause named rather than costing restarts that meet the same storage; its directory is
removed if it provably never committed.

Backends (checkpoint.backend):
    nvrx       NVRx: persistent AsyncCallsQueue worker (cpu_shm_mode), FileSystemWriterAsync with
               shared-memory staging, save_state_dict_async_plan / save_state_dict_async_finalize.
               The training loop blocks only while the state is copied into shared memory, which
               happens before the call returns, i.e. before the optimizer can change a weight.
    dcp-async  torch.distributed.checkpoint.async_save on its own gloo group (on the default
               group its collectives would interleave with FSDP's and deadlock).
    sync       torch.distributed.checkpoint.save.
At most one save is in flight: a new save first waits for the previous commit.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

from nvrx_eks.facts.checkpoint_layout import (
    COMMIT_FILE,
    ITERATION_FILE,
    METADATA_FILE,
    POINTER_FILE,
    CommitState,
    atomic_write,
    checkpoint_dirs,
    commit_state,
    may_delete,
    pointer_text,
    step_dir_name,
    step_of,
    storage_refusal_message,
    storage_refusal_now,
)
from nvrx_eks.facts.errors import ConfigError
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FaultInjector, damage_in_place

log = logging.getLogger(__name__)

#: Written by an async writer next to the rank's shards: {file name: [size, sha256 or null]}.
DIGESTS_FILE = ".digests-rank{rank}.json"


class CheckpointIncompatible(ConfigError):
    """The newest committed checkpoint belongs to another world size or model."""


class NoUsableCheckpoint(ConfigError):
    """Committed checkpoints exist but none passed verification and loading."""


class CheckpointTimeout(RuntimeError):
    """A save did not commit within checkpoint.finalize_timeout_s: treated as a fault."""


class CheckpointWriterDied(RuntimeError):
    """The NVRx checkpoint worker exited with a save in flight: the save is abandoned."""


class CheckpointStorageError(ConfigError):
    """checkpoint.dir refuses the save: read-only, not permitted, or full. A restart meets the same
    storage, so this ends the run (exit 93) with the cause named, instead of costing restarts."""


# errno -> what the storage did. EPERM/EACCES: permissions; EDQUOT: a quota is a full disk too.
_STORAGE_ERRNOS = {
    errno.EROFS: "read-only",
    errno.EACCES: "denied",
    errno.EPERM: "denied",
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
}


def _os_errors(err: BaseException | None, seen: set[int] | None = None) -> list[OSError]:
    """Every OSError inside `err`: its cause/context chain and the per-rank failures a DCP
    CheckpointException carries (NVRx re-raises the writer's error in that form)."""
    seen = set() if seen is None else seen
    if err is None or id(err) in seen:
        return []
    seen.add(id(err))
    found = [err] if isinstance(err, OSError) else []
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(inner, BaseException):
                found += _os_errors(inner, seen)
    for inner in (err.__cause__, err.__context__):
        found += _os_errors(inner, seen)
    return found


def storage_failure(err: BaseException, ckpt_dir: Path, need_bytes: int) -> str | None:
    """One line naming why checkpoint.dir refused a save, or None when `err` is not a storage
    refusal. A save failure that carries no errno is judged by what the file system says now:
    NVRx reports a writer's ENOSPC as a RuntimeError string inside the CheckpointException (and
    to the other ranks as an empty one), and a worker that died says nothing at all."""
    kinds = [(_STORAGE_ERRNOS[e.errno], e) for e in _os_errors(err) if e.errno in _STORAGE_ERRNOS]
    kind, os_err = kinds[0] if kinds else (None, None)
    if kind is None and isinstance(err, (CheckpointWriterDied, CheckpointException)):
        kind = storage_refusal_now(ckpt_dir, need_bytes)
    return storage_refusal_message(kind, ckpt_dir, need_bytes, os_err) if kind else None


def state_nbytes(state: dict[str, Any]) -> int:
    """Bytes of this rank's share of `state` (local shards of DTensors)."""
    total = 0
    for value in state.values():
        if isinstance(value, dict):
            total += state_nbytes(value)
        elif isinstance(value, DTensor):
            total += value.to_local().nbytes
        elif isinstance(value, torch.Tensor):
            total += value.nbytes
    return total


# An in-process restart aborts the NVRx writer with SIGTERM, then waits this long before SIGKILL.
# The save it abandons is never committed, so nothing is lost by not finishing it; NVRx's default
# (30 s) lets a writer in the middle of its files outlast the in-process hard timeout, and the
# monitor then kills the rank: a soft fault escalated to a process restart.
WRITER_ABORT_GRACE_S = 2.0


def _drop_results_of_abandoned_saves() -> None:
    """NVRx's writers report through one process-wide results queue, read once per save at its
    finalize. A writer aborted by an in-process restart may have reported (typically the error
    of its interrupted write) without anyone reading it; left there, it would be taken for the
    result of the next iteration's first save and fail that save. Nothing is in flight when a
    Checkpointer starts, so whatever the queue holds belongs to abandoned saves.

    Only an existing queue is drained: creating one starts a multiprocessing Manager (a spawned
    process importing the trainer, seconds), which during setup the in-process watchdog takes for
    a hang. A fresh process has none; the first save creates it, outside hang protection."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    results = filesystem_async._results_queue
    if results is None:
        return
    while True:
        try:
            results.get_nowait()
        except queue.Empty:
            return


def _worker_ready_probe() -> None:
    """Runs in the NVRx checkpoint worker; its completion proves the worker is up."""


def _rank_digests(directory: Path, rank: int, with_sha: bool) -> dict[str, list[Any]]:
    return {p.name: _file_digest(p, with_sha) for p in sorted(directory.glob(f"__{rank}_*.distcp"))}


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
        atomic_write(path / DIGESTS_FILE.format(rank=rank), json.dumps(_rank_digests(path, rank, with_sha)))
    except OSError:
        # Full or read-only storage. The write function has already reported its own outcome
        # through the results queue; raising here would kill the worker, and the trainer would
        # learn only "the worker died" instead of the error. Without the digests the commit
        # hashes on the training thread, where a storage error is reported by name.
        pass


# ----- small file helpers ------------------------------------------------------------------------


def _file_digest(path: Path, with_sha: bool) -> list[Any]:
    size = path.stat().st_size
    if not with_sha:
        return [size, None]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return [size, h.hexdigest()]


#: Files this process committed, with their (size, mtime_ns) at the commit (see _verify_share).
_VERIFIED_AT_COMMIT: dict[str, tuple[int, int]] = {}
_SHARD = re.compile(r"^__\d+_\d+\.distcp$")


def _remember_verified(directory: Path, files: dict[str, Any]) -> None:
    for name in files:
        stat = (directory / name).stat()
        _VERIFIED_AT_COMMIT[str((directory / name).resolve())] = (stat.st_size, stat.st_mtime_ns)


def _verified_earlier(path: Path, size: int) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    return _VERIFIED_AT_COMMIT.get(str(path.resolve())) == (size, stat.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def committed_checkpoints(ckpt_dir: str | Path) -> list[str]:
    """Committed checkpoint names, newest first (rebuilt from the commit records when the pointer
    is missing or unreadable)."""
    return commit_state(ckpt_dir).committed


# ----- state digest ------------------------------------------------------------------------------

#: Bytes hashed between two progress calls: ~40 ms at the ~1.7 GB/s SHA-256 of one core.
DIGEST_SLICE_BYTES = 64 << 20


def _no_progress() -> None:
    return None


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key in value:
            _flatten(f"{prefix}.{key}" if prefix else str(key), value[key], out)
    elif isinstance(value, (list, tuple)) and not any(isinstance(v, torch.Tensor) for v in value):
        if all(isinstance(v, dict) for v in value) and value:
            for i, v in enumerate(value):
                _flatten(f"{prefix}.{i}", v, out)
        else:
            out[prefix] = list(value)
    else:
        out[prefix] = value


def state_digests(state: dict[str, Any], progress: Callable[[], None] = _no_progress) -> tuple[str, list[str]]:
    """SHA-256 of a (possibly sharded) state dict: (combined digest, per-rank digests).

    Each rank hashes its own local shards, in canonical order (keys sorted; each tensor with its
    dtype, global shape and local shape), so the ranks hash in parallel and nothing is gathered
    but 32 bytes per rank; the combined digest is the SHA-256 of the rank digests in rank order.
    It identifies the state for a given world size (the same state sharded over another world
    size hashes differently): a faulted and a clean run of the same world size compare equal.

    `progress` is called at least every DIGEST_SLICE_BYTES and while waiting for the other ranks'
    digests: the trainer passes the in-process watchdog's ping, so hashing a large state (the 8b
    preset: ~6 GB per rank at 16 ranks, seconds) never looks like a hang. The exchange is an
    asynchronous all_gather polled with progress calls, not a blocking collective that would
    leave the watchdog without pings.

    Collective: every rank must call it with the same keys. Returns the same on every rank."""
    flat: dict[str, Any] = {}
    _flatten("", state, flat)
    h = hashlib.sha256()
    for key in sorted(flat):
        value = flat[key]
        if isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            cpu = local.detach().to("cpu").contiguous()
            h.update(f"{key}|{cpu.dtype}|{tuple(value.shape)}|{tuple(cpu.shape)}|".encode())
            data = cpu.reshape(-1).view(torch.uint8).numpy()  # a view: no copy
            for start in range(0, data.size, DIGEST_SLICE_BYTES):
                h.update(data[start : start + DIGEST_SLICE_BYTES])
                progress()
            progress()
        else:
            h.update(f"{key}|{json.dumps(value, sort_keys=True, default=str)}|".encode())
    mine = h.digest()
    if not dist.is_initialized():
        return hashlib.sha256(mine).hexdigest(), [mine.hex()]
    device = _collective_device()
    ours = torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(ours) for _ in range(dist.get_world_size())]
    work = dist.all_gather(gathered, ours, async_op=True)
    while not work.is_completed():
        progress()
        time.sleep(0.01)
    work.wait()
    ranks = [bytes(t.cpu().tolist()) for t in gathered]
    return hashlib.sha256(b"".join(ranks)).hexdigest(), [r.hex() for r in ranks]


def state_sha256(state: dict[str, Any], progress: Callable[[], None] = _no_progress) -> str:
    """The combined digest of state_digests."""
    return state_digests(state, progress)[0]


def _collective_device() -> torch.device:
    """NCCL collectives need CUDA tensors; gloo takes CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ----- the checkpointer --------------------------------------------------------------------------


@dataclass
class PendingSave:
    step: int
    path: Path
    handed_off_t: float
    handle: Any = None  # dcp-async future
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadResult:
    step: int
    path: Path
    state: dict[str, Any]


class Checkpointer:
    """Saves, commits, verifies and loads checkpoints for one in-process iteration.

    Collective methods (every rank, same order): the constructor, save, poll, wait, close,
    load_latest. `atomic` wraps rank 0's commit so an in-process abort never interrupts it half
    way; `ping` reports progress to the in-process watchdog while waiting.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        events: EventLog,
        faults: FaultInjector,
        identity: dict[str, Any],
        device: torch.device,
        atomic: Callable[[], Any] = contextlib.nullcontext,
        ping: Callable[[], None] = lambda: None,
        unguarded: Callable[[], Any] = contextlib.nullcontext,
    ):
        self.cfg = cfg
        self.device = device  # where the small control tensors live (CUDA for NCCL)
        self.backend = cfg.checkpoint.backend
        self.dir = Path(cfg.checkpoint_dir)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.events, self.faults, self.identity = events, faults, identity
        self.atomic, self.ping, self.unguarded = atomic, ping, unguarded
        self.pending: PendingSave | None = None
        self.last_saved_step = -1
        self._saves = 0
        self._trusted_files = 0
        self._state_bytes = 0
        self._handing_off: Path | None = None
        self._queue = None
        self._group = None
        if self.backend == "none":
            return
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
        # One token per attempt, shared by all ranks: every save of this attempt gets a directory
        # no earlier attempt can have used, even for the same step.
        token = [f"{int(time.time() * 1000):x}.{events.cycle}.{events.iteration}"]
        dist.broadcast_object_list(token, src=0)
        self.attempt = token[0]
        if self.backend == "nvrx":
            self._start_nvrx_worker()
        elif self.backend == "dcp-async":
            self._group = dist.new_group(backend="gloo")

    # -- NVRx ------------------------------------------------------------------------------------

    def _start_nvrx_worker(self) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import (
            AsyncCallsQueue,
            AsyncRequest,
        )
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (
            CheckpointMetadataCache,
        )

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
        # staging is a pageable D2H copy (NVRx syncs every 8 tensors): nvrx_eks/ops/plan.py assumes
        # 10 GB/s for it, and the GPU smoke script measures the real stall.
        AsyncCallsQueue.warmup_persistent_caller(self.rank, cpu_shm_mode=True, sigterm_timeout=WRITER_ABORT_GRACE_S)
        self._queue = AsyncCallsQueue(persistent=True, cpu_shm_mode=True, sigterm_timeout=WRITER_ABORT_GRACE_S)
        _drop_results_of_abandoned_saves()
        self._metadata_cache = CheckpointMetadataCache()
        # Wait for the spawned worker here, during setup: otherwise the first save would block for
        # the worker's start-up (seconds) and look like a hang to the in-process watchdog.
        self._queue.schedule_async_request(AsyncRequest(_worker_ready_probe, (), []))
        self._queue.maybe_finalize_async_calls(blocking=True)

    def _nvrx_hand_off(self, pending: PendingSave, state: dict[str, Any]) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import (
            FileSystemWriterAsync,
        )
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (
            save_state_dict_async_finalize,
            save_state_dict_async_plan,
        )

        writer = FileSystemWriterAsync(pending.path, use_cpu_shm_for_gpu_tensors=True, use_cached_data_structure=True)
        writer, metadata, dist_wrapper = save_state_dict_async_plan(
            state, writer, None, enable_cache=True, metadata_cache=self._metadata_cache
        )
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        if save_fn is not None:
            save_fn = partial(_write_then_digest, save_fn, str(pending.path), self.cfg.checkpoint.verify == "sha256")
        finalize = [
            partial(save_state_dict_async_finalize, writer, metadata, dist_wrapper),
            partial(self._commit, pending),
        ]
        self._queue.schedule_async_request(AsyncRequest(save_fn, save_args, finalize, preload_fn=preload_fn))

    # -- saving ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _storage_errors(self) -> Any:
        """Turn a refusal of the storage (read-only, permissions, full) into
        CheckpointStorageError, after removing the failed save's directory if it provably never
        committed. Anything else passes through unchanged (a restart may fix it)."""
        try:
            yield
        except CheckpointStorageError:
            raise
        except (Exception, CheckpointException) as err:  # DCP's is a BaseException
            # The estimate: this rank's share times the ranks (FSDP shards evenly).
            need = self._state_bytes * self.world_size
            reason = storage_failure(err, self.dir, need)
            if reason is None:
                raise
            failed = self.pending.path if self.pending is not None else self._handing_off
            self.pending = None
            if failed is not None and self.rank == 0:
                self._remove_if_uncommitted(failed)
            log.error("checkpoint save failed: %s (%s: %s)", reason, type(err).__name__, err)
            raise CheckpointStorageError(reason) from err

    def _remove_if_uncommitted(self, path: Path) -> None:
        try:
            named = commit_state(self.dir).committed
        except OSError:
            return
        if path.is_dir() and not (path / COMMIT_FILE).exists() and path.name not in named:
            shutil.rmtree(path, ignore_errors=True)

    def save(self, step: int, state: dict[str, Any]) -> float:
        """Hand off a save of `state` as of `step`; returns the stall (seconds blocked)."""
        if self.backend == "none":
            return 0.0
        with self._storage_errors():
            self._state_bytes = state_nbytes(state)
            return self._save(step, state)

    def _save(self, step: int, state: dict[str, Any]) -> float:
        self.wait()  # one save in flight at most
        start = time.monotonic()
        self._saves += 1
        pending = PendingSave(
            step=step,
            path=self.dir / step_dir_name(step, f"{self.attempt}.{self._saves}"),
            handed_off_t=time.monotonic(),
        )
        self._handing_off = pending.path
        if self.backend == "nvrx" and self._saves == 1:
            # The first NVRx save of an iteration plans, allocates the shared-memory staging
            # buffers and ships them to the worker: seconds on a busy host, which the in-process
            # watchdog would take for a hang. It runs without hang protection; the ft
            # `checkpointing` section still bounds it. Later saves reuse plan and buffers.
            with self.unguarded():
                self._nvrx_hand_off(pending, state)
        elif self.backend == "nvrx":
            self._nvrx_hand_off(pending, state)
        elif self.backend == "dcp-async":
            response = dcp.async_save(state, checkpoint_id=str(pending.path), process_group=self._group)
            pending.handle = getattr(response, "upload_completion", response)
            self._digest_when_written(pending)
        else:
            dcp.save(state, checkpoint_id=str(pending.path))
        stall = time.monotonic() - start
        pending.handed_off_t = time.monotonic()
        self.pending = pending
        self.last_saved_step = step
        self.events.emit("checkpoint_stall", step=step, backend=self.backend, stall_s=stall)
        self.faults.in_save(step)
        if self.backend == "sync":
            self._commit(pending)
        return stall

    def _digest_when_written(self, pending: PendingSave) -> None:
        """dcp-async: hash the rank's shards in the writer's thread as soon as the write is done
        (hashlib and file reads release the GIL), so the commit only gathers the digests."""
        digested = pending.extra["digested"] = threading.Event()
        with_sha = self.cfg.checkpoint.verify == "sha256"

        def digest(future) -> None:
            try:
                if not future.cancelled() and future.exception() is None:
                    pending.extra["digests"] = _rank_digests(pending.path, self.rank, with_sha)
            finally:
                digested.set()

        pending.handle.add_done_callback(digest)

    def poll(self) -> None:
        """Commit the in-flight save if every rank finished writing it. Call once per step."""
        if self.pending is None:
            return
        with self._storage_errors():
            self._poll()

    def _poll(self) -> None:
        if self.backend == "nvrx":
            # Runs the finalize functions (.metadata, then our commit) once all ranks are done.
            self._queue.maybe_finalize_async_calls(blocking=False)
        elif self.backend == "dcp-async":
            written = self.pending.handle.done() and self.pending.extra["digested"].is_set()
            done = torch.tensor([1 if written else 0], device=self.device)
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if int(done.item()):
                self.pending.handle.result()  # raises the writer's error, if any
                self._commit(self.pending)

    def wait(self) -> None:
        """Block until the in-flight save committed, reporting progress meanwhile; a save that
        takes longer than checkpoint.finalize_timeout_s raises CheckpointTimeout."""
        deadline = time.monotonic() + self.cfg.checkpoint.finalize_timeout_s
        while self.pending is not None:
            self.poll()
            if self.pending is None:
                break
            with self._storage_errors():
                self._raise_if_writer_died()
            if time.monotonic() > deadline:
                raise CheckpointTimeout(
                    f"checkpoint of step {self.pending.step} did not commit "
                    f"within {self.cfg.checkpoint.finalize_timeout_s:g}s"
                )
            self.ping()
            time.sleep(0.02)

    def _raise_if_writer_died(self) -> None:
        caller = getattr(self._queue, "persistent_caller", None) if self._queue else None
        process = getattr(caller, "process", None)
        if process is not None and not process.is_alive():
            raise CheckpointWriterDied(
                f"the checkpoint worker exited (code {process.exitcode}) while writing step {self.pending.step}"
            )

    def close(self) -> None:
        """Finish the in-flight save and stop the writer (normal end and SIGTERM)."""
        self.wait()
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    # -- committing ------------------------------------------------------------------------------

    def _commit(self, pending: PendingSave) -> None:
        """Collective. Every rank's data is on disk when this runs."""
        started = time.monotonic()
        self.events.emit("checkpoint_write_end", step=pending.step, write_s=started - pending.handed_off_t)
        with_sha = self.cfg.checkpoint.verify == "sha256"
        mine = self._writer_digests(pending)
        if mine is None:  # sync saves, or a writer that recorded nothing
            mine = _rank_digests(pending.path, self.rank, with_sha)
        _remember_verified(pending.path, mine)
        gathered: list[dict[str, Any] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        if self.rank == 0:
            files: dict[str, Any] = {}
            for part in gathered:
                files.update(part or {})
            files[METADATA_FILE] = _file_digest(pending.path / METADATA_FILE, with_sha)
            with self.atomic():
                self._write_commit(pending, files)
            self.events.emit(
                "checkpoint_commit", step=pending.step, path=str(pending.path), commit_s=time.monotonic() - started
            )
        self.pending = None

    def _writer_digests(self, pending: PendingSave) -> dict[str, Any] | None:
        if "digests" in pending.extra:
            return pending.extra["digests"]
        sidecar = pending.path / DIGESTS_FILE.format(rank=self.rank)
        try:
            recorded = json.loads(sidecar.read_text())
        except FileNotFoundError:
            return None
        sidecar.unlink()
        return recorded

    def _write_commit(self, pending: PendingSave, files: dict[str, Any]) -> None:
        manifest = {
            "step": pending.step,
            "backend": self.backend,
            "verify": self.cfg.checkpoint.verify,
            "files": files,
            "committed_at": time.time(),
            **self.identity,
        }
        # What was committed before this commit, read before its record exists: read after, a
        # first commit (no pointer yet) would find its own record and report a rebuilt pointer.
        previous = self._commit_state()
        atomic_write(pending.path / COMMIT_FILE, json.dumps(manifest, indent=1, sort_keys=True))
        # A newer commit supersedes anything at or after its step: those belong to a timeline a
        # fallback or restart abandoned.
        keep = [pending.path.name] + [n for n in previous.committed if step_of(n) < pending.step]
        keep = keep[: self.cfg.checkpoint.keep]
        atomic_write(self.dir / POINTER_FILE, pointer_text(keep))
        atomic_write(self.dir / ITERATION_FILE, f"{pending.step}\n")
        for path in checkpoint_dirs(self.dir):
            if may_delete(path, previous, keep):
                shutil.rmtree(path, ignore_errors=True)

    def _commit_state(self) -> CommitState:
        """Rank 0: what is committed, warning (log line and event) when the pointer had to be
        rebuilt from the commit records, and failing when nothing committed can be trusted."""
        state = commit_state(self.dir)
        if state.source == "lost":
            raise NoUsableCheckpoint(state.warning)
        if state.source == "rebuilt":
            log.warning("checkpoint pointer: %s", state.warning)
            self.events.emit("checkpoint_pointer_rebuilt", reason=state.warning, committed=state.committed)
        return state

    # -- loading ---------------------------------------------------------------------------------

    def _verify_share(self, path: Path, manifest: dict[str, Any]) -> str | None:
        """Check the files this rank will read (its own shards; rank 0 also the rest, e.g.
        .metadata); returns a reason on failure. A file this process committed and that is
        unchanged since (same size and mtime) is trusted without re-hashing: after an in-process
        restart that is every shard of the rank, so the reload reads each shard once, from the
        page cache the write left warm, instead of first hashing another rank's shard from the
        file system (for the 8b preset: ~6 GB per rank, seconds). Anything written to the file
        since, such as the corrupt-latest fault, changes its mtime and gets the full check (on
        Lustre, mtime has one-second resolution: a write within the commit's second would pass)."""
        prefix = f"__{self.rank}_"
        for name in sorted(manifest["files"]):
            mine = name.startswith(prefix)
            orphan = not _SHARD.match(name)
            if not (mine or (orphan and self.rank == 0)):
                continue
            size, sha = manifest["files"][name]
            target = path / name
            if not target.is_file():
                return f"{name} is missing"
            if _verified_earlier(target, size):
                self._trusted_files += 1
                continue
            actual = _file_digest(target, sha is not None)
            if actual[0] != size:
                return f"{name} has {actual[0]} bytes, the commit recorded {size}"
            if sha is not None and actual[1] != sha:
                return f"{name} does not match its recorded SHA-256"
        return None

    def _check_compatible(self, path: Path, manifest: dict[str, Any]) -> None:
        for key, expected in self.identity.items():
            if manifest.get(key) != expected:
                field_name = {"world_size": "the world size (nnodes x nproc-per-node)", "preset": "model.preset"}.get(
                    key, key
                )
                raise CheckpointIncompatible(
                    f"checkpoint {path} was written with {key}={manifest.get(key)!r}, this run has "
                    f"{key}={expected!r}; resume with the same {field_name} or point "
                    "checkpoint.dir at an empty directory to start a new run"
                )

    def load_latest(self, build_state: Callable[[], dict[str, Any]]) -> LoadResult | None:
        """Load the newest usable committed checkpoint into the tensors of `build_state()`.

        Returns None when no checkpoint was ever committed (fresh start). The choice of candidates
        is rank 0's, broadcast, so ranks never pick different checkpoints while a commit races.
        """
        if self.backend == "none":
            return None
        names: list[Any] = [None]
        if self.rank == 0:
            try:
                names[0] = self._commit_state().committed
            except NoUsableCheckpoint as err:
                names[0] = err
        dist.broadcast_object_list(names, src=0)
        if isinstance(names[0], NoUsableCheckpoint):
            raise names[0]
        for name in names[0]:
            path = self.dir / name
            started = time.monotonic()
            try:
                manifest = json.loads((path / COMMIT_FILE).read_text())
            except (OSError, ValueError) as err:
                manifest, reason = None, f"unreadable {COMMIT_FILE}: {err}"
            if manifest is not None:
                self._check_compatible(path, manifest)
                reason = self._verify_share(path, manifest)
            failed = torch.tensor([0 if reason is None else 1], device=self.device)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            state = None
            if not int(failed.item()):
                state = build_state()
                try:
                    dcp.load(state, checkpoint_id=str(path))
                except Exception as err:  # noqa: BLE001 - any load failure means: try the previous
                    reason = f"load failed: {type(err).__name__}: {err}"
                failed = torch.tensor([0 if reason is None else 1], device=self.device)
                dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if int(failed.item()):
                reason = reason or "another rank could not verify or load its share"
                log.warning(
                    "skipping checkpoint %s: %s; falling back to the previous committed checkpoint", path, reason
                )
                self.events.emit("checkpoint_fallback", path=str(path), reason=reason)
                continue
            self.events.emit(
                "checkpoint_load",
                step=manifest["step"],
                path=str(path),
                load_s=time.monotonic() - started,
                trusted_files=self._trusted_files,
            )
            return LoadResult(step=manifest["step"], path=path, state=state)
        if names[0]:
            raise NoUsableCheckpoint(
                f"checkpoint.dir: none of the committed checkpoints in {self.dir} "
                f"({', '.join(names[0])}) passed verification and loading; inspect or restore "
                "them, or point checkpoint.dir at an empty directory to start over"
            )
        return None

    # -- fault hook ------------------------------------------------------------------------------

    def corrupt_latest(self) -> str | None:
        """The `corrupt-latest` fault: overwrite bytes in the middle of the largest shard of the
        newest committed checkpoint (same size, so only content checks can notice)."""
        committed = committed_checkpoints(self.dir)
        if not committed:
            return None
        shards = sorted((self.dir / committed[0]).glob("*.distcp"), key=lambda p: p.stat().st_size)
        if not shards:
            return None
        target = shards[-1]
        return damage_in_place(target)
