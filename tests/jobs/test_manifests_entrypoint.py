"""The rendered container entrypoint, run for real by /bin/sh with stand-ins for `python` and
`ft_launcher` on PATH: exit codes reach Kubernetes as the failure policies expect, and SIGTERM
delivered as the image's tini delivers it reaches ft_launcher once and, with the real
ft_launcher, leaves its rank-monitor server up until the rank has finished."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from tests.support import REPO_ROOT
from workloads import do_not_requeue

FAKE_PYTHON = """\
#!/bin/sh
# `python -c <dns wait> HOST` and `python -m workloads.train ... --preflight`; the do-not-requeue
# check is the real one.
case " $* " in
  *" --preflight "*) exit "${PREFLIGHT_EXIT:-0}" ;;
  *" workloads.do_not_requeue "*) exec "$REAL_PYTHON" "$@" ;;
  *) echo "$@" | grep -q getaddrinfo && exit "${DNS_EXIT:-0}"; exit 0 ;;
esac
"""

FAKE_LAUNCHER = """\
#!/bin/sh
echo "$@" > "$WORK/launcher-args"
trap 'echo term >> "$WORK/launcher-signals"; sleep 0.3; exit "${LAUNCHER_TERM_EXIT:-143}"' TERM
if [ -n "${LAUNCHER_SLEEP:-}" ]; then
  touch "$WORK/launcher-started"
  i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
