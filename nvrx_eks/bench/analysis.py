"""What `nvrx-eks bench` derives from a trainer run's event log. Pure functions, no processes.

Everything is computed from the JSONL events (`workloads.events`) the trainer writes anyway, so
the same numbers can be recomputed from any run directory, and the training loop carries no
benchmark-only instrumentation.

Checkpoint cost (P1). A run with a checkpoint every k steps is cut into cycles: cycle j is steps
jk+1 .. (j+1)k and ends with the save of step (j+1)k. Cycle 0 holds the first save, which pays
one-time costs (NVRx plans the save and allocates its shared-memory staging once); it is reported
on its own and the steady state is measured over cycles 1..C:

* throughput   = C*k steps / (step_start((C+1)k+1) - step_start(k+1))
* blocked      = per cycle, the cycle's wall time minus the compute time of its k steps
                 (`step_s`): everything the training loop did besides computing, i.e. the save's
                 hand-off, waiting for the previous save, and committing it when a per-step poll
                 finds it written. With no checkpointing this is the loop's own bookkeeping.
* hand-off     = the trainer's `checkpoint_stall` (the save call alone), for reference.
* step slowdown = median step_s against the run without checkpoints: background writes competing
                 for the same cores slow the steps they overlap.

Fault recovery (P2, P3). For each injected fault, from the fault's event on: when the ranks
noticed (NVRx `restart_begin`, in-process path) or new processes started (`run_start` with a pid
not seen before the fault: ft_launcher restart or a relaunch of the whole job), when every rank
was ready to train again (`setup_end`), and the first step completed after that.

Restores (P5): per restore (an in-process iteration or new processes that loaded a state), where
it came from (every rank's `local_restore`: the node-local tier; `checkpoint_load`: FSx), its
duration (`load_s` of the slowest rank: the restore is collective, the job waits for the last
rank), the part of it that reads the tier (`load_s - build_s`: without building the empty state
that is loaded into, the same work whichever tier fills it; the optimizer's state is initialized
there) and the whole setup of that iteration (`setup_end`), which also holds the process group,
the model and, for the local tier, waiting for the previous iteration's writer.

Goodput (P4) is `workloads.goodput`'s split, read through `workloads.events.summarize`: productive
step time (each step's last execution) over wall time from the first `run_start`, the same
numbers `nvrx-eks report` and the trainer's summary.json print.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from workloads.events import RunEvents, RunReport, fault_label, summarize
from workloads.goodput import WallTimeSplit


class IncompleteRun(ValueError):
    """The event log does not hold what the measurement needs (a run died or was cut short)."""


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# ----- P1: checkpoint cost --------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointCost:
    backend: str
    interval: int
    cycles: int
    steps_per_s: float
    step_s_median: float
    blocked_s: list[float]  # per steady-state save
    handoff_s: list[float]  # per steady-state save
    first_blocked_s: float | None  # the first save of the run (cycle 0)
    first_handoff_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _last_execution(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    by_step: dict[int, dict[str, Any]] = {}
    for e in events:
        by_step[e["step"]] = e
    return by_step


def checkpoint_cost(run: RunEvents, interval: int, backend: str, rank: int = 0) -> CheckpointCost:
    """Steady-state throughput and per-save blocking of a fault-free run saving every
    `interval` steps (see the module docstring for the cycle definitions)."""
    starts = _last_execution(run.of("step_start", rank=rank))
    ends = _last_execution(run.of("step_end", rank=rank))
    k = interval
    cycles = 0
    while (cycles + 2) * k + 1 in starts:
        cycles += 1
    if cycles < 1:
        raise IncompleteRun(
            f"{backend}: need at least {2 * k + 1} steps to measure one steady-state "
            f"cycle of {k} steps; the run has {len(starts)}"
        )
    missing = [
        s for s in range(1, (cycles + 1) * k + 2) if s not in starts or (s <= (cycles + 1) * k and s not in ends)
    ]
    if missing:
        raise IncompleteRun(f"{backend}: steps {missing[:5]} have no start/end event")
    blocked = []
    for j in range(1, cycles + 1):
        first, last = j * k + 1, (j + 1) * k
        wall = starts[last + 1]["t"] - starts[first]["t"]
        blocked.append(wall - sum(ends[s]["step_s"] for s in range(first, last + 1)))
    window = starts[(cycles + 1) * k + 1]["t"] - starts[k + 1]["t"]
    stalls = {e["step"]: e["stall_s"] for e in run.of("checkpoint_stall", rank=rank)}
    steady_steps = range(k + 1, (cycles + 1) * k + 1)
    return CheckpointCost(
        backend=backend,
        interval=k,
        cycles=cycles,
        steps_per_s=cycles * k / window,
        step_s_median=statistics.median(ends[s]["step_s"] for s in steady_steps),
        blocked_s=blocked,
        handoff_s=[stalls[j * k] for j in range(2, cycles + 2) if j * k in stalls],
        first_blocked_s=starts[k + 1]["t"] - ends[k]["t"],
        first_handoff_s=stalls.get(k),
    )


@dataclass(frozen=True)
class BackendSummary:
    backend: str
    runs: int
    steps_per_s: float  # median over runs
    efficiency: float  # steps_per_s / steps_per_s without checkpoints
    blocked_s: float | None  # median over all steady-state saves of all runs
    handoff_s: float | None
    first_blocked_s: float | None  # median over runs of each run's first save
    first_handoff_s: float | None
    step_slowdown: float  # median step time / median step time without checkpoints
    floor_ratio: float | None  # handoff_s (the stall) / one in-memory copy of the rank's shard


def summarize_backends(costs: list[CheckpointCost], copy_s: float | None) -> list[BackendSummary]:
    """Per backend, medians over runs and saves, relative to the `none` backend's runs."""
    by_backend: dict[str, list[CheckpointCost]] = {}
    for cost in costs:
        by_backend.setdefault(cost.backend, []).append(cost)
    if "none" not in by_backend:
        raise IncompleteRun("the comparison needs the runs without checkpoints (backend none)")
    base_rate = statistics.median(c.steps_per_s for c in by_backend["none"])
    base_step = statistics.median(c.step_s_median for c in by_backend["none"])
    out = []
    for backend, runs in by_backend.items():
        blocked = median([s for c in runs for s in c.blocked_s])
        handoff = median([s for c in runs for s in c.handoff_s])
        rate = statistics.median(c.steps_per_s for c in runs)
        out.append(
            BackendSummary(
                backend=backend,
                runs=len(runs),
                steps_per_s=rate,
                efficiency=rate / base_rate,
                blocked_s=blocked,
                handoff_s=handoff,
                first_blocked_s=median([c.first_blocked_s for c in runs if c.first_blocked_s is not None]),
                first_handoff_s=median([c.first_handoff_s for c in runs if c.first_handoff_s is not None]),
                step_slowdown=statistics.median(c.step_s_median for c in runs) / base_step,
                floor_ratio=handoff / copy_s if handoff is not None and copy_s else None,
            )
        )
    return out


