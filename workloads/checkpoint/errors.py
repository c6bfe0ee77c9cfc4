"""What a checkpoint save or load fails with, and how a storage refusal is told from other failures."""

from __future__ import annotations

import errno
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from nvrx_eks.facts.checkpoint_layout import storage_refusal_message, storage_refusal_now
from nvrx_eks.facts.errors import ConfigError


class CheckpointIncompatible(ConfigError):
    """The newest committed checkpoint belongs to another world size or model."""


class NoUsableCheckpoint(ConfigError):
    """Committed checkpoints exist but none passed verification and loading."""


class CheckpointTimeout(RuntimeError):
    """A save did not commit within checkpoint.finalize_timeout_s: treated as a fault."""


class CheckpointWriterDied(RuntimeError):
    """The NVRx checkpoint worker exited with a save in flight: the save is abandoned."""


class TrustedFileDamaged(RuntimeError):
    """A checkpoint file a reload trusted without hashing it (this process committed it, its
    metadata is unchanged) turned out damaged: the next commit is refused and the iteration
    restarts, a fault a reload with every file hashed recovers from."""


class CheckpointStorageError(ConfigError):
    """checkpoint.dir refuses the save: read-only, not permitted, or full. A restart meets the same
    storage, so this ends the run (exit 93) with the cause named, instead of costing restarts."""


# errno -> what the storage did. EPERM/EACCES: permissions; EDQUOT: a quota is a full disk too.
_STORAGE_ERRNOS = {
    errno.EROFS: "read-only",
    errno.EACCES: "denied",
    errno.EPERM: "denied",
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
}


def _os_errors(err: BaseException | None, seen: set[int] | None = None) -> list[OSError]:
    """Every OSError inside `err`: its cause/context chain and the per-rank failures a DCP
    CheckpointException carries (NVRx re-raises the writer's error in that form)."""
    seen = set() if seen is None else seen
    if err is None or id(err) in seen:
        return []
    seen.add(id(err))
    found = [err] if isinstance(err, OSError) else []
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(inner, BaseException):
                found += _os_errors(inner, seen)
    for inner in (err.__cause__, err.__context__):
        found += _os_errors(inner, seen)
    return found


def storage_failure(err: BaseException, ckpt_dir: Path, need_bytes: int) -> str | None:
    """One line naming why checkpoint.dir refused a save, or None when `err` is not a storage
    refusal. A save failure that carries no errno is judged by what the file system says now:
    NVRx reports a writer's ENOSPC as a RuntimeError string inside the CheckpointException (and
    to the other ranks as an empty one), and a worker that died says nothing at all."""
    kinds = [(_STORAGE_ERRNOS[e.errno], e) for e in _os_errors(err) if e.errno in _STORAGE_ERRNOS]
    kind, os_err = kinds[0] if kinds else (None, None)
    if kind is None and isinstance(err, (CheckpointWriterDied, CheckpointException)):
        kind = storage_refusal_now(ckpt_dir, need_bytes)
    return storage_refusal_message(kind, ckpt_dir, need_bytes, os_err) if kind else None
