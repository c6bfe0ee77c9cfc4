"""What of the shared FSx claim a job's pods may write.

Every job in the namespace mounts the same claim. A pod that can write all of it can plant a
checkpoint or a data file that another job later reads, so a compromised or buggy job would reach
every job that resumes after it. Each pod therefore mounts the claim read-only at FSX_MOUNT_PATH
(its training data and other runs stay readable) and, on top of it, only its own directories
writable, each through a subPath of the same claim: a training job its run directory (and a
checkpoint directory set apart from it), the fabric test its key-exchange directory. All of them lie
in the job's own directory, runs/<job name> (spec.own_run_dir): the admission policy admits no other
writable mount of the claim (infra/pod_security.py).

Mounts are listed parent first: the container runtime applies them in order, so the writable
directories land on top of the read-only root. The kubelet creates a missing subPath directory on
the claim before the container starts, so the mount point exists inside the read-only root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from nvrx_eks.facts.names import FSX_MOUNT_PATH
from nvrx_eks.jobs.spec import JobSpec


@dataclass(frozen=True)
class ClaimMount:
    mount_path: str
    sub_path: str | None  # None: the claim's root
    read_only: bool


def claim_mounts(spec: JobSpec, exchange_dir: str) -> list[ClaimMount]:
    """The read-only root, then each directory the job writes (one mount for nested ones). Each
    lies in the job's own directory: build_jobspec refuses a run_dir or checkpoint.dir elsewhere."""
    if spec.workload == "nccl-test":
        writable = [exchange_dir]
    else:
        writable = [spec.train.run_dir, *([spec.train.checkpoint.dir] if spec.train.checkpoint.dir else [])]
    root = PurePosixPath(FSX_MOUNT_PATH)
    own = sorted({PurePosixPath(path) for path in writable})
    mounts = [ClaimMount(FSX_MOUNT_PATH, None, read_only=True)]
    for path in own:
        if any(path != other and path.is_relative_to(other) for other in own):
            continue  # inside a directory already mounted writable
        mounts.append(ClaimMount(str(path), str(path.relative_to(root)), read_only=False))
    return mounts
