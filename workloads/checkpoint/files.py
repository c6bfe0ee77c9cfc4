"""Checkpoint files: their digests, and which files this process committed (trusted at a reload
without re-hashing, then re-hashed off the training thread before anything is committed on them)."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nvrx_eks.facts.checkpoint_layout import commit_state


def rank_digests(directory: Path, rank: int, with_sha: bool) -> dict[str, list[Any]]:
    return {p.name: file_digest(p, with_sha) for p in sorted(directory.glob(f"__{rank}_*.distcp"))}


def file_digest(path: Path, with_sha: bool) -> list[Any]:
    size = path.stat().st_size
    if not with_sha:
        return [size, None]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return [size, h.hexdigest()]


#: Files this process committed, with their metadata at the commit (see Checkpointer._verify_share).
_VERIFIED_AT_COMMIT: dict[str, tuple[int, int, int, int]] = {}
SHARD_NAME = re.compile(r"^__\d+_\d+\.distcp$")


def _unchanged_key(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What a change to a file leaves in its metadata: size and mtime, which a tool can put back
    (`touch -r`, `os.utime`), and the two it cannot: ctime (every write, and the utime call that
    resets mtime, set it to now) and the inode (a file replaced by a copy)."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def remember_verified(directory: Path, files: dict[str, Any]) -> None:
    for name in files:
        path = directory / name
        _VERIFIED_AT_COMMIT[str(path.resolve())] = _unchanged_key(path.stat())


def verified_earlier(path: Path, size: int) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    recorded = _VERIFIED_AT_COMMIT.get(str(path.resolve()))
    return recorded is not None and recorded[0] == size and recorded == _unchanged_key(stat)


def forget_verified(directory: Path) -> None:
    """Trust nothing of `directory` at the next load: every file is hashed again."""
    prefix = str(directory.resolve()) + os.sep
    for key in [k for k in _VERIFIED_AT_COMMIT if k.startswith(prefix)]:
        del _VERIFIED_AT_COMMIT[key]


#: Nice value of the re-hashing thread (0-19; higher yields more CPU to the training thread).
RECHECK_NICENESS = 10


class TrustedFilesRecheck:
    """Re-hashes, in a thread below the training thread's priority, the files a load trusted
    without hashing them (Checkpointer._verify_share). Damage below the file system, such as bit
    rot on the storage, changes no metadata, so trusting a file cannot see it; the state loaded
    from such a file must not be committed again, because the new commit's hashes would vouch for
    it and the evidence would be gone. The commit therefore asks `damage()` first."""

    def __init__(self, files: Iterable[tuple[Path, str]]):
        self._files = list(files)
        self._damage: str | None = None
        self._thread = threading.Thread(target=self._run, name="trusted-files-recheck", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RECHECK_NICENESS)
        except OSError:
            pass
        for path, sha in self._files:
            try:
                actual = file_digest(path, with_sha=True)[1]
            except OSError as err:
                self._damage = f"{path} is unreadable: {err}"
                return
            if actual != sha:
                self._damage = f"{path} does not match its recorded SHA-256"
                return

    def damage(self) -> str | None:
        """Why a trusted file is damaged, or None when every one still matches its record (waits
        for the re-hash to finish)."""
        self._thread.join()
        return self._damage


def committed_checkpoints(ckpt_dir: str | Path) -> list[str]:
    """Committed checkpoint names, newest first (rebuilt from the commit records when the pointer
    is missing or unreadable)."""
    return commit_state(ckpt_dir).committed
