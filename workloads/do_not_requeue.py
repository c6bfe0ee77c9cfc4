"""The do-not-requeue record: a rank's decision that no restart can fix this job attempt, kept where
every node of the attempt can read it. No torch.

Why a file: ft_launcher 0.7.0 restarts ranks whatever code they exit with; its
`--ft-no-restart-exit-code` is only its own exit code when NVRx itself decides to stop. So a rank
that exits 93 (nvrx_eks.facts.exit_codes) also asks its launcher to shut the workload down
(workloads.ft_integration), which closes the rendezvous for every node. That node's launcher then
exits 1 (RendezvousClosedError), the launchers of the other nodes exit 0 ("rendezvous gracefully
exited", as a standby node does). The record tells every wrapper of a launcher (the container
entrypoint, `nvrx-eks local`) that either code means "do not requeue": it exits 93 instead and
prints the reason.

    <run_dir>/do-not-requeue/<attempt id>.json   {"reason", "rank", "time"}

The run directory is on the shared file system in the pods, so the pod whose rank did not fail
finds the same record. When the run directory refuses the record (the decision may be exactly
that: checkpoint.dir read-only or full), it goes to a directory of the rank's own node instead,
named by FALLBACK_DIR_ENV (in the pods POD_FALLBACK_DIR, on the pod's memory emptyDir; for
`nvrx-eks local`, a temporary directory of the command), which the wrapper reads too. Only that
node's wrapper then exits 93, the others as their launchers did (0 after the closed rendezvous):
one pod's 93 is what the failure policies need to fail the job instead of restarting it.

The attempt id names one attempt of the job, so that a record left by an earlier attempt (a
JobSet restart after a transient failure, a resubmission) is never read as this one's: it is the
ATTEMPT_ID_ENV variable the pod or the runner sets (JobSet pods: `<jobset uid>-<restart
attempt>` from the downward API; PyTorchJob pods: the job name, the training operator recreating
single pods, never the whole job, within one attempt; `nvrx-eks local`: a fresh id per run). A
reader may also ignore records older than its own start (`since`).

First writer wins (a hard link of a complete temporary file: atomic and exclusive), so the
reason recorded is the first rank's.

CLI, for the container entrypoint after ft_launcher ended:
    python -m workloads.do_not_requeue --run-dir DIR [--since EPOCH_S]
prints the reason in one line and exits 0 when this attempt has a record, else exits 1 silently.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

#: Set for every rank by the pod (downward API) or by `nvrx-eks local`.
ATTEMPT_ID_ENV = "NVRX_EKS_ATTEMPT_ID"
#: A directory of the rank's own node that its wrapper also reads, for a record the run directory
#: refuses. Set by the pod (POD_FALLBACK_DIR) and by `nvrx-eks local`; unset, there is none.
FALLBACK_DIR_ENV = "NVRX_EKS_RECORD_FALLBACK_DIR"
#: The pods' fallback: on /dev/shm, the trainer container's memory emptyDir, which every process
#: of the pod (the entrypoint, ft_launcher, the ranks) shares and which no other pod sees.
POD_FALLBACK_DIR = "/dev/shm/nvrx-eks-do-not-requeue"
RECORD_DIR = "do-not-requeue"


def attempt_id() -> str | None:
    return os.environ.get(ATTEMPT_ID_ENV) or None


def fallback_dir() -> Path | None:
    value = os.environ.get(FALLBACK_DIR_ENV)
    return Path(value) if value else None


def record_path(run_dir: str | Path, attempt: str) -> Path:
    # The id becomes a file name: keep it to one path component.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in attempt).lstrip(".")
    return Path(run_dir) / RECORD_DIR / f"{safe or '_'}.json"


def _record_paths(run_dir: str | Path, attempt: str, fallback: Path | None) -> list[Path]:
    """Where this attempt's record may be: the run dir's, then the fallback's."""
    return [record_path(run_dir, attempt)] + ([fallback / record_path(".", attempt).name] if fallback else [])


def write_record(
    run_dir: str | Path, attempt: str, *, reason: str, rank: int, fallback: Path | None = None
) -> Path | None:
    """Record the decision unless a record of this attempt exists. Returns the path written, or
    None when another rank was first. Where the run dir refuses it, in `fallback` (default:
    fallback_dir()); OSError when both refuse it (or there is no fallback) is the caller's."""
    fallback = fallback or fallback_dir()
    first, *other = _record_paths(run_dir, attempt, fallback)
    try:
        return _write_first(first, reason, rank)
    except OSError:
        if not other:
            raise
        return _write_first(other[0], reason, rank)


def _write_first(path: Path, reason: str, rank: int) -> Path | None:
    """Write `path` unless it exists (first writer wins): the path, or None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"reason": reason, "rank": rank, "time": time.time()}))
    try:
        os.link(tmp, path)
    except FileExistsError:
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_record(
    run_dir: str | Path, attempt: str, since: float | None = None, fallback: Path | None = None
) -> dict | None:
    """This attempt's record from the run dir, else from `fallback` (default: fallback_dir()), or
    None (absent, unreadable, or older than `since`)."""
    for path in _record_paths(run_dir, attempt, fallback or fallback_dir()):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("reason"), str):
            continue
        try:
            if since is not None and float(record.get("time", 0)) < since:
                continue
        except (TypeError, ValueError):
            continue  # not a time: not a record this module wrote
        return record
    return None


def describe(record: dict) -> str:
    """The one line a wrapper prints: the reason with any line breaks folded."""
    reason = " ".join(record["reason"].split())
    return f"do not requeue (rank {record.get('rank', '?')}): {reason}"


def check_argv(run_dir: str, python: str = "python") -> list[str]:
    """The check the container entrypoint runs after ft_launcher ended (see main)."""
    return [python, "-m", "workloads.do_not_requeue", "--run-dir", run_dir]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.do_not_requeue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run-dir", required=True)
    parser.add_argument(
        "--since", type=float, default=None, help="ignore records written before this time (seconds since the epoch)"
    )
    args = parser.parse_args(argv)
    attempt = attempt_id()
    record = read_record(args.run_dir, attempt, args.since) if attempt else None
    if record is None:
        return 1
    print(f"nvrx-eks: {describe(record)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
