"""What the trainer image holds of the project: the checkout's paths its Dockerfile copies.

Stated once, here. The CDK asset stages its build context from this list
(infra/constructs/image.py) and the CPU twin digests the same files (nvrx_eks/rehearse/image.py).
The Dockerfile's COPY lines and .dockerignore restate it because Docker reads them and cannot
import this; tests/contract/trainer/test_image_gates.py holds both to it, and
tests/contract/packaging/test_dependencies.py holds what the image copies to importing nothing else of
ours and no third-party package the `trainer` extra does not install.
"""

from __future__ import annotations

#: The Dockerfile, relative to the build context (the checkout's root).
DOCKERFILE = "workloads/Dockerfile"

#: What the build reads before any code: the `trainer` extra's pinned requirements.
BUILD_INPUTS = ("pyproject.toml", "scripts/trainer_requirements.py")

#: The project's code in the image (at /opt/nvrx-eks, its PYTHONPATH): the trainer and the ground
#: floor of facts it reads, and the GPU smoke (`python -m nvrx_eks.ops.gpu_smoke` on a node) with
#: the modules it imports and the local runner it drives.
CODE = (
    "nvrx_eks/__init__.py",
    "nvrx_eks/facts",
    "nvrx_eks/local",
    "nvrx_eks/ops/__init__.py",
    "nvrx_eks/ops/gpu_smoke.py",
    "nvrx_eks/ops/gpu_env.py",
    "nvrx_eks/ops/smoke_verdicts.py",
    "nvrx_eks/ops/smoke_report.py",
    "workloads",
)

#: Never sent: bytecode a checkout's own runs leave beside the sources.
BYTECODE = ("**/__pycache__", "**/*.pyc")


def context_patterns() -> tuple[str, ...]:
    """The build context as .dockerignore patterns, in Docker's order (the last pattern that
    matches a path decides): everything out, the image's paths back in, then bytecode out again."""
    return ("*", *(f"!{path}" for path in BUILD_INPUTS + CODE), *BYTECODE)
