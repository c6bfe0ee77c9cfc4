"""The node-local checkpoint tier: each rank's own shards, saved every checkpoint.local.interval_steps
to node-local storage and replicated to a rank on another node; the FSx tier
(workloads.checkpoint) stays the durable one at its longer interval.

Save: the rank's local shards (FSDP2 DTensors' `to_local()`, never the DTensors) and every other
tensor of the state are copied to CPU on the training thread, into the buffers of the previous
save once its writer is done (the copy floor: the optimizer may change them as soon as the save
returns); a writer thread then serializes them, writes the copy
under `<root>/step_<N>/rank<R>.pt` (+ `rank<R>.json`, written last, carrying size, SHA-256 and
the run's identity: a copy without it is incomplete) and exchanges copies with the peers over its own gloo group: rank
R sends to R + nproc_per_node and receives from R - nproc_per_node, i.e. always to another node.
Non-tensor state (step, scheduler, data position, optimizer hyper-parameters) travels as JSON inside
the copy; copies are read back with `torch.load(weights_only=True)`, so nothing is unpickled.

Restore (collective): every rank reports the copies whose SHA-256 verifies in its root (its own
and those it holds for a peer; a damaged or incomplete copy is reported in the event log with the
reason), the reports are gathered, and every rank picks the same step: the newest one for which
every rank's copy exists somewhere, and only if it is not older than the newest committed FSx
checkpoint. A rank whose own copy is missing or damaged gets it from the rank holding the replica.
Otherwise the caller falls back to FSx, with a warning (event `local_tier_skipped`) saying why.
A copy of this run whose identity (world size, model.preset, distributed.shard, ranks per node)
differs from this run's ends the run as FSx's commit records do (CheckpointIncompatible, exit 93):
the copy cannot fill this run's tensors, and restarting would meet it again.

The tier is a cache: when its root cannot be created (read-only, not permitted, full), it is off
for the iteration, with one `local_tier_disabled` event and log line naming checkpoint.local.dir,
and the run goes on with the FSx tier.

Why not NVRx's LocalCheckpointManager: on CPU its BasicTensorAwareStateDict asserts CUDA and its
replica retrieval sends through CUDA (PLATFORM-FACTS), and it loads copies with
`torch.load(weights_only=False)`, i.e. unpickles whatever a node-local directory holds. The
exchange here is a plain gloo send/recv of the copy's bytes, the same on CPU and GPU.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nvrx_eks.facts.checkpoint_layout import LAYOUT_FIELDS, atomic_write, incompatibility, local_copy_identity
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import damage_in_place

log = logging.getLogger(__name__)

#: In the run directory (on FSx): the run's identity, recorded in every local copy. A node-local
#: directory outlives the run that wrote it (a job resubmitted under the same name gets the same
#: directory); a copy from another run is never restored.
RUN_ID_FILE = "local-tier-run-id"

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_COPY = re.compile(r"^rank(\d+)\.json$")

#: The fix for a node-local copy of another identity when the operator means to start over.
_START_OVER = "point checkpoint.dir and checkpoint.local.dir at empty directories to start a new run"

#: Nice value of the writer thread (0-19; higher yields more CPU to the training thread).
WRITER_NICENESS = 10

#: A copy's bytes: read from a file (bytearray), serialized (memoryview) or received from a peer.
Buffer = bytes | bytearray | memoryview

# The writer thread of the previous in-process iteration, if any: a new iteration waits for it
# before reading the root, so the copy it was finishing counts.
_previous_writer: threading.Thread | None = None


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
    faults: the copy floor), else into new ones."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    staging = staging if staging is not None else {}
    for path, leaf in _leaves(state):
        if isinstance(leaf, torch.Tensor):
            local = leaf.detach()
            local = local.to_local() if isinstance(local, DTensor) else local
            key = _key(path)
            buffer = staging.get(key)
            if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
                buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu")
            buffer.copy_(local)
            tensors[key] = buffer
        else:
            meta[_key(path)] = list(leaf) if isinstance(leaf, tuple) else leaf
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


def encode_copy(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> memoryview:
    """The copy's bytes, as a view of the serializer's own buffer: at hundreds of MB per rank and
    save, every extra copy is CPU time the training step does not get."""
    buf = io.BytesIO()
    torch.save({"tensors": tensors, "meta": json.dumps(meta)}, buf)
    return buf.getbuffer()


def decode_copy(data: Buffer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    return loaded["tensors"], json.loads(loaded["meta"])


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


def write_copy(root: Path, step: int, rank: int, data: Buffer, run: str, identity: dict[str, Any]) -> Path:
    """Write one rank's copy of `step` under `root`: the data, then its record (size, SHA-256,
    run and identity), each atomically, so a copy interrupted half way has no record and is
    never read."""
    directory = step_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"rank{rank}.pt"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    atomic_write(
        directory / f"rank{rank}.json",
        json.dumps(
            {
                "step": step,
                "rank": rank,
                "run": run,
                "identity": identity,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ),
    )
    return target


def read_copy(
    root: Path, step: int, rank: int, run: str, identity: dict[str, Any]
) -> tuple[bytearray | None, str | None]:
    """(data, None) when the copy is complete and verifies, else (None, reason). A copy of this
    run of another model raises CheckpointIncompatible: skipping it would only move the mismatch
    to FSx, or to a fresh start over the run's checkpoints. A copy of another layout (LAYOUT_FIELDS)
    is skipped: the FSx checkpoint is resharded onto this run's."""
    directory = step_dir(root, step)
    record_path = directory / f"rank{rank}.json"
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
    try:
        with open(directory / f"rank{rank}.pt", "rb") as f:
            # Read into a writable buffer: sent to a peer as is, without another copy.
            data = bytearray(os.fstat(f.fileno()).st_size)
            f.readinto(data)
    except OSError as err:
        return None, f"unreadable: {err}"
    if len(data) != record.get("bytes"):
        return None, f"has {len(data)} bytes, its record says {record.get('bytes')}"
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
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
    target = step_dir(root, steps[0]) / f"rank{rank}.pt"
    return damage_in_place(target)


