"""Repeat the two stops of tests/runs/local/test_local_signals.py and count the second stops that
lost their stop-save. Each round: `nvrx-eks local` (2 ranks, tiny preset) stopped past step 12 by
SIGTERM to the command alone, resumed, and stopped a few steps later by SIGTERM to every process
of the run at once (a node shutdown, a process-group kill). A round is good when that second stop
exits 143, leaves no process behind, and both ranks wrote their `run_end` ("terminated": the
stop-save was made). Prints one line per round; keeps the run directories of the bad rounds
under OUT, with their launcher.log, for reading.

Usage: .venv/bin/python scripts/repeat_local_stops.py OUT [ROUNDS]   (default 20; ~40 s a round)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runs.local.test_local_signals import stop_twice  # noqa: E402


def one_round(run_dir: Path) -> str:
    """'' for a good round, else what went wrong."""
    _, second = stop_twice(run_dir)
    ends = {e["rank"]: e["status"] for e in second.events.of("run_end")}
    problems = []
    if second.code != 143:
        problems.append(f"exit {second.code}")
    if second.left:
        problems.append(f"{len(second.left)} processes left")
    if ends != {0: "terminated", 1: "terminated"}:
        failed = [e.get("signature") for e in second.events.of("iteration_failed")]
        problems.append(f"run_end {ends or 'missing'}; iteration_failed {failed}")
    return "; ".join(problems)


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    bad = 0
    for i in range(rounds):
        round_dir = out / f"round-{i}"
        problem = one_round(round_dir / "run")
        bad += bool(problem)
        print(f"round {i}: {problem or 'stop-save made by both ranks'}", flush=True)
        if not problem:
            shutil.rmtree(round_dir)
    print(f"{bad} of {rounds} second stops lost their stop-save")


if __name__ == "__main__":
    main()
