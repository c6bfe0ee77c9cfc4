"""One writer per run directory: a lease taken before anything of a run is written.

Two runs on one directory (a resume started while the first still runs, a second job pointed at
the same path) delete each other's in-flight checkpoints through retention, interleave their
events and summaries, and one may resume from the other's state. The lease is an exclusive
`flock` on `<run_dir>/.lease`, held for as long as the run's owner lives (the kernel drops it
when the process ends, however it ends), with the holder (pid, host, command, start time)
written inside so a refusal can name it. Lustre clients support flock when the file system is
mounted with it (FSx for Lustre's CSI driver mounts with `flock`).

That is `nvrx-eks local`'s lease (RunLease). A job on EKS has no process that lives as long as
the run: its rank 0 holds the same file by heartbeat (HeartbeatLease), and the lease follows rank
0 from process to process (RankZeroLease).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from nvrx_eks.facts.errors import ConfigError

LEASE_FILE = ".lease"

log = logging.getLogger("workloads.train")


class RunDirectoryInUse(ConfigError):
    """Another live run holds the run directory's lease."""


class RunLease:
    """`with RunLease(run_dir):` around everything a run writes there."""

    def __init__(self, run_dir: Path, command: str = "nvrx-eks local"):
        self.path = Path(run_dir) / LEASE_FILE
        self.command = command
        self._file: TextIO | None = None

    def __enter__(self) -> RunLease:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lease = open(self.path, "a+")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lease.seek(0)
            held_by = lease.read().strip()
            lease.close()
            raise in_use("--run-dir", self.path.parent, held_by) from None
        lease.seek(0)
        lease.truncate()
        lease.write(json.dumps(holder(self.command)) + "\n")
        lease.flush()
        self._file = lease
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None


def holder(command: str) -> dict[str, Any]:
    """What a lease says of its holder, so that a refusal can name it."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}


def in_use(field: str, run_dir: Path, holder_text: str) -> RunDirectoryInUse:
    return RunDirectoryInUse(
        f"{field}: {run_dir} is in use by another run ({describe(holder_text)}); wait for it "
        "to end, stop it, or choose another directory"
    )


def describe(holder_text: str) -> str:
    try:
        holder = json.loads(holder_text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        return f"{holder['command']}, pid {holder['pid']} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


#: On EKS the run's rank 0 holds the lease by rewriting it this often. A flock would outlive a
#: lost node until the file system evicts the dead client, and refuse the job's own next attempt
#: meanwhile; a heartbeat stops with its writer.
BEAT_S = 5.0
#: A lease not rewritten for this long belongs to a run that is gone.
STALE_S = 4 * BEAT_S
#: How long a claim may stand before the contender that finds it takes the claimant for dead (it
#: died between its claim and its write). A live claimant replaces the lease within milliseconds,
#: and the contender sees that at its next look; the bound is the lease's own: a claimant stalled
#: this long would have lost a lease it held. (Half a beat was once used: a claimant descheduled
#: for 2.5 s between its check and its write then shared the lease with the next contender.)
CLAIM_STALE_S = STALE_S
#: Claims tried on one lease before giving up (each one after the first means a claimant died
#: between its claim and its write).
_CLAIM_TRIES = 3
#: Rounds of reading and installing before take() gives up on a lease its own launch keeps
#: rewriting.
_TAKE_ROUNDS = 3


def _no_ping() -> None:
    return None


def held_by_an_ancestor(holder_text: str) -> bool:
    """The lease is held by a process this one descends from: `nvrx-eks local`, which holds it for
    the whole run it starts."""
    import psutil

    try:
        holder = json.loads(holder_text)
        ours = {p.pid for p in psutil.Process().parents()}
        return holder.get("host") == socket.gethostname() and holder.get("pid") in ours
    except (ValueError, AttributeError, psutil.Error):
        return False


def _record(holder_text: str | None) -> dict[str, Any]:
    """A lease's holder record; {} when absent or not a record."""
    try:
        record = json.loads(holder_text or "")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _term(holder_text: str | None) -> int:
    term = _record(holder_text).get("term")
    return term if isinstance(term, int) and not isinstance(term, bool) else 0