@dataclass
class LocalRestore:
    step: int
    state: dict[str, Any]
    source: str  # "local" (own copy) or "replica" (received from the rank that held it)


def _exchange(group: Any, send_to: int | None, payload: Buffer | None, recv_from: int | None) -> memoryview | None:
    """Send `payload` to one rank and receive one from another, without ordering deadlocks:
    sizes first, then the bytes, all as non-blocking pairs."""
    # isend/irecv return None only on a rank outside the group; every rank here is in it.
    works: list[Any] = []
    size_in = torch.zeros(1, dtype=torch.int64)
    if send_to is not None:
        assert payload is not None
        works.append(dist.isend(torch.tensor([len(payload)], dtype=torch.int64), send_to, group=group))
    if recv_from is not None:
        works.append(dist.irecv(size_in, recv_from, group=group))
    for w in works:
        w.wait()
    works = []
    data_in = None
    if send_to is not None:
        assert payload is not None
        works.append(dist.isend(torch.frombuffer(payload, dtype=torch.uint8), send_to, group=group))
    if recv_from is not None:
        data_in = torch.empty(int(size_in.item()), dtype=torch.uint8)
        works.append(dist.irecv(data_in, recv_from, group=group))
    for w in works:
        w.wait()
    return data_in.numpy().data if data_in is not None else None


