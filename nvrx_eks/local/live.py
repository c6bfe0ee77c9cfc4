"""A run as it happens, for `nvrx-eks local` and `rehearse`: one line per fault, restart,
checkpoint and the run's end, read from the run's events (workloads.events) while it trains.

The monitor loops re-read every event at each poll, so `EventLines` remembers which events it
has described and returns only the new ones. Restarts, checkpoints and the run's end are rank
0's view (every rank records each restart; events name the rank the process held then); a fault
is one line however many ranks recorded it (a node-loss is recorded by each rank of its node).
`LiveView` prints those lines with the run's progress: above a spinner on a terminal, and as
plain lines (progress at most every PROGRESS_EVERY_S) in a log or a pipe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.status import Status

from workloads.events import SHARED_LINE_STARTS, RunEvents, load_run, watch_line

#: Without a terminal, the progress (step, loss) is a plain line at most this often: a log of a
#: long run stays readable, and the event lines still come as they happen.
PROGRESS_EVERY_S = 10.0


def clock(t: float) -> str:
    """An event's wall-clock time as the line shows it (local time)."""
    return time.strftime("%H:%M:%S", time.localtime(t))


class EventLines:
    """The lines of a run's events not yet returned, oldest first."""

    def __init__(self) -> None:
        self._described: set[tuple[Any, ...]] = set()
        #: Lines that stand for several events: a fault every rank of a node recorded, an error
        #: each rank met.
        self._once: set[str] = set()

    def new_lines(self, run: RunEvents) -> list[str]:
        """From all the run's events so far (a poll reads them all again)."""
        return [line for _, line in self.new_timed_lines(run)]

    def new_timed_lines(self, run: RunEvents) -> list[tuple[float, str]]:
        """new_lines, each with its event's time."""
        lines = []
        step: int | None = None  # rank 0's step at the event: the line's context
        for event in run.events:
            if event["rank"] == 0 and event["event"] == "step_start":
                step = event["step"]
            elif event["event"] == "fault_injected":
                step = event["step"]  # a fault fires as its step starts, before step_start is written
            identity = (event.get("host"), event["pid"], event["rank"], event["t"], event["event"])
            if identity in self._described:
                continue
            text = self._describe(event, run)
            if text is None:
                continue
            self._described.add(identity)
            at = f"step {step}  " if step is not None else ""
            lines.append((event["t"], f"{clock(event['t'])} {at}{text}"))
        return lines

    def _describe(self, event: dict[str, Any], run: RunEvents) -> str | None:
        """The line for an event, or None for one that gets no line (or had its line already)."""
        took: float | None = None
        if event["event"] == "restart_end" and event["rank"] == 0:
            # The restart's length as the report computes it (a launcher restart has no begin event).
            lengths = [r.latency_s for r in run.restarts(rank=0) if r.end_t == event["t"] and r.pids[1] == event["pid"]]
            took = lengths[0] if lengths else None
        text = watch_line(event, took)
        if text is not None and text.startswith(SHARED_LINE_STARTS):
            if text in self._once:
                return None
            self._once.add(text)
        return text


def progress_text(run: RunEvents) -> str | None:
    """Rank 0's latest step (of the run's total) and loss; None before its first step."""
    progress = _progress(run)
    return progress[1] if progress else None


def _progress(run: RunEvents) -> tuple[float, str] | None:
    """(when, progress_text) of rank 0's latest step."""
    ends = run.of("step_end", rank=0)
    if not ends:
        return None
    starts = run.of("run_start", rank=0)
    total = f"/{starts[-1]['steps']}" if starts and isinstance(starts[-1].get("steps"), int) else ""
    return ends[-1]["t"], f"step {ends[-1]['step']}{total}  loss {ends[-1]['loss']:.3f}"


class LiveView:
    """A run's event lines and progress while it trains. Enter it around a monitor loop that
    calls `poll()`; it may be entered again (a relaunch) and keeps what it printed. Leaving it
    prints the lines of the events written since the last poll."""

    def __init__(
        self,
        console: Console,
        run_dir: Path,
        since: float,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.console = console
        self.run_dir = run_dir
        self.since = since  # the run's start: a resumed directory's earlier runs are not replayed
        self.lines = EventLines()
        self._now = now
        self._status: Status | None = None
        self._progress: str | None = None
        self._progress_printed_at: float | None = None

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._status = self.console.status(self._progress or "starting")
            self._status.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.poll()
        finally:
            if self._status is not None:
                self._status.stop()
                self._status = None

    def poll(self, run: RunEvents | None = None) -> RunEvents:
        """Print the new event lines and the progress, from `run` (the run's events, read by the
        caller) or from the run directory; returns the events read."""
        run = load_run(self.run_dir) if run is None else run
        mine = run.started_since(self.since)
        progress = _progress(mine)
        due = None  # a progress line to print among the event lines, in time order (no terminal)
        if progress is not None and progress[1] != self._progress:
            self._progress = progress[1]
            if self._status is not None:
                self._status.update(progress[1])
            elif self._progress_printed_at is None or self._now() - self._progress_printed_at >= PROGRESS_EVERY_S:
                due = progress
                self._progress_printed_at = self._now()
        for at, line in self.lines.new_timed_lines(mine):
            if due is not None and due[0] < at:
                self.console.print(due[1], markup=False, highlight=False)
                due = None
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        if due is not None:
            self.console.print(due[1], markup=False, highlight=False)
        return run
