"""The rendered container entrypoint, run for real by /bin/sh with stand-ins for `python` and
`ft_launcher` on PATH (tests/support/entrypoint_sandbox.py): exit codes reach Kubernetes as the
failure policies expect, the two APIs' entrypoints differ only in their exit mapping and
rendezvous host, a do-not-requeue record of this attempt makes the pod exit 93, and SIGTERM
delivered as the image's tini delivers it reaches ft_launcher once. With the real ft_launcher
and ranks: tests/runs/jobs/test_entrypoint_real_launcher.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from tests.support import REPO_ROOT
from tests.support.entrypoint_sandbox import (
    deliver_sigterm_like_tini,
    entrypoint,
    stale_records,
    trainer_pod,
)
from workloads import do_not_requeue


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
    assert _run(entrypoint("jobset"), env, **extra) == jobset_exit
    assert _run(entrypoint("pytorchjob"), env, **extra) == pytorchjob_exit


def test_launcher_gets_the_rendered_arguments(sandbox):
    work, env = sandbox
    assert _run(entrypoint("jobset"), env) == 0
    args = (work / "launcher-args").read_text().split()
    assert args[args.index("--rdzv-endpoint") + 1] == "train-coordinator-0-0.train:29500"


def _rendezvous_host(script: str) -> str:
    words = script.split()
    return words[words.index("--rdzv-endpoint") + 1].rsplit(":", 1)[0]


def test_the_two_entrypoints_differ_only_in_their_exit_mapping_and_rendezvous_host():
    """What the tests with the real ft_launcher (tests/runs/jobs/test_entrypoint_real_launcher.py)
    hold for the JobSet entrypoint (signal forwarding, the rank-monitor server outliving SIGTERM,
    the do-not-requeue record read after the launcher) holds for the PyTorchJob one: the same
    script apart from `finish`, whose mapping of each launcher status the stand-in launcher tests
    check for both. A change that makes them differ elsewhere fails here; then run those tests
    under both APIs again."""
    jobset, pytorchjob = entrypoint("jobset"), entrypoint("pytorchjob")

    def after_finish(script: str) -> str:
        # `finish` is the first definition; the first command after it is the DNS wait.
        return script[script.index("\n# The coordinator's DNS record") :]

    assert 'finish() { exit "$1"; }' in jobset.split("\n# The coordinator's DNS record")[0]
    host, other = _rendezvous_host(jobset), _rendezvous_host(pytorchjob)
    assert after_finish(pytorchjob).replace(other, host) == after_finish(jobset)


#: A launcher whose rank recorded "do not requeue" for this attempt on the run dir, then exits
#: as ft_launcher does after the workload's shutdown (1 on the rank's node, 0 on the others).
RECORDING_LAUNCHER = """\
#!/bin/sh
"$REAL_PYTHON" -c '
import sys
from workloads import do_not_requeue
do_not_requeue.write_record(sys.argv[1], do_not_requeue.attempt_id(), rank=0,
                            reason="checkpoint.dir /x is read-only; make it writable")
' "$WORK/run"
exit "$LAUNCHER_EXIT"
"""


def _entrypoint_on_run_dir(work: Path, env: dict, api: str, **extra: str) -> subprocess.CompletedProcess:
    script = entrypoint(api).replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
    env = {**env, "PYTHONPATH": str(REPO_ROOT), "NVRX_EKS_ATTEMPT_ID": "uid-1-0", **extra}
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
@pytest.mark.parametrize("launcher_exit", ["1", "0"])
def test_this_attempts_record_on_the_run_dir_makes_the_pod_exit_93(sandbox, api, launcher_exit):
    """Whatever the launcher exits with after a rank stopped the job (1 on its node, 0 on the
    others), a record of this attempt on the run dir makes the pod exit 93 and say why, once."""
    work, env = sandbox
    (work / "bin" / "ft_launcher").write_text(RECORDING_LAUNCHER)
    done = _entrypoint_on_run_dir(work, env, api, LAUNCHER_EXIT=launcher_exit)
    assert done.returncode == 93, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("nvrx-eks: do not requeue")]
    assert lines == ["nvrx-eks: do not requeue (rank 0): checkpoint.dir /x is read-only; make it writable"]


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("api, expected", [("jobset", 1), ("pytorchjob", 138)])
def test_a_launcher_failure_without_this_attempts_record_keeps_its_exit_status(sandbox, api, expected, stale):
    """The launcher exits 1 as ft_launcher does once its failing rank used up the restarts (the
    real one does so in tests/runs/jobs/test_entrypoint_real_launcher.py): JobSet, its own code;
    PyTorchJob, retryable 138. Records of other attempts change nothing."""
    work, env = sandbox
    if stale:
        stale_records(work / "run", "uid-1-0")
    done = _entrypoint_on_run_dir(work, env, api, LAUNCHER_EXIT="1")
    assert done.returncode == expected, done.stderr
    assert "do not requeue" not in done.stdout + done.stderr


#: A launcher whose rank stops the job (workloads.train._stop_the_job) while the run dir refuses
#: writes, then exits 1 as ft_launcher does after the shutdown request.
STOPPING_LAUNCHER = """\
#!/bin/sh
"$REAL_PYTHON" -c '
import sys
from workloads import do_not_requeue
do_not_requeue.write_record(sys.argv[1], do_not_requeue.attempt_id(), rank=0,
                            reason="cannot continue: checkpoint.dir /x is read-only")
