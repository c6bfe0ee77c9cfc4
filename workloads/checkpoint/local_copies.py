"""A node-local copy (workloads.checkpoint.local_tier): one rank's share of a state, its files
under the tier's root and on the wire between ranks. No policy here: what to save, keep, trust or
restore is LocalTier's.

A copy of step N by rank R is `<root>/step_<N>/rank<R>.bin` (workloads.checkpoint.copy_format: a
JSON header and the tensors' raw bytes) and `rank<R>.json`, its record (size, SHA-256, the run and
its identity), written last: a copy without one is incomplete and never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nvrx_eks.facts.checkpoint_layout import LAYOUT_FIELDS, atomic_write, incompatibility
from workloads.checkpoint import copy_format
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.faults import FullDiskFile, damage_in_place

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

#: A copy's bytes: a memory map of its file, or what a peer sent.
Buffer = bytearray | memoryview | mmap.mmap


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
            # The fault's file stands in for the real one: only its writes are called.
            nbytes, sha256 = write(cast(BinaryIO, FullDiskFile(tmp)) if disk_full else f)
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


#: What precedes a copy on the wire: its size, the SHA-256 its origin recorded, and whether a
#: copy follows at all (not when the origin's own write failed).
WIRE_HEADER = struct.Struct("<Q32s?")


def exchange(
    group: Any, send_to: int | None, payload: Buffer | None, recv_from: int | None, sha256: str | None = None
) -> tuple[memoryview | None, str | None]:
    """Send `payload` (with its SHA-256, when given) to one rank and receive one from another,
    without ordering deadlocks: sizes and digests first, then the bytes, all as non-blocking pairs.
    A `send_to` with no `payload` sends the header alone, saying no copy follows: the receiver
    does not wait for one. Returns what was received: (bytes, SHA-256 hex), or (None, None)."""
    # isend/irecv return None only on a rank outside the group; every rank here is in it.
    works: list[Any] = []
    header_in = torch.zeros(WIRE_HEADER.size, dtype=torch.uint8)
    if send_to is not None:
        digest = bytes.fromhex(sha256) if sha256 and payload is not None else b""
        header = WIRE_HEADER.pack(len(payload) if payload is not None else 0, digest, payload is not None)
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
        size, digest_in, follows = WIRE_HEADER.unpack(header_in.numpy().tobytes())
        if follows:
            data_in = torch.empty(size, dtype=torch.uint8)
            works.append(dist.irecv(data_in, recv_from, group=group))
    for w in works:
        w.wait()
    if data_in is None:
        return None, None
    return data_in.numpy().data, digest_in.hex()
