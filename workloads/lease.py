"""One writer per run directory: a lease taken before anything of a run is written.

Two runs on one directory (a resume started while the first still runs, a second job pointed at
the same path) delete each other's in-flight checkpoints through retention, interleave their
events and summaries, and one may resume from the other's state. The lease is an exclusive
`flock` on `<run_dir>/.lease`, held for as long as the run's owner lives (the kernel drops it
when the process ends, however it ends), with the holder (pid, host, command, start time)
written inside so a refusal can name it. Lustre clients support flock when the file system is
mounted with it (FSx for Lustre's CSI driver mounts with `flock`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from nvrx_eks.facts.errors import ConfigError

LEASE_FILE = ".lease"


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


class HeartbeatLease:
    """The lease of a run on EKS, taken by its rank 0 before the run writes anything: the holder,
    the job attempt and a beat counter, rewritten every BEAT_S by a daemon thread for as long as
    the process lives. A lease whose content does not change for STALE_S is gone and is taken
    over; one that changes belongs to a live run, which is refused naming it. A holder known to be
    gone is taken over at once (see _gone); otherwise the wait, STALE_S, stays below the in-process
    barrier timeout the other ranks wait in meanwhile."""

    def __init__(self, run_dir: Path, attempt: str | None, command: str):
        self.path = Path(run_dir) / LEASE_FILE
        self.holder = {**holder(command), "attempt": attempt, "beat": 0}
        self._stop = False

    def take(self) -> None:
        """Raises RunDirectoryInUse when a live run holds the lease."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        seen = self._read()
        if seen and held_by_an_ancestor(seen):
            return  # nvrx-eks local holds it for this run
        if seen and not self._gone(seen):
            deadline = time.monotonic() + STALE_S
            while time.monotonic() < deadline:
                time.sleep(BEAT_S / 2)
                now = self._read()
                if now != seen:
                    raise in_use("run_dir", self.path.parent, now)
        self._write()
        threading.Thread(target=self._beat, name="run-lease", daemon=True).start()

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

    def release(self) -> None:
        self._stop = True

    def _read(self) -> str:
        try:
            return self.path.read_text().strip()
        except (FileNotFoundError, IsADirectoryError):
            return ""

    def _write(self) -> None:
        tmp = self.path.with_name(f"{LEASE_FILE}.{self.holder['host']}.{self.holder['pid']}.tmp")
        tmp.write_text(json.dumps(self.holder) + "\n")
        os.replace(tmp, self.path)

    def _beat(self) -> None:
        while not self._stop:
            time.sleep(BEAT_S)
            self.holder["beat"] += 1
            try:
                self._write()
            except OSError:
                pass  # the file system hiccuped; the next beat tries again, STALE_S allows three misses
