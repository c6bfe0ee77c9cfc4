"""The seven scenarios of `nvrx-eks bench` (P1-P7): trainer runs on this machine, one after another, under
the same launcher command the cluster uses (`nvrx_eks.bench.launcher`), then the analysis of
their event logs (`nvrx_eks.bench.analysis`). Settings are in `nvrx_eks.bench.settings`, fault
schedules in `nvrx_eks.bench.schedules`.

What differs between the two sides of each comparison is exactly one setting (or, for P4, the
documented set of settings that makes up each configuration); the model, data, steps, checkpoint
interval and fault schedule are the same.

P1  checkpoint backends none / sync / dcp-async / nvrx, no faults; plus the in-memory copy floor
    (nvrx_eks.bench.floor). The run order rotates with each repetition so no backend always runs
    first on a cold page cache.
P2  one run with `exception` and `hang` faults alternated, recovered in process.
P3  the same `sigkill` schedule twice, in-process restart off on both sides: once recovered by
    ft_launcher inside the job, once by a full relaunch (ft_launcher allowed no restart, so the
    job ends; it is started again at once and resumes from the newest checkpoint, which is the
    fastest a job controller could do it: no pod scheduling, no image pull, no node checks).
P4  a seeded schedule of exception/hang/sigkill over the same steps: the layered configuration
    (NVRx async checkpoints + in-process restart + ft_launcher restarts) against the baseline
    (sync checkpoints, in-process restart off, every fault ends the job and it is relaunched).
P5  checkpoint tiers: two simulated nodes, the same FSx interval and the same exception / hang /
    sigkill schedule, with the node-local tier (replicated to the other node) and without it;
    plus the copy floor, against which the local tier's stall per save is measured, and every
    restore's duration by where it came from (the node-local tier on one side, FSx on the other).
P6  hot spares: 2 active simulated nodes of one rank, the same `sigkill` of node 1 recovered by
    (a) a spare node in process (`--nodes 2 --spare-nodes 1`), (b) ft_launcher restarting every node's
    workers, (c) a full relaunch; and `node-loss` of node 1 (launcher and ranks) recovered by (a)
    and by (d) ft_launcher's own hot-spare node (`--nnodes 2:3`: it waits in the rendezvous and
    joins when the surviving node restarts its workers). Without any spare a lost node has no
    in-job recovery to compare with.
P7  the gloo release of the in-process abort: the same `exception` faults with the gloo pair
    sockets shut down on abort and without (inprocess.release_gloo_sockets), side by side.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from nvrx_eks.bench.analysis import (
    CheckpointCost,
    Restore,
    checkpoint_cost,
    fault_recoveries,
    goodput_record,
    goodput_split,
    median,
    recovery_medians,
    restores,
    summarize_backends,
)
from nvrx_eks.bench.launcher import BenchRunFailed, Launcher
from nvrx_eks.bench.schedules import seeded_schedule, spaced_schedule
from nvrx_eks.bench.settings import BACKENDS, BenchSettings
from workloads.events import load_run


def _batch(settings: BenchSettings) -> tuple[str, ...]:
    return (f"data.batch_size={settings.batch_size}",)


def recovery_schedule(kinds: list[str], settings: BenchSettings) -> tuple[str, int]:
    """The schedule of the recovery scenarios (P2, P3, P7): the first fault once a checkpoint
    exists, then one every checkpoint interval + 4 steps, ranks taken in turn."""
    return spaced_schedule(kinds, first_step=settings.interval + 3, spacing=settings.interval + 4, nproc=settings.nproc)


def run_p1(launcher: Launcher, settings: BenchSettings, floor: Callable[[], dict]) -> dict:
    k = settings.interval
    steps = (settings.p1_cycles + 1) * k + 1
    costs: list[CheckpointCost] = []
    total = settings.p1_runs * len(BACKENDS)
    for repeat in range(settings.p1_runs):
        rotated = BACKENDS[repeat % len(BACKENDS) :] + BACKENDS[: repeat % len(BACKENDS)]
        for backend in rotated:
            launcher.progress(f"P1 checkpoint efficiency: {backend} ({len(costs) + 1}/{total})")
            run_dir = launcher.completed(
                f"p1-{backend}-{repeat + 1}",
                preset=settings.preset,
                steps=steps,
                backend=backend,
                extra=_batch(settings),
            )
            costs.append(checkpoint_cost(load_run(run_dir), k, backend))
            launcher.drop_checkpoints(run_dir)
    launcher.progress("P1 checkpoint efficiency: one in-memory copy of a rank's shard")
    copy = floor()
    backends = summarize_backends(costs, copy["copy_s"])
    order = {b: i for i, b in enumerate(BACKENDS)}
    return {
        "preset": settings.preset,
        "batch_size": settings.batch_size,
        "interval": k,
        "steps": steps,
        "cycles": settings.p1_cycles,
        "runs_per_backend": settings.p1_runs,
        "floor": copy,
        "backends": [asdict(b) for b in sorted(backends, key=lambda b: order[b.backend])],
        "runs": [c.as_dict() for c in costs],
    }


def run_p2(launcher: Launcher, settings: BenchSettings) -> dict:
    kinds = ["exception", "hang"] * settings.repeats
    spec, steps = recovery_schedule(kinds, settings)
    launcher.progress(f"P2 soft faults, in-process restart: {spec}")
    run_dir = launcher.completed(
        "p2-inprocess", preset=settings.recovery_preset, steps=steps, backend="nvrx", faults=spec
    )
    launcher.drop_checkpoints(run_dir)
    recoveries = fault_recoveries(load_run(run_dir))
    for r in recoveries:
        if r.path != "inprocess":
            raise BenchRunFailed(
                f"P2: {r.fault} was not recovered in process ({r.path}); see {run_dir / 'launcher.log'}"
            )
    return {
        "preset": settings.recovery_preset,
        "schedule": spec,
        "steps": steps,
        "by_kind": {
            kind: recovery_medians([r for r in recoveries if r.kind == kind]) for kind in ("exception", "hang")
        },
        "recoveries": [r.as_dict() for r in recoveries],
    }


def run_p3(launcher: Launcher, settings: BenchSettings) -> dict:
    spec, steps = recovery_schedule(["sigkill"] * settings.repeats, settings)
    common = {"preset": settings.recovery_preset, "steps": steps, "backend": "nvrx", "faults": spec}
    no_inprocess = ("inprocess.enabled=false",)
    launcher.progress(f"P3 hard faults, ft_launcher restarts: {spec}")
    ft_dir = launcher.completed("p3-ft-launcher", extra=no_inprocess, **common)
    launcher.progress(f"P3 hard faults, full relaunch: {spec}")
    launches = launcher.relaunched_until_done(
        "p3-full-relaunch",
        max_launches=settings.repeats + 2,
        extra=(*no_inprocess, "fault_tolerance.max_restarts=0"),
        **common,
    )
    relaunch_dir = launcher.root / "p3-full-relaunch"
    sides: dict[str, dict[str, Any]] = {}
    for name, run_dir in (("ft_launcher", ft_dir), ("full_relaunch", relaunch_dir)):
        recoveries = fault_recoveries(load_run(run_dir), ("sigkill",))
        sides[name] = {"medians": recovery_medians(recoveries), "recoveries": [r.as_dict() for r in recoveries]}
        launcher.drop_checkpoints(run_dir)
    ft_first = sides["ft_launcher"]["medians"]["first_step_s"]
    relaunch_first = sides["full_relaunch"]["medians"]["first_step_s"]
    return {
        "preset": settings.recovery_preset,
        "schedule": spec,
        "steps": steps,
        "relaunches": launches - 1,
        **sides,
        "ratio": relaunch_first / ft_first if ft_first and relaunch_first else None,
    }


def run_p4(launcher: Launcher, settings: BenchSettings) -> dict:
    spec = seeded_schedule(
        settings.seed,
        steps=settings.p4_steps,
        faults=settings.p4_faults,
        interval=settings.interval,
        nproc=settings.nproc,
    )
    common = {"preset": settings.preset, "steps": settings.p4_steps, "faults": spec}
    launcher.progress(f"P4 goodput, layered (nvrx + in-process + ft_launcher): {spec}")
    layered_dir = launcher.completed("p4-layered", backend="nvrx", extra=_batch(settings), **common)
    launcher.progress(f"P4 goodput, baseline (sync + full relaunch): {spec}")
    launches = launcher.relaunched_until_done(
        "p4-baseline",
        max_launches=settings.p4_faults + 2,
        backend="sync",
        extra=(*_batch(settings), "inprocess.enabled=false", "fault_tolerance.max_restarts=0"),
        **common,
    )
    baseline_dir = launcher.root / "p4-baseline"
    layered_run, baseline_run = load_run(layered_dir), load_run(baseline_dir)
    layered = goodput_split(layered_run)
    # Which path recovered each fault: the layered side should take in-process restarts for
    # exception and hang and ft_launcher for sigkill; an escalation shows up here.
    result: dict[str, Any] = {
        "preset": settings.preset,
        "batch_size": settings.batch_size,
        "seed": settings.seed,
        "schedule": spec,
        "steps": settings.p4_steps,
        "interval": settings.interval,
        "layered": {
            **goodput_record(layered),
            "restarts": layered.restarts_by_layer(),
            "recoveries": [r.as_dict() for r in fault_recoveries(layered_run)],
        },
        "baseline": {
            **goodput_record(goodput_split(baseline_run)),
            "relaunches": launches - 1,
            "recoveries": [r.as_dict() for r in fault_recoveries(baseline_run)],
        },
    }
    for run_dir in (layered_dir, baseline_dir):
        launcher.drop_checkpoints(run_dir)
    result["goodput_ratio"] = result["layered"]["goodput"] / result["baseline"]["goodput"]
    return result


def _restore_medians(found: list[Restore]) -> dict[str, Any]:
    """Each restore, and per source ("local", "fsx") the median restore, its reading part and the
    restarted iteration's setup."""
    return {
        "restores": [r.as_dict() for r in found],
        "restore_s": {src: median([r.load_s for r in found if r.source == src]) for src in ("local", "fsx")},
        "restore_read_s": {
            src: median([r.read_s for r in found if r.source == src and r.read_s is not None])
            for src in ("local", "fsx")
        },
        "restore_setup_s": {
            src: median([r.setup_s for r in found if r.source == src and r.setup_s is not None])
            for src in ("local", "fsx")
        },
        "from_memory": sum(r.from_memory for r in found),
    }


