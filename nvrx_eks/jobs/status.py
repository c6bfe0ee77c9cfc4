"""What a submitted job is doing: its phase, its pods by node, the restarts each resilience layer
made and, with hot spare nodes, which nodes hold the active ranks, which wait as spares and which
were lost, as `nvrx-eks status` prints them."""

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
from nvrx_eks.facts.job_names import SPARE_NODES_ANNOTATION
from nvrx_eks.facts.names import GPU_RESOURCE
from workloads.spares import NodeRole, node_roles


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
    gpus: int = 1
    #: What the container left in its termination-message file, such as the fabric test's verdict.
    termination_message: str = ""


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
    #: With hot spare nodes: every launched node's role in the current attempt.
    roles: list[NodeRole] = field(default_factory=list)

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
        statuses = [_pod_status(p) for p in pods]
        return cls(
            kind=kind,
            name=obj["metadata"]["name"],
            phase=phase,
            controller_restarts=restarts,
            max_restarts=max_restarts,
            pods=statuses,
            message=message,
            roles=_node_roles(obj, statuses, restarts),
        )

    def role_of(self, pod: PodStatus) -> str:
        """The pod's node's role, for pods of the current attempt of a job with spares."""
        role = next((r for r in self.roles if r.node == pod.node_rank), None)
        if role is None or pod.restart_attempt not in ("-", str(self.controller_restarts)):
            return "-"
        if role.first_rank is None:
            return role.role
        return f"active, ranks {role.first_rank}-{role.first_rank + pod.gpus - 1}"

    def as_data(self) -> dict:
        """What `render` prints, for `status NAME -o json|yaml`."""
        return {
            "kind": self.kind.kind,
            "name": self.name,
            "phase": self.phase,
            "message": self.message,
            "restarts": {
                "kubernetes": self.controller_restarts,
                "max_kubernetes": self.max_restarts,
                "containers": self.container_restarts,
            },
            "nodes": {role: [r.node for r in self.roles if r.role == role] for role in _ROLES} if self.roles else None,
            "pods": [
                {
                    "node": p.node_rank,
                    "pod": p.name,
                    "phase": p.phase,
                    "on_node": p.node,
                    "restarts": p.restarts,
                    "last_exit": p.last_exit,
                    "attempt": p.restart_attempt,
                    "termination_message": p.termination_message,
                    **({"role": self.role_of(p)} if self.roles else {}),
                }
                for p in self.pods
            ],
        }

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
        if self.roles:
            by_role = {role: [r.node for r in self.roles if r.role == role] for role in _ROLES}
            console.print(
                "Nodes (hot spares): "
                + "; ".join(f"{role} {', '.join(map(str, nodes)) or 'none'}" for role, nodes in by_role.items())
            )
        table = Table(title="Pods", show_header=True)
        columns = ["node", "pod", "phase", "on node", "restarts", "last exit", "attempt"]
        for column in columns + (["role"] if self.roles else []):
            table.add_column(column, no_wrap=column == "pod")
        for p in self.pods:
            row = [
                str(p.node_rank),
                escape(p.name),
                p.phase,
                escape(p.node),
                str(p.restarts),
                p.last_exit,
                p.restart_attempt,
            ]
            table.add_row(*row, *([self.role_of(p)] if self.roles else []))
        console.print(table)
        for p in self.pods:
            if p.termination_message:
                console.print(f"node {p.node_rank}: {escape(p.termination_message)}", highlight=False, soft_wrap=True)


#: The roles of a node with hot spares, in the order `status` lists them.
_ROLES = ("active", "spare", "lost")


def _node_roles(obj: dict, pods: list[PodStatus], restarts: int | None) -> list[NodeRole]:
    """With hot spare nodes (the job's annotation): each launched node's role in the current
    attempt, by the rank assignment's own rule (workloads.spares.node_roles). A node is lost when
    its pod of this attempt failed: with spares a failed index is not retried (the rendered
    Job's backoffLimitPerIndex: 0)."""
    spares = int(((obj.get("metadata") or {}).get("annotations") or {}).get(SPARE_NODES_ANNOTATION, "0"))
    if not spares:
        return []
    replicated = ((obj.get("spec") or {}).get("replicatedJobs") or [{}])[0]
    launched = ((replicated.get("template") or {}).get("spec") or {}).get("parallelism")
    current = [p for p in pods if p.restart_attempt in ("-", str(restarts))]
    if not isinstance(launched, int):
        launched = max((p.node_rank for p in current), default=-1) + 1
    lost = {p.node_rank for p in current if p.phase == "Failed"}
    gpus = max((p.gpus for p in current), default=1)
    return node_roles(launched_nodes=launched, spare_nodes=spares, lost=lost, nproc_per_node=gpus)


def _pod_status(pod: k8s.V1Pod) -> PodStatus:
    status = pod.status
    restarts, last_exit, message = 0, "", ""
    for cs in (status.container_statuses or []) if status else []:
        restarts += cs.restart_count or 0
        terminated = (cs.state.terminated if cs.state else None) or (
            cs.last_state.terminated if cs.last_state else None
        )
        if terminated is not None:
            last_exit = f"{terminated.exit_code} ({terminated.reason or 'exited'})"
            message = (terminated.message or "").strip()
    labels = pod.metadata.labels or {}
    return PodStatus(
        name=pod.metadata.name,
        node_rank=node_rank(pod),
        phase=(status.phase if status else None) or "Unknown",
        node=(pod.spec.node_name if pod.spec else None) or "-",
        restarts=restarts,
        last_exit=last_exit or "-",
        restart_attempt=labels.get(JOBSET_RESTART_ATTEMPT_LABEL, "-"),
        gpus=gpus_per_pod(pod),
        termination_message=message,
    )
