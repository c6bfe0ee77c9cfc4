"""Fault injection: spec parsing (no torch) and the injector the training loop calls.

Spec: comma-separated `KIND@STEP[:RANK]`, e.g. "exception@20:1,hang@35:0,kill-in-save@50". RANK
defaults to 0; it is the rank active at that moment (with spare nodes a spare that took over a lost
rank's place answers to that rank). Each fault fires once per run, even across in-process and
launcher restarts: before acting, the target rank creates a marker file in `<run_dir>/faults/`
(O_EXCL, fsync'd), and a fault whose marker exists is skipped. Replayed steps after a restart
therefore run clean, which is what makes a faulted run end bit-identical to a clean one, on CPU:
there every kernel is deterministic. On GPU, cuDNN/flash-attention backward kernels and atomics
are not, so a faulted and a clean GPU run agree only to within floating-point noise unless the run
enables torch.use_deterministic_algorithms (with CUBLAS_WORKSPACE_CONFIG=:4096:8), at a speed
cost. Two kinds model what a restart does not make go away, and say how long they last instead:
`oom` (every time) and `nan` (until the node is replaced).

Kinds and which resilience layer should recover them:
  exception      raise at the start of STEP                       -> in-process restart
  hang           Python-level endless loop without progress pings -> in-process soft timeout
  block          blocking C-level sleep (async exceptions cannot interrupt it, the watchdog's
                 automatic heartbeat stops too)                   -> in-process hard timeout kills
                                                                     the rank -> ft_launcher
  sigkill        SIGKILL the rank at the start of STEP            -> ft_launcher
  kill-in-save   SIGKILL the rank right after it handed the first checkpoint at or after STEP to
                 the writer, before the commit                    -> ft_launcher; the half-written
                                                                     checkpoint is never loaded
  corrupt-latest overwrite bytes in the newest committed checkpoint at the start of STEP
                                                                  -> detected on the next load,
                                                                     which falls back to the
                                                                     previous committed one
  corrupt-local  overwrite bytes in the rank's newest node-local copy (workloads.checkpoint.local_tier) at
                 the start of STEP, then fail the step like `exception`, so the restore meets the
                 damage                                           -> in-process restart; the rank's
                                                                     copy comes from the replica
                                                                     its peer on another node holds
  node-loss      NODE instead of RANK: at the start of STEP the first rank of that node (active
                 node index: ranks NODE x nproc ...) SIGKILLs the node's launcher, every process
                 the launcher started, and itself: a simulated node lost whole
                                                                  -> in-process restart with a spare
                                                                     node (workloads.spares), else
                                                                     a relaunch
  local-disk-full  NODE instead of RANK: from STEP on, that node's node-local checkpoint storage
                 (checkpoint.local.dir) is full: every write there of a local copy of STEP or a
                 later step, its own or a replica, fails with ENOSPC (OSError, errno 28) as the
                 file system's would
                                                                  -> nothing restarts: the node's
                                                                     ranks and their peers keep
                                                                     training, restores use what
                                                                     is complete or FSx
  coordinator-loss  at the start of STEP the rank SIGKILLs the job's coordinator (workloads.coordinator,
                 found through the pidfile `nvrx-eks local` writes; in pods no rank can see it, and
                 the fault only records that)             -> every store gone: the launch fails and
                                                             is started again (on EKS the JobSet
                                                             recreates every pod)
  oom            raise a CUDA out-of-memory error at the start of STEP, each time the rank reaches it
                 (a batch the GPU cannot hold: deterministic, so unlike every other kind it fires
                 again after each restart)                       -> the second time before any
                                                                     checkpoint ends the job: exit 93
                                                                     (workloads.repeated_failure)
  nan            the rank's loss (and so its gradients) is non-finite at every step from STEP on,
                 as a faulty GPU computes: on the node it first fired on (its host, JobSet attempt
                 and launcher), which a relaunch or a spare replaces with a healthy one
                                                                  -> that node leaves the job for
                                                                     replacement (workloads.nonfinite):
                                                                     a spare in process, else a
                                                                     relaunch; on every rank at once
                                                                     the run diverged: exit 93
  slow           the rank sleeps SLOW_SECONDS_PER_STEP in each of SLOW_STEPS steps from STEP
                 (a straggler, not a failure: nothing should restart)
  slow-digest    the end-of-run state digest of a run that reached STEP takes SLOW_DIGEST_SECONDS
                 longer on the rank, in slices between its progress pings (a large state: the
                 in-process watchdog must not take it for a hang; nothing should restart)
  slow-close     the checkpoint writer's close at the end of a run that saved STEP takes
                 SLOW_CLOSE_SECONDS longer on the rank (the NVRx worker's exit, which drops every
                 shared-memory staging buffer of a large state): nothing should restart after the
                 final commit
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_ENV
from nvrx_eks.facts.run_layout import coordinator_pidfile

FAULT_KINDS = (
    "exception",
    "hang",
    "block",
    "sigkill",
    "kill-in-save",
    "corrupt-latest",
    "corrupt-local",
    "node-loss",
    "local-disk-full",
    "coordinator-loss",
    "slow",
    "slow-digest",
    "oom",
    "nan",
    "slow-close",
)
KINDS_NEEDING_CHECKPOINTS = ("kill-in-save", "corrupt-latest", "slow-close")
KINDS_NEEDING_LOCAL_TIER = ("corrupt-local", "local-disk-full")
#: Kinds whose target is a node (its first rank carries them out), not a rank.
NODE_KINDS = ("node-loss", "local-disk-full")
#: Kinds that interrupt nothing by themselves: no restart is theirs to recover from.
KINDS_INTERRUPTING_NOTHING = ("corrupt-latest", "slow", "local-disk-full", "slow-close")
SLOW_SECONDS_PER_STEP = 0.5
SLOW_STEPS = 5
SLOW_DIGEST_SECONDS = 12.0
_SLOW_DIGEST_SLICE_S = 0.25
SLOW_CLOSE_SECONDS = 12.0


class InjectedFault(RuntimeError):
    """The exception raised by an `exception` fault."""


def node_incarnation() -> str:
    """This rank's node as a `nan` fault's faulty GPU belongs to it: its host, its JobSet attempt
    and its launcher (the rank's parent). A launcher restart keeps all three (the same GPU), a
    relaunch or a spare taking the rank's place changes one (a healthy node)."""
    attempt = os.environ.get(JOBSET_RESTART_ATTEMPT_ENV, "0") or "0"
    return f"{socket.gethostname()}/attempt{attempt}/launcher{os.getppid()}"


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    step: int
    rank: int
    index: int  # position in the spec string; part of the marker name so duplicates stay distinct

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.step}:{self.rank}"

    @property
    def marker_name(self) -> str:
        return f"{self.index:02d}-{self.kind}-step{self.step}-rank{self.rank}"


