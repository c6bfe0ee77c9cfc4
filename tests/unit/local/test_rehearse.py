"""`nvrx-eks rehearse` without a container runtime: the JobSet and PyTorchJob controllers' part
(restarts, exit 93, disruptions, spares), the pod faults, the rendered pod's translation into
podman's arguments, and the execution loop against scripted pods. The pods in podman, from the CPU
twin of the trainer image: tests/runs/local/test_rehearse.py.
"""

from __future__ import annotations

import io
import json
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_LABEL
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.rehearse import pods, runner
from nvrx_eks.rehearse.jobset import JobState, jobset_action
from nvrx_eks.rehearse.pods import NodeDirs, PodIdentity, create_argv
from nvrx_eks.rehearse.runner import execute, split_faults
from nvrx_eks.rehearse.runtime import CONTAINERD_SECCOMP


def _jobset(**kwargs) -> dict:
    return render_job(build_jobspec(resolve_config("p5"), nodes=2, name="train", **kwargs)).job_document


def _job_spec(**kwargs) -> dict:
    return _jobset(**kwargs)["spec"]["replicatedJobs"][0]["template"]["spec"]


# --- the controllers, from the rendered JobSet -------------------------------------------------


def test_exit_93_fails_the_jobset_and_other_failures_restart_it_up_to_max_restarts():
    jobset = _jobset()
    job = JobState(_job_spec())
    job.pod_ended(1, EXIT_DO_NOT_REQUEUE)
    assert jobset_action(jobset["spec"], job.failure_reason, 0, job.failure_message) == "fail"
    job = JobState(_job_spec())
    job.pod_ended(0, 137)
    max_restarts = jobset["spec"]["failurePolicy"]["maxRestarts"]
    assert [jobset_action(jobset["spec"], job.failure_reason, n) for n in range(max_restarts + 1)] == [
        "restart"
    ] * max_restarts + ["fail"]
    job = JobState(_job_spec())
    job.pod_ended(0, 0)
    assert not job.succeeded_job and job.failure_reason is None
    job.pod_ended(1, 0)
    assert job.succeeded_job


def test_a_pod_the_cluster_disrupted_restarts_the_jobset_without_counting():
    """A preemption or eviction (condition DisruptionTarget) fails the Job through its pod failure
    policy, and the JobSet recreates every pod past maxRestarts: interruptions are not failures.
    The same pod killed without the condition (OOM, a crash) counts."""
    jobset = _jobset()
    max_restarts = jobset["spec"]["failurePolicy"]["maxRestarts"]
    job = JobState(_job_spec())
    job.pod_ended(1, 143, disrupted=True, pod="train-worker-0-1")
    assert job.failure_message == (
        "Pod training/train-worker-0-1 has condition DisruptionTarget matching FailJob rule at index 1"
    )
    assert jobset_action(jobset["spec"], job.failure_reason, max_restarts, job.failure_message) == "restart-uncounted"
    job = JobState(_job_spec())
    job.pod_ended(1, 137)
    assert jobset_action(jobset["spec"], job.failure_reason, max_restarts, job.failure_message) == "fail"


def test_with_a_spare_a_failed_pod_fails_only_its_index():
    job = JobState(_job_spec(spare_nodes=1))
    job.pod_ended(1, 1)
    assert job.failure_reason is None  # the spare takes over; no pod is replaced
    job.pod_ended(0, 0)
    job.pod_ended(2, 0)
    assert job.succeeded_job  # the active nodes' pods succeeded
    job.pod_ended(0, 1)
    job = JobState(_job_spec(spare_nodes=1))
    job.pod_ended(0, 1)
    job.pod_ended(2, 1)
    assert job.failure_reason == "FailedIndexes"


def test_pod_faults_are_split_from_the_trainers_and_checked():
    faults, trainer = split_faults("exception@9:1,pod-stop@17:1,pod-kill@29:0", 2)
    assert [f.label for f in faults] == ["pod-stop@17:1", "pod-kill@29:0"] and trainer == "exception@9:1"
    with pytest.raises(ConfigError, match="names node 2"):
        split_faults("pod-kill@5:2", 2)
    with pytest.raises(ConfigError, match="pod-stop@STEP:NODE"):
        split_faults("pod-stop@x", 2)


# --- one rendered pod, as podman runs it -------------------------------------------------------