def run_p5(launcher: Launcher, settings: BenchSettings, floor: Callable[[], dict]) -> dict:
    """The same faults with and without the node-local tier: `nproc` ranks as that many simulated
    nodes of one rank each, so every replica crosses a node."""
    nodes = settings.nproc
    fsx = settings.p5_fsx_interval
    spec, steps = spaced_schedule(
        ["exception", "hang", "sigkill"], first_step=fsx + fsx // 2, spacing=settings.p5_spacing, nproc=nodes
    )
    common = {
        "preset": settings.preset,
        "steps": steps,
        "backend": "nvrx",
        "faults": spec,
        "nodes": nodes,
        "nproc": 1,
        "checkpoint_interval": fsx,
        "extra": _batch(settings),
    }
    sides = {}
    for name, local in (("tiers", settings.interval), ("fsx_only", None)):
        launcher.progress(
            f"P5 checkpoint tiers, {name} (FSx every {fsx} steps, local "
            f"{'every ' + str(local) if local else 'off'}): {spec}"
        )
        run_dir = launcher.completed(f"p5-{name}", local_interval=local, **common)
        run = load_run(run_dir)
        recoveries = fault_recoveries(run)
        summary = json.loads((run_dir / "summary.json").read_text())
        local_stalls = [e["stall_s"] for e in run.of("local_save", rank=0)]
        sides[name] = {
            **goodput_record(goodput_split(run)),
            "medians": recovery_medians(recoveries),
            "recoveries": [r.as_dict() for r in recoveries],
            "state_sha256": summary["state_sha256"],
            "local_saves": len(local_stalls),
            # The first save allocates the staging buffers; later ones copy into them.
            "local_stall_s": median(local_stalls[1:]) if len(local_stalls) > 1 else None,
            "local_restores": {
                src: len([e for e in run.of("local_restore") if e["source"] == src]) for src in ("local", "replica")
            },
            "fsx_loads": len(run.of("checkpoint_load")),
            **_restore_medians(restores(run)),
        }
        launcher.drop_checkpoints(run_dir)
        shutil.rmtree(run_dir / "local-node0", ignore_errors=True)
        shutil.rmtree(run_dir / "local-node1", ignore_errors=True)
    launcher.progress("P5 checkpoint tiers: one in-memory copy of a rank's shard")
    copy = floor()
    stall = sides["tiers"]["local_stall_s"]
    local_restore, fsx_restore = sides["tiers"]["restore_s"]["local"], sides["fsx_only"]["restore_s"]["fsx"]
    return {
        "preset": settings.preset,
        "batch_size": settings.batch_size,
        "schedule": spec,
        "steps": steps,
        "nodes": nodes,
        "fsx_interval": fsx,
        "local_interval": settings.interval,
        **sides,
        "floor": copy,
        "local_stall_floor_ratio": stall / copy["copy_s"] if stall and copy["copy_s"] else None,
        # The same run's restores side by side, the local tier's against FSx's: the whole restore,
        # building the empty state to fill included (the same work on both sides).
        "restore_ratio": fsx_restore / local_restore if fsx_restore and local_restore else None,
        "bit_identical": sides["tiers"]["state_sha256"] == sides["fsx_only"]["state_sha256"],
    }