_DIGITS = re.compile(r"[0-9]+")


def parse_fault_spec(spec: str) -> tuple[FaultSpec, ...]:
    """Parse `KIND@STEP[:RANK],...`. Raises ValueError naming the bad item and the accepted form."""
    faults = []
    for index, raw in enumerate(item.strip() for item in (spec or "").split(",")):
        if not raw:
            continue
        form = f"expected KIND@STEP[:RANK] with KIND one of {', '.join(FAULT_KINDS)}"
        kind, sep, where = raw.partition("@")
        if not sep or kind not in FAULT_KINDS:
            raise ValueError(f"fault {raw!r}: {form}")
        step_text, _, rank_text = where.partition(":")
        # Only 0-9: int() also takes other scripts' digits (٣, ５), `1_0`, `+5` and `-0`, none of
        # which a schedule means to write.
        if not all(_DIGITS.fullmatch(text) for text in (step_text, rank_text or "0")):
            raise ValueError(f"fault {raw!r}: STEP and RANK must be written with the digits 0-9; {form}")
        try:
            step, rank = int(step_text), int(rank_text or 0)
        except ValueError:  # more digits than Python converts
            raise ValueError(f"fault {raw!r}: STEP and RANK must be integers; {form}") from None
        if step < 1 or rank < 0:
            raise ValueError(f"fault {raw!r}: STEP must be >= 1 and RANK >= 0")
        faults.append(FaultSpec(kind=kind, step=step, rank=rank, index=index))
    return tuple(faults)


