"""What `nvrx-eks bench` runs: the scenario names, the checkpoint backends P1 compares, and the
quick and full settings (model, repetitions, steps, fault counts) with their input checks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nvrx_eks.facts.errors import ConfigError

BACKENDS = ("none", "sync", "dcp-async", "nvrx")
SCENARIOS = ("p1", "p2", "p3", "p4", "p5", "p6", "p7")


@dataclass(frozen=True)
class BenchSettings:
    # P1 and P4: a model whose checkpoint costs what a real one does relative to its step. On 2
    # CPU cores the 34M "small" preset takes ~1 s per step at batch 1 (FSDP traffic and compute)
    # and writes ~200 MB per rank per checkpoint.
    preset: str = "small"
    # P2 and P3 time the recovery machinery; their model only adds its rebuild and reload.
    recovery_preset: str = "small"
    batch_size: int = 1
    nproc: int = 2
    interval: int = 2  # checkpoint every k steps (P1, P4; P2 and P3 checkpoint as often)
    p1_cycles: int = 6  # steady-state save cycles per P1 run (after the first save)
    p1_runs: int = 3  # P1 runs per backend
    repeats: int = 3  # P2: faults per kind; P3: faults per recovery path
    p4_steps: int = 40
    p4_faults: int = 4
    seed: int = 7
    # P5: FSx every p5_fsx_interval steps on both sides, the local tier every `interval` steps on
    # one; faults spaced so that each lands a few steps after an FSx save or well past it.
    p5_fsx_interval: int = 10
    p5_spacing: int = 7
    dist_backend: str = "auto"
    overrides: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.dist_backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"--dist-backend: {self.dist_backend!r} is not a backend; use auto, gloo or nccl")
        if self.nproc < 1:
            raise ConfigError("--nproc: must be at least 1")
        if self.interval < 1:
            raise ConfigError("--interval: must be at least 1 step")
        if self.repeats < 1 or self.p1_runs < 1:
            raise ConfigError("--repeats: must be at least 1")
        if self.p4_faults < 1:
            raise ConfigError("--p4-faults: must be at least 1")
        spacing = self.interval + 2
        if self.p4_steps < (self.p4_faults + 1) * spacing + self.interval:
            raise ConfigError(
                f"--p4-steps: {self.p4_steps} steps cannot hold {self.p4_faults} "
                f"faults {spacing} steps apart after the first checkpoint; use at "
                f"least {(self.p4_faults + 1) * spacing + self.interval} steps or "
                "fewer faults"
            )


# Each trainer launch pays ~12 s here (launcher and rank start-up, setup, shutdown): --quick
# keeps the launches few and takes its repetitions inside runs (P1: saves per run).
QUICK = BenchSettings(recovery_preset="tiny", p1_cycles=4, p1_runs=1, repeats=2, p4_steps=18, p4_faults=3)
FULL = BenchSettings()


def settings_for(quick: bool, **changes: Any) -> BenchSettings:
    """The quick or full settings with the given changes (None = keep); `repeats` sets every
    repetition count."""
    base = QUICK if quick else FULL
    changes = {k: v for k, v in changes.items() if v is not None}
    if "repeats" in changes:
        changes["p1_runs"] = changes["repeats"]
    settings = replace(base, **changes)
    settings.validate()
    return settings
