"""`nvrx-eks local` with its output in a pipe: the fault, the restart and the checkpoint commits
come as plain lines in the order they happened, each once, and the run ends with the command
that reports it (which works on that run directory). While it runs it holds its run directory
(workloads/lease.py): a second run there is refused, naming the holder, before it writes
anything, and the first run ends as if it had been alone."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from tests.support.named_runs import RUNS, named_summary
from tests.support.trainer_fixtures import REPO, exclusive_trainer_runs, port_pair
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]
CLOCK = r"\d\d:\d\d:\d\d "
#: The named run this one is, but for its fault: recovered, it must end in the same state.
CLEAN = "clean-2x1-40"


def test_local_prints_each_fault_restart_and_commit_as_it_happens_then_the_report_command(tmp_path, tmp_path_factory):
    clean = named_summary(tmp_path_factory, CLEAN)
    spec = RUNS[CLEAN]
    run_dir = tmp_path / "run"
    argv = ["local", "--nodes", str(spec.nodes), "--nproc", str(spec.nproc), "--steps", str(spec.steps),
            "--checkpoint-interval", str(spec.interval), "--faults", "exception@8:0",
            "--run-dir", str(run_dir)]  # fmt: skip
    with exclusive_trainer_runs(tmp_path_factory):
        first = subprocess.Popen(
            [*CLI, *argv, "--port", str(port_pair())],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and first.poll() is None and not load_run(run_dir).of("step_end"):
                time.sleep(0.2)
            assert first.poll() is None, "the run ended before a second one could meet it"
            second = subprocess.run(
                [*CLI, *argv, "--resume", "--port", str(port_pair())], capture_output=True, text=True, cwd=REPO
            )
            out, err = first.communicate(timeout=600)
        finally:
            first.kill()
            first.wait()
    assert first.returncode == 0, out[-3000:] + err[-3000:]

    # The second run: refused in one line naming the holder, exit 2; nothing of it in the run.
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert "is in use by another run (nvrx-eks local, pid" in second.stderr and "Traceback" not in second.stderr
    assert len(load_run(run_dir).of("run_start")) == spec.nodes * spec.nproc  # the first run's ranks alone
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["state_sha256"] == clean["state_sha256"]

    assert "\x1b" not in out, "a pipe gets no spinner and no colour codes"
    lines = out.splitlines()

    def at(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.fullmatch(CLOCK + pattern, line)]
        assert len(found) == 1, f"{pattern!r} printed {len(found)} times:\n{out}"
        return found[0]

    steps = spec.steps
    fault = at(r"step 8  fault exception@8:0 injected")
    began = at(r"step 8  restart \(in-process\) began: .*injected.*")
    resumed = at(r"step 8  resumed from step 0 \(in-process, \d+\.\d s\)")
    commit = at(r"step \d+  checkpoint step 10 committed")
    ended = at(rf"step {steps}  run completed at step {steps}, loss \d+\.\d{{3}}")
    assert fault < began < resumed < commit < ended, out
    assert any(re.fullmatch(rf"step \d+/{steps}  loss \d+\.\d{{3}}", line) for line in lines[:fault]), out

    assert lines[-1] == f"where the time went: nvrx-eks report {run_dir}"
    report_argv = shlex.split(lines[-1].split(": ", 1)[1])
    assert report_argv[:2] == ["nvrx-eks", "report"]
    report = subprocess.run([*CLI, *report_argv[1:]], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert "exception@8:0" in report.stdout, report.stdout
