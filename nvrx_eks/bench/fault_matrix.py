"""Every fault kind on every node class, with spare nodes and without: which layer recovered it, the
time from the fault to the first training step after it, and the steps replayed.

Each case is one `nvrx-eks local` run of the tiny preset (2 active simulated nodes of one rank,
plus a spare node where the case has one, a committed checkpoint every CHECKPOINT_INTERVAL steps)
with one fault at FAULT_STEP, compared with a clean run of the same active world: a recovered run
ends with the clean run's `state_sha256`. The node classes are node 0 (which hosted every store
before the job had a coordinator), any other node, and the coordinator itself.

`python -m nvrx_eks.bench.fault_matrix --out DIR` runs them all (about 15 runs of 30-60 s on 2
cores) and writes DIR/fault-matrix.json and DIR/fault-matrix.md; tests/runs/trainer/test_fault_matrix.py
runs the rows that lose node 0 or the coordinator.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from workloads.events import RunEvents

STEPS = 20
FAULT_STEP = 12
CHECKPOINT_INTERVAL = 4
ACTIVE_NODES = 2


@dataclass(frozen=True)
class Case:
    kind: str
    target: int  # the rank (node-loss: the node) the fault names; the coordinator-loss fault's firing rank
    spares: int

    @property
    def fault(self) -> str:
        return f"{self.kind}@{FAULT_STEP}:{self.target}"

    @property
    def node(self) -> str:
        return "coordinator" if self.kind == "coordinator-loss" else f"node {self.target}"

    @property
    def expected_layer(self) -> str:
        """The fastest layer that can recover it: a spare takes a lost rank's or node's place in
        process; without one, ft_launcher restarts a lost rank's workers, and a lost node (its
        launcher gone) or coordinator makes the launch start again (the JobSet's recreation)."""
        if self.kind in ("exception", "hang"):
            return "inprocess"
        if self.kind == "coordinator-loss":
            return "kubernetes"
        if self.spares:
            return "inprocess"
        return "launcher" if self.kind == "sigkill" else "kubernetes"


CASES = tuple(
    Case(kind, target, spares)
    for spares in (0, 1)
    for kind, target in (
        ("sigkill", 0),
        ("sigkill", 1),
        ("node-loss", 0),
        ("node-loss", 1),
        ("exception", 0),
        ("hang", 0),
        ("coordinator-loss", 0),
    )
)


def run_case(root: Path, case: Case | None, port: int | None = None) -> dict[str, Any]:
    """One local run (None: the clean run) on rendezvous port `port` (default a free one); returns
    its row."""
    from nvrx_eks.local.runner import LocalRun, run_local
    from workloads.events import load_run

    name = "clean" if case is None else f"{case.kind}-{case.node.replace(' ', '')}-spares{case.spares}"
    run_dir = root / name
    started = time.monotonic()
    local_run = LocalRun(
        nproc=1,
        steps=STEPS,
        faults=case.fault if case else "",
        run_dir=run_dir,
        preset="tiny",
        checkpoint_interval=CHECKPOINT_INTERVAL,
        backend="nvrx",
        nodes=ACTIVE_NODES,
        spare_nodes=case.spares if case else 0,
        port=port,
    )
    code = run_local(local_run, console=Console(file=io.StringIO()), print_summary=False)
    row: dict[str, Any] = {"case": name, "exit_code": code, "wall_s": round(time.monotonic() - started, 1)}
    if case is not None:
        row.update(asdict(case), fault=case.fault, node=case.node, expected_layer=case.expected_layer)
    summary_path = run_dir / "summary.json"
    row["state_sha256"] = json.loads(summary_path.read_text())["state_sha256"] if summary_path.exists() else None
    if case is not None:
        row.update(recovery_columns(load_run(run_dir)))
    return row


def recovery_columns(run: RunEvents) -> dict[str, Any]:
    """A faulted row's recovery: the layer that recovered the run's first fault, the steps it
    replayed, the step it resumed from, and the seconds from the fault to rank 0's first step
    after it was ready again. Empty when no fault was injected."""
    from workloads.events import fault_outcomes

    outcomes = fault_outcomes(run.of("fault_injected"), run.restarts(0))
    if not outcomes:
        return {}
    outcome = outcomes[0]
    ready = outcome["t"] + outcome.get("recovered_s", 0.0)
    after = [e["t"] for e in run.of("step_end", rank=0) if e["t"] > ready]
    return {
        "layer": outcome.get("layer"),
        "replayed_steps": outcome.get("lost_steps"),
        "resumed_from_step": outcome.get("resumed_from_step"),
        "first_step_after_s": round(min(after) - outcome["t"], 2) if after else None,
    }


def markdown(rows: list[dict[str, Any]], clean_sha: str | None) -> str:
    names = {"inprocess": "in-process", "launcher": "ft_launcher", "kubernetes": "relaunch (JobSet)"}
    lines = [
        "| fault | node | spares | recovered by | first step after the fault | steps replayed | state as clean |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for row in rows:
        layer = names.get(row.get("layer") or "", "ended" if row["exit_code"] else "none")
        first = row.get("first_step_after_s")
        lines.append(
            f"| {row['fault']} | {row['node']} | {row['spares']} | {layer} | "
            f"{f'{first:.1f} s' if first is not None else '-'} | {row.get('replayed_steps', '-')} | "
            f"{'yes' if row['state_sha256'] and row['state_sha256'] == clean_sha else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvrx_eks.bench.fault_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the runs and the table")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: --out {args.out} is not empty; give a new directory", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    clean = run_case(args.out, None)
    rows = []
    for case in CASES:
        rows.append(run_case(args.out, case))
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "fault-matrix.json").write_text(json.dumps({"clean": clean, "rows": rows}, indent=1))
    table = markdown(rows, clean["state_sha256"])
    (args.out / "fault-matrix.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
