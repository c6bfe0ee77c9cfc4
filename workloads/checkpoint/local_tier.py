"""The node-local checkpoint tier: each rank's own shards, saved every checkpoint.local.interval_steps
to host memory and node-local storage and replicated to a rank on another node; the FSx tier
(workloads.checkpoint) stays the durable one at its longer interval.

Save: the rank's local shards (FSDP2 DTensors' `to_local()`, never the DTensors) and every other
tensor of the state are copied to CPU on the training thread, into the buffers of the previous
save once its writer is done (the copy floor: the optimizer may change them as soon as the save
returns). Those buffers are the host-memory copy: the newest save, kept for the life of the
process, across in-process restarts. A writer thread then streams them to
`<root>/step_<N>/rank<R>.bin` (workloads.checkpoint.copy_format: a JSON header and the tensors'
raw bytes) while hashing them, writes `rank<R>.json` last (size, SHA-256 and the run's identity: a
copy without it is incomplete), and exchanges copies with the peers over its own gloo group: rank
R sends to R + nproc_per_node and receives from R - nproc_per_node, i.e. always to another node.
The SHA-256 travels with the bytes, so the holder's record vouches for what the origin wrote, not
for what arrived. Nothing in a copy is unpickled: its header is JSON and its tensors are views.

Restore (collective): every rank lists the copies whose records fit this run (its own and those it
holds for a peer; a copy that does not fit is reported in the event log with the reason), the
lists are gathered, and every rank picks the same step: the newest one for which every rank's copy
exists somewhere, and only if it is not older than the newest committed FSx checkpoint. Only then
are the chosen step's copies checked, where they are needed: each rank its own, and when one fails
the ranks holding its replica theirs; a copy that fails is skipped with the reason and the choice is
made again without it. A rank whose own copy is missing or damaged gets it from the rank holding
the replica. Otherwise the caller falls back to FSx, with a warning (event `local_tier_skipped`)
saying why. A copy of this run whose identity (world size, model.preset, distributed.shard, ranks
per node) differs from this run's ends the run as FSx's commit records do (CheckpointIncompatible,
exit 93): the copy cannot fill this run's tensors, and restarting would meet it again.

Where a rank's own copy is read from, fastest first (the restore is on every restart's critical
path, and a tier slower to read than the file system it backs is no tier):
- host memory, after an in-process restart: the save's buffers, copied into the model; no disk,
  no hash (they never left this process: as trusted as the model they are copied into);
- its file (a new process after ft_launcher's restart, or no host copy): memory-mapped and hashed
  against its record before a byte is used, one pass over the page cache, then viewed, not
  decoded. File metadata is not trusted here as the FSx tier trusts its own commits: the
  `corrupt-local` fault damages a copy within milliseconds of its write, inside one tick of the
  file times, and the host copy already covers the restarts that trust would speed up.
A peer's replica is always hashed by the rank holding it before it is sent.

The tier is a cache: when its root cannot be created (read-only, not permitted, full), it is off
for the iteration, with one `local_tier_disabled` event and log line naming checkpoint.local.dir,
and the run goes on with the FSx tier.

Why not NVRx's LocalCheckpointManager: on CPU its BasicTensorAwareStateDict asserts CUDA and its
replica retrieval sends through CUDA (PLATFORM-FACTS), and it loads copies with
`torch.load(weights_only=False)`, i.e. unpickles whatever a node-local directory holds. The
exchange here is a plain gloo send/recv of the copy's bytes, the same on CPU and GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nvrx_eks.facts.checkpoint_layout import LAYOUT_FIELDS, atomic_write, incompatibility, local_copy_identity
from workloads.checkpoint import copy_format
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.checkpoint.groups import checkpoint_gloo_group
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FullDiskFile, damage_in_place, local_disk_full, marker_dir, parse_fault_spec

log = logging.getLogger(__name__)

#: In the run directory (on FSx): the run's identity, recorded in every local copy. A node-local
#: directory outlives the run that wrote it (a job resubmitted under the same name gets the same
#: directory); a copy from another run is never restored.
RUN_ID_FILE = "local-tier-run-id"

#: A copy's data and its record, in `step_<N>/`: rank<R>.bin, rank<R>.json.
DATA_SUFFIX, RECORD_SUFFIX = ".bin", ".json"
#: Recorded in every copy's record: copies of another format (torch.save ones, before this one)
#: are skipped, and the FSx checkpoint loads instead.
COPY_FORMAT = "flat-1"

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_COPY = re.compile(rf"^rank(\d+){re.escape(RECORD_SUFFIX)}$")

#: The fix for a node-local copy of another identity when the operator means to start over.
_START_OVER = "point checkpoint.dir and checkpoint.local.dir at empty directories to start a new run"

#: Nice value of the writer thread (0-19; higher yields more CPU to the training thread).
WRITER_NICENESS = 10

#: A copy's bytes: a memory map of its file, or what a peer sent.
Buffer = bytearray | memoryview | mmap.mmap

#: How often a wait for the writer reports progress to the in-process watchdog.
_PING_EVERY_S = 0.05


def _no_ping() -> None:
    return None


# The writer thread of the previous in-process iteration, if any: a new iteration waits for it
# before reading the root, so the copy it was finishing counts.
_previous_writer: threading.Thread | None = None


@dataclass
class HostCopy:
    """The newest save, in host memory: the staging buffers it was copied into, and whose it is.
    Outlives the in-process iteration that saved it (a module global), not the process."""

    step: int
    rank: int
    run: str
    identity: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]


_host_copy: HostCopy | None = None


def drop_host_copy() -> None:
    """Forget the host-memory copy: the next restore reads the node-local files, as a new process
    would."""
    global _host_copy
    _host_copy = None


@dataclass
class _Failing:
    """Saves of this process that failed in a row, since `since_step`, the first for `reason`."""

    since_step: int
    reason: str
    saves: int = 1


# Outlives the in-process iteration, as the node's storage does: a restart does not report again
# what was reported already.
_failing: _Failing | None = None


def _report(events: EventLog, step: int, problem: str | None) -> None:
    """Report how the save of `step` went, once per failure and not per save: the first failed
    save (`local_save_failed`, with a log line) and the first that succeeds again
    (`local_save_recovered`, with the count of those that failed). A full disk fails every
    interval for as long as nobody frees it, and one line per interval would bury the rest of
    the run's log."""
    global _failing
    if problem is not None and _failing is None:
        _failing = _Failing(step, problem)
        log.warning(
            "local checkpoint save of step %d failed: %s; training goes on (the tier is a cache: a "
            "restore takes the newest step complete for every rank, or checkpoint.dir); said once, "
            "until a save succeeds again",
            step,
            problem,
        )
        events.emit("local_save_failed", step=step, reason=problem[:500])
    elif problem is not None and _failing is not None:
        _failing.saves += 1
    elif _failing is not None:
        log.info(
            "local checkpoint saves succeed again at step %d (%d failed from step %d)",
            step,
            _failing.saves,
            _failing.since_step,
        )
        events.emit("local_save_recovered", step=step, failed_saves=_failing.saves, since_step=_failing.since_step)
        _failing = None


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _leaves(value: Any, path: tuple[str, ...] = ()):
    """(path, leaf) of a nested state: dicts and lists/tuples holding tensors are containers."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _leaves(value[key], (*path, str(key)))
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, torch.Tensor)) for v in value):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, str(i)))
    else:
        yield path, value


def _key(path: tuple[str, ...]) -> str:
    return "\x1f".join(path)


def split_state(
    state: dict[str, Any], staging: dict[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's share of `state` as (CPU tensor copies, JSON-able leaves), keyed by path.
    Copies go into the tensors of `staging` where shape and dtype match (no allocation, no page
    faults: the copy floor), else into new ones.

    GPU tensors are copied into pinned buffers without waiting, with one synchronization of the
    streams used at the end: a pageable device-to-host copy stages through a driver buffer and
    blocks per tensor, at about half the bandwidth. The pinned buffers stay with the host copy
    and take the next save, like pageable ones; a restore from memory reads them back to the GPU
    at pinned speed too. CPU tensors are copied as before."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    staging = staging if staging is not None else {}
    copying_from: set[torch.device] = set()
    for path, leaf in _leaves(state):
        if isinstance(leaf, torch.Tensor):
            local = leaf.detach()
            local = local.to_local() if isinstance(local, DTensor) else local
            key = _key(path)
            buffer = staging.get(key)
            from_gpu = local.is_cuda
            if (
                buffer is None
                or buffer.shape != local.shape
                or buffer.dtype != local.dtype
                or (from_gpu and not buffer.is_pinned())
            ):
                buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=from_gpu)
            buffer.copy_(local, non_blocking=from_gpu)
            if from_gpu:
                copying_from.add(local.device)
            tensors[key] = buffer
        else:
            meta[_key(path)] = list(leaf) if isinstance(leaf, tuple) else leaf
    for device in copying_from:
        # The copies were queued on the device's current stream, after the step that produced
        # the tensors: once it is drained the buffers hold this step, and the writer may read.
        torch.cuda.current_stream(device).synchronize()
    return tensors, meta


def fill_state(
    template: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any], path: tuple[str, ...] = ()
) -> Any:
    """`template` with its tensors overwritten in place from `tensors` and its other leaves
    replaced from `meta` (same structure as split_state walked)."""
    if isinstance(template, dict):
        return {k: fill_state(v, tensors, meta, (*path, str(k))) for k, v in template.items()}
    if isinstance(template, (list, tuple)) and any(isinstance(v, (dict, torch.Tensor)) for v in template):
        filled = [fill_state(v, tensors, meta, (*path, str(i))) for i, v in enumerate(template)]
        return type(template)(filled)
    key = _key(path)
    if isinstance(template, torch.Tensor):
        local = template.to_local() if isinstance(template, DTensor) else template
        stored = tensors[key]
        if stored.shape != local.shape or stored.dtype != local.dtype:
            raise ValueError(
                f"{key}: stored {stored.dtype}{tuple(stored.shape)}, expected {local.dtype}{tuple(local.shape)}"
            )
        with torch.no_grad():
            local.copy_(stored)
        return template
    value = meta[key]
    return tuple(value) if isinstance(template, tuple) else value


def run_id(run_dir: Path) -> str:
    """This run's identity, created on first use (collective: rank 0 decides, all ranks learn)."""
    ident: list[str | None] = [None]
    if dist.get_rank() == 0:
        path = run_dir / RUN_ID_FILE
        if not path.is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, uuid.uuid4().hex)
        ident[0] = path.read_text().strip()
    dist.broadcast_object_list(ident, src=0)
    run = ident[0]
    assert run is not None  # rank 0 always sets it
    return run


