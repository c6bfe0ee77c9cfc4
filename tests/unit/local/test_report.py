"""`nvrx-eks report`: the time breakdown and the timeline, on a run whose events are known."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.bench.analysis import goodput_record, goodput_split
from nvrx_eks.local.report import (
    MAX_BARS_PER_LANE_COLOUR,
    analyze,
    draw_timeline,
    merged_bars,
    plot_timeline,
    print_breakdown,
)
from nvrx_eks.local.report import run as report_run
from nvrx_eks.local.throughput_chart import FAULT_COLOUR, draw_throughput
from tests.support.cli_process import WIDE_TERMINAL, cli_process
from workloads.events import RunEvents, load_run, split_first_saves, summarize


def _write_run(run_dir: Path) -> None:
    """Two ranks, 1 s steps (1000 tokens/s), a checkpoint every 4 steps (the first save of each
    process a 2 s stall, its warm-up, the others 0.5 s), an exception at step 6 on rank 1
    recovered in process (resume from 4), a SIGKILL at step 10 recovered by the launcher (new
    pids, resume from 8)."""
    events: dict[int, list[dict]] = {0: [], 1: []}

    def emit(rank, t, event, pid, cycle=0, iteration=0, **fields):
        events[rank].append(
            {"v": 1, "t": t, "event": event, "rank": rank, "pid": pid, "host": "h", "cycle": cycle,
             "iteration": iteration, **fields}
        )  # fmt: skip

    saved_by: set[int] = set()  # the pids that saved once (every rank's pids differ)
    for rank in (0, 1):
        pid = 100 + rank
        t = 0.0
        emit(rank, t, "run_start", pid, world_size=2)
        t = 5.0
        emit(rank, t, "setup_end", pid, resumed_from_step=0, setup_s=5.0)

        def steps(first, last, t, pid, cycle=0, iteration=0, rank=rank):
            for step in range(first, last + 1):
                emit(rank, t, "step_start", pid, cycle, iteration, step=step)
                t += 1.0
                throughput = {"tokens_per_s": 1000.0, "tokens_per_s_per_gpu": 500.0, "mfu": None}
                emit(rank, t, "step_end", pid, cycle, iteration, step=step, loss=1.0, step_s=1.0, **throughput)
                if step % 4 == 0:
                    stall_s = 0.5 if pid in saved_by else 2.0
                    saved_by.add(pid)
                    t += stall_s
                    emit(rank, t, "checkpoint_stall", pid, cycle, iteration, step=step, stall_s=stall_s)
                    emit(rank, t + 0.3, "checkpoint_write_end", pid, cycle, iteration, step=step, write_s=0.3)
            return t

        t = steps(1, 5, t, pid)  # 5 steps + 1 save = 12 s
        if rank == 1:
            emit(rank, t, "fault_injected", pid, kind="exception", step=6, target_rank=1)
        emit(rank, t + 1.0, "restart_begin", pid, layer="inprocess")
        t += 3.0  # detect + restart: 3 s after the fault
        emit(rank, t, "restart_end", pid, iteration=1, layer="inprocess", resumed_from_step=4)
        t = steps(5, 9, t, pid, iteration=1)  # step 5 replayed
        if rank == 1:
            emit(rank, t, "fault_injected", pid, iteration=1, kind="sigkill", step=10, target_rank=1)
        new_pid = 200 + rank
        t += 8.0  # launcher restart: 8 s
        emit(rank, t - 2.0, "run_start", new_pid, cycle=1, world_size=2)
        emit(rank, t, "restart_end", new_pid, cycle=1, layer="launcher", resumed_from_step=8)
        t = steps(9, 12, t, new_pid, cycle=1)  # step 9 replayed
        emit(rank, t, "run_end", new_pid, cycle=1, status="completed", final_step=12)
    (run_dir / "events").mkdir(parents=True)
    for rank, lines in events.items():
        (run_dir / "events" / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


@pytest.fixture
def run_dir(tmp_path) -> Path:
    _write_run(tmp_path / "run")
    return tmp_path / "run"


def test_breakdown_accounts_for_every_second(run_dir):
    b = analyze(load_run(run_dir)).split
    assert b.final_step == 12
    assert b.productive_s == pytest.approx(12.0)  # each step counted once, at its last execution
    assert b.replayed_s == pytest.approx(2.0)  # steps 5 and 9 ran twice
    assert b.checkpoint_stall_s == pytest.approx(2.0 + 0.5 + 2.0)  # saves at steps 4, 8 and 12
    assert b.saves == 3 and b.median_stall_s == pytest.approx(2.0)
    assert b.restarts_by_layer() == {"inprocess": 1, "launcher": 1}
    total = b.productive_s + b.checkpoint_stall_s + b.replayed_s + b.recovery_s + b.other_s
    assert total == pytest.approx(b.wall_s)
    assert b.goodput == pytest.approx(b.productive_s / b.wall_s)


def test_report_bench_and_the_summary_print_one_split(run_dir):
    run = load_run(run_dir)
    report, bench, summary = analyze(run), goodput_split(run), summarize(run)
    assert report.split == bench == summary  # one split, not copies of its fields
    record = goodput_record(bench)
    assert record["goodput"] == summary.goodput
    parts = ("wall_s", "productive_s", "checkpoint_stall_s", "replayed_s")
    assert [record[p] for p in parts] == [getattr(summary, p) for p in parts]
    assert summary.recovery_s == pytest.approx(3.0 + 8.0)  # the exception in process, the sigkill by the launcher
    assert record["other_s"] == pytest.approx(summary.recovery_s + summary.other_s)  # P4 shows them as one part


def test_report_json_keeps_its_keys_in_order(run_dir, tmp_path):
    out = tmp_path / "breakdown.json"
    report_run(run_dir, tmp_path / "timeline.png", out, Console(file=StringIO()))
    written = json.loads(out.read_text())
    assert list(written) == [
        *("wall_s", "productive_s", "checkpoint_stall_s", "eval_s", "replayed_s", "recovery_s", "other_s"),
        *("goodput", "final_step", "saves", "median_stall_s"),
        *("first_save_stall_s", "first_saves", "steady_median_stall_s", "restarts", "faults", "throughput"),
        "last_eval",
    ]
    summary = summarize(load_run(run_dir))
    assert (written["goodput"], written["median_stall_s"]) == (summary.goodput, summary.median_stall_s)
    assert list(written["faults"][0]) == [
        *("label", "t", "layer", "detect_and_restart_s", "first_step_after_s", "resumed_from_step", "lost_steps")
    ]


def test_each_fault_has_its_layer_and_lost_steps(run_dir):
    exception, sigkill = analyze(load_run(run_dir)).faults
    assert (exception.label, exception.layer, exception.resumed_from_step) == ("exception@6:1", "inprocess", 4)
    assert exception.detect_and_restart_s == pytest.approx(3.0)
    assert exception.lost_steps == 1  # step 5 was done and lost
    assert exception.first_step_after_s == pytest.approx(4.0)
    assert (sigkill.label, sigkill.layer, sigkill.resumed_from_step) == ("sigkill@10:1", "launcher", 8)
    assert sigkill.detect_and_restart_s == pytest.approx(8.0)
    assert sigkill.lost_steps == 1


def test_timeline_marks_every_fault(run_dir, tmp_path):
    run = load_run(run_dir)
    png = tmp_path / "timeline.png"
    marked = plot_timeline(run, analyze(run), png)
    assert marked == ["exception@6:1", "sigkill@10:1"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _rgb(colour) -> tuple[float, ...]:
    """A drawn or legend colour without its alpha (restart windows are drawn lighter than their key)."""
    from matplotlib.colors import to_rgb

    return tuple(round(c, 3) for c in to_rgb(colour))


def _legend_colours(legend) -> dict[str, tuple[float, ...]]:
    """Each legend entry's label and colour (a patch's face, a line's colour)."""
    handles = legend.legend_handles
    return {
        text.get_text(): _rgb(h.get_facecolor() if hasattr(h, "get_facecolor") else h.get_color())
        for text, h in zip(legend.get_texts(), handles, strict=True)
    }


