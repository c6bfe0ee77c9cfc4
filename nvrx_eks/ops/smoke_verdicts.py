"""The GPU smoke's verdicts on what its runs recorded (nvrx_eks.ops.gpu_smoke): functions of the
runs' events and workloads.memory's estimate, held by tests to recorded runs (tests/unit/ops/recorded/).

Faults: the smoke injects only faults the in-process layer is meant to recover (an exception and a
hang, workloads/faults.py). A run passes only if each was recovered in process, in the same
processes, with no launcher restart and no in-process restart left unfinished: an in-process
restart that escalates to ft_launcher still ends in a completed run, and that escalation is what
the smoke is there to catch.

Memory: the allocator's measured high-water mark against the part of the estimate it counts, within
MEMORY_TOLERANCE (see MEMORY_COMPARED for what is and is not in either side).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from workloads.events import LAYER_NAMES, RunEvents, summarize
from workloads.memory import GIB, MemoryEstimate

#: The layer meant to recover each fault the smoke injects.
SMOKE_FAULTS_LAYER = "inprocess"

#: The measured peak may exceed the estimate of what the allocator holds by this factor, on top of
#: the estimate's fixed reserved line (cuBLAS workspaces, one segment per FSDP2 stream): rounding of
#: blocks to the allocator's sizes, fragmentation beyond the estimate's 5%, and the small tensors
#: the model leaves out (RNG states, loss scalars, DTensor bookkeeping). An assumption until the
#: first GPU run calibrates it (workloads.memory FRAGMENTATION and AUTO_FILL_SHARE with it).
MEMORY_TOLERANCE = 1.10

#: What the memory check compares, in its report.
MEMORY_COMPARED = (
    "max over ranks of torch.cuda.max_memory_reserved at run_end, in an iteration no in-process restart "
    "preceded where one ran (the resume launch), <= "
    f"{MEMORY_TOLERANCE:g} x (the estimate's GPU subtotal + fragmentation) + its fixed reserved line "
    "(cuBLAS workspaces, per-stream segments). Left out on both sides: the CUDA context and NCCL's own "
    "buffers (outside torch's allocator). A peak measured after restarts also holds what the failed "
    "iterations left cached: shown as peak_after_restarts_gib, not judged"
)


def faults_check(run: RunEvents, faults: str, exit_code: int) -> dict[str, Any]:
    """The faults phase's verdict: each fault of the spec `faults` (the plan's, KIND@STEP:RANK,...)
    injected and recovered by SMOKE_FAULTS_LAYER, as rank 0 saw it (every rank restarts with it);
    no launcher (or Kubernetes) restart; as many in-process restarts as faults; every
    restart_begin followed by a restart_end in its process; the launch exiting 0. `problems` says
    what failed, one line each."""
    report = summarize(run, rank=0)
    by_layer = report.restarts_by_layer()
    outcomes = {o["fault"]: o for o in reversed(report.fault_outcomes())}  # the first of each fault
    expected = [f.strip() for f in faults.split(",") if f.strip()]
    inprocess = [r for r in report.restarts if r.layer == "inprocess"]
    same_pids = all(r.pids[0] == r.pids[1] for r in inprocess)
    unended = unended_restarts(run, rank=0)
    problems = []
    if exit_code != 0:
        problems.append(f"the launch exited {exit_code}")
    for fault in expected:
        outcome = outcomes.get(fault)
        if outcome is None:
            problems.append(f"{fault} was never injected")
        elif outcome.get("layer") is None:
            problems.append(f"{fault}: no restart followed it")
        elif outcome["layer"] != SMOKE_FAULTS_LAYER:
            problems.append(
                f"{fault} was recovered by {LAYER_NAMES.get(outcome['layer'], outcome['layer'])}, "
                f"not {LAYER_NAMES[SMOKE_FAULTS_LAYER]}"
            )
    for layer, count in by_layer.items():
        if layer != SMOKE_FAULTS_LAYER and count:
            problems.append(f"{count} {LAYER_NAMES.get(layer, layer)} restart(s)")
    if len(inprocess) != len(expected):
        problems.append(f"{len(inprocess)} in-process restart(s) for {len(expected)} fault(s)")
    if unended:
        problems.append(f"{unended} in-process restart(s) began and never resumed training (no restart_end)")
    if not same_pids:
        problems.append("an in-process restart changed the process")
    return {
        "ok": not problems,
        "exit_code": exit_code,
        "problems": problems,
        "fault_outcomes": [
            {
                "fault": fault,
                "layer": outcomes.get(fault, {}).get("layer"),
                "recovered_s": _rounded(outcomes.get(fault, {}).get("recovered_s")),
            }
            for fault in expected
        ],
        "restarts_by_layer": by_layer,
        "restart_begins": len(run.of("restart_begin", rank=0)),
        "unended_restarts": unended,
        "inprocess_restarts": len(inprocess),
        "recovered_s": [round(r.latency_s, 2) for r in inprocess],
        "same_pids": same_pids,
    }


def unended_restarts(run: RunEvents, rank: int = 0) -> int:
    """In-process restarts of `rank` that began (restart_begin) and never resumed training: a
    restart_end in the process closes the last begin before it; the begins before that one are
    iterations that failed again before training, and a begin nothing closes is a process that
    gave up and left the fault to the next layer."""
    unended = 0
    open_begins: Counter[int] = Counter()
    for event in run.of("restart_begin", "restart_end", rank=rank):
        pid = event["pid"]
        if event["event"] == "restart_begin":
            open_begins[pid] += 1
        elif event.get("layer") == "inprocess" and open_begins[pid]:
            unended += open_begins[pid] - 1
            open_begins[pid] = 0
    return unended + sum(open_begins.values())


def memory_check(
    estimate: MemoryEstimate, run_ends: list[dict[str, Any]], gpu: bool, setup_ends: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """The memory phase's verdict from the completed runs' run_end events (every rank's): the peak
    of the ranks' restart-free iterations (iteration 0, where the resume launch gave one), else
    the peak after restarts, against MEMORY_TOLERANCE x the allocator's share of `estimate` plus
    its fixed reserved line. On CPU there is nothing to measure: the check is the estimate's
    presence, and no figure stands in for a measurement. `setup_ends`: the faulted run's, whose
    reserved bytes as an in-process restart's iteration starts show what the failed iteration left
    cached (reported, not judged)."""
    measured_ends = [e for e in run_ends if e.get("gpu_peak_reserved_bytes") is not None]
    clean = [e for e in measured_ends if e["iteration"] == 0]
    judged = clean or measured_ends
    measured = max((e["gpu_peak_reserved_bytes"] for e in judged), default=None)
    after_restarts = max((e["gpu_peak_reserved_bytes"] for e in measured_ends if e["iteration"] > 0), default=None)
    retries = [e["gpu_alloc_retries"] for e in measured_ends if e.get("gpu_alloc_retries") is not None]
    at_restart = [
        e["gpu_reserved_bytes"] for e in setup_ends if e.get("iteration", 0) > 0 and e.get("gpu_reserved_bytes")
    ]
    scaled = estimate.allocator_reserved - estimate.fixed_reserved
    bound = MEMORY_TOLERANCE * scaled + estimate.fixed_reserved
    return {
        "compared": MEMORY_COMPARED,
        "peak_reserved_gib": _gib(measured),
        "measured_in": None if measured is None else ("restart-free iteration" if clean else "after restarts"),
        "peak_after_restarts_gib": _gib(after_restarts),
        "iterations": sorted({e["iteration"] for e in judged}),
        "alloc_retries": max(retries, default=None),
        "reserved_at_restart_gib": _gib(max(at_restart, default=None)),
        "estimate_allocated_gib": _gib(estimate.allocator_reserved),
        "bound_gib": _gib(int(bound)),
        "tolerance": MEMORY_TOLERANCE,
        "ratio": None if measured is None else round(measured / estimate.allocator_reserved, 3),
        "estimate_gib": _gib(estimate.total),
        "estimate_components_gib": {name: round(b / GIB, 3) for name, b in estimate.components()},
        "ok": measured is None if not gpu else measured is not None and measured <= bound,
    }


def _gib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / GIB, 2)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)