' "$WORK/run"
exit 1
"""


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_a_record_the_run_dir_refuses_reaches_the_entrypoint_through_the_pods_shm(sandbox, api):
    """A run dir made read-only (the reason the rank stops): the record goes to the fallback the
    pod names, a directory on its own memory emptyDir, where the entrypoint finds it: exit 93, not
    the launcher's 1 (JobSet: retried up to maxRestarts; PyTorchJob: 138, retried)."""
    work, env = sandbox
    pod = trainer_pod(api)
    container = pod["containers"][0]
    pod_env = {var["name"]: var.get("value") for var in container["env"]}
    fallback = pod_env[do_not_requeue.FALLBACK_DIR_ENV]
    [shm] = [m for m in container["volumeMounts"] if fallback.startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == shm["name"]]
    assert "emptyDir" in volume and not shm.get("readOnly")  # the pod's own, writable
    (work / "run").mkdir()
    (work / "run" / do_not_requeue.RECORD_DIR).write_text("")  # writes there fail, as on a read-only dir
    (work / "bin" / "ft_launcher").write_text(STOPPING_LAUNCHER)
    script = entrypoint(api).replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
    local_shm = str(work / "shm" / Path(fallback).name)
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        env={**env, "PYTHONPATH": str(REPO_ROOT), "NVRX_EKS_ATTEMPT_ID": "uid-1-0",
             do_not_requeue.FALLBACK_DIR_ENV: local_shm},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 93, done.stderr
    assert "nvrx-eks: do not requeue (rank 0): cannot continue: checkpoint.dir /x is read-only" in done.stderr
    assert list(Path(local_shm).iterdir())  # the record is there, not in the run dir


@pytest.mark.parametrize("nodes", [1, 4])
def test_fabric_test_script_parses_under_bash(nodes):
    job = render_job(build_jobspec(resolve_config(), nodes=nodes, name="nccl-test", workload="nccl-test")).job_document
    container = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/bash", "-c")
    checked = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


# --- SIGTERM as the image's tini delivers it, with the real ft_launcher ------------------------


def _with_launcher_started(work: Path, argv: list[str], env: dict) -> subprocess.Popen:
    """The entrypoint, once the stand-in launcher has started."""
    process = subprocess.Popen(argv, env=env, start_new_session=True)
    deadline = time.monotonic() + 20
    while not (work / "launcher-started").exists():
        assert time.monotonic() < deadline, "the launcher did not start"
        time.sleep(0.02)
    return process


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_sigterm_as_tini_delivers_it_reaches_the_launcher_once(sandbox, api):
    work, env = sandbox
    process = _with_launcher_started(work, ["/bin/sh", "-c", entrypoint(api)], {**env, "LAUNCHER_SLEEP": "1"})
    deliver_sigterm_like_tini(process)
    assert process.wait(timeout=20) == 143
    assert (work / "launcher-signals").read_text().splitlines() == ["term"]


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
@pytest.mark.parametrize("launcher_exit", ["1", "0"])
def test_a_launcher_exit_after_the_forwarded_sigterm_makes_the_pod_exit_143(sandbox, api, launcher_exit):
    """ft_launcher exits 1 after forwarding a SIGTERM even when its ranks honoured it with 143, and
    0 when it counts their exits as graceful; the pod was asked to stop, and says so: neither a
    failure nor a finished run."""
    work, env = sandbox
    env = {**env, "LAUNCHER_SLEEP": "1", "LAUNCHER_TERM_EXIT": launcher_exit}
    process = _with_launcher_started(work, ["/bin/sh", "-c", entrypoint(api)], env)
    deliver_sigterm_like_tini(process)
    assert process.wait(timeout=20) == 143
