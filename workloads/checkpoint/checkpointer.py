"""The Checkpointer: when to save (its policy), saving through the backend's writer, committing,
and restoring the newest usable state into the stateful objects it was built with."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from nvrx_eks.facts.checkpoint_layout import (
    COMMIT_FILE,
    DIGESTS_FILE,
    ITERATION_FILE,
    METADATA_FILE,
    POINTER_FILE,
    CommitState,
    atomic_write,
    checkpoint_dirs,
    commit_state,
    incompatibility,
    may_delete,
    pointer_text,
    step_dir_name,
    step_of,
)
from workloads.checkpoint import files as ckpt_files
from workloads.checkpoint.digest import state_nbytes
from workloads.checkpoint.errors import (
    CheckpointIncompatible,
    CheckpointStorageError,
    CheckpointTimeout,
    NoUsableCheckpoint,
    TrustedFileDamaged,
    storage_failure,
)
from workloads.checkpoint.local_tier import LocalTier
from workloads.checkpoint.safe_load import SafeFileSystemReader, TensorsOnlyLoadPlanner
from workloads.checkpoint.train_state import Stateful
from workloads.checkpoint.writers import PendingSave, build_writer
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FaultInjector, damage_in_place

log = logging.getLogger(__name__)


@dataclass
class LoadResult:
    step: int
    path: Path
    state: dict[str, Any]


class _NoSections:
    """Stands in for ft_launcher's section reporter where none is connected (tools, tests)."""

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        yield


def _load_failure(err: BaseException) -> str:
    """What went wrong in one line per cause: DCP's CheckpointException carries each rank's
    exception with a traceback in its text."""
    if isinstance(err, CheckpointException):
        causes = sorted({f"{type(e).__name__}: {e}" for e, _ in err.failures.values()})
        return "; ".join(causes)
    return f"{type(err).__name__}: {err}"