def _timeline_bars(fig) -> dict[tuple[int, tuple[float, ...]], list[tuple[float, float]]]:
    """(lane, colour) -> the (start, width) of each bar of that colour in that lane, by start."""
    out: dict[tuple[int, tuple[float, ...]], list[tuple[float, float]]] = {}
    for collection in fig.axes[0].collections:
        for path in collection.get_paths():
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            key = (round(ys.min() + 0.3), _rgb(collection.get_facecolor()[0]))
            out.setdefault(key, []).append((round(xs.min(), 6), round(xs.max() - xs.min(), 6)))
    return {key: sorted(bars) for key, bars in out.items()}


def test_timeline_draws_each_process_first_save_as_warm_up(run_dir):
    import matplotlib.pyplot as plt

    run = load_run(run_dir)
    fig, _ = draw_timeline(run, analyze(run))
    legend = _legend_colours(fig.legends[0])
    warm_up, steady = legend["first save of a process (warm-up)"], legend["checkpoint stall"]
    assert warm_up != steady
    bars = _timeline_bars(fig)
    plt.close(fig)
    for lane in (0, 1):
        # pid 10x's first save (step 4, at 9 s) and the new pid 20x's after the launcher
        # restart (step 12, at 32.5 s); step 8, saved by pid 10x after its in-process restart, is steady.
        assert bars[(lane, warm_up)] == [(9.0, 2.0), (32.5, 2.0)]
        assert bars[(lane, steady)] == [(19.0, 0.5)]