# ----- P2, P3: recovery from one fault -------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    fault: str  # KIND@STEP:RANK
    kind: str
    path: str  # "inprocess" (same processes) | "new processes" (launcher restart or relaunch)
    detect_s: float | None  # in-process: fault -> first rank's restart_begin (detected, aborted)
    respawn_s: float | None  # new processes: fault -> last rank's run_start (stop, spawn, import)
    restart_s: float  # fault -> every rank ready to train (setup_end: rebuilt, checkpoint loaded)
    first_step_s: float  # fault -> first step completed after the restart
    resumed_from_step: int
    lost_steps: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fault_recoveries(run: RunEvents, kinds: tuple[str, ...] | None = None) -> list[Recovery]:
    """One Recovery per injected fault (of `kinds`) that interrupted training, oldest first."""
    faults = [f for f in run.of("fault_injected") if kinds is None or f["kind"] in kinds]
    all_faults = run.of("fault_injected")
    out = []
    for fault in faults:
        later = [f["t"] for f in all_faults if f["t"] > fault["t"]]
        horizon = min(later) if later else float("inf")
        out.append(_recovery(run, fault, horizon))
    return out


def _recovery(run: RunEvents, fault: dict[str, Any], horizon: float) -> Recovery:
    t0 = fault["t"]
    label = fault_label(fault)
    window = [e for e in run.events if t0 <= e["t"] < horizon]
    pids_before = {e["pid"] for e in run.events if e["t"] <= t0}
    # The ranks training when the fault hit (with hot spares not every rank is) must all be ready
    # again, except one lost for good (no event after the fault) whose place a spare took.
    active = {
        e["rank"] for e in run.events if e["t"] < t0 and e["event"] == "step_end" and e["step"] == fault["step"] - 1
    }
    after = {e["rank"] for e in window if e["event"] != "fault_injected"}
    ready_after = {e["rank"] for e in window if e["event"] == "setup_end"}
    gone, spares_in = active - after, ready_after - active
    ranks = sorted((active - gone) | spares_in) if active and len(gone) <= len(spares_in) else run.ranks
    begins = [e for e in window if e["event"] == "restart_begin"]
    fresh_starts: dict[int, dict[str, Any]] = {}
    for e in window:
        if e["event"] == "run_start" and e["pid"] not in pids_before:
            fresh_starts.setdefault(e["rank"], e)
    ready: dict[int, dict[str, Any]] = {}
    for e in window:
        if e["event"] == "setup_end" and e["rank"] not in ready:
            ready[e["rank"]] = e
    if set(ready) != set(ranks):
        raise IncompleteRun(f"{label}: not every rank was ready to train again after the fault")
    restart_t = max(e["t"] for e in ready.values())
    steps_after = [e for e in window if e["event"] == "step_end" and e["rank"] == 0 and e["t"] > restart_t]
    if not steps_after:
        raise IncompleteRun(f"{label}: no step completed after the restart")
    resumed = ready[0]["resumed_from_step"]
    if fresh_starts:
        path, detect_s = "new processes", None
        respawn_s = max(e["t"] for e in fresh_starts.values()) - t0
    else:
        path, respawn_s = "inprocess", None
        detect_s = min(e["t"] for e in begins) - t0 if begins else None
    return Recovery(
        fault=label,
        kind=fault["kind"],
        path=path,
        detect_s=detect_s,
        respawn_s=respawn_s,
        restart_s=restart_t - t0,
        first_step_s=steps_after[0]["t"] - t0,
        resumed_from_step=resumed,
        lost_steps=max(0, fault["step"] - 1 - resumed),
    )


