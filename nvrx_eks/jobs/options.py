"""JobOptions: the flags that describe a job, shared by render, validate and submit (cheap to
import: the CLI declares its flags from it before any command runs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: What a job runs: the trainer, or the NCCL/EFA fabric test.
Workload = Literal["train", "nccl-test"]


@dataclass
class JobOptions:
    """The flags shared by render, validate and submit."""

    nodes: int | None = None
    api: str = "jobset"
    fabric_test: bool = False
    name: str | None = None
    image: str | None = None
    train_config: str | None = None
    overrides: list[str] = field(default_factory=list)
    faults: str | None = None
    max_restarts: int = 3
    max_step_time_s: float | None = None
    spare_nodes: int = 0

    @property
    def workload(self) -> Workload:
        return "nccl-test" if self.fabric_test else "train"
