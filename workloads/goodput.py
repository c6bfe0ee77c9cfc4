"""Where a run's wall time went: the one goodput split the summary, `report` and `bench` print. No torch.

The trainer's summary.json (via `workloads.events.summarize`), `nvrx-eks report` and `nvrx-eks
bench` all read this split, so a run's goodput is the same number wherever it is printed. It is
plain arithmetic over event fields (stdlib only) because the trainer image imports it.

The parts add up to the wall time:
    productive_s        each step's last execution (`step_end.step_s`); goodput = productive / wall
    checkpoint_stall_s  the training loop blocked by saves (`checkpoint_stall.stall_s`)
    eval_s              evaluations on the held-out split (`eval_end.eval_s`, workloads.evaluation)
    replayed_s          earlier executions of steps computed again after a restart (lost work)
    recovery_s          fault -> training ready again, once per fault (the caller measures it)
    other_s             the rest: start-up, launcher restarts no fault explains, commits, shutdown
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WallTimeSplit:
    wall_s: float
    productive_s: float
    checkpoint_stall_s: float
    eval_s: float
    replayed_s: float
    recovery_s: float
    other_s: float
    final_step: int  # highest step completed
    lost_steps: int  # step executions that were redone (one per replayed step)
    saves: int  # checkpoint stalls counted

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


def split_wall_time(
    *,
    wall_s: float,
    step_ends: Iterable[dict[str, Any]],
    stalls_s: list[float],
    recovery_s: float,
    evals_s: Iterable[float] = (),
) -> WallTimeSplit:
    """Split `wall_s` given one rank's `step_end` events in time order, its checkpoint stalls and
    evaluations, and the recovery time of the run's faults. A step executed again after a restart counts once as
    productive (its last execution) and its earlier executions as replayed."""
    last_exec: dict[int, float] = {}
    replayed_s = 0.0
    lost_steps = 0
    for e in step_ends:
        if e["step"] in last_exec:
            replayed_s += last_exec[e["step"]]
            lost_steps += 1
        last_exec[e["step"]] = e["step_s"]
    productive_s = sum(last_exec.values())
    stall_s = sum(stalls_s)
    eval_s = sum(evals_s)
    return WallTimeSplit(
        wall_s=wall_s,
        productive_s=productive_s,
        checkpoint_stall_s=stall_s,
        eval_s=eval_s,
        replayed_s=replayed_s,
        recovery_s=recovery_s,
        # Clamped: recovery windows may overlap a stall or a replayed step on a loaded machine.
        other_s=max(0.0, wall_s - productive_s - stall_s - eval_s - replayed_s - recovery_s),
        final_step=max(last_exec) if last_exec else 0,
        lost_steps=lost_steps,
        saves=len(stalls_s),
    )
