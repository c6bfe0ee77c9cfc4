"""What `nvrx-eks local` prints when a run ends: its outcome read from the run's own events (final
step, restarts, each fault and its recovery, checkpoints, goodput, leftover processes)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvrx_eks.local.report import analyze, format_restarts, format_stalls
from workloads.events import RunEvents, load_run, summarize


def stop_reason(run: RunEvents, since: float) -> str | None:
    """Why a rank of the run started at `since` ended it on an error no restart can fix (the
    newest such event)."""
    stops = run.started_since(since).of("unrecoverable")
    return stops[-1]["reason"] if stops else None


def replayed_steps(directory: RunEvents, this_run: RunEvents, rank: int = 0) -> int:
    """Steps `rank` computed again in this run: every step_end of this run for a step the rank
    had already completed, earlier in this run (a restart) or in an earlier run of the
    directory (a resume that loaded an older checkpoint than the furthest step reached, after a
    fallback past a damaged one)."""
    first_of_this_run = this_run.events[0]["t"] if this_run.events else float("inf")
    done = {e["step"] for e in directory.of("step_end", rank=rank) if e["t"] < first_of_this_run}
    replayed = 0
    for e in this_run.of("step_end", rank=rank):
        replayed += e["step"] in done
        done.add(e["step"])
    return replayed


def local_tier_line(run: RunEvents) -> str | None:
    """The node-local tier's saves, failed writes and restores; None where the run had none."""
    restores = run.of("local_restore")
    failed = run.of("local_save_failed")
    if not (restores or failed or run.of("local_save")):
        return None
    via = [e["source"] for e in restores]
    line = f"{len(run.of('local_save', rank=0))} saves"
    if failed:
        # The tier is a cache: failed writes leave restores to what is complete elsewhere, or FSx,
        # so they are named, not fatal. A rank reports the first of the saves that fail in a row,
        # and the first that succeeds again.
        ranks = sorted({e["rank"] for e in failed})
        recovered = run.of("local_save_recovered")
        still = [r for r in ranks if not [e for e in recovered if e["rank"] == r and e["t"] > failed[-1]["t"]]]
        since = min(e.get("step", 0) for e in failed)
        line += (
            f", saves failed on rank(s) {', '.join(map(str, ranks))} from step {since}"
            f" ({'still failing at the end' if still else 'then recovered'}; last: {failed[-1]['reason']})"
        )
    return (
        f"{line}; restores by rank: {via.count('local')} own copy, {via.count('replica')} replica; "
        f"FSx loads {len(run.of('checkpoint_load'))}"
    )


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
    directory = load_run(run_dir)
    run = directory.started_since(started_at)
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
    evals = run.of("eval_end", rank=0)
    if evals:
        last = evals[-1]
        table.add_row("held-out loss", f"{last['loss']:.3f} at step {last['step']} ({len(evals)} evaluations)")
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
        else:
            text = f"injected; no restart followed (the run ended with exit {code})"
        table.add_row(f"fault {outcome['fault']}", text)
    for rebuilt in run.of("checkpoint_pointer_rebuilt", rank=0)[:1]:
        table.add_row("checkpoint pointer", escape(rebuilt["reason"]))
    for fb in run.of("checkpoint_fallback", rank=0):
        table.add_row("checkpoint fallback", escape(f"{Path(fb['path']).name}: {fb['reason']}"))
    local_tier = local_tier_line(run)
    if local_tier is not None:
        table.add_row("local tier", escape(local_tier))
    skips = {(e["origin_rank"], e["step"]): e for e in run.of("local_copy_skipped")}
    for skipped in skips.values():
        table.add_row(
            "local copy skipped", escape(f"rank {skipped['origin_rank']} step {skipped['step']}: {skipped['reason']}")
        )
    if report.stalls_s:
        # The steady saves apart from each process's first (warm-up), as `report` gives them.
        table.add_row("checkpoint stall", format_stalls(analyze(run)))
    table.add_row("goodput", f"{report.goodput:.1%} (replayed steps: {replayed_steps(directory, run)})")
    summary = run_dir / "summary.json"
    if summary.is_file() and summary.stat().st_mtime >= started_at:
        table.add_row("state_sha256", json.loads(summary.read_text())["state_sha256"][:16] + "…")
    table.add_row("processes left", "none" if not killed else f"killed {killed}")
    console.print(table)