def test_the_pod_runs_with_its_own_args_env_security_context_and_mounts(tmp_path):
    jobset = _jobset()
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    (container,) = template["spec"]["containers"]
    pod = PodIdentity("train", 1, 2, "uid0", "rehearsal-node-1")
    dirs = NodeDirs(tmp_path / "fsx", tmp_path / "node-1", tmp_path / "configmaps")
    argv = create_argv(
        template,
        "trainer",
        pod,
        image="twin:1",
        hosts=[("a.train", "127.0.10.1"), ("b.train", "127.0.10.2")],
        dirs=dirs,
        claim="fsx-lustre",
        run_label="r",
    )
    image_at = argv.index("twin:1")
    assert argv[image_at + 1 :] == container["args"]  # verbatim, after the image's tini entrypoint
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--cap-drop", "ALL") in pairs and ("--cap-add", "IPC_LOCK") in pairs
    assert ("--security-opt", f"seccomp={CONTAINERD_SECCOMP}") in pairs
    assert ("--security-opt", "no-new-privileges") in pairs
    assert ("--stop-timeout", str(template["spec"]["terminationGracePeriodSeconds"])) in pairs
    assert ("--hostname", "train-worker-0-1") in pairs and ("--network", "host") in pairs
    env = dict(a.split("=", 1) for f, a in pairs if f == "--env")
    rendered = {e["name"] for e in container["env"]}
    assert rendered <= set(env)
    assert env["NVRX_EKS_ATTEMPT_ID"] == "uid0-2"  # $(JOBSET_UID)-$(JOBSET_RESTART_ATTEMPT), expanded
    assert env["POD_NAME"] == pod.pod_name and env["JOBSET_RESTART_ATTEMPT"] == "2"
    mounts = {a.split(":")[1]: a for f, a in pairs if f == "--volume"}
    assert set(mounts) | {"/dev/shm"} == {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["/etc/nvrx-eks"].endswith(":ro")
    assert mounts["/local-checkpoints"].startswith(f"{dirs.node_root}/mnt/k8s-disks/0/nvrx-eks-checkpoints/train:")
    assert pod.labels[JOBSET_RESTART_ATTEMPT_LABEL] == "2"


def test_kubernetes_env_expansion():
    assert pods.expand("$(A)-$(B)-$$(A)-$(C)", {"A": "1", "B": "2"}) == "1-2-$(A)-$(C)"


# --- the runner's loop, against a scripted container runtime ---------------------------------


class ScriptedPods:
    """The few podman calls `execute` makes, answered from a script: the worker pods step through
    `steps` (rank 0 writing a step_end each time a pod's state is read), then exit 0, or exit
    `fails[(attempt, index)] = (step, code)` at that step; a kill ends a pod with 137 and a stop
    (a pod deleted) with 143. `interrupt_at`: (attempt, step) at which Ctrl-C arrives;
    `interrupt_creating`: the pod whose creation Ctrl-C interrupts."""

    def __init__(self, trainer_dir: Path, steps: int, fails=None, interrupt_at=None, interrupt_creating=None):
        self.trainer_dir, self.steps = trainer_dir, steps
        self.fails, self.interrupt_at, self.interrupt_creating = fails or {}, interrupt_at, interrupt_creating
        self.created: list[str] = []
        self.exited: dict[str, int] = {}
        self.removed: set[str] = set()
        self.removals: list[str] = []  # every name each `rm` named, in order
        self.reached: dict[int, int] = {}  # attempt -> rank 0's last step
        self.t = 1000.0

    def run(self, argv, check=True, **kwargs):
        if argv[0] == "create":
            if argv[2] == self.interrupt_creating:
                raise KeyboardInterrupt
            self.created.append(argv[2])
        if argv[0] == "rm":
            self.removed.update(argv[2:])
            self.removals.extend(argv[2:])
        return subprocess.CompletedProcess(argv, 0, f"log of {argv[-1]}\n", "")

    def popen(self, argv, **kwargs):
        name = argv[-1]
        if name not in self.exited:
            self.exited[name] = 137 if argv[0] == "kill" else 143
        return subprocess.Popen(["true"])

    def exit_code(self, name):
        if name in self.exited or "coordinator" in name:
            return self.exited.get(name)
        index, attempt = (int(x) for x in re.fullmatch(r"train-worker-0-(\d+)-a(\d+)", name).groups())
        if index == 0:
            self._step(attempt)
        step = self.reached.get(attempt, 0)
        fail = self.fails.get((attempt, index))
        if fail is not None and step >= fail[0]:
            self.exited[name] = fail[1]
        elif step >= self.steps:
            self.exited[name] = 0
        return self.exited.get(name)

    def _step(self, attempt):
        step = self.reached.get(attempt, 0) + 1
        if step > self.steps:
            return
        if self.interrupt_at == (attempt, step):
            raise KeyboardInterrupt
        self.reached[attempt] = step
        self.t += 1.0
        event = {"v": 1, "t": self.t, "event": "step_end", "rank": 0, "pid": 10 + attempt, "cycle": 0,
                 "iteration": 0, "attempt": attempt, "step": step, "step_s": 0.5, "loss": 1.0}  # fmt: skip
        (self.trainer_dir / "events").mkdir(parents=True, exist_ok=True)
        with (self.trainer_dir / "events" / "rank0.jsonl").open("a") as f:
            f.write(json.dumps(event) + "\n")

    def remove_labelled(self, label):
        return [n for n in self.created if n not in self.removed]


def _scripted_rehearsal(tmp_path: Path, faults: str, monkeypatch, **script):
    """A Prepared around the rendered p5 JobSet, whose pods the script runs; pod 0's rendezvous
    port listens (a socket of the test's)."""
    monkeypatch.setattr(runner, "POLL_S", 0.0)
    listener = socket.create_server(("127.0.0.1", 0))
    trainer_dir = tmp_path / "fsx" / "runs" / "train"
    engine = ScriptedPods(trainer_dir, **script)
    out = io.StringIO()
    run = runner.Rehearsal(engine, tmp_path, _jobset(), "twin:test", Console(file=out, width=200))
    pod_faults, _ = split_faults(faults, 2)
    prepared = runner.Prepared(run, trainer_dir, listener.getsockname()[1], 1, pod_faults)
    return prepared, engine, out, listener


def test_execute_restarts_the_jobset_as_its_controllers_would_and_fires_each_pod_fault(tmp_path, monkeypatch):
    prepared, engine, out, listener = _scripted_rehearsal(tmp_path, "pod-kill@3:1,pod-stop@5:0", monkeypatch, steps=8)
    with listener:
        assert execute(prepared) == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith("rehearse:")]
    assert lines == [
        "rehearse: pod-kill@3:1 (train-worker-0-1-a0)",
        "rehearse: pod train-worker-0-1-a0 exited 137",
        "rehearse: the Job failed (BackoffLimitExceeded); JobSet restart 1",
        "rehearse: pod-stop@5:0 (train-worker-0-0-a1)",
        "rehearse: pod train-worker-0-0-a1 exited 143",
        "rehearse: the Job failed (PodFailurePolicy); JobSet restart 2 (not counted: the pod was disrupted)",
        "rehearse: pod train-worker-0-0-a2 exited 0",
        "rehearse: pod train-worker-0-1-a2 exited 0",
    ]
    record = json.loads((tmp_path / "rehearsal.json").read_text())
    assert {k: record[k] for k in ("exit_code", "attempts", "job_failure_reason", "pods", "image")} == {
        "exit_code": 0,
        "attempts": 3,
        "job_failure_reason": None,
        "pods": 2,
        "image": "twin:test",
    }
    assert (record["pod_faults"], record["pod_faults_not_fired"]) == (["pod-kill@3:1", "pod-stop@5:0"], [])
    assert record["leftover_containers"] == [] and set(engine.created) == engine.removed  # every pod deleted
    assert {p.name for p in (tmp_path / "pod-logs").iterdir()} == {f"{name}.log" for name in engine.created}
    faults = [json.loads(line) for line in (prepared.trainer_dir / "events" / "pods.jsonl").read_text().splitlines()]
    assert [(f["kind"], f["step"], f["node"], f["attempt"]) for f in faults] == [
        ("pod-kill", 3, 1, 0),
        ("pod-stop", 5, 0, 1),
    ]