def outside_world(faults: tuple[FaultSpec, ...], world_size: int) -> list[FaultSpec]:
    """The faults that name a rank the world does not have (ranks are 0 .. world_size - 1): they
    would never fire. The one check every layer runs (trainer, preflight, validator, local runner)."""
    return [fault for fault in faults if fault.rank >= world_size]


def target_limit(fault: FaultSpec, *, nodes: int, world_size: int) -> tuple[str, int]:
    """What a fault's target counts, and how many of them the job has active: the NODE_KINDS name
    a node, every other kind a rank. A target at or above the limit would never fire."""
    return ("node", nodes) if fault.kind in NODE_KINDS else ("rank", world_size)


def marker_dir(run_dir: str | Path) -> Path:
    """Where each fault's marker is created when it fires (see FaultInjector._claim)."""
    return Path(run_dir) / "faults"


def local_disk_full(faults: tuple[FaultSpec, ...], node: int, markers: Path) -> Callable[[int], bool]:
    """Whether a local save of a step finds `node`'s node-local checkpoint storage full: a
    local-disk-full fault of that node has fired (its marker exists; the first rank of the node
    creates it at the fault's step, FaultInjector.at_step_start) and the step is the fault's or
    later. The step, not the moment: a save of an earlier step still being written when the
    fault fires is not touched, so which saves fail does not depend on the writer's speed."""
    mine = [(markers / f.marker_name, f.step) for f in faults if f.kind == "local-disk-full" and f.rank == node]
    return lambda step: any(step >= first and marker.exists() for marker, first in mine)


class FullDiskFile:
    """A file being written on a disk with no space left: every write fails with ENOSPC, as the
    kernel's does (the local-disk-full fault)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))


def outside_world_problem(fault: FaultSpec, world_size: int) -> str:
    return (
        f"faults: {fault.label} targets rank {fault.rank} but the world has {world_size} ranks; "
        f"use a rank below {world_size}"
    )


def damage_in_place(target: Path) -> str:
    """Overwrite 64 bytes in the middle of `target` (size unchanged, so only a checksum notices):
    the corruption the corrupt-latest and corrupt-local faults inject. Returns the path."""
    fd = os.open(target, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xde\xad\xbe\xef" * 16, max(0, target.stat().st_size // 2 - 32))
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(target)


def _block_in_c() -> None:
    """Sleep inside libc so that neither async exceptions nor the progress watchdog's pending
    calls can run: only a signal that kills the process ends this."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    while True:
        libc.sleep(3600)


def _kill_coordinator(run_dir: Path) -> bool:
    """SIGKILL the launch's coordinator; False when this rank cannot see it (no pidfile: a pod)."""
    try:
        pid = int(coordinator_pidfile(run_dir).read_text())
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        return False
    return True