def test_breakdown_splits_first_save_warm_up_from_steady_saves(run_dir):
    from io import StringIO

    from rich.console import Console

    b = analyze(load_run(run_dir))
    # Two processes per rank (before and after the launcher restart), each warming up once.
    assert (b.first_saves, b.first_save_stall_s) == (2, pytest.approx(4.0))
    assert b.steady_median_stall_s == pytest.approx(0.5)
    out = StringIO()
    print_breakdown(b, run_dir, Console(file=out, width=200))
    text = out.getvalue()
    assert "median 500 ms over 1 steady save (first saves of 2 processes: 4.0 s of warm-up)" in text
    cells = [line.split("│")[1:3] for line in text.splitlines() if line.count("│") == 4]
    rows = {name.strip(): seconds.strip() for name, seconds in cells}
    assert rows["checkpoint stalls: steady"] == "0.5"
    assert rows["checkpoint stalls: first saves (warm-up)"] == "4.0"


def test_a_process_is_its_host_and_pid():
    def stall(host, pid, step):
        return {"event": "checkpoint_stall", "host": host, "pid": pid, "step": step, "stall_s": 1.0}

    stalls = [stall("a", 7, 5), stall("b", 7, 5), stall("a", 7, 10), stall("b", 8, 10)]
    first, steady = split_first_saves(stalls)
    assert first == [stalls[0], stalls[1], stalls[3]]  # the same pid on another host is another process
    assert steady == [stalls[2]]


def test_throughput_marks_each_fault_on_both_panels(run_dir):
    import matplotlib.pyplot as plt

    fig = draw_throughput(load_run(run_dir))
    for ax in fig.axes:
        lines = [line for line in ax.lines if _rgb(line.get_color()) == _rgb(FAULT_COLOUR)]
        assert [list(line.get_xdata()) for line in lines] == [[6, 6], [10, 10]]
        assert [t.get_text().strip() for t in ax.texts] == ["exception@6:1", "sigkill@10:1"]
        assert "fault injected" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_every_colour_drawn_has_a_legend_entry(run_dir):
    import matplotlib.pyplot as plt

    run = load_run(run_dir)
    throughput = draw_throughput(run)
    for ax in throughput.axes:
        # Each panel's key holds exactly its curves and the fault lines (the grid is not a line).
        drawn = {_rgb(line.get_color()) for line in ax.lines}
        assert drawn == set(_legend_colours(ax.get_legend()).values()), ax.get_ylabel()
    plt.close(throughput)
    timeline, _ = draw_timeline(run, analyze(run))
    ax = timeline.axes[0]
    drawn = {_rgb(c.get_facecolor()[0]) for c in ax.collections}
    drawn |= {_rgb(p.get_facecolor()) for p in ax.patches} | {_rgb(line.get_color()) for line in ax.lines}
    legend = _legend_colours(timeline.legends[0])
    plt.close(timeline)
    assert legend["first save of a process (warm-up)"] in drawn
    assert drawn <= set(legend.values())