class Checkpointer:
    """Saves, commits, verifies and loads checkpoints for one in-process iteration.

    Built with the stateful objects it saves (`states`: key -> object with state_dict and
    load_state_dict) and the node-local tier if one is on; owns the save policy (`maybe_save`:
    every checkpoint.interval_steps, every checkpoint.interval_seconds when every rank agrees, at
    the last step, and when forced) and reports its work to ft_launcher as the `checkpointing`
    section. `save`/`load_latest` take a state dict directly, for tools that have no loop.

    Collective methods (every rank, same order): the constructor, restore, maybe_save, poll,
    save, wait, close, finish, load_latest. `atomic` wraps rank 0's commit so an in-process abort
    never interrupts it half way; `ping` reports progress to the in-process watchdog while waiting.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        events: EventLog,
        faults: FaultInjector,
        identity: dict[str, Any],
        device: torch.device,
        states: Mapping[str, Stateful] | None = None,
        local_tier: LocalTier | None = None,
        ft: Any = None,
        atomic: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        ping: Callable[[], None] = lambda: None,
        unguarded: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    ):
        self.cfg = cfg
        self.device = device  # where the small control tensors live (CUDA for NCCL)
        self.backend = cfg.checkpoint.backend
        self.dir = Path(cfg.checkpoint_dir)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.events, self.faults, self.identity = events, faults, identity
        #: Written into every commit record beside the identity, never compared on load (the
        #: trainer sets global_batch_tokens once it knows its accumulation).
        self.run_facts: dict[str, Any] = {}
        #: The commit record of the checkpoint load_latest loaded, if any.
        self.loaded_manifest: dict[str, Any] | None = None
        self.states: Mapping[str, Stateful] = states or {}
        self.local_tier = local_tier
        self.ft = ft if ft is not None else _NoSections()
        self.atomic, self.ping, self.unguarded = atomic, ping, unguarded
        self.pending: PendingSave | None = None
        self.last_saved_step = -1
        self._last_save_t = time.monotonic()
        self._saves = 0
        self._trusted_files = 0
        # The files the last load trusted without hashing, re-hashed before the next commit.
        self._recheck: ckpt_files.TrustedFilesRecheck | None = None
        self._loaded_from: Path | None = None
        self._pointer_warned: str | None = None  # the pointer warning last reported (_commit_state)
        self._state_bytes = 0
        self._handing_off: Path | None = None
        self.attempt = ""
        if self.backend == "none":
            self.writer = None
            return
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
        # One token per attempt, shared by all ranks: every save of this attempt gets a directory
        # no earlier attempt can have used, even for the same step.
        token = [f"{int(time.time() * 1000):x}.{events.cycle}.{events.iteration}"]
        dist.broadcast_object_list(token, src=0)
        self.attempt = token[0]
        self.writer = build_writer(
            self.backend,
            rank=self.rank,
            device=device,
            with_sha=cfg.checkpoint.verify == "sha256",
            commit=self._commit,
            unguarded=unguarded,
            group_timeout_s=cfg.checkpoint.finalize_timeout_s,
            write_threads=cfg.checkpoint.write_threads,
            attempt=self.attempt,
        )
        if self.writer is not None and self.writer.worker_start is not None:
            events.emit("checkpoint_worker", start=self.writer.worker_start)

    # -- the policy ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: every stateful object's state under its key."""
        return {key: stateful.state_dict() for key, stateful in self.states.items()}

    def time_due(self) -> bool:
        """This rank's vote for a save because checkpoint.interval_seconds elapsed. Every rank
        must save at the same step, so the caller reduces the votes and passes `force`."""
        every_s = self.cfg.checkpoint.interval_seconds
        return every_s is not None and time.monotonic() - self._last_save_t >= every_s

    def maybe_save(self, step: int, *, force: bool = False) -> None:
        """After `step`: save to checkpoint.dir when the policy says so, and to the local tier
        every checkpoint.local.interval_steps."""
        if step % self.cfg.checkpoint.interval_steps == 0 or step == self.cfg.steps or force:
            with self.ft.section("checkpointing"):
                self.save(step, self.state_dict())
            self._last_save_t = time.monotonic()
        # Also at FSx saves: a restore right after one then still finds the local tier current.
        local, local_every = self.local_tier, self.cfg.checkpoint.local.interval_steps
        if local is not None and local_every is not None and step % local_every == 0:
            with self.ft.section("checkpointing"):
                local.save(step, self.state_dict(), ping=self.ping)

    def poll_in_flight(self) -> None:
        """Before a step: commit the save in flight if every rank finished writing it."""
        if self.pending is not None:
            with self.ft.section("checkpointing"):
                self.poll()

    def finish(self, step: int) -> None:
        """At the end (completed or SIGTERM): save `step` unless saved, then drain both tiers."""
        with self.ft.section("checkpointing"):
            if self.last_saved_step < step:
                self.save(step, self.state_dict())
            self.close()
            if self.local_tier is not None:
                self.local_tier.wait(ping=self.ping)

    def restore(self) -> int | None:
        """Load the newest state complete for every rank into the stateful objects; returns its
        step, None on a fresh start. The node-local tier wins when it holds a step not older than
        the newest committed checkpoint in checkpoint.dir (no FSx data is read then)."""
        loaded: Any = None
        if self.local_tier is not None and self.backend != "none":
            committed = commit_state(self.dir).committed if self.rank == 0 else []
            loaded = self.local_tier.restore(self.state_dict, step_of(committed[0]) if committed else -1)
        if loaded is None:
            loaded = self.load_latest(self.state_dict)
        if loaded is not None:
            for key, stateful in self.states.items():
                stateful.load_state_dict(loaded.state[key])
        self.last_saved_step = loaded.step if loaded is not None else 0
        self._last_save_t = time.monotonic()
        return loaded.step if loaded is not None else None

    @property
    def corrupt_local(self) -> Callable[[], str | None] | None:
        """The `corrupt-local` fault's action, when the local tier is on."""
        return self.local_tier.corrupt_newest if self.local_tier is not None else None

    # -- saving ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
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
        if self.writer is None:
            return 0.0
        with self._storage_errors():
            self._state_bytes = state_nbytes(state)
            return self._save(step, state)

    def _save(self, step: int, state: dict[str, Any]) -> float:
        assert self.writer is not None
        self.wait()  # one save in flight at most
        start = time.monotonic()
        self._saves += 1
        pending = PendingSave(
            step=step,
            path=self.dir / step_dir_name(step, f"{self.attempt}.{self._saves}"),
            handed_off_t=time.monotonic(),
        )
        self._handing_off = pending.path
        self.writer.hand_off(pending, state, first=self._saves == 1)
        stall = time.monotonic() - start
        pending.handed_off_t = time.monotonic()
        self.pending = pending
        self.last_saved_step = step
        self.events.emit("checkpoint_stall", step=step, backend=self.backend, stall_s=stall)
        self.faults.in_save(step)
        if self.writer.blocking:
            self._commit(pending)
        return stall

    def poll(self) -> None:
        """Commit the in-flight save if every rank finished writing it. Call once per step."""
        if self.pending is None or self.writer is None:
            return
        with self._storage_errors():
            self.writer.poll(self.pending)

    def wait(self) -> None:
        """Block until the in-flight save committed, reporting progress meanwhile; a save that
        takes longer than checkpoint.finalize_timeout_s raises CheckpointTimeout."""
        deadline = time.monotonic() + self.cfg.checkpoint.finalize_timeout_s
        while self.pending is not None and self.writer is not None:
            self.poll()
            if self.pending is None:
                break
            with self._storage_errors():
                self.writer.raise_if_died(self.pending)
            if time.monotonic() > deadline:
                raise CheckpointTimeout(
                    f"checkpoint of step {self.pending.step} did not commit "
                    f"within {self.cfg.checkpoint.finalize_timeout_s:g}s"
                )
            self.ping()
            time.sleep(0.02)

    def close(self) -> None:
        """Finish the in-flight save and stop the writer (normal end and SIGTERM)."""
        self.wait()
        if self.writer is None:
            return
        # Stopping NVRx's worker joins it with no bound and no progress to report (its exit
        # drops every shared-memory staging buffer: seconds for a large state), which the
        # in-process watchdog took for a hang: a restart after the final commit, a restore and
        # a second finish. Unguarded; finish's ft `checkpointing` section still bounds it.
        with self.unguarded():
            self.faults.during_close(self.last_saved_step)
            self.writer.close()

    # -- committing ------------------------------------------------------------------------------

    def _commit(self, pending: PendingSave) -> None:
        """Collective. Every rank's data is on disk when this runs."""
        started = time.monotonic()
        self.events.emit("checkpoint_write_end", step=pending.step, write_s=started - pending.handed_off_t)
        with_sha = self.cfg.checkpoint.verify == "sha256"
        mine = self._writer_digests(pending)
        if mine is None:  # sync saves, or a writer that recorded nothing
            mine = ckpt_files.rank_digests(pending.path, self.rank, with_sha)
        damage = self._recheck.damage() if self._recheck is not None else None
        gathered: list[dict[str, Any]] = [{}] * self.world_size
        dist.all_gather_object(gathered, {"files": mine, "damage": damage})
        self._refuse_damaged_lineage(pending, gathered)
        self._recheck = None
        ckpt_files.remember_verified(pending.path, mine)
        if self.rank == 0:
            files: dict[str, Any] = {}
            for part in gathered:
                files.update(part["files"])
            files[METADATA_FILE] = ckpt_files.file_digest(pending.path / METADATA_FILE, with_sha)
            with self.atomic():
                self._write_commit(pending, files)
            self.events.emit(
                "checkpoint_commit", step=pending.step, path=str(pending.path), commit_s=time.monotonic() - started
            )
        self.pending = None

    def _refuse_damaged_lineage(self, pending: PendingSave, gathered: list[dict[str, Any]]) -> None:
        """Every rank, on the gathered re-hash results: when a file the last load trusted turned
        out damaged, the state trained since grew from damaged data, so this save is not committed
        (its hashes would vouch for it). Raised as a fault: the restart reloads with every file of
        that checkpoint hashed, so the damage is found there and the load falls back."""
        damaged = [(rank, part["damage"]) for rank, part in enumerate(gathered) if part["damage"]]
        if not damaged:
            return
        assert self._loaded_from is not None  # a re-hash exists only after a load
        ckpt_files.forget_verified(self._loaded_from)
        rank, reason = damaged[0]
        message = (
            f"rank {rank}: {reason}, found after the load trusted it unchanged; the state loaded "
            f"from {self._loaded_from} is damaged, so step {pending.step} is not committed"
        )
        log.error("checkpoint: %s", message)
        self.events.emit("checkpoint_trust_failed", step=pending.step, path=str(self._loaded_from), reason=message)
        raise TrustedFileDamaged(message)

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
            **self.run_facts,
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
        rebuilt from the commit records or gave way to newer commits, and failing when nothing
        committed can be trusted."""
        state = commit_state(self.dir)
        if state.source == "lost":
            # commit_state always says why a pointer is lost; the fallback only satisfies the type.
            raise NoUsableCheckpoint(state.warning or f"no committed checkpoint in {self.dir} can be trusted")
        # Once per condition: the load reads the state, and so does the first commit after it,
        # before that commit's pointer repairs it.
        if state.source in ("rebuilt", "stale") and state.warning != self._pointer_warned:
            self._pointer_warned = state.warning
            log.warning("checkpoint pointer: %s", state.warning)
            self.events.emit(f"checkpoint_pointer_{state.source}", reason=state.warning, committed=state.committed)
        return state

    # -- loading ---------------------------------------------------------------------------------

    def _verify_share(self, path: Path, manifest: dict[str, Any]) -> tuple[str | None, list[tuple[Path, str]]]:
        """Check the files this rank will read (its own shards; rank 0 also the rest, e.g.
        .metadata); returns a reason on failure, and the files trusted without hashing with their
        recorded SHA-256. A file this process committed and that is unchanged since (same size,
        mtime, ctime and inode) is trusted: after an in-process restart that is every shard of the
        rank, so the reload reads each shard once, from the page cache the write left warm,
        instead of first hashing another rank's shard from the file system (for the 8b preset:
        ~6 GB per rank, seconds). Anything written to the file since, such as the corrupt-latest
        fault, changes its ctime even when the mtime is put back, and gets the full check (file
        times have the kernel clock's tick, and on Lustre one second, as resolution: a write
        within the commit's tick passes). What the metadata cannot show is caught before the next
        commit: the trusted files are re-hashed off the training thread (_refuse_damaged_lineage)."""
        prefix = f"__{self.rank}_"
        trusted: list[tuple[Path, str]] = []
        for name in sorted(manifest["files"]):
            mine = name.startswith(prefix)
            orphan = not ckpt_files.SHARD_NAME.match(name)
            if not (mine or (orphan and self.rank == 0)):
                continue
            size, sha = manifest["files"][name]
            target = path / name
            if not target.is_file():
                return f"{name} is missing", trusted
            if ckpt_files.verified_earlier(target, size):
                self._trusted_files += 1
                if sha is not None:
                    trusted.append((target, sha))
                continue
            actual = ckpt_files.file_digest(target, sha is not None)
            if actual[0] != size:
                return f"{name} has {actual[0]} bytes, the commit recorded {size}", trusted
            if sha is not None and actual[1] != sha:
                return f"{name} does not match its recorded SHA-256", trusted
        return None, trusted

    def _check_compatible(self, path: Path, manifest: dict[str, Any]) -> None:
        problem = incompatibility(manifest, self.identity, layout_may_differ=True)
        if problem is not None:
            raise CheckpointIncompatible(f"checkpoint {path} {problem}")

    def _optional_keys(self) -> frozenset[str]:
        """The flattened state keys a checkpoint may lack (a stateful object's
        `optional_state_keys`: what checkpoints written before it was saved do not hold)."""
        return frozenset(
            f"{key}.{name}"
            for key, stateful in self.states.items()
            for name in getattr(stateful, "optional_state_keys", ())
        )

    def load_latest(self, build_state: Callable[[], dict[str, Any]]) -> LoadResult | None:
        """Load the newest usable committed checkpoint into the tensors of `build_state()`.

        Returns None when no checkpoint was ever committed (fresh start). The choice of candidates
        is rank 0's, broadcast, so ranks never pick different checkpoints while a commit races.
        """
        if self.writer is None:
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
            manifest: dict[str, Any] | None
            reason: str | None
            trusted: list[tuple[Path, str]] = []
            try:
                manifest = json.loads((path / COMMIT_FILE).read_text())
            except (OSError, ValueError) as err:
                manifest, reason = None, f"unreadable {COMMIT_FILE}: {err}"
            if manifest is not None:
                self._check_compatible(path, manifest)
                reason, trusted = self._verify_share(path, manifest)
            failed = torch.tensor([0 if reason is None else 1], device=self.device)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            state: dict[str, Any] | None = None
            build_s = 0.0  # of load_s: the empty state to load into, the same work for either tier
            planner = TensorsOnlyLoadPlanner(self._optional_keys())
            if not int(failed.item()):
                building = time.monotonic()
                state = build_state()
                build_s = time.monotonic() - building
                try:
                    dcp.load(
                        state,
                        checkpoint_id=str(path),
                        storage_reader=SafeFileSystemReader(str(path)),
                        planner=planner,
                    )
                # DCP reports a failed read as CheckpointException, a BaseException.
                except (Exception, CheckpointException) as err:  # noqa: BLE001 - any load failure: try the previous
                    reason = f"load failed: {_load_failure(err)}"
                failed = torch.tensor([0 if reason is None else 1], device=self.device)
                dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if int(failed.item()):
                reason = reason or "another rank could not verify or load its share"
                log.warning(
                    "skipping checkpoint %s: %s; falling back to the previous committed checkpoint", path, reason
                )
                self.events.emit("checkpoint_fallback", path=str(path), reason=reason)
                continue
            assert manifest is not None and state is not None  # every rank verified and loaded
            if planner.absent:
                absent = ", ".join(planner.absent)
                log.warning("checkpoint %s records no %s (written before it was saved): not checked", path, absent)
                self.events.emit("checkpoint_state_unknown", path=str(path), keys=planner.absent)
            self._loaded_from, self.loaded_manifest = path, manifest
            if manifest.get("world_size") != self.world_size:
                log.info(
                    "checkpoint %s was written by %s ranks: resharded onto %d",
                    path,
                    manifest.get("world_size"),
                    self.world_size,
                )
                self.events.emit(
                    "checkpoint_resharded",
                    path=str(path),
                    from_world=manifest.get("world_size"),
                    to_world=self.world_size,
                )
            self._recheck = ckpt_files.TrustedFilesRecheck(trusted) if trusted else None
            self.events.emit(
                "checkpoint_load",
                step=manifest["step"],
                path=str(path),
                load_s=time.monotonic() - started,
                build_s=build_s,
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
        committed = ckpt_files.committed_checkpoints(self.dir)
        if not committed:
            return None
        shards = sorted((self.dir / committed[0]).glob("*.distcp"), key=lambda p: p.stat().st_size)
        if not shards:
            return None
        target = shards[-1]
        return damage_in_place(target)
