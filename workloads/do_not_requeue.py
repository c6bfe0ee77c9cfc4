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
finds the same record. The attempt id names one attempt of the job, so that a record left by an
earlier attempt (a JobSet restart after a transient failure, a resubmission) is never read as this
one's: it is the ATTEMPT_ID_ENV variable the pod or the runner sets (JobSet pods:
`<jobset uid>-<restart attempt>` from the downward API; PyTorchJob pods: the job name, the
training operator recreating single pods, never the whole job, within one attempt; `nvrx-eks
local`: a fresh id per run). A reader may also ignore records older than its own start (`since`).

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
RECORD_DIR = "do-not-requeue"


def attempt_id() -> str | None:
    return os.environ.get(ATTEMPT_ID_ENV) or None


def record_path(run_dir: str | Path, attempt: str) -> Path:
    # The id becomes a file name: keep it to one path component.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in attempt).lstrip(".")
    return Path(run_dir) / RECORD_DIR / f"{safe or '_'}.json"


def write_record(run_dir: str | Path, attempt: str, *, reason: str, rank: int) -> Path | None:
    """Record the decision unless a record of this attempt exists. Returns the path written, or
    None when another rank was first. OSError (the run dir itself unwritable) is the caller's."""
    path = record_path(run_dir, attempt)
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


def read_record(run_dir: str | Path, attempt: str, since: float | None = None) -> dict | None:
    """This attempt's record, or None (absent, unreadable, or older than `since`)."""
    try:
        record = json.loads(record_path(run_dir, attempt).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("reason"), str):
        return None
    if since is not None and float(record.get("time", 0)) < since:
        return None
    return record


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
