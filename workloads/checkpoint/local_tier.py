"""The node-local checkpoint tier: each rank's own shards, saved every checkpoint.local.interval_steps
to host memory and node-local storage and replicated to a rank on another node; the FSx tier
(workloads.checkpoint) stays the durable one at its longer interval.

Save: the rank's local shards (FSDP2 DTensors' `to_local()`, never the DTensors) and every other
tensor of the state are copied to CPU on the training thread, into the buffers of the previous
save once its writer is done (the copy floor: the optimizer may change them as soon as the save
returns). Those buffers are the host-memory copy: the newest save, kept for the life of the
process, across in-process restarts. A writer thread then streams them to
`<root>/step_<N>/rank<R>.bin` (workloads.checkpoint.local_copies) while hashing them, writes
`rank<R>.json` last (size, SHA-256 and the run's identity: a copy without it is incomplete), and
exchanges copies with the peers over its own gloo group: rank R sends to R + nproc_per_node and
receives from R - nproc_per_node, i.e. always to another node.
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
and the run goes on with the FSx tier. When a save cannot be written (a node's disk fills), the
rank still takes part in the exchange, saying it has no copy, so its peer never waits for one;
the rank reports the first of its saves that fail in a row and the first that succeeds again, and
a restore takes the newest step complete for every rank as always (the failed rank's host copy
after an in-process restart; else an older complete step, or FSx).

Why not NVRx's LocalCheckpointManager: on CPU its BasicTensorAwareStateDict asserts CUDA and its
replica retrieval sends through CUDA (PLATFORM-FACTS), and it loads copies with
`torch.load(weights_only=False)`, i.e. unpickles whatever a node-local directory holds. The
exchange here is a plain gloo send/recv of the copy's bytes, the same on CPU and GPU.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nvrx_eks.facts.checkpoint_layout import local_copy_identity
from workloads.checkpoint import copy_format
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.checkpoint.groups import checkpoint_gloo_group
from workloads.checkpoint.local_copies import (
    Buffer,
    copies_in,
    copy_paths,
    copy_record,
    corrupt_newest_copy,
    exchange,
    fill_state,
    open_copy,
    run_id,
    split_state,
    step_dir,
    write_own_copy,
    write_replica,
)
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import local_disk_full, marker_dir, parse_fault_spec

log = logging.getLogger(__name__)

#: Nice value of the writer thread (0-19; higher yields more CPU to the training thread).
WRITER_NICENESS = 10

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
    save (`local_save_failed`, with a warning that says what it means) and the first that
    succeeds again (`local_save_recovered`, with the count of those that failed); both are
    watched lines (workloads.events.watch_line). A full disk fails every
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
        events.emit("local_save_recovered", step=step, failed_saves=_failing.saves, since_step=_failing.since_step)
        _failing = None


@dataclass
class LocalRestore:
    step: int
    state: dict[str, Any]
    source: str  # "local" (own copy) or "replica" (received from the rank that held it)


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
        self.identity = local_copy_identity(
            self.world, cfg.model.preset, cfg.distributed.shard, nproc_per_node, cfg.model.shape_changes
        )
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
                    self.root, step, self.rank, tensors, meta, self.run, self.identity, disk_full=self._disk_full(step)
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
                replica, replica_sha256 = exchange(self._group, self.peer, own, self.source, sha256)
                if replica is not None and replica_sha256 is not None:
                    try:
                        write_replica(
                            self.root,
                            step,
                            self.source,
                            replica,
                            replica_sha256,
                            self.run,
                            self.identity,
                            disk_full=self._disk_full(step),
                        )
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
                exchange(self._group, origin, opened[origin], None)
            elif self.rank == origin:
                data, _ = exchange(self._group, None, None, holder)
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
