"""Job commands against a live cluster: submit, status, logs, delete.

`submit` never leaves half a job behind: everything is validated offline first, then every
object is sent to the API server as a server-side dry run (`?dryRun=All`, strict field
validation) so admission webhooks and schema checks run before anything is created; only then
are the NetworkPolicy, the ConfigMap and the job created (the policy first, so no pod of the job
starts reachable from the whole cluster), and if the job is refused the others are removed again.
The policy and the ConfigMap are then owned by the job, so deleting the job deletes them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from urllib3.exceptions import HTTPError as Urllib3Error

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.render import MANAGED_BY_SELECTOR, RenderedJob
from nvrx_eks.jobs.spec import TRAINER_CONTAINER


@dataclass(frozen=True)
class JobKind:
    api: str
    group: str
    version: str
    plural: str
    kind: str
    #: Label the controller puts on the job's pods, valued with the job name.
    pod_label: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def pod_selector(self, name: str) -> str:
        return f"{self.pod_label}={name}"


JOB_KINDS: dict[str, JobKind] = {
    "jobset": JobKind("jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "jobset.sigs.k8s.io/jobset-name"),
    "pytorchjob": JobKind(
        "pytorchjob", "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "training.kubeflow.org/job-name"
    ),
}
_KIND_BY_NAME = {k.kind: k for k in JOB_KINDS.values()}
#: What submit creates beside the job, owned by it.
_OWNED_KINDS = ("ConfigMap", "NetworkPolicy")

_INSTALL_HINT = {
    "jobset": "the JobSet controller is part of the cluster add-ons; redeploy the cluster stack",
    "pytorchjob": "set addons.install_training_operator: true in the profile and deploy, or use --api jobset",
}


def api_error(error: Exception, doing: str) -> ConfigError:
    """A user-facing message for what the API server (or the way to it) said."""
    if isinstance(error, ApiException):
        message = error.reason
        try:
            message = json.loads(error.body or "{}").get("message") or message
        except (ValueError, AttributeError):
            pass
        if error.status == 401:
            return ConfigError(
                f"the cluster rejected the authentication token while {doing}; check that your AWS "
                "credentials are for the account of the cluster"
            )
        if error.status == 403:
            return ConfigError(
                f"the cluster denied {doing}: {message}; your IAM principal needs an EKS access entry "
                "(admin_principal_arn in the profile)"
            )
        return ConfigError(f"the cluster refused {doing} ({error.status}): {message}")
    return ConfigError(
        f"cannot reach the Kubernetes API while {doing} ({error}); with endpoint access 'private' run "
        "from inside the VPC, otherwise add your network to endpoint.public_cidrs"
    )


class JobClient:
    def __init__(self, api_client: k8s.ApiClient, namespace: str, console: Console | None = None):
        self.api_client = api_client
        self.namespace = namespace
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.console = console or Console()

    # ----- discovery ------------------------------------------------------------------------

    def serves(self, kind: JobKind) -> bool:
        """Whether the cluster has the custom resource (its controller's CRD is installed)."""
        try:
            self.custom.get_api_resources(kind.group, kind.version)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise api_error(e, f"discovering {kind.api_version}") from None
        except Urllib3Error as e:
            raise api_error(e, f"discovering {kind.api_version}") from None

    def find(self, name: str) -> tuple[JobKind, dict]:
        """The job named `name`, whichever kind it is; ConfigError if there is none."""
        for kind in JOB_KINDS.values():
            if not self.serves(kind):
                continue
            obj = self._get_job(kind, name)
            if obj is not None:
                return kind, obj
        raise ConfigError(
            f"no training job named {name!r} in namespace {self.namespace!r}; list them with "
            "`nvrx-eks status` or check the name"
        )

    def _get_job(self, kind: JobKind, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise api_error(e, f"reading {kind.kind} {name}") from None
        except Urllib3Error as e:
            raise api_error(e, f"reading {kind.kind} {name}") from None

    def list_jobs(self, selector: str = MANAGED_BY_SELECTOR) -> list[tuple[JobKind, dict]]:
        jobs = []
        for kind in JOB_KINDS.values():
            if not self.serves(kind):
                continue
            try:
                items = self.custom.list_namespaced_custom_object(
                    kind.group, kind.version, self.namespace, kind.plural, label_selector=selector
                )["items"]
            except (ApiException, Urllib3Error) as e:
                raise api_error(e, f"listing {kind.kind}s") from None
            jobs.extend((kind, item) for item in items)
        return jobs

    def pods(self, kind: JobKind, name: str) -> list[k8s.V1Pod]:
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=kind.pod_selector(name)).items
        except (ApiException, Urllib3Error) as e:
            raise api_error(e, f"listing the pods of {name}") from None
        return sorted(pods, key=node_rank)

    # ----- submit ---------------------------------------------------------------------------

    def submit(self, rendered: RenderedJob) -> dict:
        """Server-side dry run of every object, then create them; returns the created job."""
        spec = rendered.spec
        kind = JOB_KINDS[spec.api]
        if not self.serves(kind):
            raise ConfigError(f"the cluster does not serve {kind.kind} ({kind.api_version}): {_INSTALL_HINT[kind.api]}")
        if self._get_job(kind, spec.name) is not None:
            raise ConfigError(
                f"{kind.kind} {spec.name!r} already exists in {self.namespace!r}; delete it first "
                f"(`nvrx-eks delete {spec.name}`) or choose another --name"
            )
        # The NetworkPolicy before the job, so no pod of it is ever reachable from the whole cluster.
        documents = sorted(rendered.documents, key=lambda d: d["kind"] != "NetworkPolicy")
        for document in documents:
            self._create(document, dry_run=True)
        created: list[dict] = []
        try:
            for document in documents:
                created.append(self._create(document, dry_run=False))
        except ConfigError:
            for obj in reversed(created):
                self._delete_quietly(obj)
            raise
        job = next(o for o in created if o["kind"] == kind.kind)
        for obj in created:
            if obj["kind"] in _OWNED_KINDS:
                self._own(obj, job)
        return job

    def _create(self, document: dict, *, dry_run: bool) -> dict:
        kind = document["kind"]
        name = document["metadata"]["name"]
        doing = f"{'dry-run creating' if dry_run else 'creating'} {kind} {name}"
        options = {"field_validation": "Strict"}
        if dry_run:
            options["dry_run"] = "All"
        try:
            if kind == "ConfigMap":
                result = self.core.create_namespaced_config_map(self.namespace, document, **options)
                return self.api_client.sanitize_for_serialization(result) | {"kind": "ConfigMap", "apiVersion": "v1"}
            if kind == "NetworkPolicy":
                result = self.networking.create_namespaced_network_policy(self.namespace, document, **options)
                return self.api_client.sanitize_for_serialization(result) | {
                    "kind": "NetworkPolicy",
                    "apiVersion": "networking.k8s.io/v1",
                }
            job_kind = _KIND_BY_NAME.get(kind)
            if job_kind is None:
                raise ConfigError(f"submit does not create {kind} objects")
            return self.custom.create_namespaced_custom_object(
                job_kind.group, job_kind.version, self.namespace, job_kind.plural, document, **options
            )
        except (ApiException, Urllib3Error) as e:
            raise api_error(e, doing) from None

    def _own(self, obj: dict, owner: dict) -> None:
        """Make the job the owner of its ConfigMap / NetworkPolicy so the garbage collector
        deletes them together."""
        reference = {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        patch = {"metadata": {"ownerReferences": [reference]}}
        try:
            if obj["kind"] == "ConfigMap":
                self.core.patch_namespaced_config_map(obj["metadata"]["name"], self.namespace, patch)
            else:
                self.networking.patch_namespaced_network_policy(obj["metadata"]["name"], self.namespace, patch)
        except (ApiException, Urllib3Error) as e:
            self.console.print(
                f"[yellow]warning:[/] could not make {owner['kind']} {escape(owner['metadata']['name'])} own "
                f"{obj['kind']} {escape(obj['metadata']['name'])} ({escape(str(e))}); `nvrx-eks delete` "
                "removes it explicitly"
            )

    def _delete_quietly(self, obj: dict) -> None:
        try:
            self._delete_object(obj["kind"], obj["metadata"]["name"])
        except ConfigError as e:
            self.console.print(f"[yellow]warning:[/] could not roll back {obj['kind']} {obj['metadata']['name']}: {e}")

    def _delete_object(self, kind: str, name: str) -> bool:
        """Delete one object (foreground, so its pods go first); False if it did not exist."""
        body = k8s.V1DeleteOptions(propagation_policy="Foreground")
        try:
            if kind == "ConfigMap":
                self.core.delete_namespaced_config_map(name, self.namespace, body=body)
            elif kind == "NetworkPolicy":
                self.networking.delete_namespaced_network_policy(name, self.namespace, body=body)
            else:
                job_kind = _KIND_BY_NAME[kind]
                self.custom.delete_namespaced_custom_object(
                    job_kind.group, job_kind.version, self.namespace, job_kind.plural, name, body=body
                )
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise api_error(e, f"deleting {kind} {name}") from None
        except Urllib3Error as e:
            raise api_error(e, f"deleting {kind} {name}") from None

    # ----- delete ---------------------------------------------------------------------------

    def delete(self, name: str, *, wait: bool = False, timeout_s: float = 600, poll_s: float = 2.0) -> JobKind:
        kind, _ = self.find(name)
        self._delete_object(kind.kind, name)
        # Owned by the job, but delete them explicitly too in case the ownership patch failed.
        self._delete_object("ConfigMap", f"{name}-config")
        self._delete_object("NetworkPolicy", name)
        if wait:
            self.wait_gone(kind, name, timeout_s=timeout_s, poll_s=poll_s)
        return kind

    def wait_gone(self, kind: JobKind, name: str, *, timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._get_job(kind, name) is None and not self.pods(kind, name):
                return
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"{kind.kind} {name} or its pods still exist after {timeout_s:.0f} s; check "
                    "`nvrx-eks status` (pods stuck terminating usually mean an unreachable node)"
                )
            time.sleep(poll_s)

    # ----- status ---------------------------------------------------------------------------

    def status(self, name: str) -> JobStatus:
        kind, obj = self.find(name)
        return JobStatus.from_objects(kind, obj, self.pods(kind, name))

    # ----- logs -----------------------------------------------------------------------------

    def logs(
        self,
        name: str,
        *,
        node: int | None = None,
        rank: int | None = None,
        follow: bool = False,
        tail_lines: int | None = None,
        write: Callable[[str], None] | None = None,
    ) -> int:
        """Print the pods' logs (prefixed `nodeN |`), or one node's, or one rank's lines; returns
        the number of lines written."""
        kind, obj = self.find(name)
        pods = self.pods(kind, name)
        if not pods:
            raise ConfigError(f"{kind.kind} {name} has no pods yet; see `nvrx-eks status {name}`")
        line_filter: Callable[[str], bool] | None = None
        if rank is not None:
            # The trainer tags its log lines `[rankN]`; ranks of one node share a pod.
            node = rank // gpus_per_pod(pods[0])
            tag = f"[rank{rank}]"

            def line_filter(line: str) -> bool:
                return tag in line

        if node is not None:
            selected = [p for p in pods if node_rank(p) == node]
            if not selected:
                raise ConfigError(f"--node/--rank: node {node} does not exist; the job has {len(pods)} pods")
            pods = selected
        write = write or (lambda line: self.console.print(line, markup=False, highlight=False, soft_wrap=True))
        lock = threading.Lock()
        count = 0

        def pump(pod: k8s.V1Pod) -> None:
            nonlocal count
            prefix = f"node{node_rank(pod)} | " if len(pods) > 1 else ""
            for line in self._log_lines(pod, follow=follow, tail_lines=tail_lines):
                if line_filter is None or line_filter(line):
                    with lock:
                        write(prefix + line)
                        count += 1

        if follow and len(pods) > 1:
            threads = [threading.Thread(target=pump, args=(p,), daemon=True) for p in pods]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for pod in pods:
                pump(pod)
        return count

    def _log_lines(self, pod: k8s.V1Pod, *, follow: bool, tail_lines: int | None) -> Iterator[str]:
        container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else TRAINER_CONTAINER
        try:
            response = self.core.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=container,
                follow=follow,
                tail_lines=tail_lines,
                _preload_content=False,
            )
        except (ApiException, Urllib3Error) as e:
            raise api_error(e, f"reading the log of {pod.metadata.name}") from None
        buffered = b""
        try:
            for chunk in response.stream(4096):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if buffered:
                yield buffered.decode(errors="replace")
        finally:
            response.release_conn()


def node_rank(pod: k8s.V1Pod) -> int:
    """The node index of a job pod (JobSet completion index, or PyTorchJob master 0 / worker i+1)."""
    labels = (pod.metadata.labels or {}) if pod.metadata else {}
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    index = labels.get("batch.kubernetes.io/job-completion-index") or annotations.get(
        "batch.kubernetes.io/job-completion-index"
    )
    if index is not None:
        return int(index)
    replica_type = labels.get("training.kubeflow.org/replica-type", "").lower()
    replica_index = int(labels.get("training.kubeflow.org/replica-index", "0"))
    return replica_index + 1 if replica_type == "worker" else replica_index


def gpus_per_pod(pod: k8s.V1Pod) -> int:
    from nvrx_eks.facts.names import GPU_RESOURCE

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
        restart_attempt=labels.get("jobset.sigs.k8s.io/restart-attempt", "-"),
    )
