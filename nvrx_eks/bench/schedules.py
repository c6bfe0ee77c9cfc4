"""The fault schedules of `nvrx-eks bench`: evenly spaced (P2, P3, P5-P7) and seeded (P4)."""

from __future__ import annotations

import random

from nvrx_eks.facts.errors import ConfigError


def spaced_schedule(kinds: list[str], *, first_step: int, spacing: int, nproc: int) -> tuple[str, int]:
    """Faults `spacing` steps apart from `first_step`, ranks taken in turn. Returns the spec and
    a step count that leaves `spacing` clean steps after the last fault."""
    items = [f"{kind}@{first_step + i * spacing}:{i % nproc}" for i, kind in enumerate(kinds)]
    return ",".join(items), first_step + len(kinds) * spacing


def seeded_schedule(seed: int, *, steps: int, faults: int, interval: int, nproc: int) -> str:
    """`faults` faults drawn from exception, hang and sigkill (each kind as evenly as the count
    allows, in a seeded order) at seeded steps at least interval+2 apart, none before a
    checkpoint exists and none in the last interval. The same seed gives the same schedule."""
    rng = random.Random(seed)
    kinds = [("exception", "hang", "sigkill")[i % 3] for i in range(faults)]
    rng.shuffle(kinds)
    spacing = interval + 2
    low, high = interval + 2, steps - interval
    slack = (high - low) - (faults - 1) * spacing
    if slack < 0:
        raise ConfigError(
            f"--p4-steps: {steps} steps cannot hold {faults} faults {spacing} steps "
            "apart; raise --p4-steps or lower --p4-faults"
        )
    # Spread `slack` extra steps over the gaps at random: faults keep their minimum spacing.
    cuts = sorted(rng.randint(0, slack) for _ in range(faults))
    fault_steps = [low + cut + i * spacing for i, cut in enumerate(cuts)]
    return ",".join(f"{kind}@{step}:{rng.randrange(nproc)}" for kind, step in zip(kinds, fault_steps, strict=True))
