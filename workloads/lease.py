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
import time
from pathlib import Path
from types import TracebackType
from typing import TextIO

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
            raise RunDirectoryInUse(
                f"--run-dir: {self.path.parent} is in use by another run ({describe(held_by)}); wait for it "
                "to end, stop it, or choose another directory"
            ) from None
        lease.seek(0)
        lease.truncate()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command, "since": time.time()}
        lease.write(json.dumps(holder) + "\n")
        lease.flush()
        self._file = lease
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None


def describe(holder_text: str) -> str:
    try:
        holder = json.loads(holder_text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        return f"{holder['command']}, pid {holder['pid']} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
