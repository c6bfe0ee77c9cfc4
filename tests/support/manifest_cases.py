"""Shared inputs of the manifest tests: the golden matrix and how a case is rendered.

Golden files live in tests/golden/, one per case, named <profile>-<api or fabric>-<nodes>n.yaml.
Regenerate them after an intended change with:

    NVRX_EKS_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/contract/jobs/test_manifests_render.py

and review the diff like code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from infra.config import resolve_config
from nvrx_eks.jobs.render import RenderedJob, render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.jobs.validate import Expectations
from tests.support import REPO_ROOT

GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
UPDATE_GOLDEN = os.environ.get("NVRX_EKS_UPDATE_GOLDEN") == "1"
#: A pullable-looking, pinned image so the golden manifests are what `submit` would send.
GOLDEN_IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks-trainer:golden"
GOLDEN_NCCL_IMAGE = "public.ecr.aws/hpc-cloud/nccl-tests@sha256:" + "0" * 64


@dataclass(frozen=True)
class Case:
    profile: str
    api: str  # "jobset", "pytorchjob" or "fabric"
    nodes: int

    @property
    def id(self) -> str:
        return f"{self.profile}-{self.api}-{self.nodes}n"

    @property
    def golden_path(self) -> Path:
        return GOLDEN_DIR / f"{self.id}.yaml"

    def render(self) -> RenderedJob:
        config = resolve_config(self.profile)
        if self.api == "fabric":
            spec = build_jobspec(
                config, nodes=self.nodes, name="nccl-test", workload="nccl-test", image=GOLDEN_NCCL_IMAGE
            )
        else:
            spec = build_jobspec(config, nodes=self.nodes, name="train", api=self.api, image=GOLDEN_IMAGE)
        return render_job(spec)

    def expectations(self) -> Expectations:
        config = resolve_config(self.profile)
        return Expectations(config.kubernetes_version, "training", "fsx-lustre", config.gpu_nodes.instance_type)


GOLDEN_CASES = [
    Case(profile, api, nodes)
    for profile in ("p5", "g5-smoke")
    for api in ("jobset", "pytorchjob")
    for nodes in (1, 2, 4, 16)
] + [Case("p5", "fabric", 2), Case("g5-smoke", "fabric", 2)]
