"""The rendered container entrypoint, run for real by /bin/sh with stand-ins for `python` and
`ft_launcher` on PATH: exit codes reach Kubernetes as the failure policies expect, and SIGTERM
delivered to the process group (what the image's `tini -g` does) reaches ft_launcher once."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from infra.config import resolve_config
from scripts.jobspec import build_jobspec
from scripts.render import render_job

FAKE_PYTHON = """\
#!/bin/sh
# `python -c <dns wait> HOST` and `python -m workloads.train ... --preflight`
case " $* " in
  *" --preflight "*) exit "${PREFLIGHT_EXIT:-0}" ;;
  *) echo "$@" | grep -q getaddrinfo && exit "${DNS_EXIT:-0}"; exit 0 ;;
esac
"""

FAKE_LAUNCHER = """\
#!/bin/sh
echo "$@" > "$WORK/launcher-args"
trap 'echo term >> "$WORK/launcher-signals"; sleep 0.3; exit 143' TERM
if [ -n "${LAUNCHER_SLEEP:-}" ]; then
  touch "$WORK/launcher-started"
  i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
fi
exit "${LAUNCHER_EXIT:-0}"
"""


def _entrypoint(api: str) -> str:
    job = render_job(build_jobspec(resolve_config(), nodes=2, name="train", api=api)).job_document
    if api == "jobset":
        pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    else:
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    args = pod["spec"]["containers"][0]["args"]
    assert args[:2] == ["/bin/sh", "-c"]
    return args[2]


@pytest.fixture
def sandbox(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python", FAKE_PYTHON), ("ft_launcher", FAKE_LAUNCHER)):
        path = bin_dir / name
        path.write_text(textwrap.dedent(body))
        path.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "WORK": str(tmp_path)}
    return tmp_path, env


def _run(script: str, env: dict, **extra) -> int:
    return subprocess.run(["/bin/sh", "-c", script], env={**env, **extra}, timeout=30).returncode


@pytest.mark.parametrize(
    "extra, jobset_exit, pytorchjob_exit",
    [
        ({}, 0, 0),
        ({"PREFLIGHT_EXIT": "93"}, 93, 93),  # unfixable: both fail the job for good
        ({"LAUNCHER_EXIT": "93"}, 93, 93),
        ({"LAUNCHER_EXIT": "1"}, 1, 138),  # launcher gave up: retryable for the training operator
        ({"PREFLIGHT_EXIT": "2"}, 2, 138),
        ({"DNS_EXIT": "1"}, 1, 138),  # rendezvous name never resolved
        ({"LAUNCHER_EXIT": "137"}, 137, 137),
    ],
)
def test_exit_codes_reach_kubernetes_as_the_failure_policies_expect(sandbox, extra, jobset_exit, pytorchjob_exit):
    _, env = sandbox
    assert _run(_entrypoint("jobset"), env, **extra) == jobset_exit
    assert _run(_entrypoint("pytorchjob"), env, **extra) == pytorchjob_exit


def test_launcher_gets_the_rendered_arguments(sandbox):
    work, env = sandbox
    assert _run(_entrypoint("jobset"), env) == 0
    args = (work / "launcher-args").read_text().split()
    assert args[args.index("--rdzv-endpoint") + 1] == "train-worker-0-0.train:29500"


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_sigterm_to_the_group_reaches_the_launcher_once(sandbox, api):
    work, env = sandbox
    process = subprocess.Popen(
        ["/bin/sh", "-c", _entrypoint(api)], env={**env, "LAUNCHER_SLEEP": "1"}, start_new_session=True
    )
    deadline = time.monotonic() + 20
    while not (work / "launcher-started").exists():
        assert time.monotonic() < deadline, "the launcher did not start"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGTERM)  # tini -g signals the whole process group
    assert process.wait(timeout=20) == 143
    # Exactly one SIGTERM: a second one would cut ft_launcher's graceful shutdown short.
    assert (work / "launcher-signals").read_text().splitlines() == ["term"]


@pytest.mark.parametrize("nodes", [1, 4])
def test_fabric_test_script_parses_under_bash(nodes):
    job = render_job(build_jobspec(resolve_config(), nodes=nodes, name="nccl-test", workload="nccl-test")).job_document
    container = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/bash", "-c")
    checked = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
