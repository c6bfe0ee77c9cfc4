"""The GPU smoke script's report when its runs go wrong, without running them: a launch whose
ranks never started."""

from __future__ import annotations

import json

from nvrx_eks.ops.gpu_smoke import smoke


def test_no_rank_started_is_a_failed_report_with_the_launcher_log_not_a_traceback(tmp_path, monkeypatch):
    """On a fresh machine an import, CUDA or NCCL error ends every rank before run_start: the
    smoke reports that, with the launcher's last lines, and runs no later phase."""
    from rich.console import Console

    from nvrx_eks.ops import gpu_smoke
    from workloads.events import load_run

    launches = []

    def ranks_die_at_import(plan, run_dir, **kwargs):
        launches.append(run_dir)
        run_dir.mkdir(parents=True)
        lines = [f"[launcher] restart {n}" for n in range(80)]
        lines.append("ModuleNotFoundError: No module named 'nvidia_resiliency_ext'")
        (run_dir / gpu_smoke.LAUNCHER_LOG).write_text("\n".join(lines) + "\n")
        return {"exit_code": 1, "run": load_run(run_dir), "summary": None}

    monkeypatch.setattr(gpu_smoke, "_run", ranks_die_at_import)
    with open(tmp_path / "console.txt", "w") as sink:
        result = smoke(out_dir=tmp_path / "smoke", dry_run=True, console=Console(file=sink, width=200))

    assert launches == [tmp_path / "smoke" / "faulted"]
    assert not result["ok"] and list(result["checks"]) == ["faults"]
    faults = result["checks"]["faults"]
    assert faults["exit_code"] == 1 and "run_start" in faults["error"]
    assert len(faults["launcher_log_tail"]) == gpu_smoke.LOG_TAIL_LINES
    assert faults["launcher_log_tail"][-1] == "ModuleNotFoundError: No module named 'nvidia_resiliency_ext'"
    assert json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text()) == result
    assert "No module named 'nvidia_resiliency_ext'" in (tmp_path / "console.txt").read_text()


def test_the_report_is_made_of_data_alone_its_keys_in_their_order(tmp_path):
    """smoke_report reads no type of gpu_smoke (which imports it): what the smoke runs is a dict,
    the first keys of gpu_smoke.json, and a phase skipped for the budget neither passes nor fails."""
    import io

    from rich.console import Console

    from nvrx_eks.ops.gpu_smoke import plan_for
    from nvrx_eks.ops.smoke_report import SmokeReport

    plan = plan_for(True, None, None).described
    report = SmokeReport(tmp_path, Console(file=io.StringIO()), plan, 480.0, device={"gpus": []})
    report.checks["faults"] = {"ok": True, "commits": 3}
    report.write_so_far()
    assert json.loads((tmp_path / "gpu_smoke.json").read_text())["complete"] is False
    report.checks["resume"] = {"ok": None, "skipped": "budget"}
    result = report.final()
    assert list(result) == [
        "mode",
        "nproc",
        "preset",
        "precision",
        "seq_len",
        "batch_size",
        "budget_s",
        "complete",
        "checks",
        "skipped",
        "ok",
        "device",
    ]
    assert result["mode"] == "dry-run (cpu, gloo)" and result["skipped"] == ["resume"] and result["ok"] is True
    assert json.loads((tmp_path / "gpu_smoke.json").read_text()) == result
