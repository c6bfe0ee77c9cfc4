"""Environment the trainer processes need from NCCL and torch, stated once, and the NCCL versions
they can run on.

Every place a trainer process can get its environment from carries TRAINER_PROCESS_ENV: the
rendered pod env (nvrx_eks/jobs/render.py trainer_env, so a job run with `--image` of another
build keeps it) and the image's ENV (workloads/Dockerfile, for anything started in the container
by hand; a test checks that its ENV holds this table). The runs started on this machine
(nvrx_eks/local/runner.py: `nvrx-eks local`, `gpu-smoke`) pass NCCL_RESTART_ENV, and the trainer
sets the allocator's variable itself before its first CUDA allocation (workloads.device
resolve_runtime). ft_launcher passes its own environment on to the ranks. No torch import at
module level: the operator CLI renders from it.

`python -m workloads.process_env --check-nccl` (the image build runs it) fails unless the NCCL
torch loads is one NVRx's in-process restart can run on (nccl_version_problem).
"""

from __future__ import annotations

import sys

NCCL_RESTART_ENV: dict[str, str] = {
    # ft_launcher sets 1 (TearDown) unless the variable is already set: the ProcessGroupNCCL
    # watchdog would then kill the whole rank on an async NCCL error (e.g. the EFA error after a
    # peer dies), turning an in-process-recoverable fault into a launcher restart whenever the
    # error arrives before NVRx aborts. 0 and 2 keep the process (pytorch#155916); 2
    # (CleanUpOnly) also aborts the failed communicator at once, so the rank blocked in the
    # collective raises instead of waiting for NVRx's soft timeout.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    # CUDA errors seen by the watchdog are left to the training thread (and so to NVRx) instead
    # of being re-thrown in the watchdog thread, which terminates the process.
    "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0",
    # NVLink SHARP communicators cannot be aborted and re-created in process.
    "NCCL_NVLS_ENABLE": "0",
}

#: The CUDA caching allocator's settings for GPU runs: expandable segments let freed blocks of
#: different sizes be reused without fragmenting (the activations of recomputed blocks and loss
#: chunks come and go every step; workloads.memory's fragmentation allowance assumes them). In
#: the environment from process start, so no import or library that allocates before the
#: trainer's set-up can freeze the allocator's settings without them.
CUDA_ALLOC_CONF = "expandable_segments:True"
TORCH_ALLOCATOR_ENV: dict[str, str] = {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}

#: Everything above: what a trainer process's environment holds.
TRAINER_PROCESS_ENV: dict[str, str] = {**NCCL_RESTART_ENV, **TORCH_ALLOCATOR_ENV}

#: NVRx's in-process restart needs NCCL >= 2.26.2 (older releases hang or crash when
#: communicators are aborted mid-collective) and must avoid 2.28.3-2.28.8 (NVRx's in-process
#: usage guide, docs/source/inprocess/usage_guide.rst, Known issues).
NCCL_MIN_VERSION = (2, 26, 2)
NCCL_AVOIDED_VERSIONS = ((2, 28, 3), (2, 28, 8))


def nccl_version_problem(version: tuple[int, ...]) -> str | None:
    """Why NVRx's in-process restart cannot run on this NCCL version, or None."""
    shown = ".".join(map(str, version))
    if version < NCCL_MIN_VERSION:
        return f"NCCL {shown} is older than {'.'.join(map(str, NCCL_MIN_VERSION))}"
    low, high = NCCL_AVOIDED_VERSIONS
    if low <= version[:3] <= high:
        avoided = "-".join(".".join(map(str, v)) for v in NCCL_AVOIDED_VERSIONS)
        return f"NCCL {shown} is in {avoided}, which NVRx's in-process restart must avoid"
    return None


def main(argv: list[str]) -> int:
    if argv != ["--check-nccl"]:
        print("usage: python -m workloads.process_env --check-nccl", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        print(f"torch {torch.__version__} has no NCCL: the GPU image needs a CUDA build of torch", file=sys.stderr)
        return 1
    version = tuple(torch.cuda.nccl.version())
    problem = nccl_version_problem(version)
    if problem is not None:
        print(f"{problem}: use a torch build that brings another NCCL", file=sys.stderr)
        return 1
    print("NCCL", ".".join(map(str, version)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