class LocalTier:
    """Saves and restores the node-local tier for one in-process iteration.

    Collective (every rank, same order): the constructor, restore, and each save (the writer
    threads exchange replicas in the order of the saves)."""

    def __init__(self, cfg: TrainConfig, *, events: EventLog, nproc_per_node: int):
        self.cfg, self.events = cfg, events
        self.root = Path(cfg.local_checkpoint_dir)
        self.keep = cfg.checkpoint.local.keep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.identity = local_copy_identity(self.world, cfg.model.preset, cfg.distributed.shard, nproc_per_node)
        # Ranks are laid out node by node: R + nproc_per_node is the same local rank on the next
        # node. With one node there is no other node to replicate to.
        self.peer = (self.rank + nproc_per_node) % self.world if self.world > nproc_per_node else None
        self.source = (self.rank - nproc_per_node) % self.world if self.peer is not None else None
        # Its own gloo group: replicas move in the writer thread while the training thread runs
        # the step's collectives on the default group.
        self._group = dist.new_group(backend="gloo")
        self._writer: threading.Thread | None = None
        self._staging: dict[str, torch.Tensor] = {}
        self._error: BaseException | None = None
        self.last_saved_step = -1
        global _previous_writer
        if _previous_writer is not None:
            _previous_writer.join(timeout=cfg.resolved_pg_timeout_s("gloo"))
            _previous_writer = None
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

    def save(self, step: int, state: dict[str, Any]) -> float:
        """Copy the rank's share of `state` and hand it to the writer thread; returns the stall."""
        global _previous_writer
        if self.disabled is not None:
            return 0.0
        started = time.monotonic()
        self.wait()  # one save in flight: a writer still busy shows up as stall
        # The previous copy's buffers are free again (its writer finished): copy into them.
        tensors, meta = split_state(state, self._staging)
        self._staging = tensors
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
        # cores the step needs, serializing, hashing and writing the copy waits.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        except OSError:
            pass
        try:
            started = time.monotonic()
            data = encode_copy(tensors, meta)
            write_copy(self.root, step, self.rank, data, self.run, self.identity)
            written = time.monotonic()
            replica = None
            if self.peer is not None and self.source is not None:  # both or neither
                replica = _exchange(self._group, self.peer, data, self.source)
                assert replica is not None
                write_copy(self.root, step, self.source, replica, self.run, self.identity)
            self._retain()
            self.events.emit(
                "local_saved",
                step=step,
                write_s=written - started,
                replicate_s=time.monotonic() - written,
                bytes=len(data),
                replica_of=self.source,
            )
        except BaseException as err:  # noqa: BLE001 - reported by wait(); the thread must end
            self._error = err

    def wait(self) -> None:
        """Wait for the writer thread. A failed local save is logged, not raised: the tier is a
        shortcut, the FSx tier still holds the run."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            log.warning("local checkpoint save failed: %s: %s", type(self._error).__name__, self._error)
            self.events.emit("local_save_failed", reason=f"{type(self._error).__name__}: {self._error}"[:500])
            self._error = None

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
            for suffix in (".json", ".pt"):
                (directory / f"rank{r}{suffix}").unlink(missing_ok=True)
        with_contents = directory.is_dir() and any(directory.iterdir())
        if directory.is_dir() and not with_contents:
            shutil.rmtree(directory, ignore_errors=True)

    def corrupt_newest(self) -> str | None:
        """The `corrupt-local` fault's target: this rank's newest own copy, finished first."""
        if self.disabled is not None:
            return None
        self.wait()
        return corrupt_newest_copy(self.root, self.rank)

    # -- restoring -------------------------------------------------------------------------------

    def restore(self, build_state: Callable[[], dict[str, Any]], fsx_step: int) -> LocalRestore | None:
        """Collective. The newest step every rank's copy is available for, if not older than
        `fsx_step` (rank 0's view of the newest committed FSx checkpoint); None otherwise.
        Raises CheckpointIncompatible on every rank when some rank holds a copy of this run
        with another identity."""
        if self.disabled is not None:
            return None
        verified: dict[tuple[int, int], Buffer] = {}
        incompatible: str | None = None
        for step, origin in copies_in(self.root):
            if origin not in self._mine():
                continue
            try:
                copy, reason = read_copy(self.root, step, origin, self.run, self.identity)
            except CheckpointIncompatible as err:
                incompatible = incompatible or str(err)
                continue
            if copy is None:
                log.warning(
                    "local checkpoint: skipping rank %d's copy of step %d in %s: %s", origin, step, self.root, reason
                )
                self.events.emit(
                    "local_copy_skipped", step=step, origin_rank=origin, own=origin == self.rank, reason=reason
                )
                continue
            verified[(step, origin)] = copy
        reports: list[Any] = [None] * self.world
        dist.all_gather_object(
            reports, {"copies": sorted(verified), "fsx_step": fsx_step, "incompatible": incompatible}
        )
        refusals = [report["incompatible"] for report in reports if report["incompatible"]]
        if refusals:
            raise CheckpointIncompatible(refusals[0])
        fsx_step = reports[0]["fsx_step"]
        holders: dict[tuple[int, int], list[int]] = {}
        for holder, report in enumerate(reports):
            for step, origin in report["copies"]:
                holders.setdefault((step, origin), []).append(holder)
        complete = sorted({s for s, _ in holders if all((s, r) in holders for r in range(self.world))}, reverse=True)
        chosen = complete[0] if complete and complete[0] >= fsx_step else None
        if chosen is None:
            newest = max((s for s, _ in holders), default=None)
            reason = (
                "no local copies"
                if newest is None
                else f"no step has every rank's copy newer than FSx step {fsx_step}"
                if complete
                else f"newest local step {newest} lacks some rank's copy and no older step is complete"
            )
            if complete and complete[0] < fsx_step:
                reason = f"newest complete local step {complete[0]} is older than FSx step {fsx_step}"
            if self.rank == 0:
                log.warning("local checkpoint tier skipped: %s; loading from FSx", reason)
            self.events.emit("local_tier_skipped", reason=reason, fsx_step=fsx_step)
            return None
        started = time.monotonic()
        # Each rank's copy comes from the rank itself when it verified, else from the lowest
        # rank holding a verified replica.
        source_of = {r: (r if r in holders[(chosen, r)] else min(holders[(chosen, r)])) for r in range(self.world)}
        data: Buffer | None = verified.get((chosen, self.rank)) if source_of[self.rank] == self.rank else None
        for origin, holder in source_of.items():
            if holder == origin:
                continue
            if self.rank == holder:
                _exchange(self._group, origin, verified[(chosen, origin)], None)
            elif self.rank == origin:
                data = _exchange(self._group, None, None, holder)
        assert data is not None  # its own verified copy, or the replica just received
        tensors, meta = decode_copy(data)
        state = fill_state(build_state(), tensors, meta)
        via = "local" if source_of[self.rank] == self.rank else "replica"
        self.events.emit(
            "local_restore",
            step=chosen,
            source=via,
            from_rank=source_of[self.rank],
            fsx_step=fsx_step,
            load_s=time.monotonic() - started,
        )
        # Copies newer than the chosen step belong to a timeline this restore abandons.
        for step in sorted({s for s, r in copies_in(self.root) if s > chosen and r in self._mine()}):
            self._drop(step)
        return LocalRestore(step=chosen, state=state, source=via)
