"""`nvrx-eks rehearse`: the rendered JobSet's pods run in podman, under their own security context
and containerd's RuntimeDefault seccomp profile, from the CPU twin of the trainer image.

Without podman (or where it cannot run) the tests that need it skip with one line saying why;
`make setup` installs it where it can (as root with apt). The JobSet semantics and the pod's
translation into podman's arguments are tested without it.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_LABEL
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.rehearse import pods, runner
from nvrx_eks.rehearse.jobset import JobState, jobset_action
from nvrx_eks.rehearse.pods import SUBSTITUTIONS, NodeDirs, PodIdentity, create_argv
from nvrx_eks.rehearse.runner import execute, prepare, split_faults
from nvrx_eks.rehearse.runtime import CONTAINERD_SECCOMP, REHEARSAL_LABEL, Podman
from tests.support.named_runs import named_summary
from tests.support.trainer_fixtures import exclusive_trainer_runs


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


@pytest.fixture(scope="session")
def podman() -> Podman:
    engine = Podman()
    if reason := engine.unusable():
        pytest.skip(f"no container runtime for rehearsals: {reason}")
    return engine


def _prepare(tmp_path: Path, podman: Podman, **kwargs) -> object:
    options = {"profile": None, "nodes": 2, "nproc": 1, "steps": 30, "faults": "", "run_dir": tmp_path / "r"}
    return prepare(**{**options, **kwargs}, console=Console(file=io.StringIO()), podman=podman)


def _inspect_container_of(prepared, podman: Podman) -> dict:
    name = prepared.run.create(0, 0)
    try:
        return podman.inspect(name)
    finally:
        podman.run(["rm", "-f", name], check=False)


def _rendered_pod(root: Path) -> dict:
    jobset = next(d for d in yaml.safe_load_all((root / "rendered.yaml").read_text()) if d and d["kind"] == "JobSet")
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def _differences(rendered: dict, inspected: dict, image_env: set[str]) -> set[str]:
    """What of the rendered pod's container the created container does not carry as written, by
    SUBSTITUTIONS key; anything else is named by its field."""
    (container,) = rendered["spec"]["containers"]
    found: set[str] = set()
    if inspected["ImageName"] != container["image"]:
        found.add("image")
    ran_args = inspected["Config"]["Cmd"]
    if ran_args != container["args"]:
        # Only the rank count may differ: --nproc-per-node and --world-size.
        normalize = lambda s: re.sub(r"(--nproc-per-node|--world-size) \d+", r"\1 N", s)  # noqa: E731
        assert [normalize(a) for a in ran_args] == [normalize(a) for a in container["args"]], "args"
        found.add("ranks per node")
    ran_env = dict(e.split("=", 1) for e in inspected["Config"]["Env"])
    for var in container["env"]:
        if "value" in var and "$(" not in var["value"] and ran_env.get(var["name"]) != var["value"]:
            found.add(f"env {var['name']}")
    rendered_names = {v["name"] for v in container["env"]}
    kubelet_added = {"JOB_COMPLETION_INDEX", "HOSTNAME", "container", "TERM", "HOME"}
    for name in set(ran_env) - rendered_names - image_env - kubelet_added:
        found.add(f"env {name}")
    host_config = inspected["HostConfig"]
    caps = container["securityContext"]["capabilities"]
    assert set(host_config["CapAdd"] or []) == {f"CAP_{c}" for c in caps["add"]}, "capabilities"
    assert f"seccomp={CONTAINERD_SECCOMP}" in " ".join(host_config["SecurityOpt"]), "seccomp"
    assert "no-new-privileges" in " ".join(host_config["SecurityOpt"]), "allowPrivilegeEscalation"
    if host_config["NetworkMode"] == "host":
        found.add("network")
    if not host_config.get("Devices"):
        found.add("resources")
    mounted = {m["Destination"] for m in inspected["Mounts"]} | set(host_config.get("Tmpfs") or {})
    assert mounted == {m["mountPath"] for m in container["volumeMounts"]}, "volume mounts"
    assert inspected["Config"]["Hostname"] == "train-worker-0-0"
    assert inspected["Config"]["StopTimeout"] == rendered["spec"]["terminationGracePeriodSeconds"]
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_the_rehearsed_pod_differs_from_the_rendered_one_only_by_the_substitutions(tmp_path, podman):
    prepared = _prepare(tmp_path, podman)
    inspected = _inspect_container_of(prepared, podman)
    image = json.loads(podman.run(["image", "inspect", prepared.run.image]).stdout)[0]
    image_env = {e.split("=", 1)[0] for e in image["Config"]["Env"]}
    assert _differences(_rendered_pod(prepared.run.root), inspected, image_env) == set(SUBSTITUTIONS)


def _no_container_left(podman: Podman) -> None:
    left = podman.run(["ps", "-a", "--filter", f"label={REHEARSAL_LABEL}", "--format", "{{.Names}}"]).stdout
    assert left.split() == []


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_rehearsals_of_the_p5_pods_end_as_the_bare_process_run_does(tmp_path, tmp_path_factory, podman):
    """Acceptance: a rehearsal with a trainer fault, a deleted pod and a killed pod ends with the
    state of `nvrx-eks local` on the same world (its clean run); each fault is recovered by its
    layer; the p5 pod's ranks start under containerd's profile (they bind to their NUMA node
    themselves); no container is left."""
    expected = named_summary(tmp_path_factory, "clean-2x1-40")["state_sha256"]
    with exclusive_trainer_runs(tmp_path_factory):
        # 40 steps: past the pod-kill's step 25 the run still has 15 steps (about 1.5 s), time
        # for the runner's poll to see it before the run ends.
        faults = "exception@9:1,pod-stop@15:1,pod-kill@25:0"
        faulted = _prepare(tmp_path / "faults", podman, steps=40, faults=faults)
        assert execute(faulted) == 0
    _no_container_left(podman)
    log = (faulted.run.root / "pod-logs" / "train-worker-0-0-a0.log").read_text()
    assert "numa: local rank 0 bound to NUMA node 0" in log
    summary = json.loads((faulted.trainer_dir / "summary.json").read_text())
    assert summary["state_sha256"] == expected
    layers = {f["fault"]: f.get("layer") for f in summary["faults"]}
    assert layers == {"exception@9:1": "inprocess", "pod-stop@15:1": "kubernetes", "pod-kill@25:0": "kubernetes"}
    record = json.loads((faulted.run.root / "rehearsal.json").read_text())
    assert record["attempts"] == 3 and record["pod_faults_not_fired"] == []


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_ft_launchers_numactl_binding_cannot_start_a_rank_under_the_pods_seccomp_profile(
    tmp_path, tmp_path_factory, podman
):
    """The render before the fix set NVRX_GPUS_PER_NUMA: ft_launcher then starts each rank as
    `numactl --cpunodebind N --membind N`, which containerd's RuntimeDefault refuses without
    CAP_SYS_NICE. The same pod with that variable fails, numactl's EPERM in its log. One pod,
    and no launcher restarts: the first start of its rank shows it."""
    prepared = _prepare(tmp_path, podman, steps=5, nodes=1, overrides=["fault_tolerance.max_restarts=0"])
    container = prepared.run.pod_template["spec"]["containers"][0]
    container["env"].append({"name": "NVRX_GPUS_PER_NUMA", "value": "4"})
    prepared.run.jobset["spec"]["failurePolicy"]["maxRestarts"] = 0
    with exclusive_trainer_runs(tmp_path_factory):
        assert execute(prepared) != 0
    log = (prepared.run.root / "pod-logs" / "train-worker-0-0-a0.log").read_text()
    assert "Operation not permitted" in log and "membind" in log
    assert not os.path.exists(prepared.trainer_dir / "summary.json")
    _no_container_left(podman)
