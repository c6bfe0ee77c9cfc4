"""Environment the trainer processes need from NCCL and torch for NVRx's in-process restart,
stated once.

Every place a trainer process can get its environment from carries it: the rendered pod env
(nvrx_eks/jobs/render.py trainer_env, so a job run with `--image` of another build keeps it), the
image's ENV (workloads/Dockerfile, for anything started in the container by hand) and the runs
started on this machine (nvrx_eks/local/runner.py: `nvrx-eks local`, `gpu-smoke`). ft_launcher
passes its own environment on to the ranks; a test checks that the Dockerfile's ENV equals this
table. No torch import: the operator CLI renders from it.
"""

from __future__ import annotations

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
