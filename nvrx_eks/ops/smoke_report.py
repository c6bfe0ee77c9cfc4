"""The GPU smoke's report (nvrx_eks.ops.gpu_smoke): gpu_smoke.json, written after every phase, and
the table printed at the end. It reads only data: what the smoke runs, the checks' results, and
what was read of the device."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

#: What a check's row leaves out of its numbers (printed below the table, or only in the JSON).
HIDDEN = ("ok", "skipped", "compared", "estimate_components_gib", "launcher_log_tail", "problems", "fault_outcomes")


@dataclass
class SmokeReport:
    """The report of one smoke as its phases add their checks."""

    out_dir: Path
    console: Console
    #: What the smoke runs, the report's first keys (gpu_smoke.SmokePlan.described).
    plan: dict[str, Any]
    budget_s: float
    #: What nvrx_eks.ops.gpu_env read of the GPU machine; None on a dry run.
    device: dict[str, Any] | None
    #: Each phase's check by its name, in the order the phases ran.
    checks: dict[str, Any] = field(default_factory=dict)

    def result(self, *, complete: bool) -> dict[str, Any]:
        """The report of the checks so far; `complete` once no phase is left to run. A phase
        skipped for the budget proves nothing and fails nothing: it is listed under "skipped"."""
        checks = self.checks
        ran = {name: c for name, c in checks.items() if not c.get("skipped")}
        result = {
            **self.plan,
            "budget_s": self.budget_s,
            "complete": complete,
            "checks": checks,
            "skipped": [name for name in checks if name not in ran],
            "ok": complete and all(c["ok"] for c in ran.values()),
        }
        if self.device is not None:
            result["device"] = self.device
        return result

    def write_so_far(self) -> None:
        """The phases so far, incomplete: what a smoke killed before its next phase ends leaves."""
        write(self.out_dir, self.result(complete=False))

    def final(self, *, stopped: bool = False) -> dict[str, Any]:
        """The result, written and printed. `stopped`: a launch ended because the smoke was told
        to stop: the phases so far, incomplete, and no further launch (a timeout around the smoke
        waits for nothing more)."""
        result = self.result(complete=not stopped)
        if stopped:
            result["stopped"] = "by a signal during a launch"
        write(self.out_dir, result)
        print_result(result, self.console)
        return result


def write(out_dir: Path, result: dict[str, Any]) -> None:
    """out_dir/gpu_smoke.json, replaced atomically: a smoke killed mid-write leaves the previous
    phase's report whole, never a torn file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "gpu_smoke.json.tmp"
    partial.write_text(json.dumps(result, indent=1))
    os.replace(partial, out_dir / "gpu_smoke.json")


def print_result(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"GPU smoke: {result['mode']}, {result['nproc']} rank(s), preset {result['preset']}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("numbers")
    for name, check in result["checks"].items():
        numbers = ", ".join(f"{k}={v}" for k, v in check.items() if k not in HIDDEN)
        if check.get("skipped"):
            verdict = f"[yellow]skipped: {check['skipped']}[/]"
        else:
            verdict = "[green]ok[/]" if check["ok"] else "[red]FAILED[/]"
        table.add_row(name, verdict, numbers)
    console.print(table)
    for name, check in result["checks"].items():
        for problem in check.get("problems", []):
            console.print(f"{name}: {problem}", markup=False, highlight=False)
        if check.get("launcher_log_tail"):
            console.print("launcher log, last lines:", markup=False)
            console.print("\n".join(check["launcher_log_tail"]), markup=False, highlight=False)
