"""Checkpoint files: their digests, and which files this process committed (trusted at a reload
without re-hashing)."""

from __future__ import annotations

import hashlib
import re
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


#: Files this process committed, with their (size, mtime_ns) at the commit (see Checkpointer._verify_share).
_VERIFIED_AT_COMMIT: dict[str, tuple[int, int]] = {}
SHARD_NAME = re.compile(r"^__\d+_\d+\.distcp$")


def remember_verified(directory: Path, files: dict[str, Any]) -> None:
    for name in files:
        stat = (directory / name).stat()
        _VERIFIED_AT_COMMIT[str((directory / name).resolve())] = (stat.st_size, stat.st_mtime_ns)


def verified_earlier(path: Path, size: int) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    return _VERIFIED_AT_COMMIT.get(str(path.resolve())) == (size, stat.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def committed_checkpoints(ckpt_dir: str | Path) -> list[str]:
    """Committed checkpoint names, newest first (rebuilt from the commit records when the pointer
    is missing or unreadable)."""
    return commit_state(ckpt_dir).committed