def copy_paths(root: Path, step: int, rank: int) -> tuple[Path, Path]:
    """(data, record) of rank `rank`'s copy of `step` under `root`."""
    directory = step_dir(root, step)
    return directory / f"rank{rank}{DATA_SUFFIX}", directory / f"rank{rank}{RECORD_SUFFIX}"


def _write_record(
    root: Path, step: int, rank: int, nbytes: int, sha256: str, run: str, identity: dict[str, Any]
) -> None:
    """The record, written atomically after the data: a copy interrupted half way has none and is
    never read."""
    atomic_write(
        copy_paths(root, step, rank)[1],
        json.dumps(
            {
                "step": step,
                "rank": rank,
                "run": run,
                "identity": identity,
                "format": COPY_FORMAT,
                "bytes": nbytes,
                "sha256": sha256,
            }
        ),
    )


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def _write_copy(
    root: Path,
    step: int,
    rank: int,
    write: Callable[[BinaryIO], tuple[int, str]],
    run: str,
    identity: dict[str, Any],
    disk_full: bool,
) -> tuple[Path, str]:
    """Write rank `rank`'s copy of `step`: its data with `write` (returns its size and SHA-256)
    to a temporary file moved into place, then its record; returns (the data file, SHA-256).
    When any of it fails (a full disk) nothing of the copy is left: partial data takes space the
    next save needs, and an earlier record of the same step must not describe other bytes.
    `disk_full`: the local-disk-full fault (workloads.faults), every write of the data failing
    as on a full disk."""
    data, record = copy_paths(root, step, rank)
    tmp = _temporary(data)
    try:
        data.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            nbytes, sha256 = write(FullDiskFile(tmp) if disk_full else f)
        os.replace(tmp, data)
        _write_record(root, step, rank, nbytes, sha256, run, identity)
    except BaseException:
        for path in (tmp, record, data):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    return data, sha256