class FaultInjector:
    """Fires this rank's faults at the points the training loop reports.

    `emit` records each fault in the event log before it acts (a SIGKILL leaves no later chance).
    """

    def __init__(
        self,
        faults: tuple[FaultSpec, ...],
        rank: int,
        marker_dir: Path,
        emit: Callable[..., object],
        nproc_per_node: int = 1,
    ):
        self.faults = faults
        self.nproc_per_node = nproc_per_node
        self.retarget(rank)
        self.marker_dir = marker_dir
        self.emit = emit
        self._slow_until_step = 0
        self._digest_delay_left: float | None = None
        self._nan_owner: dict[FaultSpec, str] = {}  # a fired `nan` fault -> the node it fired on

    def retarget(self, rank: int) -> None:
        """Take the faults of `rank`, the rank this process holds now (in-process restarts with
        spares move ranks)."""
        node, local = divmod(rank, self.nproc_per_node)
        self.mine = [
            f for f in self.faults if (f.rank == node and local == 0 if f.kind in NODE_KINDS else f.rank == rank)
        ]
        self.rank = rank

    def _claim(self, fault: FaultSpec, node: str = "") -> bool:
        """Create the fault's marker (recording `node`, for a `nan` fault); False if it already
        fired in this run."""
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        path = self.marker_dir / fault.marker_name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{time.time()} pid={os.getpid()} node={node}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def loss_poisoned(self, step: int) -> bool:
        """Whether a `nan` fault makes this rank's loss non-finite at `step`: from the fault's step
        on, on the node it first fired on. The first rank to reach the step claims the fault for
        its node (and records it); a later process learns the owner from the marker."""
        for fault in self.mine:
            if fault.kind != "nan" or step < fault.step:
                continue
            here = node_incarnation()
            if fault not in self._nan_owner:
                if self._claim(fault, here):
                    self._nan_owner[fault] = here
                    self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank)
                else:
                    marker = (self.marker_dir / fault.marker_name).read_text()
                    self._nan_owner[fault] = marker.partition(" node=")[2].strip()
            if self._nan_owner[fault] == here:
                return True
        return False

    def at_step_start(
        self, step: int, corrupt_latest: Callable[[], str | None], corrupt_local: Callable[[], str | None] | None = None
    ) -> None:
        if step < self._slow_until_step:
            time.sleep(SLOW_SECONDS_PER_STEP)
        for fault in self.mine:
            if fault.step != step or fault.kind in ("kill-in-save", "slow-digest", "nan", "slow-close"):
                continue
            if fault.kind == "oom":  # no marker: a deterministic failure meets every replay
                self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank)
                raise _out_of_memory(step, self.rank)
            if not self._claim(fault):
                continue
            if fault.kind == "corrupt-latest":
                damaged = corrupt_latest()
                self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank, damaged=damaged)
                continue
            if fault.kind == "corrupt-local":
                damaged = corrupt_local() if corrupt_local is not None else None
                self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank, damaged=damaged)
                raise InjectedFault(f"corrupt-local at step {step} on rank {self.rank}: damaged {damaged}")
            node = {"node": fault.rank} if fault.kind in NODE_KINDS else {}
            self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank, **node)
            # local-disk-full: its marker, just created, is what the node's local tier finds full.
            if fault.kind == "exception":
                raise InjectedFault(f"injected exception at step {step} on rank {self.rank}")
            if fault.kind == "hang":
                while True:  # no ping: the in-process soft timeout must notice
                    time.sleep(0.05)
            if fault.kind == "block":
                _block_in_c()
            if fault.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.kind == "node-loss":
                from workloads.node_exit import leave_with_node

                leave_with_node()
            if fault.kind == "coordinator-loss" and not _kill_coordinator(self.marker_dir.parent):
                self.emit("fault_not_applicable", kind=fault.kind, step=step, reason="no coordinator process visible")
            if fault.kind == "slow":
                self._slow_until_step = step + SLOW_STEPS
                time.sleep(SLOW_SECONDS_PER_STEP)

    def in_save(self, step: int) -> None:
        """Called right after a save of `step` was handed to the writer, before its commit."""
        for fault in self.mine:
            if fault.kind == "kill-in-save" and step >= fault.step and self._claim(fault):
                self.emit("fault_injected", kind=fault.kind, step=step, target_rank=self.rank)
                os.kill(os.getpid(), signal.SIGKILL)

    def during_digest(self, final_step: int) -> None:
        """Called between slices of the end-of-run state digest, right after a progress ping."""
        if self._digest_delay_left is None:
            self._digest_delay_left = 0.0
            for fault in self.mine:
                if fault.kind == "slow-digest" and final_step >= fault.step and self._claim(fault):
                    self.emit("fault_injected", kind=fault.kind, step=final_step, target_rank=self.rank)
                    self._digest_delay_left = SLOW_DIGEST_SECONDS
        if self._digest_delay_left > 0:
            pause = min(_SLOW_DIGEST_SLICE_S, self._digest_delay_left)
            self._digest_delay_left -= pause
            time.sleep(pause)

    def during_close(self, last_saved_step: int) -> None:
        """Called in the checkpoint writer's close, where the rank waits for its worker to exit."""
        for fault in self.mine:
            if fault.kind == "slow-close" and last_saved_step >= fault.step and self._claim(fault):
                self.emit("fault_injected", kind=fault.kind, step=last_saved_step, target_rank=self.rank)
                time.sleep(SLOW_CLOSE_SECONDS)


def _out_of_memory(step: int, rank: int) -> Exception:
    """What an `oom` fault raises: torch's CUDA out-of-memory error, with the parts of its message
    that vary from one try to the next (the sizes), as the caching allocator words it."""
    import torch

    free = 1.0 + (time.monotonic_ns() % 997) / 1000
    return torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total capacity of 79.19 GiB of "
        f"which {free:.2f} GiB is free. (injected at step {step} on rank {rank})"
    )
