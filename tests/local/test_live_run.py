"""`nvrx-eks local` with its output in a pipe: the fault, the restart and the checkpoint commits
come as plain lines in the order they happened, each once, and the run ends with the command
that reports it (which works on that run directory)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.support.trainer_fixtures import REPO, exclusive_trainer_runs, port_pair

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]
CLOCK = r"\d\d:\d\d:\d\d "


def test_local_prints_each_fault_restart_and_commit_as_it_happens_then_the_report_command(tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    argv = ["local", "--nodes", "2", "--nproc", "1", "--steps", "16", "--faults", "exception@8:0"]
    with exclusive_trainer_runs(tmp_path_factory):
        result = subprocess.run(
            [*CLI, *argv, "--run-dir", str(run_dir), "--port", str(port_pair())],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "\x1b" not in out, "a pipe gets no spinner and no colour codes"
    lines = out.splitlines()

    def at(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.fullmatch(CLOCK + pattern, line)]
        assert len(found) == 1, f"{pattern!r} printed {len(found)} times:\n{out}"
        return found[0]

    fault = at(r"step 8  fault exception@8:0 injected")
    began = at(r"step 8  restart \(in-process\) began: .*injected.*")
    resumed = at(r"step 8  resumed from step 0 \(in-process, \d+\.\d s\)")
    commit = at(r"step \d+  checkpoint step 10 committed")
    ended = at(r"step 16  run completed at step 16, loss \d+\.\d{3}")
    assert fault < began < resumed < commit < ended, out
    assert any(re.fullmatch(r"step \d+/16  loss \d+\.\d{3}", line) for line in lines[:fault]), out

    assert lines[-1] == f"where the time went: nvrx-eks report {run_dir}"
    report_argv = shlex.split(lines[-1].split(": ", 1)[1])
    assert report_argv[:2] == ["nvrx-eks", "report"]
    report = subprocess.run([*CLI, *report_argv[1:]], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert "exception@8:0" in report.stdout, report.stdout