def write_own_copy(
    root: Path,
    step: int,
    rank: int,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    run: str,
    identity: dict[str, Any],
    disk_full: bool = False,
) -> tuple[Path, str]:
    """Write this rank's copy of `step` under `root`, hashed as it is written; returns (its data
    file, SHA-256)."""
    return _write_copy(root, step, rank, lambda f: copy_format.write(f, tensors, meta), run, identity, disk_full)


def write_replica(
    root: Path,
    step: int,
    rank: int,
    data: Buffer,
    sha256: str,
    run: str,
    identity: dict[str, Any],
    disk_full: bool = False,
) -> None:
    """Write the copy of rank `rank` a peer sent, under the SHA-256 the peer computed as it wrote
    its own: what arrived is checked against what was written when the replica is used."""

    def write(f: BinaryIO) -> tuple[int, str]:
        f.write(data)
        return len(data), sha256

    _write_copy(root, step, rank, write, run, identity, disk_full)


def copy_record(
    root: Path, step: int, rank: int, run: str, identity: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) when the copy is complete and fits this run, else (None, reason); reads no
    data. A copy of this run of another model raises CheckpointIncompatible: skipping it would
    only move the mismatch to FSx, or to a fresh start over the run's checkpoints. A copy of another
    layout (LAYOUT_FIELDS) is skipped: the FSx checkpoint is resharded onto this run's."""
    data_path, record_path = copy_paths(root, step, rank)
    try:
        record = json.loads(record_path.read_text())
    except FileNotFoundError:
        return None, "incomplete (no record)"
    except (OSError, ValueError) as err:
        return None, f"unreadable record: {err}"
    if record.get("run") != run:
        return None, f"written by another run ({record.get('run')}), not this one ({run})"
    recorded = record.get("identity")
    if not isinstance(recorded, dict):
        return None, "records no run identity (written before copies carried one)"
    problem = incompatibility(recorded, identity, start_over=_START_OVER, layout_may_differ=True)
    if problem is not None:
        raise CheckpointIncompatible(f"checkpoint.local.dir: the node-local copy {record_path} {problem}")
    layout = {key: recorded.get(key) for key in LAYOUT_FIELDS if recorded.get(key) != identity.get(key)}
    if layout:
        # Another layout (a resume on another world size): the FSx checkpoint is resharded instead.
        return None, f"laid out for {layout}, this run for { {key: identity.get(key) for key in layout} }"
    if record.get("format") != COPY_FORMAT:
        return None, f"written in another format ({record.get('format', 'torch.save')}), this run reads {COPY_FORMAT}"
    try:
        size = data_path.stat().st_size
    except OSError as err:
        return None, f"unreadable: {err}"
    if size != record.get("bytes"):
        return None, f"has {size} bytes, its record says {record.get('bytes')}"
    return record, None


