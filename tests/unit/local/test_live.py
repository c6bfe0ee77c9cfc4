"""The lines `nvrx-eks local` and `rehearse` print as a run happens (nvrx_eks.local.live), from
crafted event lists: time order, each event once across polls, rank 0's view of restarts and
checkpoints, a fault once however many ranks recorded it; and the plain-line mode without a
terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from nvrx_eks.local.live import PROGRESS_EVERY_S, EventLines, LiveView, clock
from workloads.events import RunEvents, events_dir

T0 = 1_800_000_000.0


def event(name: str, t: float, rank: int = 0, pid: int | None = None, cycle: int = 0, **fields: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "t": T0 + t,
        "event": name,
        "rank": rank,
        "pid": 1000 + rank if pid is None else pid,
        "host": "h",
        "cycle": cycle,
        "iteration": 0,
        "attempt": 0,
        **fields,
    }


def texts(lines: list[str]) -> list[str]:
    """The lines without their clock (local time), which is checked on its own."""
    return [line.split(" ", 1)[1] for line in lines]


def run_of(*events: dict[str, Any]) -> RunEvents:
    return RunEvents(sorted(events, key=lambda e: e["t"]))


def two_ranks_through_an_inprocess_restart() -> list[dict[str, Any]]:
    events = [event("run_start", 0.0, rank=r, steps=16) for r in (0, 1)]
    for step in range(1, 9):
        events += [event("step_start", step, rank=r, step=step) for r in (0, 1)]
        if step < 8:
            events += [event("step_end", step + 0.5, rank=r, step=step, loss=3.0, step_s=0.5) for r in (0, 1)]
    events += [
        event("checkpoint_commit", 5.7, step=4, path="/ckpt/step_4", commit_s=0.1),
        event("fault_injected", 8.1, rank=1, kind="exception", step=8, target_rank=1),
        event("restart_begin", 8.2, layer="inprocess", reason="RuntimeError('injected at step 8')\nmore"),
        event("restart_begin", 8.2, rank=1, layer="inprocess", reason="RuntimeError('injected at step 8')"),
        event("restart_end", 10.3, layer="inprocess", resumed_from_step=4, since_begin_s=2.1),
        event("restart_end", 10.3, rank=1, layer="inprocess", resumed_from_step=4, since_begin_s=2.1),
        event("step_start", 10.4, step=5),
        event("run_end", 12.0, status="completed", final_step=16, final_loss=2.5),
    ]
    return events


def test_lines_come_in_time_order_with_rank_0s_step_and_the_restart_length():
    lines = EventLines().new_lines(run_of(*two_ranks_through_an_inprocess_restart()))
    assert texts(lines) == [
        "step 5  checkpoint step 4 committed",
        "step 8  fault exception@8:1 injected",
        "step 8  restart (in-process) began: RuntimeError('injected at step 8')",
        "step 8  resumed from step 4 (in-process, 2.1 s)",
        "step 5  run completed at step 16, loss 2.500",
    ]
    assert lines[1].split(" ", 1)[0] == clock(T0 + 8.1)


def test_a_poll_that_reads_every_event_again_prints_only_the_new_ones():
    events = two_ranks_through_an_inprocess_restart()
    lines = EventLines()
    first = lines.new_lines(run_of(*events[:-4]))
    assert texts(first)[-1] == "step 8  restart (in-process) began: RuntimeError('injected at step 8')"
    assert lines.new_lines(run_of(*events[:-4])) == []
    # The next poll also finds a commit older than lines already printed (its file was read
    # before the line was written): it is printed now, once.
    late_commit = event("checkpoint_commit", 8.15, step=8, path="/ckpt/step_8", commit_s=0.1)
    assert texts(lines.new_lines(run_of(*events, late_commit))) == [
        "step 8  checkpoint step 8 committed",
        "step 8  resumed from step 4 (in-process, 2.1 s)",
        "step 5  run completed at step 16, loss 2.500",
    ]
    assert lines.new_lines(run_of(*events, late_commit)) == []


def test_a_fault_every_rank_of_a_node_recorded_is_one_line_and_other_ranks_restarts_are_not_shown():
    events = [
        event("fault_injected", 1.0, rank=2, kind="node-loss", step=6, target_rank=2, node=1),
        event("fault_injected", 1.0, rank=3, kind="node-loss", step=6, target_rank=3, node=1),
        event("restart_begin", 1.2, rank=1, layer="inprocess", reason="peer fault"),
        event("restart_end", 2.0, rank=1, layer="inprocess", resumed_from_step=4),
        event("checkpoint_commit", 2.5, rank=1, step=4, path="/ckpt/step_4", commit_s=0.1),
        event("unrecoverable", 3.0, rank=1, reason="the checkpoint cannot be loaded"),
        event("unrecoverable", 3.0, rank=2, reason="the checkpoint cannot be loaded"),
    ]
    lines = EventLines()
    assert texts(lines.new_lines(run_of(*events))) == [
        "step 6  fault node-loss@6:1 injected",
        "step 6  cannot continue: the checkpoint cannot be loaded",
    ]
    assert lines.new_lines(run_of(*events)) == []


def test_a_launcher_restart_is_timed_from_the_last_event_of_the_previous_cycle_and_a_fault_names_its_step():
    events = [
        event("step_start", 1.0, step=2),  # the fault fires as step 3 starts, before its step_start
        event("fault_injected", 1.5, kind="sigkill", step=3, target_rank=0),
        event("restart_end", 6.0, pid=2000, cycle=1, layer="launcher", resumed_from_step=2),
    ]
    assert texts(EventLines().new_lines(run_of(*events))) == [
        "step 3  fault sigkill@3:0 injected",
        "step 3  resumed from step 2 (ft_launcher, 4.5 s)",
    ]


def write_events(run_dir: Path, *events: dict[str, Any]) -> None:
    path = events_dir(run_dir) / "rank0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_events_are_plain_lines_and_progress_is_a_line_at_most_every_interval(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    clock_ = FakeClock()
    write_events(tmp_path, event("run_start", 0.0, steps=16))
    with LiveView(console, tmp_path, since=T0, now=clock_) as view:
        write_events(tmp_path, event("step_end", 1.0, step=1, loss=3.25, step_s=0.5))
        view.poll()
        clock_.now = PROGRESS_EVERY_S / 2
        write_events(
            tmp_path,
            event("step_end", 2.0, step=2, loss=3.0, step_s=0.5),
            event("fault_injected", 2.1, kind="exception", step=3, target_rank=0),
        )
        view.poll()
        clock_.now = PROGRESS_EVERY_S
        write_events(tmp_path, event("step_end", 3.0, step=3, loss=2.75, step_s=0.5))
        view.poll()
        # Written after the last poll: leaving the view prints it.
        write_events(tmp_path, event("checkpoint_commit", 3.5, step=3, path="/c/step_3", commit_s=0.1))
    printed = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()  # no spinner, no colour codes in a log
    assert [line if line.startswith("step ") else line.split(" ", 1)[1] for line in printed] == [
        "step 1/16  loss 3.250",
        "step 3  fault exception@3:0 injected",
        "step 3/16  loss 2.750",
        "step 3  checkpoint step 3 committed",
    ]


def test_events_of_an_earlier_run_in_the_directory_are_not_replayed(tmp_path):
    out = io.StringIO()
    write_events(tmp_path, event("checkpoint_commit", 1.0, pid=7, step=10, path="/c/step_10", commit_s=0.1))
    write_events(tmp_path, event("run_start", 5.0, pid=8, steps=20))
    write_events(tmp_path, event("checkpoint_commit", 6.0, pid=8, step=20, path="/c/step_20", commit_s=0.1))
    with LiveView(Console(file=out, force_terminal=False, width=200), tmp_path, since=T0 + 4.0):
        pass
    assert texts(out.getvalue().splitlines()) == ["checkpoint step 20 committed"]


def test_without_a_terminal_a_progress_line_comes_before_the_events_that_followed_its_step(tmp_path):
    """A first poll that finds step 7's end and step 8's fault together (a loaded machine polls
    late) prints them in the order they happened, not the fault first."""
    out = io.StringIO()
    write_events(tmp_path, event("run_start", 0.0, steps=16))
    with LiveView(Console(file=out, force_terminal=False, width=200), tmp_path, since=T0, now=FakeClock()) as view:
        write_events(
            tmp_path,
            event("step_end", 7.0, step=7, loss=3.25, step_s=0.5),
            event("fault_injected", 7.1, kind="exception", step=8, target_rank=0),
            event("restart_begin", 7.2, layer="inprocess", reason="InjectedFault('injected')"),
        )
        view.poll()
    printed = out.getvalue().splitlines()
    assert [line if line.startswith("step ") else line.split(" ", 1)[1] for line in printed] == [
        "step 7/16  loss 3.250",
        "step 8  fault exception@8:0 injected",
        "step 8  restart (in-process) began: InjectedFault('injected')",
    ]