def test_execute_ends_on_a_do_not_requeue_exit_and_names_the_faults_it_did_not_fire(tmp_path, monkeypatch):
    prepared, engine, out, listener = _scripted_rehearsal(
        tmp_path, "pod-kill@20:1", monkeypatch, steps=30, fails={(0, 1): (4, EXIT_DO_NOT_REQUEUE)}
    )
    with listener:
        assert execute(prepared) == EXIT_DO_NOT_REQUEUE
    text = " ".join(out.getvalue().split())
    assert "rehearse: pod faults not fired (the run ended first): pod-kill@20:1" in text
    record = json.loads((tmp_path / "rehearsal.json").read_text())
    assert (record["attempts"], record["job_failure_reason"]) == (1, "PodFailurePolicy")
    assert record["pod_faults_not_fired"] == ["pod-kill@20:1"]
    assert set(engine.created) == engine.removed


def test_execute_deletes_the_pods_when_interrupted(tmp_path, monkeypatch):
    prepared, engine, out, listener = _scripted_rehearsal(tmp_path, "", monkeypatch, steps=10, interrupt_at=(0, 3))
    with listener:
        assert execute(prepared) == 128 + signal.SIGINT
    assert "rehearse: stopping: deleting the pods" in out.getvalue()
    assert set(engine.created) == engine.removed
    assert json.loads((tmp_path / "rehearsal.json").read_text())["attempts"] == 1


def test_a_ctrl_c_while_the_next_attempt_starts_deletes_each_pod_once(tmp_path, monkeypatch):
    """The first attempt's pods, its coordinator included, are gone once it ended; an interrupt
    while the restart creates its pods must not delete that coordinator again (its saved log would
    be overwritten by the runtime's "no such container")."""
    prepared, engine, out, listener = _scripted_rehearsal(
        tmp_path, "pod-kill@3:1", monkeypatch, steps=8, interrupt_creating="train-coordinator-0-0-a1"
    )
    with listener:
        assert execute(prepared) == 128 + signal.SIGINT
    assert "rehearse: stopping: deleting the pods" in out.getvalue()
    assert sorted(engine.removals) == sorted(set(engine.removals)), engine.removals
    assert set(engine.created) <= engine.removed


# --- in podman ---------------------------------------------------------------------------------