class HeartbeatLease:
    """The lease of a run on EKS, taken by its rank 0 before the run writes anything: the holder,
    the job attempt, its launch, a term and a beat counter, rewritten every BEAT_S by a daemon
    thread while the holder holds it. A lease whose content does not change for STALE_S is gone and
    is taken over; one that changes belongs to a live run, which is refused naming it.

    Taken over at once, without the wait: a holder known to be gone (see _gone), and a holder of
    the same launch (see _same_launch): with spare nodes NVRx may make another process rank 0 at an
    in-process restart (workloads.spares), and that process takes its own job's lease from the lost
    rank 0 while the other ranks wait for it. Otherwise the wait, STALE_S, stays below the
    in-process barrier timeout the other ranks wait in meanwhile.

    Two contenders never both take it: an absent lease is created with a hard link (exclusive),
    and a present one is replaced only by the contender whose hard link of a claim named after the
    content it replaces succeeded, after checking that the lease still has that content. The
    loser finds the winner's lease, just written, and is refused at once. Every take raises the
    term: a holder whose beat finds a higher term has been replaced and stops beating; one that
    finds a lower term of its own launch (the replaced holder's last beat, written as it was
    replaced) writes its own again."""

    def __init__(self, run_dir: Path, attempt: str | None, command: str, rendezvous_round: str | None = None):
        self.path = Path(run_dir) / LEASE_FILE
        #: The launch the holder belongs to: its job attempt and rendezvous round (None: unknown,
        #: then no other process counts as the same launch).
        self.launch = f"{attempt}/{rendezvous_round}" if attempt and rendezvous_round else None
        self.holder = {**holder(command), "attempt": attempt, "launch": self.launch, "term": 0, "beat": 0}
        self._stop = threading.Event()
        self._written = ""  # the lease as this holder last wrote it

    def take(self, ping: Callable[[], None] = _no_ping) -> str:
        """Hold the lease; returns how it came to be held, for the event log. Raises
        RunDirectoryInUse when a live run of another launch holds it. `ping`: progress for the
        in-process watchdog while a lease is watched for STALE_S."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        seen = self._read()
        for _ in range(_TAKE_ROUNDS):
            if seen and held_by_an_ancestor(seen):
                return f"held by the command that started this run ({describe(seen)})"
            if seen and not (self._gone(seen) or self._same_launch(seen)):
                self._wait_until_stale(seen, ping)
            if self._install(seen, ping):
                threading.Thread(target=self._beat, name="run-lease", daemon=True).start()
                return "taken" if not seen else f"taken over from {describe(seen)}"
            # Another contender wrote the lease since `seen`: it is live unless it is our launch's.
            now = self._read()
            if now and not (self._gone(now) or self._same_launch(now)):
                raise in_use("run_dir", self.path.parent, now)
            seen = now
        raise in_use("run_dir", self.path.parent, seen or "")

    def _wait_until_stale(self, seen: str, ping: Callable[[], None]) -> None:
        changed, now = self._watch(seen, STALE_S, ping)
        if changed:
            raise in_use("run_dir", self.path.parent, now or "")

    def _watch(self, seen: str, seconds: float, ping: Callable[[], None]) -> tuple[bool, str | None]:
        """Look at the lease every half beat for `seconds`: (True, its text) as soon as it is no
        longer `seen`, (False, `seen`) if it stayed so."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            _sleep(BEAT_S / 2, ping)
            now = self._read()
            if now != seen:
                return True, now
        return False, seen

    def _gone(self, holder_text: str) -> bool:
        """Known gone without waiting: a process of this host that no longer runs (this pod's
        earlier rank 0, restarted by ft_launcher; a JobSet's recreated pod has its predecessor's
        host name, and a pod name runs once at a time)."""
        import psutil

        try:
            holder = json.loads(holder_text)
            return holder.get("host") == socket.gethostname() and not psutil.pid_exists(int(holder["pid"]))
        except (ValueError, AttributeError, KeyError, TypeError):
            return False

    def _same_launch(self, holder_text: str | None) -> bool:
        """Held by a process of this launch: the same job attempt and the same rendezvous round,
        which every process NVRx may make rank 0 shares. A job resubmitted under the same name
        (a PyTorchJob's attempt id is its name) has a round of its own."""
        return self.launch is not None and _record(holder_text).get("launch") == self.launch

    def _install(self, seen: str | None, ping: Callable[[], None]) -> bool:
        """Write this holder's lease in place of `seen` (None: no lease file); False when another
        contender wrote it first."""
        self.holder["term"] = _term(seen) + 1
        text = json.dumps(self.holder)
        tmp = self._temporary()
        tmp.write_text(text + "\n")
        try:
            if seen is None:
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    return False
            else:
                claim = self._claim(seen, tmp, ping)
                if claim is None:
                    return False
                try:
                    if self._read() != seen:
                        return False
                    os.replace(tmp, self.path)
                finally:
                    claim.unlink(missing_ok=True)
                for leftover in self.path.parent.glob(f"{self._claims_on(seen)}*"):
                    leftover.unlink(missing_ok=True)  # of claimants that died before their write
        finally:
            tmp.unlink(missing_ok=True)
        self._written = text
        return True

    def _claim(self, seen: str, tmp: Path, ping: Callable[[], None]) -> Path | None:
        """The claim on replacing `seen`, made with a hard link (only one contender's succeeds);
        None when another contender holds it and replaced the lease. A claim whose lease is still
        `seen` after CLAIM_STALE_S belongs to a claimant that died: the next one is tried."""
        for n in range(_CLAIM_TRIES):
            claim = self.path.with_name(f"{self._claims_on(seen)}{n}")
            try:
                os.link(tmp, claim)
                return claim
            except FileExistsError:
                pass
            if self._watch(seen, CLAIM_STALE_S, ping)[0]:
                return None
        return None

    def _claims_on(self, seen: str) -> str:
        """The name every claim on replacing the lease `seen` starts with."""
        return f"{LEASE_FILE}.claim-{hashlib.sha256(seen.encode()).hexdigest()[:16]}-"

    def release(self) -> None:
        """Stop beating (the process is no longer rank 0): the next rank 0 takes the lease over."""
        self._stop.set()

    def _read(self) -> str | None:
        """The lease's text; None when there is no lease file."""
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return ""

    def _temporary(self) -> Path:
        return self.path.with_name(f"{LEASE_FILE}.{self.holder['host']}.{self.holder['pid']}.tmp")

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                now = self._read()
                if now != self._written and not self._still_ours(now):
                    log.error(
                        "%s: the run directory's lease is now held by %s; this process stops renewing it",
                        self.path.parent,
                        describe(now or ""),
                    )
                    return
                self.holder["beat"] += 1
                text = json.dumps(self.holder)
                tmp = self._temporary()
                tmp.write_text(text + "\n")
                os.replace(tmp, self.path)
                self._written = text
            except OSError:
                pass  # the file system hiccuped; the next beat tries again, STALE_S allows three misses

    def _still_ours(self, now: str | None) -> bool:
        """Whether a lease this holder did not write last is still its own to renew: gone (None),
        or rewritten by an earlier holder of its launch (a lower term: that holder's last beat,
        racing the take-over). A higher term, or another launch's lease, has replaced it."""
        return now is None or (self._same_launch(now) and _term(now) < self.holder["term"])