def run_p6(launcher: Launcher, settings: BenchSettings) -> dict:
    """The same lost rank (node 1 of 2, one rank per node) recovered by each layer."""
    step = 3 * settings.interval + 1  # a few steps after a save, as in P3
    steps = step + 2 * settings.interval + 4
    common = {"preset": settings.recovery_preset, "steps": steps, "backend": "nvrx", "nproc": 1}
    sides = {}
    runs = (
        ("spare_inprocess", "sigkill", {"nodes": 2, "spare_nodes": 1}),
        ("ft_launcher", "sigkill", {"nodes": 2}),
        ("full_relaunch", "sigkill", {"nodes": 2, "extra": ("fault_tolerance.max_restarts=0",)}),
        ("spare_node_loss", "node-loss", {"nodes": 2, "spare_nodes": 1}),
        ("ft_hot_spare_node_loss", "node-loss", {"nodes": 2, "launcher_spare_nodes": 1}),
    )
    for name, kind, options in runs:
        spec = f"{kind}@{step}:1"
        launcher.progress(f"P6 hot spares, {name}: {spec}")
        if name == "full_relaunch":
            launcher.relaunched_until_done(f"p6-{name}", max_launches=3, faults=spec, **common, **options)
            run_dir = launcher.root / f"p6-{name}"
        else:
            run_dir = launcher.completed(f"p6-{name}", faults=spec, **common, **options)
        recoveries = fault_recoveries(load_run(run_dir))
        summary = json.loads((run_dir / "summary.json").read_text())
        sides[name] = {"recovery": recoveries[0].as_dict(), "state_sha256": summary["state_sha256"]}
        launcher.drop_checkpoints(run_dir)
    first = {name: side["recovery"]["first_step_s"] for name, side in sides.items()}
    return {
        "preset": settings.recovery_preset,
        "steps": steps,
        "fault_step": step,
        **sides,
        "ratio_ft_launcher": first["ft_launcher"] / first["spare_inprocess"],
        "ratio_full_relaunch": first["full_relaunch"] / first["spare_inprocess"],
        "ratio_ft_hot_spare": first["ft_hot_spare_node_loss"] / first["spare_node_loss"],
        "bit_identical": len({side["state_sha256"] for side in sides.values()}) == 1,
    }


def run_p7(launcher: Launcher, settings: BenchSettings) -> dict:
    """In-process recovery of an exception, after detection, with and without the gloo release."""
    spec, steps = recovery_schedule(["exception"] * settings.repeats, settings)
    sides = {}
    for name, release in (("release", True), ("no_release", False)):
        launcher.progress(f"P7 gloo release {'on' if release else 'off'}: {spec}")
        run_dir = launcher.completed(
            f"p7-{name}",
            preset=settings.recovery_preset,
            steps=steps,
            backend="nvrx",
            faults=spec,
            extra=(f"inprocess.release_gloo_sockets={str(release).lower()}",),
        )
        recoveries = fault_recoveries(load_run(run_dir))
        after = [r.first_step_s - r.detect_s for r in recoveries if r.detect_s is not None]
        sides[name] = {
            "medians": recovery_medians(recoveries),
            "after_detect_s": median(after),
            "recoveries": [r.as_dict() for r in recoveries],
        }
        launcher.drop_checkpoints(run_dir)
    return {"preset": settings.recovery_preset, "schedule": spec, "steps": steps, **sides}