def recovery_medians(recoveries: list[Recovery]) -> dict[str, Any]:
    def med(name: str) -> float | None:
        return median([getattr(r, name) for r in recoveries if getattr(r, name) is not None])

    return {
        "n": len(recoveries),
        "detect_s": med("detect_s"),
        "respawn_s": med("respawn_s"),
        "restart_s": med("restart_s"),
        "first_step_s": med("first_step_s"),
        "lost_steps": med("lost_steps"),
    }


# ----- P4: goodput ----------------------------------------------------------------------------


def goodput_split(run: RunEvents, rank: int = 0) -> RunReport:
    """The run's goodput split as `rank` saw it: `workloads.events.summarize`, the one split
    `nvrx-eks report` and the trainer's summary.json read too. A run without a step has none."""
    split = summarize(run, rank)
    if split.final_step == 0:
        raise IncompleteRun("the run completed no step")
    return split


def goodput_record(split: WallTimeSplit) -> dict[str, Any]:
    """P4's (and P5's) record of a run in bench.json: the split with recovery and the rest in one
    part (`other_s`), as P4's table, chart and stored results have always shown it."""
    return {
        "goodput": split.goodput,
        "wall_s": split.wall_s,
        "productive_s": split.productive_s,
        "checkpoint_stall_s": split.checkpoint_stall_s,  # the trainer's hand-off stalls
        "replayed_s": split.replayed_s,  # steps computed again after a restart
        # detection, restarts and relaunches, start-up, commits, shutdown
        "other_s": split.recovery_s + split.other_s,
        "final_step": split.final_step,
        "lost_steps": split.lost_steps,
        "saves": split.saves,
    }


# ----- P5: restores ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Restore:
    source: str  # "local" (the node-local tier: host memory, own file or a replica) or "fsx"
    step: int
    load_s: float  # the slowest rank's
    read_s: float | None  # the slowest rank's load_s - build_s (None: an event without build_s)
    from_memory: bool  # every rank from its host copy (the local tier only)
    setup_s: float | None  # the iteration's setup, slowest rank

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def restores(run: RunEvents) -> list[Restore]:
    """Every restore of the run, in order: one per (cycle, iteration) that loaded a state."""
    loads: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in run.of("local_restore", "checkpoint_load"):
        loads.setdefault((event["cycle"], event["iteration"]), []).append(event)
    setups: dict[tuple[int, int], list[float]] = {}
    for event in run.of("setup_end"):
        setups.setdefault((event["cycle"], event["iteration"]), []).append(event["setup_s"])
    found = []
    for key, events in sorted(loads.items()):
        local = all(e["event"] == "local_restore" for e in events)
        found.append(
            Restore(
                source="local" if local else "fsx",
                step=events[0]["step"],
                load_s=max(e["load_s"] for e in events),
                read_s=max(e["load_s"] - e["build_s"] for e in events) if all("build_s" in e for e in events) else None,
                from_memory=local and all(e.get("from_memory", False) for e in events),
                setup_s=max(setups[key]) if key in setups else None,
            )
        )
    return found