def test_report_command(run_dir, tmp_path):
    out_json = tmp_path / "breakdown.json"
    result = cli_process("report", str(run_dir), "--json", str(out_json), env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    assert "in-process" in result.stdout and "ft_launcher" in result.stdout
    assert (run_dir / "timeline.png").exists()
    breakdown = json.loads(out_json.read_text())
    assert breakdown["restarts"] == {"inprocess": 1, "launcher": 1}
    assert (breakdown["first_saves"], breakdown["first_save_stall_s"]) == (2, pytest.approx(4.0))


def test_report_on_a_missing_directory_exits_2(tmp_path):
    result = cli_process("report", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "bad",
    [
        '{"v":1,"t":"abc","event":"step_end","rank":0,"pid":100,"cycle":0,"iteration":0,"step":3,"step_s":1.0}',
        '{"v":1,"t":7.5,"event":5,"rank":0,"pid":100,"cycle":0,"iteration":0}',
        '{"v":1,"t":7.5,"event":"step_end","rank":0,"pid":100,"cycle":0,"iteration":0,"step":{"a":1},'
        '"loss":1.0,"step_s":1.0}',
        '{"v":1,"t":NaN,"event":"step_end","rank":0,"pid":100,"cycle":0,"iteration":0,"step":3,"loss":1.0,"step_s":1}',
        '{"v":1,"t":7.5,"event":"fault_injected","rank":0,"pid":100,"cycle":0,"iteration":0,"kind":"exception"}',
        '{"v":1,"t":Infinity,"event":"checkpoint_stall","rank":0,"pid":100,"cycle":0,"iteration":0,"step":4}',
        '{"v":1,"t":7.5,"event":"restart_end","rank":true,"pid":100,"cycle":0,"iteration":0,"layer":"launcher",'
        '"resumed_from_step":4}',
    ],
    ids=["t-string", "event-number", "step-mapping", "t-nan", "fault-without-step", "t-infinity", "rank-bool"],
)
def test_report_skips_records_with_wrong_types_or_missing_fields_and_says_so(run_dir, tmp_path, bad):
    with (run_dir / "events" / "rank0.jsonl").open("a") as events:
        events.write(bad + "\n")
    assert load_run(run_dir).unreadable_lines == 1
    result = cli_process("report", str(run_dir), "--png", str(tmp_path / "t.png"), env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "skipped 1 line(s) of" in result.stdout and "a field missing or of the wrong type" in result.stdout
    assert analyze(load_run(run_dir)).split.final_step == 12  # the well-formed events still count


def _long_run(steps: int, ranks: int = 2) -> RunEvents:
    """`steps` 0.1 s steps on each rank, a save every 100 steps, one in-process restart halfway
    that replays the steps since the last save."""
    events = []
    for rank in range(ranks):
        common = {"v": 1, "rank": rank, "pid": 100 + rank, "host": "h", "cycle": 0, "attempt": 0}
        events.append({**common, "t": 0.0, "event": "run_start", "iteration": 0})
        events.append({**common, "t": 1.0, "event": "setup_end", "iteration": 0, "resumed_from_step": 0, "setup_s": 1})
        t, step, iteration = 1.0, 1, 0
        while step <= steps:
            t += 0.1
            end = {"event": "step_end", "step": step, "loss": 1.0, "step_s": 0.1, "iteration": iteration}
            events.append({**common, "t": t, **end})
            if step % 100 == 0:
                stall = {"event": "checkpoint_stall", "step": step, "stall_s": 0.01, "iteration": iteration}
                events.append({**common, "t": t + 0.01, **stall})
                t += 0.01
            if step == steps // 2 and iteration == 0:
                events.append({**common, "t": t + 0.5, "event": "restart_begin", "iteration": 0, "layer": "inprocess"})
                t, iteration, step = t + 1.0, 1, step // 100 * 100
                restart = {"event": "restart_end", "layer": "inprocess", "resumed_from_step": step}
                events.append({**common, "t": t, "iteration": 1, **restart})
            step += 1
    return RunEvents(sorted(events, key=lambda e: e["t"]))


def _artists(steps: int) -> tuple[int, int]:
    """(collections and patches on the timeline, the most bars one of them holds)."""
    import matplotlib.pyplot as plt

    run = _long_run(steps)
    fig, _ = draw_timeline(run, analyze(run))
    ax = fig.axes[0]
    most = max(len(c.get_paths()) for c in ax.collections)
    count = len(ax.collections) + len(ax.patches)
    plt.close(fig)
    return count, most


def test_timeline_draws_as_many_artists_for_a_long_run_as_for_a_short_one():
    short, _ = _artists(600)
    long, most = _artists(4 * MAX_BARS_PER_LANE_COLOUR)
    assert long == short
    assert most <= 2 * MAX_BARS_PER_LANE_COLOUR + 1


def test_merged_bars_keep_what_is_covered_and_respect_the_bound():
    bars = [(i * 1.0, 0.9) for i in range(10_000)] + [(20_000.0, 1.0)]
    merged = merged_bars(bars, limit=100)
    assert len(merged) <= 2 * 100 + 1
    assert merged[0][0] == 0.0 and merged[-1] == (20_000.0, 1.0)  # the lone bar after a wide gap stays
    assert sum(w for _, w in merged) >= sum(w for _, w in bars)  # gaps narrower than a pixel fill in
    assert merged_bars(bars[:50], limit=100) == bars[:50]
