"""What `nvrx-eks local` prints when a run ends: its outcome read from the run's own events (final
step, restarts, each fault and its recovery, checkpoints, goodput, leftover processes)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvrx_eks.local.report import format_restarts
from workloads.events import RunEvents, load_run, summarize


def stop_reason(run: RunEvents, since: float) -> str | None:
    """Why a rank of this run ended it on an error no restart can fix (the newest such event)."""
    stops = [e for e in run.of("unrecoverable") if e["t"] >= since]
    return stops[-1]["reason"] if stops else None


def restart_counts(run: RunEvents) -> dict[str, int]:
    """Restarts begun, recovered or not: in-process ones from restart_begin (the busiest rank's
    count; every rank records each one), launcher ones from the highest launcher cycle seen,
    JobSet ones (a rehearsal's recreated pods) from the highest attempt seen."""
    per_rank: dict[int, int] = {}
    for e in run.of("restart_begin"):
        per_rank[e["rank"]] = per_rank.get(e["rank"], 0) + 1
    return {
        "inprocess": max(per_rank.values(), default=0),
        "launcher": max((e["cycle"] for e in run.events), default=0),
        "kubernetes": max((e.get("attempt", 0) for e in run.events), default=0),
    }


def print_report(
    console: Console,
    run_dir: Path,
    code: int,
    wall_s: float,
    killed: list[int],
    started_at: float = 0.0,
    stopped: str | None = None,
    command: str = "local",
) -> None:
    """The run's outcome from its own events: a resumed run directory also holds the events and
    summary.json of earlier runs, which must not be reported as this one's."""
    run = RunEvents([e for e in load_run(run_dir).events if e["t"] >= started_at])
    report = summarize(run)
    # With a do-not-requeue record the run's code (93) is not the launcher's (1, closed rendezvous).
    ended = "JobSet exit" if command == "rehearse" else "launcher exit"
    title = f"exit {code}, {wall_s:.1f}s" if stopped else f"{ended} {code}, {wall_s:.1f}s"
    table = Table(title=f"nvrx-eks {command}: {title}", show_header=False)
    table.add_column(no_wrap=True)  # labels stay greppable on narrow terminals
    table.add_column(overflow="fold")
    reason = stopped or stop_reason(run, started_at)
    if reason is not None:
        table.add_row("stopped", escape(reason))
    table.add_row("final step", str(report.final_step))
    ends = run.of("step_end", rank=0)
    if ends:
        table.add_row("loss first -> last", f"{ends[0]['loss']:.3f} -> {ends[-1]['loss']:.3f}")
    counts = restart_counts(run)
    table.add_row("restarts", format_restarts(counts).replace(" /", ","))
    for outcome in report.fault_outcomes():
        if "layer" in outcome:
            text = (
                f"recovered by {outcome['layer']} in {outcome['recovered_s']:.1f}s, resumed "
                f"from step {outcome['resumed_from_step']} ({outcome['lost_steps']} steps lost)"
            )
        elif code == 0:
            text = "injected (no restart needed)"
        elif outcome["kind"] == "node-loss" and outcome["target"] == 0:
            text = (
                "not recovered: node 0 hosts the rendezvous and in-process stores, so its loss ends "
                "the run (on EKS the JobSet then recreates every pod)"
            )
        else:
            text = f"injected; no restart followed (the run ended with exit {code})"
        table.add_row(f"fault {outcome['fault']}", text)
    for rebuilt in run.of("checkpoint_pointer_rebuilt", rank=0)[:1]:
        table.add_row("checkpoint pointer", escape(rebuilt["reason"]))
    for fb in run.of("checkpoint_fallback", rank=0):
        table.add_row("checkpoint fallback", escape(f"{Path(fb['path']).name}: {fb['reason']}"))
    restores = run.of("local_restore")
    if restores or run.of("local_save"):
        via = [e["source"] for e in restores]
        table.add_row(
            "local tier",
            f"{len(run.of('local_save', rank=0))} saves; restores by rank: "
            f"{via.count('local')} own copy, {via.count('replica')} replica; "
            f"FSx loads {len(run.of('checkpoint_load'))}",
        )
    skips = {(e["origin_rank"], e["step"]): e for e in run.of("local_copy_skipped")}
    for skipped in skips.values():
        table.add_row(
            "local copy skipped", escape(f"rank {skipped['origin_rank']} step {skipped['step']}: {skipped['reason']}")
        )
    median_stall_s = report.median_stall_s  # None when the run saved nothing
    if median_stall_s is not None:
        table.add_row(
            "checkpoint stall",
            f"median {median_stall_s * 1000:.1f} ms, max "
            f"{max(report.stalls_s) * 1000:.1f} ms over {len(report.stalls_s)} saves",
        )
    table.add_row("goodput", f"{report.goodput:.1%} (replayed steps: {report.lost_steps})")
    summary = run_dir / "summary.json"
    if summary.is_file() and summary.stat().st_mtime >= started_at:
        table.add_row("state_sha256", json.loads(summary.read_text())["state_sha256"][:16] + "…")
    table.add_row("processes left", "none" if not killed else f"killed {killed}")
    console.print(table)