def _sleep(seconds: float, ping: Callable[[], None]) -> None:
    """Sleep, pinging the in-process watchdog at least every second."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        ping()


class RankZeroLease:
    """The run directory's lease, held by whichever process is rank 0 now. The launcher's rank 0
    takes it before anything of the run is written; after each in-process restart the process
    NVRx made rank 0 (with spare nodes, a spare that took a lost node's place) takes it over from
    its own launch at once, and a process that is no longer rank 0 stops renewing it."""

    def __init__(self, run_dir: Path, *, attempt: str | None, rendezvous_round: str | None, command: str):
        self.run_dir, self.attempt, self.round, self.command = Path(run_dir), attempt, rendezvous_round, command
        self.held: HeartbeatLease | None = None

    def follow(self, rank: int, ping: Callable[[], None] = _no_ping) -> str | None:
        """For the rank this process holds now: take the lease if it is rank 0 and does not hold
        it (returns how it came to be held), stop renewing it if it is no longer rank 0. Raises
        RunDirectoryInUse when another live run holds it."""
        if rank == 0 and self.held is None:
            lease = HeartbeatLease(self.run_dir, self.attempt, self.command, self.round)
            how = lease.take(ping)
            self.held = lease
            return how
        if rank != 0 and self.held is not None:
            self.held.release()
            self.held = None
        return None
