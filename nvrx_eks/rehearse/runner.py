"""`nvrx-eks rehearse`: the JobSet a profile renders, its pods run in podman on this machine.

The job is rendered and validated as `submit` would (nvrx_eks.jobs.commands.build_spec), with
the ranks per pod and a CPU-sized trainer config as render inputs; every pod then runs in the CPU
twin of the trainer image (nvrx_eks.rehearse.image) with only the substitutions of
nvrx_eks.rehearse.pods. The controllers' part is emulated from the rendered JobSet
(nvrx_eks.rehearse.jobset): a pod ending fails its Job or its index, a failed Job restarts the
JobSet (every pod deleted, with its grace period, and recreated) or fails it. The coordinator's
pod is started first and the others once its rendezvous port listens; its Job failing restarts
the JobSet as the worker Job's does, and the JobSet's end deletes it (as the JobSet controller
deletes a finished JobSet's active Jobs).

Faults at pod level (besides the trainer's own, which go into its config):
    pod-kill@STEP:NODE  the pod's container is killed (SIGKILL): a lost node
    pod-stop@STEP:NODE  the pod is deleted: SIGTERM, SIGKILL after its grace period (preemption)
Each fires once, when rank 0 has ended STEP and the pod the previous one struck has ended, and is
written to the run's events like the trainer's faults, so the report says which layer recovered it.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts import job_names
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.names import FSX_MOUNT_PATH
from nvrx_eks.jobs.commands import build_spec, expectations
from nvrx_eks.jobs.options import JobOptions
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.validate import validate_documents
from nvrx_eks.local.live import LiveView
from nvrx_eks.local.outcome import print_report
from nvrx_eks.local.processes import StopSignals
from nvrx_eks.local.runner import local_config
from nvrx_eks.rehearse.image import build_twin
from nvrx_eks.rehearse.jobset import REASON_BACKOFF_LIMIT, JobState, jobset_action
from nvrx_eks.rehearse.pods import NodeDirs, PodIdentity, create_argv
from nvrx_eks.rehearse.runtime import REHEARSAL_LABEL, Podman
from workloads import do_not_requeue
from workloads.events import SCHEMA_VERSION, events_dir

POD_FAULT_KINDS = ("pod-kill", "pod-stop")
#: How often the runner reads the run's progress and the pods' states: a pod fault fires at the
#: first poll at or after its step, so a few of the tiny preset's steps (about 0.1 s each) late.
POLL_S = 0.2
JOB_NAME = "train"
#: How long pod 0 may take to listen on its rendezvous port before the others start anyway.
RENDEZVOUS_WAIT_S = 120.0


@dataclass(frozen=True)
class PodFault:
    kind: str
    step: int
    node: int

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.step}:{self.node}"


def split_faults(spec: str, launched_nodes: int) -> tuple[list[PodFault], str]:
    """(pod faults, the trainer's fault spec)."""
    pod_faults, trainer = [], []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        kind = item.split("@", 1)[0]
        if kind not in POD_FAULT_KINDS:
            trainer.append(item)
            continue
        try:
            step, node = (int(x) for x in item.split("@", 1)[1].split(":"))
        except ValueError:
            raise ConfigError(f"--faults: {item!r}; write {kind}@STEP:NODE, e.g. {kind}@20:1") from None
        if not 0 <= node < launched_nodes:
            raise ConfigError(f"--faults: {item} names node {node}; the job launches nodes 0-{launched_nodes - 1}")
        pod_faults.append(PodFault(kind, step, node))
    return pod_faults, ",".join(trainer)


class Rehearsal:
    """One rehearsal: its directories, its pods, the emulated controllers."""

    def __init__(self, podman: Podman, root: Path, jobset: dict[str, Any], image: str, console: Console):
        self.podman, self.root, self.jobset, self.image, self.console = podman, root, jobset, image, console
        self.name = jobset["metadata"]["name"]
        replicated = jobset["spec"]["replicatedJobs"][0]
        self.job_spec = replicated["template"]["spec"]
        self.pod_template = self.job_spec["template"]
        self.pods = int(self.job_spec["parallelism"])
        self.uid = uuid.uuid4().hex[:12]
        self.label = f"{self.name}-{self.uid}"
        self.claim = next(
            v["persistentVolumeClaim"]["claimName"]
            for v in self.pod_template["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        )
        self.container = self.pod_template["spec"]["containers"][0]["name"]
        coordinators = [
            rj for rj in jobset["spec"]["replicatedJobs"] if rj["name"] == job_names.COORDINATOR_REPLICATED_JOB
        ]
        self.coordinator_spec = coordinators[0]["template"]["spec"] if coordinators else None
        # The JobSet's DNS records: every worker pod's, and the coordinator's.
        self.hosts = [
            (job_names.jobset_pod_dns_name(self.name, i), self.identity(i, 0).address) for i in range(self.pods)
        ]
        if self.coordinator_spec is not None:
            coordinator = self.coordinator_identity(0)
            self.hosts.append((f"{coordinator.hostname}.{self.name}", coordinator.address))

    def dirs(self, index: int) -> NodeDirs:
        return NodeDirs(self.root / "fsx", self.root / "nodes" / f"node-{index}", self.root / "configmaps")

    def identity(self, index: int, attempt: int) -> PodIdentity:
        return PodIdentity(self.name, index, attempt, self.uid, f"rehearsal-node-{index}")

    def coordinator_identity(self, attempt: int) -> PodIdentity:
        return PodIdentity(
            self.name, 0, attempt, self.uid, "rehearsal-system-node", job_names.COORDINATOR_REPLICATED_JOB
        )

    def create_coordinator(self, attempt: int) -> str:
        assert self.coordinator_spec is not None
        template = self.coordinator_spec["template"]
        pod = self.coordinator_identity(attempt)
        argv = create_argv(
            template,
            template["spec"]["containers"][0]["name"],
            pod,
            image=self.image,
            hosts=self.hosts,
            dirs=NodeDirs(self.root / "fsx", self.root / "nodes" / "system", self.root / "configmaps"),
            claim=self.claim,
            run_label=self.label,
        )
        self.podman.run(argv)
        return pod.pod_name

    def create(self, index: int, attempt: int) -> str:
        pod = self.identity(index, attempt)
        argv = create_argv(
            self.pod_template,
            self.container,
            pod,
            image=self.image,
            hosts=self.hosts,
            dirs=self.dirs(index),
            claim=self.claim,
            run_label=self.label,
        )
        self.podman.run(argv)
        return pod.pod_name

    def start_attempt(self, attempt: int, port: int) -> tuple[list[str], str | None]:
        """(the worker pods, the coordinator's pod or None) of a new attempt, started."""
        coordinator = self.create_coordinator(attempt) if self.coordinator_spec is not None else None
        names = [self.create(i, attempt) for i in range(self.pods)]
        first = coordinator or names[0]
        self.podman.run(["start", first])
        deadline = time.monotonic() + RENDEZVOUS_WAIT_S
        while time.monotonic() < deadline and self.podman.exit_code(first) is None:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        rest = names if coordinator else names[1:]
        if rest:
            self.podman.run(["start", *rest])
        return names, coordinator

    def delete(self, names: list[str]) -> None:
        """Delete pods as the kubelet does: SIGTERM, SIGKILL after the grace period; keep logs."""
        stops = [self.podman.popen(["stop", n], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in names]
        for stop in stops:
            stop.wait()
        self.save_logs(names)
        self.podman.run(["rm", "-f", *names], check=False)

    def save_logs(self, names: list[str]) -> None:
        logs = self.root / "pod-logs"
        logs.mkdir(exist_ok=True)
        for name in names:
            out = self.podman.run(["logs", name], check=False)
            (logs / f"{name}.log").write_text(out.stdout + out.stderr)


def _emit_fault(run_dir: Path, fault: PodFault, nproc: int, attempt: int) -> None:
    """The fault in the run's events, as the trainer writes its own (workloads.events)."""
    path = events_dir(run_dir) / "pods.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "v": SCHEMA_VERSION,
        "t": time.time(),
        "event": "fault_injected",
        "rank": fault.node * nproc,
        "pid": 0,
        "host": "rehearsal",
        "cycle": 0,
        "iteration": 0,
        "attempt": attempt,
        "kind": fault.kind,
        "step": fault.step,
        "target_rank": fault.node * nproc,
        "node": fault.node,
    }
    with path.open("a") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")


@dataclass
class Prepared:
    """A rehearsal ready to run: the rendered job, the twin image, the pod faults."""

    run: Rehearsal
    trainer_dir: Path  # the trainer's run directory, on the rehearsal's FSx directory
    port: int  # pod 0's rendezvous port
    nproc: int
    pod_faults: list[PodFault]


def prepare(
    *,
    profile: str | None,
    nodes: int,
    config_path: str | None = None,
    nproc: int,
    steps: int,
    faults: str,
    run_dir: Path | None,
    spare_nodes: int = 0,
    checkpoint_interval: int = 10,
    local_interval: int | None = None,
    preset: str = "tiny",
    overrides: list[str] | tuple[str, ...] = (),
    console: Console,
    podman: Podman,
) -> Prepared:
    if reason := podman.unusable():
        raise ConfigError(f"rehearse: {reason}")
    root = (run_dir or Path("runs") / time.strftime("rehearse-%Y%m%d-%H%M%S")).resolve()
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"--run-dir: {root} already holds a rehearsal; choose another directory")
    pod_faults, trainer_faults = split_faults(faults, nodes + spare_nodes)
    deployment = load_deployment(profile, config_path)
    train = local_config(
        run_dir=Path("runs") / JOB_NAME,  # on the FSx claim, as render places a default run
        steps=steps,
        faults=trainer_faults,
        preset=preset,
        checkpoint_interval=checkpoint_interval,
        backend="nvrx",
        overrides=overrides,
        local_interval=local_interval,
    )
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=root, delete=False) as f:
        f.write(train.to_yaml())
    # The job as `submit` would send it, validated; then the same job with `nproc` ranks per pod
    # instead of one per GPU, which is what runs.
    options = JobOptions(nodes=nodes, train_config=f.name, spare_nodes=spare_nodes, name=JOB_NAME)
    try:
        submitted = render_job(build_spec(deployment, options, None))
        report = validate_documents(submitted.documents, expectations(deployment, None))
        if not report.ok:
            raise ConfigError("rehearse: the rendered job does not validate: " + "; ".join(map(str, report.errors)))
        options.ranks_per_node = nproc
        spec = build_spec(deployment, options, None)
    finally:
        Path(f.name).unlink()
    rendered = render_job(spec)
    (root / "rendered.yaml").write_text(submitted.text)
    (root / "rehearsed.yaml").write_text(rendered.text)
    for cm in (d for d in rendered.documents if d["kind"] == "ConfigMap"):
        for key, value in cm["data"].items():
            (root / "configmaps" / cm["metadata"]["name"]).mkdir(parents=True, exist_ok=True)
            (root / "configmaps" / cm["metadata"]["name"] / key).write_text(value)
    image = build_twin(podman, console)
    run = Rehearsal(podman, root, rendered.job_document, image, console)
    console.print(
        f"rehearsal {root}: {run.pods} pod(s) of {spec.instance_type} from profile "
        f"{deployment.config.name}, image {image}"
    )
    return Prepared(
        run=run,
        trainer_dir=root / "fsx" / Path(spec.train.run_dir).relative_to(FSX_MOUNT_PATH),
        port=int(spec.rendezvous_endpoint.rsplit(":", 1)[1]),
        nproc=nproc,
        pod_faults=pod_faults,
    )


def execute(prepared: Prepared) -> int:
    """Run the JobSet to its end: attempts, pod faults, the controllers' decisions; then the
    report. No container of the rehearsal is left, whatever way it ends."""
    run = prepared.run
    started, started_at = time.monotonic(), time.time()
    jobset = _JobSetRun(prepared)
    view = LiveView(run.console, prepared.trainer_dir, started_at)  # the run's lines as they happen, every attempt's
    stop = StopSignals()
    with stop, view:
        try:
            jobset.run_to_end(view)
        except KeyboardInterrupt:
            # Ctrl-C, SIGTERM or SIGHUP: the pods are deleted as the cluster would delete them (SIGTERM,
            # their grace period, SIGKILL), so the ranks finish their in-flight checkpoint.
            with stop.ignoring_interrupts():
                run.console.print("rehearse: stopping: deleting the pods")
                jobset.delete_pods()
            jobset.code = 128 + (stop.received or signal.SIGINT)
        finally:
            leftovers = run.podman.remove_labelled(f"{REHEARSAL_LABEL}={run.label}")
    return _report(prepared, jobset, started, started_at, leftovers)


class _JobSetRun:
    """The JobSet's attempts as its controllers drive them: each attempt's pods started, the pod
    faults sent one at a time, each pod's end given to its Job, and the JobSet's answer to a
    failed Job (restart, counted or not, or fail) or a succeeded one (done)."""

    def __init__(self, prepared: Prepared):
        self.prepared, self.run = prepared, prepared.run
        self.console, self.podman = prepared.run.console, prepared.run.podman
        self.code, self.attempt, self.counted_restarts = 1, 0, 0
        self.pending = list(prepared.pod_faults)
        self.job = JobState(self.run.job_spec)
        self.names: list[str] = []
        self.coordinator: str | None = None
        # The attempt's worker pods not yet ended, by index; those stopped as the cluster stops a
        # pod it evicts; those a fault was sent to.
        self.running: dict[int, str] = {}
        self.disrupted: set[int] = set()
        self.struck: set[int] = set()

    def run_to_end(self, view: LiveView) -> None:
        while True:
            self.names, self.coordinator = self.run.start_attempt(self.attempt, self.prepared.port)
            self.job = JobState(self.run.job_spec)
            self.running, self.disrupted, self.struck = dict(enumerate(self.names)), set(), set()
            action = self._watch_attempt(view)
            self.delete_pods()
            self.names, self.coordinator = [], None  # gone: an interrupt from here on deletes only the next attempt's
            if action not in ("restart", "restart-uncounted"):
                return
            self.attempt += 1
            self.counted_restarts += action == "restart"
            uncounted = " (not counted: the pod was disrupted)" if action == "restart-uncounted" else ""
            self.console.print(
                f"rehearse: the Job failed ({self.job.failure_reason}); JobSet restart {self.attempt}{uncounted}"
            )

    def delete_pods(self) -> None:
        self.run.delete([*self.names, *([self.coordinator] if self.coordinator else [])])

    def _watch_attempt(self, view: LiveView) -> str | None:
        """Poll the attempt until its pods have ended or the JobSet answered; that answer."""
        action = None
        while self.running and action is None:
            time.sleep(POLL_S)
            ends = view.poll().of("step_end", rank=0)
            self._send_due_fault(max((e["step"] for e in ends if e.get("attempt", 0) == self.attempt), default=0))
            action = self._coordinator_ended()
            action = self._workers_ended(action)
        return action

    def _send_due_fault(self, reached: int) -> None:
        """The next pending fault whose step rank 0 `reached`, sent to its pod."""
        # One fault at a time: the next waits until the pod the last one struck has ended and the
        # controllers answered, even when the run (polled every POLL_S) already passed both steps;
        # otherwise two faults would land as one.
        due = [f for f in self.pending if reached >= f.step and f.node in self.running]
        for fault in due[:1] if not self.struck & set(self.running) else []:
            self.pending.remove(fault)
            self.struck.add(fault.node)
            _emit_fault(self.prepared.trainer_dir, fault, self.prepared.nproc, self.attempt)
            self.console.print(f"rehearse: {fault.label} ({self.running[fault.node]})")
            verb = ["kill", "-s", "KILL"] if fault.kind == "pod-kill" else ["stop"]
            if fault.kind != "pod-kill":
                self.disrupted.add(fault.node)
            self.podman.popen([*verb, self.running[fault.node]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _coordinator_ended(self) -> str | None:
        """The JobSet's answer when the coordinator's pod has exited, else None."""
        coordinator_code = self.podman.exit_code(self.coordinator) if self.coordinator else None
        if coordinator_code is None:
            return None
        # Its Job (backoffLimit 0) fails; no failure-policy rule targets it.
        self.console.print(f"rehearse: coordinator pod {self.coordinator} exited {coordinator_code}")
        self.code = coordinator_code
        return jobset_action(self.run.jobset["spec"], REASON_BACKOFF_LIMIT, self.counted_restarts, "")

    def _workers_ended(self, action: str | None) -> str | None:
        """Each worker pod that exited given to its Job; the JobSet's answer once the Job failed
        or succeeded, else `action`."""
        for index, name in list(self.running.items()):
            exit_code = self.podman.exit_code(name)
            if exit_code is None:
                continue
            del self.running[index]
            self.console.print(f"rehearse: pod {name} exited {exit_code}")
            self.job.pod_ended(index, exit_code, disrupted=index in self.disrupted, pod=name)
            if self.job.failure_reason:
                self.code = exit_code
                action = jobset_action(
                    self.run.jobset["spec"], self.job.failure_reason, self.counted_restarts, self.job.failure_message
                )
            elif self.job.succeeded_job:
                self.code, action = 0, "done"
        return action


def _report(prepared: Prepared, jobset: _JobSetRun, started: float, started_at: float, leftovers: list[str]) -> int:
    """The rehearsal's record (rehearsal.json) and report; its exit code."""
    run, trainer_dir = prepared.run, prepared.trainer_dir
    code = jobset.code
    record = do_not_requeue.read_record(trainer_dir, f"{run.uid}-{jobset.attempt}")
    if record is not None:
        code = EXIT_DO_NOT_REQUEUE
    wall_s = time.monotonic() - started
    if jobset.pending:
        # The run ended before the poll saw their step: the rehearsal did not do what was asked.
        run.console.print(
            "[yellow]rehearse: pod faults not fired (the run ended first):[/] "
            f"{', '.join(f.label for f in jobset.pending)}"
        )
    (run.root / "rehearsal.json").write_text(
        json.dumps(
            {
                "exit_code": code,
                "wall_s": wall_s,
                "attempts": jobset.attempt + 1,
                "job_failure_reason": jobset.job.failure_reason,
                "image": run.image,
                "pods": run.pods,
                "pod_faults": [f.label for f in prepared.pod_faults],
                "pod_faults_not_fired": [f.label for f in jobset.pending],
                "run_dir": str(trainer_dir),
                "leftover_containers": leftovers,
            },
            indent=1,
        )
    )
    print_report(
        run.console,
        trainer_dir,
        code,
        wall_s,
        [],
        started_at,
        stopped=do_not_requeue.describe(record) if record else None,
        command="rehearse",
    )
    return code


def rehearse(*, console: Console | None = None, podman: Podman | None = None, **options: Any) -> int:
    """`nvrx-eks rehearse`: prepare (render, validate, build the twin), then execute."""
    return execute(prepare(console=console or Console(), podman=podman or Podman(), **options))
