"""What a submitted job is doing: its phase, its pods by node, and the restarts each resilience
layer made, as `nvrx-eks status` prints them."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes import client as k8s
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvrx_eks.facts.job_kinds import (
    JOB_COMPLETION_INDEX_LABEL,
    JOBSET_RESTART_ATTEMPT_LABEL,
    PYTORCHJOB_REPLICA_INDEX_LABEL,
    PYTORCHJOB_REPLICA_TYPE_LABEL,
    JobKind,
)
from nvrx_eks.facts.names import GPU_RESOURCE


def node_rank(pod: k8s.V1Pod) -> int:
    """The node index of a job pod (JobSet completion index, or PyTorchJob master 0 / worker i+1)."""
    labels = (pod.metadata.labels or {}) if pod.metadata else {}
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    index = labels.get(JOB_COMPLETION_INDEX_LABEL) or annotations.get(JOB_COMPLETION_INDEX_LABEL)
    if index is not None:
        return int(index)
    replica_type = labels.get(PYTORCHJOB_REPLICA_TYPE_LABEL, "").lower()
    replica_index = int(labels.get(PYTORCHJOB_REPLICA_INDEX_LABEL, "0"))
    return replica_index + 1 if replica_type == "worker" else replica_index


def gpus_per_pod(pod: k8s.V1Pod) -> int:
    for container in pod.spec.containers if pod.spec else []:
        limits = (container.resources.limits or {}) if container.resources else {}
        if GPU_RESOURCE in limits:
            return int(limits[GPU_RESOURCE])
    return 1


@dataclass
class PodStatus:
    name: str
    node_rank: int
    phase: str
    node: str
    restarts: int
    last_exit: str
    restart_attempt: str


@dataclass
class JobStatus:
    kind: JobKind
    name: str
    phase: str
    #: Restarts by the Kubernetes layer (JobSet recreations / PyTorchJob pod recreations seen).
    controller_restarts: int | None
    max_restarts: int | None
    pods: list[PodStatus] = field(default_factory=list)
    message: str = ""

    @property
    def container_restarts(self) -> int:
        return sum(p.restarts for p in self.pods)

    @classmethod
    def from_objects(cls, kind: JobKind, obj: dict, pods: list[k8s.V1Pod]) -> JobStatus:
        status = obj.get("status") or {}
        conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
        message = conditions[-1].get("message", "") if conditions else ""
        if kind.kind == "JobSet":
            types = {c.get("type") for c in conditions}
            if "Failed" in types:
                phase = "Failed"
            elif "Completed" in types:
                phase = "Succeeded"
            elif "Suspended" in types:
                phase = "Suspended"
            elif any(p.status and p.status.phase == "Running" for p in pods):
                phase = "Running"
            else:
                phase = "Pending"
            restarts = status.get("restarts", 0)
            max_restarts = (obj.get("spec") or {}).get("failurePolicy", {}).get("maxRestarts")
        else:
            phase = conditions[-1]["type"] if conditions else "Pending"
            restarts = None  # the training operator keeps no cumulative count
            max_restarts = (obj.get("spec") or {}).get("runPolicy", {}).get("backoffLimit")
        return cls(
            kind=kind,
            name=obj["metadata"]["name"],
            phase=phase,
            controller_restarts=restarts,
            max_restarts=max_restarts,
            pods=[_pod_status(p) for p in pods],
            message=message,
        )

    def render(self, console: Console) -> None:
        restarts = "n/a" if self.controller_restarts is None else str(self.controller_restarts)
        limit = "" if self.max_restarts is None else f" of {self.max_restarts}"
        console.print(
            f"[bold]{self.kind.kind} {self.name}[/]: {self.phase}"
            + (f" ({escape(self.message)})" if self.message else "")
        )
        layers = Table(title="Restarts by resilience layer", show_header=True)
        layers.add_column("layer")
        layers.add_column("restarts", justify="right")
        layers.add_column("seen from")
        layers.add_row("3. Kubernetes (whole job recreated)", restarts + limit, f"{self.kind.kind} status")
        layers.add_row("   container restarts (kubelet)", str(self.container_restarts), "pod status")
        layers.add_row("2. ft_launcher (ranks restarted)", "-", "trainer events on FSx (nvrx-eks report)")
        layers.add_row("1. in-process (NVRx Wrapper)", "-", "trainer events on FSx (nvrx-eks report)")
        console.print(layers)
        table = Table(title="Pods", show_header=True)
        for column in ("node", "pod", "phase", "on node", "restarts", "last exit", "attempt"):
            table.add_column(column, no_wrap=column == "pod")
        for p in self.pods:
            table.add_row(
                str(p.node_rank),
                escape(p.name),
                p.phase,
                escape(p.node),
                str(p.restarts),
                p.last_exit,
                p.restart_attempt,
            )
        console.print(table)


def _pod_status(pod: k8s.V1Pod) -> PodStatus:
    status = pod.status
    restarts, last_exit = 0, ""
    for cs in (status.container_statuses or []) if status else []:
        restarts += cs.restart_count or 0
        terminated = (cs.state.terminated if cs.state else None) or (
            cs.last_state.terminated if cs.last_state else None
        )
        if terminated is not None:
            last_exit = f"{terminated.exit_code} ({terminated.reason or 'exited'})"
    labels = pod.metadata.labels or {}
    return PodStatus(
        name=pod.metadata.name,
        node_rank=node_rank(pod),
        phase=(status.phase if status else None) or "Unknown",
        node=(pod.spec.node_name if pod.spec else None) or "-",
        restarts=restarts,
        last_exit=last_exit or "-",
        restart_attempt=labels.get(JOBSET_RESTART_ATTEMPT_LABEL, "-"),
    )