def open_copy(path: Path, record: dict[str, Any], *, hashed: bool) -> tuple[mmap.mmap | None, str | None]:
    """(the copy's bytes, None), memory-mapped, or (None, reason). `hashed`: check the SHA-256
    against the record first. The mapping is private: views of it may be written (torch.frombuffer
    needs writable memory) without touching the file."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as err:  # ValueError: an empty file cannot be mapped
        return None, f"unreadable: {err}"
    if len(data) != record.get("bytes"):
        return None, f"has {len(data)} bytes, its record says {record.get('bytes')}"
    if hashed and hashlib.sha256(data).hexdigest() != record.get("sha256"):
        return None, "does not match its recorded SHA-256"
    return data, None


def copies_in(root: Path) -> list[tuple[int, int]]:
    """(step, rank) of every copy that has a record under root, newest step first."""
    found: list[tuple[int, int]] = []
    if not root.is_dir():
        return found
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if not m:
            continue
        for f in d.iterdir():
            c = _COPY.match(f.name)
            if c:
                found.append((int(m.group(1)), int(c.group(1))))
    return sorted(found, reverse=True)


def corrupt_newest_copy(root: Path, rank: int) -> str | None:
    """The `corrupt-local` fault: overwrite bytes in the middle of this rank's newest own copy
    (same size, so only the SHA-256 notices)."""
    steps = [s for s, r in copies_in(root) if r == rank]
    if not steps:
        return None
    return damage_in_place(copy_paths(root, steps[0], rank)[0])


@dataclass
class LocalRestore:
    step: int
    state: dict[str, Any]
    source: str  # "local" (own copy) or "replica" (received from the rank that held it)


#: What precedes a copy on the wire: its size, the SHA-256 its origin recorded, and whether a
#: copy follows at all (not when the origin's own write failed).
_WIRE_HEADER = struct.Struct("<Q32s?")


def _exchange(
    group: Any, send_to: int | None, payload: Buffer | None, recv_from: int | None, sha256: str | None = None
) -> tuple[memoryview | None, str | None]:
    """Send `payload` (with its SHA-256, when given) to one rank and receive one from another,
    without ordering deadlocks: sizes and digests first, then the bytes, all as non-blocking pairs.
    A `send_to` with no `payload` sends the header alone, saying no copy follows: the receiver
    does not wait for one. Returns what was received: (bytes, SHA-256 hex), or (None, None)."""
    # isend/irecv return None only on a rank outside the group; every rank here is in it.
    works: list[Any] = []
    header_in = torch.zeros(_WIRE_HEADER.size, dtype=torch.uint8)
    if send_to is not None:
        digest = bytes.fromhex(sha256) if sha256 and payload is not None else b""
        header = _WIRE_HEADER.pack(len(payload) if payload is not None else 0, digest, payload is not None)
        works.append(dist.isend(torch.frombuffer(bytearray(header), dtype=torch.uint8), send_to, group=group))
    if recv_from is not None:
        works.append(dist.irecv(header_in, recv_from, group=group))
    for w in works:
        w.wait()
    works = []
    data_in = None
    if send_to is not None and payload is not None:
        works.append(dist.isend(torch.frombuffer(payload, dtype=torch.uint8), send_to, group=group))
    if recv_from is not None:
        size, digest_in, follows = _WIRE_HEADER.unpack(header_in.numpy().tobytes())
        if follows:
            data_in = torch.empty(size, dtype=torch.uint8)
            works.append(dist.irecv(data_in, recv_from, group=group))
    for w in works:
        w.wait()
    if data_in is None:
        return None, None
    return data_in.numpy().data, digest_in.hex()


class LocalTier:
    """Saves and restores the node-local tier for one in-process iteration.

    Collective (every rank, same order): the constructor, restore, and each save (the writer
    threads exchange replicas in the order of the saves)."""

    def __init__(self, cfg: TrainConfig, *, events: EventLog, nproc_per_node: int, ping: Callable[[], None] = _no_ping):
        """`ping`: progress for the in-process watchdog while the previous iteration's writer is
        waited for."""
        self.cfg, self.events = cfg, events
        self.root = Path(cfg.local_checkpoint_dir)
        self.keep = cfg.checkpoint.local.keep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.identity = local_copy_identity(self.world, cfg.model.preset, cfg.distributed.shard, nproc_per_node)
        # Ranks are laid out node by node: R + nproc_per_node is the same local rank on the next
        # node. With one node there is no other node to replicate to.
        self.peer = (self.rank + nproc_per_node) % self.world if self.world > nproc_per_node else None
        self.source = (self.rank - nproc_per_node) % self.world if self.peer is not None else None
        #: Whether this node's storage is full (the local-disk-full fault; never, without it).
        self._disk_full = local_disk_full(
            parse_fault_spec(cfg.faults), self.rank // nproc_per_node, marker_dir(cfg.run_dir)
        )
        # Its own gloo group: replicas move in the writer thread while the training thread runs
        # the step's collectives on the default group.
        self._group = checkpoint_gloo_group(cfg.checkpoint.finalize_timeout_s)
        self._writer: threading.Thread | None = None
        #: (step, what failed or None) of the save the writer thread finished, for wait().
        self._outcome: tuple[int, str | None] | None = None
        self.last_saved_step = -1
        global _previous_writer
        stuck = False
        if _previous_writer is not None:
            # With pings: a thread blocked in join runs no pending calls, so the watchdog's
            # automatic progress stamps stop, and a writer that takes the soft timeout to finish
            # would trip it.
            deadline = time.monotonic() + cfg.resolved_pg_timeout_s("gloo")
            while _previous_writer.is_alive() and time.monotonic() < deadline:
                _previous_writer.join(timeout=_PING_EVERY_S)
                ping()
            stuck, _previous_writer = _previous_writer.is_alive(), None
        # The host copy's buffers take the next save (no allocation, no page faults), whoever's
        # they were (split_state allocates wherever a shape or dtype differs); not while a writer
        # that outlived its timeout may still read them.
        self._staging: dict[str, torch.Tensor] = _host_copy.tensors if _host_copy is not None and not stuck else {}
        #: Why the tier is off for this iteration (None: on). Every rank agrees: a step needs
        #: every rank's copy, so one rank without a root leaves the others' copies useless.
        self.disabled = self._agree_on(self._root_problem())
        self.run = run_id(Path(cfg.run_dir)) if self.disabled is None else ""

    def _root_problem(self) -> str | None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return f"checkpoint.local.dir {self.root} cannot be created: {err.strerror or err} (errno {err.errno})"
        return None

    def _agree_on(self, problem: str | None) -> str | None:
        """Collective: the first rank's problem with its root, named, or None when every rank
        has one. Rank 0 reports it (one event, one log line) for the run."""
        problems: list[str | None] = [None] * self.world
        dist.all_gather_object(problems, problem, group=self._group)
        found = next((f"rank {rank}: {p}" for rank, p in enumerate(problems) if p is not None), None)
        if found is not None and self.rank == 0:
            log.warning(
                "local checkpoint tier disabled: %s; the run goes on with checkpoint.dir only "
                "(fix the directory or its mount, or point checkpoint.local.dir elsewhere)",
                found,
            )
            self.events.emit("local_tier_disabled", reason=found)
        return found

    # -- saving ----------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], ping: Callable[[], None] = _no_ping) -> float:
        """Copy the rank's share of `state` and hand it to the writer thread; returns the stall.
        `ping`: progress for the in-process watchdog while a busy writer is waited for."""
        global _previous_writer, _host_copy
        if self.disabled is not None:
            return 0.0
        started = time.monotonic()
        self.wait(ping)  # one save in flight: a writer still busy shows up as stall
        # The previous copy's buffers are free again (its writer finished): copy into them. Until
        # the copy is whole they hold no step, so a restart in between reads the files instead.
        _host_copy = None
        tensors, meta = split_state(state, self._staging)
        self._staging = tensors
        try:
            # Through JSON, as the file's header: a restore from memory sets the same values as
            # one from the file, and later changes to the live objects do not reach the copy.
            meta = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as err:
            # Reported at once by wait(): no save of this state can be written.
            self._outcome = (step, f"{type(err).__name__}: {err}")
            self.wait()
            return time.monotonic() - started
        _host_copy = HostCopy(step, self.rank, self.run, self.identity, tensors, meta)
        stall = time.monotonic() - started
        nbytes = sum(t.nbytes for t in tensors.values())
        self.events.emit("local_save", step=step, stall_s=stall, bytes=nbytes)
        self._writer = _previous_writer = threading.Thread(
            target=self._write_and_replicate, args=(step, tensors, meta), name=f"local-tier-{step}", daemon=True
        )
        self._writer.start()
        self.last_saved_step = step
        return stall

    def _write_and_replicate(self, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        # Below the training thread's priority (Linux: the nice value of this thread alone): on
        # cores the step needs, writing and hashing the copy waits.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        except OSError:
            pass
        problems: list[str] = []
        try:
            started = time.monotonic()
            own: Buffer | None = None
            sha256, nbytes = "", 0
            try:
                path, sha256 = write_own_copy(
                    self.root, step, self.rank, tensors, meta, self.run, self.identity, self._disk_full(step)
                )
                nbytes = path.stat().st_size
                # The file just written, from the page cache: no serialized copy in memory.
                own, reason = open_copy(path, {"bytes": nbytes}, hashed=False)
                if own is None:
                    raise OSError(f"{path}: {reason}")
            except Exception as err:  # noqa: BLE001 - the exchange below still takes place
                problems.append(f"own copy: {type(err).__name__}: {err}")
            written = time.monotonic()
            replica_of = None
            if self.peer is not None and self.source is not None:  # both or neither
                # Whatever became of the own copy: the peer waits for this rank's word, and one
                # that never came would hold it until the group's timeout, then restart every
                # rank, at every interval for as long as this node's storage fails.
                replica, replica_sha256 = _exchange(self._group, self.peer, own, self.source, sha256)
                if replica is not None and replica_sha256 is not None:
                    try:
                        write_replica(
                            self.root, step, self.source, replica, replica_sha256, self.run, self.identity,
                            self._disk_full(step),
                        )  # fmt: skip
                        replica_of = self.source
                    except Exception as err:  # noqa: BLE001 - reported by wait()
                        problems.append(f"replica of rank {self.source}: {type(err).__name__}: {err}")
            if own is not None:
                # Not after a failed own copy: the older ones are then this rank's newest.
                self._retain()
                self.events.emit(
                    "local_saved",
                    step=step,
                    write_s=written - started,
                    replicate_s=time.monotonic() - written,
                    bytes=nbytes,
                    replica_of=replica_of,
                )
        except BaseException as err:  # noqa: BLE001 - reported by wait(); the thread must end
            problems.append(f"{type(err).__name__}: {err}")
        self._outcome = (step, "; ".join(problems) or None)

    def wait(self, ping: Callable[[], None] = _no_ping) -> None:
        """Wait for the writer thread, calling `ping` meanwhile: under load a writer takes seconds
        (200 MB written, sent and received at nice 10), longer than the in-process soft timeout
        allows a rank to go without progress. A failed local save is reported (_report), not
        raised: the tier is a shortcut, the FSx tier still holds the run."""
        if self._writer is not None:
            while self._writer.is_alive():
                self._writer.join(timeout=_PING_EVERY_S)
                ping()
            self._writer = None
        if self._outcome is not None:
            _report(self.events, *self._outcome)
            self._outcome = None

    def _mine(self) -> set[int]:
        return {self.rank} | ({self.source} if self.source is not None else set())

    def _retain(self) -> None:
        """Keep the newest `keep` steps of the copies this rank writes (its own and its replica)."""
        steps = sorted({s for s, r in copies_in(self.root) if r in self._mine()}, reverse=True)
        for step in steps[self.keep :]:
            self._drop(step)

    def _drop(self, step: int) -> None:
        directory = step_dir(self.root, step)
        for r in self._mine():
            data, record = copy_paths(self.root, step, r)
            record.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            # What a writer killed half way left (this process's own writer is done by now).
            for partial in directory.glob(f".{data.name}.tmp-*"):
                partial.unlink(missing_ok=True)
        with_contents = directory.is_dir() and any(directory.iterdir())
        if directory.is_dir() and not with_contents:
            shutil.rmtree(directory, ignore_errors=True)

    def corrupt_newest(self) -> str | None:
        """The `corrupt-local` fault's target: this rank's newest own copy, finished first. The
        host-memory copy is dropped with it: the fault is there to show that the restore refuses a
        damaged copy and takes the replica, and an in-process restart would otherwise restore
        from memory without reading the damaged file (as a new process would read it)."""
        if self.disabled is not None:
            return None
        self.wait()
        drop_host_copy()
        return corrupt_newest_copy(self.root, self.rank)

    # -- restoring -------------------------------------------------------------------------------

    def _own_host_copy(self) -> HostCopy | None:
        """The host-memory copy when it is this rank's, of this run and identity (a restart with
        spare nodes may give this process another rank)."""
        host = _host_copy
        if host is None or (host.rank, host.run, host.identity) != (self.rank, self.run, self.identity):
            return None
        return host

    def _skipped(self, step: int, origin: int, reason: str) -> None:
        log.warning("local checkpoint: skipping rank %d's copy of step %d in %s: %s", origin, step, self.root, reason)
        self.events.emit("local_copy_skipped", step=step, origin_rank=origin, own=origin == self.rank, reason=reason)

    def _candidates(self, host: HostCopy | None) -> tuple[dict[tuple[int, int], dict[str, Any] | None], str | None]:
        """The copies this rank could provide, by (step, origin): their records (None: the host
        copy), read without touching any data; and the refusal of a copy of another identity."""
        candidates: dict[tuple[int, int], dict[str, Any] | None] = {}
        incompatible: str | None = None
        for step, origin in copies_in(self.root):
            if origin not in self._mine():
                continue
            try:
                record, reason = copy_record(self.root, step, origin, self.run, self.identity)
            except CheckpointIncompatible as err:
                incompatible = incompatible or str(err)
                continue
            if record is None:
                self._skipped(step, origin, reason or "")
                continue
            candidates[(step, origin)] = record
        if host is not None:
            candidates[(host.step, self.rank)] = None
        return candidates, incompatible

    def _check(
        self,
        step: int,
        origin: int,
        candidates: dict[tuple[int, int], dict[str, Any] | None],
        opened: dict[int, Buffer],
    ) -> bool:
        """Check this rank's copy of (step, origin) against its SHA-256 before it is used, keeping
        its bytes in `opened`. The host copy needs neither: it never left this process."""
        record = candidates[(step, origin)]
        if record is None:
            return True
        data, reason = open_copy(copy_paths(self.root, step, origin)[0], record, hashed=True)
        if data is None:
            self._skipped(step, origin, reason or "")
            return False
        opened[origin] = data
        return True

    def _sources(
        self,
        step: int,
        holders: dict[tuple[int, int], list[int]],
        candidates: dict[tuple[int, int], dict[str, Any] | None],
        in_memory: list[int | None],
        opened: dict[int, Buffer],
    ) -> dict[int, int] | None:
        """Collective. Which rank provides each rank's copy of `step`: the rank itself when its own
        copy checks out, else the lowest rank whose replica does. Copies that fail are taken out
        of `holders`; None when some rank's copy is left nowhere (choose again). `in_memory`: the
        step of each rank's host copy; when every rank holds `step` there, nothing is read or
        exchanged (the restart after an in-process fault)."""
        own_ok: list[bool | None] = [True] * self.world
        if any(held != step for held in in_memory):
            mine = self._check(step, self.rank, candidates, opened) if (step, self.rank) in candidates else None
            dist.all_gather_object(own_ok, mine)
        needed = [r for r in range(self.world) if not own_ok[r]]
        for r in range(self.world):
            if own_ok[r] is False:
                holders[(step, r)].remove(r)
        replicas_ok: list[dict[int, bool]] = [{} for _ in range(self.world)]
        if needed:
            checked = {
                r: self._check(step, r, candidates, opened)
                for r in needed
                if r != self.rank and (step, r) in candidates
            }
            dist.all_gather_object(replicas_ok, checked)
            for holder, results in enumerate(replicas_ok):
                for r, ok in results.items():
                    if not ok:
                        holders[(step, r)].remove(holder)
        sources: dict[int, int] = {}
        for r in range(self.world):
            if own_ok[r]:
                sources[r] = r
                continue
            verified = [holder for holder, results in enumerate(replicas_ok) if results.get(r)]
            if not verified:
                return None
            sources[r] = min(verified)
        return sources

    def _choose(self, holders: dict[tuple[int, int], list[int]], fsx_step: int) -> tuple[int | None, str]:
        """The newest step every rank's copy is held for, if not older than `fsx_step`; else
        (None, why)."""
        held = {key for key, ranks in holders.items() if ranks}
        complete = sorted({s for s, _ in held if all((s, r) in held for r in range(self.world))}, reverse=True)
        if complete and complete[0] >= fsx_step:
            return complete[0], ""
        newest = max((s for s, _ in held), default=None)
        if newest is None:
            return None, "no local copies"
        if complete:
            return None, f"newest complete local step {complete[0]} is older than FSx step {fsx_step}"
        return None, f"newest local step {newest} lacks some rank's copy and no older step is complete"

    def restore(self, build_state: Callable[[], dict[str, Any]], fsx_step: int) -> LocalRestore | None:
        """Collective. The newest step every rank's copy is available for, if not older than
        `fsx_step` (rank 0's view of the newest committed FSx checkpoint); None otherwise.
        Raises CheckpointIncompatible on every rank when some rank holds a copy of this run
        with another identity."""
        if self.disabled is not None:
            return None
        host = self._own_host_copy()
        candidates, incompatible = self._candidates(host)
        reports: list[Any] = [None] * self.world
        dist.all_gather_object(
            reports,
            {
                "copies": sorted(candidates),
                "in_memory": host.step if host is not None else None,
                "fsx_step": fsx_step,
                "incompatible": incompatible,
            },
        )
        # Timed from here, where the ranks agree on what exists, as checkpoint_load is timed from
        # the broadcast of the committed checkpoints: before it, a rank waits for the slowest.
        started = time.monotonic()
        refusals = [report["incompatible"] for report in reports if report["incompatible"]]
        if refusals:
            raise CheckpointIncompatible(refusals[0])
        fsx_step = reports[0]["fsx_step"]
        holders: dict[tuple[int, int], list[int]] = {}
        for holder, report in enumerate(reports):
            for step, origin in report["copies"]:
                holders.setdefault((step, origin), []).append(holder)
        # Choose, then check what the choice needs; a copy that fails is out and the choice is
        # made again (each round removes a holder, so this ends).
        opened: dict[int, Buffer] = {}
        while True:
            chosen, reason = self._choose(holders, fsx_step)
            if chosen is None:
                if self.rank == 0:
                    log.warning("local checkpoint tier skipped: %s; loading from FSx", reason)
                self.events.emit("local_tier_skipped", reason=reason, fsx_step=fsx_step)
                drop_host_copy()  # not the state the run goes on from
                return None
            opened.clear()
            sources = self._sources(chosen, holders, candidates, [r["in_memory"] for r in reports], opened)
            if sources is not None:
                break
        data: Buffer | None = opened.get(self.rank) if sources[self.rank] == self.rank else None
        for origin, holder in sources.items():
            if holder == origin:
                continue
            if self.rank == holder:
                _exchange(self._group, origin, opened[origin], None)
            elif self.rank == origin:
                data, _ = _exchange(self._group, None, None, holder)
        from_memory = sources[self.rank] == self.rank and candidates[(chosen, self.rank)] is None
        if from_memory:
            assert host is not None  # the candidate without a record is the host copy
            tensors, meta = host.tensors, host.meta
        else:
            assert data is not None  # its own checked copy, or the replica just received
            tensors, meta = copy_format.read(data)
        building = time.monotonic()
        template = build_state()  # of load_s: the same work for either tier (build_s)
        build_s = time.monotonic() - building
        state = fill_state(template, tensors, meta)
        if not from_memory or host is None or host.step != chosen:
            drop_host_copy()
        via = "local" if sources[self.rank] == self.rank else "replica"
        self.events.emit(
            "local_restore",
            step=chosen,
            source=via,
            from_rank=sources[self.rank],
            from_memory=from_memory,
            fsx_step=fsx_step,
            load_s=time.monotonic() - started,
            build_s=build_s,
        )
        # Copies newer than the chosen step belong to a timeline this restore abandons.
        for step in sorted({s for s, r in copies_in(self.root) if s > chosen and r in self._mine()}):
            self._drop(step)
        return LocalRestore(step=chosen, state=state, source=via)