fi
exit "${LAUNCHER_EXIT:-0}"
"""


def _trainer_pod(api: str) -> dict:
    job = render_job(build_jobspec(resolve_config(), nodes=2, name="train", api=api)).job_document
    if api == "jobset":
        return job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def _entrypoint(api: str) -> str:
    args = _trainer_pod(api)["containers"][0]["args"]
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
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "WORK": str(tmp_path), "REAL_PYTHON": sys.executable}
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
    assert args[args.index("--rdzv-endpoint") + 1] == "train-coordinator-0-0.train:29500"


def _rendezvous_host(script: str) -> str:
    words = script.split()
    return words[words.index("--rdzv-endpoint") + 1].rsplit(":", 1)[0]


def test_the_two_entrypoints_differ_only_in_their_exit_mapping_and_rendezvous_host():
    """What the tests with the real ft_launcher below hold for the JobSet entrypoint (signal
    forwarding, the rank-monitor server outliving SIGTERM, the do-not-requeue record read after
    the launcher) holds for the PyTorchJob one: the same script apart from `finish`, whose
    mapping of each launcher status the stand-in launcher tests check for both. A change that
    makes them differ elsewhere fails here; then run those tests under both APIs again."""
    jobset, pytorchjob = _entrypoint("jobset"), _entrypoint("pytorchjob")

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
    script = _entrypoint(api).replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
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


def _stale_records(run_dir: Path, attempt: str) -> None:
    """A record of another attempt, and one of this attempt id but older than the pod (an earlier
    submission under the same name)."""
    do_not_requeue.write_record(run_dir, "uid-0-3", reason="an earlier attempt", rank=0)
    old = do_not_requeue.write_record(run_dir, attempt, reason="earlier", rank=0)
    record = json.loads(old.read_text())
    old.write_text(json.dumps({**record, "time": record["time"] - 3600}))


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("api, expected", [("jobset", 1), ("pytorchjob", 138)])
def test_a_launcher_failure_without_this_attempts_record_keeps_its_exit_status(sandbox, api, expected, stale):
    """The launcher exits 1 as ft_launcher does once its failing rank used up the restarts (the
    real one does so in test_a_failure_without_this_attempts_record_keeps_its_exit_status below):
    JobSet, its own code; PyTorchJob, retryable 138. Records of other attempts change nothing."""
    work, env = sandbox
    if stale:
        _stale_records(work / "run", "uid-1-0")
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
    pod = _trainer_pod(api)
    container = pod["containers"][0]
    pod_env = {var["name"]: var.get("value") for var in container["env"]}
    fallback = pod_env[do_not_requeue.FALLBACK_DIR_ENV]
    [shm] = [m for m in container["volumeMounts"] if fallback.startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == shm["name"]]
    assert "emptyDir" in volume and not shm.get("readOnly")  # the pod's own, writable
    (work / "run").mkdir()
    (work / "run" / do_not_requeue.RECORD_DIR).write_text("")  # writes there fail, as on a read-only dir
    (work / "bin" / "ft_launcher").write_text(STOPPING_LAUNCHER)
    script = _entrypoint(api).replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
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

DOCKERFILE = REPO_ROOT / "workloads" / "Dockerfile"


def _tini_signals_the_group() -> bool:
    """`tini -g` signals the child's whole process group, plain tini the child alone."""
    (line,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    return "-g" in json.loads(line.removeprefix("ENTRYPOINT"))


def _deliver_sigterm_like_tini(process: subprocess.Popen) -> None:
    # The test starts the entrypoint in its own session, as tini's child is: pid == pgid.
    if _tini_signals_the_group():
        os.killpg(process.pid, signal.SIGTERM)
    else:
        os.kill(process.pid, signal.SIGTERM)


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
    process = _with_launcher_started(work, ["/bin/sh", "-c", _entrypoint(api)], {**env, "LAUNCHER_SLEEP": "1"})
    _deliver_sigterm_like_tini(process)
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
    process = _with_launcher_started(work, ["/bin/sh", "-c", _entrypoint(api)], env)
    _deliver_sigterm_like_tini(process)
    assert process.wait(timeout=20) == 143


#: A rank that reports to ft_launcher's rank monitor like the trainer, and on SIGTERM keeps
#: reporting for two seconds (its final checkpoint) before it exits 143.
RANK = """\
import os, signal, sys, time
from pathlib import Path
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

work = Path(os.environ["WORK"])
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
client = RankMonitorClient()
client.init_workload_monitoring()
(work / "rank-started").touch()
while not terms:
    client.send_heartbeat()
    time.sleep(0.1)
try:
    for _ in range(20):
        time.sleep(0.1)
        client.send_heartbeat()
    client.shutdown_workload_monitoring()
except Exception as err:
    (work / "rank-result").write_text(f"lost the rank monitor: {type(err).__name__}: {err}")
    sys.exit(1)
(work / "rank-result").write_text("finished")
sys.exit(143)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_rank_finishes_its_last_checkpoint_when_the_pod_is_terminated(sandbox):
    """The rendered entrypoint with the real ft_launcher (local rendezvous, one CPU rank): SIGTERM
    delivered as the image's tini does must leave ft_launcher's rank-monitor server up while the
    rank finishes. Signalling the whole group (`tini -g`) stops the server first. The JobSet
    entrypoint stands for both (test_the_two_entrypoints_differ_only_in_their_exit_mapping_and_rendezvous_host)."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair
    from workloads.config import TrainConfig
    from workloads.launch import build_ft_launcher_argv

    work, env = sandbox
    (work / "rank.py").write_text(RANK)
    cfg = TrainConfig.from_dict(
        {"run_dir": str(work / "run"), "fault_tolerance": {"monitor": "heartbeat"}}, source="test"
    )
    port = port_pair()
    argv = build_ft_launcher_argv(
        cfg, config_path="unused", nnodes=1, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}",
        launcher=str(Path(sys.executable).parent / "ft_launcher"),
    )  # fmt: skip
    argv = argv[: argv.index("-m")] + [str(work / "rank.py")]
    # The entrypoint's `ft_launcher ...` becomes the real launcher with this local command line.
    (work / "bin" / "ft_launcher").write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    with coordinator_serving(port):
        process = subprocess.Popen(
            ["/bin/sh", "-c", _entrypoint("jobset")],
            env={**env, "PATH": f"{work / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
            stdout=open(work / "launcher.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (work / "rank-started").exists():
                assert process.poll() is None, (work / "launcher.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the rank did not start"
                time.sleep(0.1)
            time.sleep(1.0)  # a few heartbeats in
            _deliver_sigterm_like_tini(process)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    result = (work / "rank-result").read_text() if (work / "rank-result").exists() else "(no result)"
    assert result == "finished", f"{result}\n{(work / 'launcher.log').read_text()[-3000:]}"
    assert process.returncode == 143, (work / "launcher.log").read_text()[-3000:]


# --- A rank's "do not requeue", with the real ft_launcher ----------------------------------------

#: A rank that, when told to, decides like the trainer that no restart can fix the job: it
#: records the decision for its attempt, asks its launcher to shut the workload down, exits 93.
#: Otherwise it fails with 1 (FAIL) or reports heartbeats until it is stopped.
STOPPING_RANK = """\
import os, sys, time
from pathlib import Path
from workloads import do_not_requeue
from workloads.config import FaultToleranceConfig
from workloads.ft_integration import FaultToleranceReporter

work = Path(os.environ["WORK"])
with open(work / "rank-starts", "a") as f:
    f.write(os.environ["GROUP_RANK"] + "\\n")
ft = FaultToleranceReporter(FaultToleranceConfig(monitor="heartbeat"))
if os.environ.get("FAIL") == "1":
    sys.exit(1)
if os.environ.get("STOP") == os.environ["GROUP_RANK"]:
    do_not_requeue.write_record(work / "run", do_not_requeue.attempt_id(), rank=int(os.environ["RANK"]),
                                reason="checkpoint.dir /x is read-only; make it writable")
    ft.request_shutdown("checkpoint.dir /x is read-only")
    os._exit(93)
while True:
    ft.heartbeat()
    time.sleep(0.2)
"""


def _real_launcher_sandbox(
    work: Path, env: dict, api: str, *, nnodes: int = 1, node: int = 0, port: int
) -> tuple[str, dict]:
    """The rendered entrypoint of `api` with the real ft_launcher (local rendezvous, one CPU rank
    per node, no restarts beyond one) running STOPPING_RANK, the run dir under `work`."""
    from workloads.config import TrainConfig
    from workloads.launch import build_ft_launcher_argv

    (work / "rank.py").write_text(STOPPING_RANK)
    cfg = TrainConfig.from_dict(
        {"run_dir": str(work / "run"), "fault_tolerance": {"monitor": "heartbeat", "max_restarts": 1}}, source="test"
    )
    argv = build_ft_launcher_argv(
        cfg, config_path="unused", nnodes=nnodes, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}",
        launcher=str(Path(sys.executable).parent / "ft_launcher"),
    )  # fmt: skip
    argv = argv[: argv.index("-m")] + [str(work / "rank.py")]
    bin_dir = work / f"bin-{node}"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python",):
        (bin_dir / name).write_text((work / "bin" / name).read_text())
        (bin_dir / name).chmod(0o755)
    (bin_dir / "ft_launcher").write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    (bin_dir / "ft_launcher").chmod(0o755)
    script = _entrypoint(api)
    script = script.replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
    env = {**env, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT), "NVRX_EKS_ATTEMPT_ID": "uid-1-0"}  # fmt: skip
    return script, env


def _run_logged(script: str, env: dict, log: Path, **extra) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", script], env={**env, **extra}, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _finish(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_a_rank_that_stops_the_job_makes_the_pod_exit_93_after_one_cycle(sandbox):
    """The JobSet entrypoint stands for both; the PyTorchJob's mapping of the record is
    test_this_attempts_record_on_the_run_dir_makes_the_pod_exit_93."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    script, env = _real_launcher_sandbox(work, env, "jobset", port=port)
    started = time.monotonic()
    with coordinator_serving(port):
        code = _finish(_run_logged(script, env, work / "log", STOP="0"), timeout=120)
    log = (work / "log").read_text(errors="replace")
    assert code == 93, log[-3000:]
    assert time.monotonic() - started < 60, log[-3000:]
    # One launcher cycle: the shutdown request closed the rendezvous instead of a restart.
    assert (work / "rank-starts").read_text().split() == ["0"], log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("nvrx-eks: do not requeue")]
    assert lines == ["nvrx-eks: do not requeue (rank 0): checkpoint.dir /x is read-only; make it writable"]


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_a_failure_without_this_attempts_record_keeps_its_exit_status(sandbox):
    """A rank that fails with 1 until the launcher gives up: the JobSet pod exits with the real
    launcher's status, 1, as before. A record of another attempt, or of this attempt id but older
    than the pod (an earlier submission under the same name), changes nothing. The PyTorchJob's
    mapping of that status (138), and the same without records, are
    test_a_launcher_failure_without_this_attempts_record_keeps_its_exit_status."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    script, env = _real_launcher_sandbox(work, env, "jobset", port=port)
    _stale_records(work / "run", env["NVRX_EKS_ATTEMPT_ID"])
    with coordinator_serving(port):
        code = _finish(_run_logged(script, env, work / "log", FAIL="1"), timeout=120)
    log = (work / "log").read_text(errors="replace")
    assert code == 1, log[-3000:]
    assert "do not requeue" not in log


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_the_node_whose_rank_did_not_fail_exits_93_too(sandbox):
    """Two JobSet pods on one rendezvous (nnodes 2, one rank each): node 1's rank stops the job;
    node 0's launcher sees the closed rendezvous and exits 0 (as a standby node would); its
    entrypoint finds the record on the shared run dir and exits 93 as well."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    processes = []
    with coordinator_serving(port, nnodes=2):
        for node in (0, 1):
            script, node_env = _real_launcher_sandbox(work, env, "jobset", nnodes=2, node=node, port=port)
            # Two launchers on one host: NVRx closes such a rendezvous unless told it is a simulation.
            processes.append(
                _run_logged(script, node_env, work / f"log-{node}", STOP="1", NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE="1")
            )
        codes = [_finish(p, timeout=120) for p in processes]
    logs = [(work / f"log-{node}").read_text(errors="replace") for node in (0, 1)]
    assert codes == [93, 93], "\n=====\n".join(log[-3000:] for log in logs)
    for log in logs:
        assert "nvrx-eks: do not requeue (rank 1): checkpoint.dir /x is read-only" in log
    assert sorted((work / "rank-starts").read_text().split()) == ["0", "1"]
