"""The job's objects on a live cluster: find, list, submit and delete them (status.py reads what
they are doing, logs.py streams their pods' output).

`submit` never leaves half a job behind: everything is validated offline first, then every
object is sent to the API server as a server-side dry run (`?dryRun=All`, strict field
validation) so admission webhooks and schema checks run before anything is created; only then
are the NetworkPolicy, the ConfigMap and the job created (the policy first, so no pod of the job
starts reachable from the whole cluster), and if the job is refused the others are removed again.
The policy and the ConfigMap are then owned by the job, so deleting the job deletes them. Before
any of that, `submit` refuses a name a job of either kind already has: a job writes only its own
directory, /fsx/runs/<name> (nvrx_eks.jobs.spec.own_run_dir), so the name is what keeps two jobs
from writing one run directory.

`delete` keeps the NetworkPolicy until the job's pods are gone: they run on for up to their
termination grace period, finishing the save in flight, with stores that have no authentication.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.markup import escape
from urllib3.exceptions import HTTPError as Urllib3Error

from nvrx_eks.facts import job_names
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_kinds import JOB_KIND_BY_NAME, JOB_KINDS, JobKind
from nvrx_eks.jobs.render import RenderedJob
from nvrx_eks.jobs.status import JobStatus, node_rank

T = TypeVar("T")

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
            # EKS authenticates through access entries only (authentication mode API): a valid
            # token of a principal no entry names is refused as unauthenticated.
            return ConfigError(
                f"the cluster did not accept your AWS identity while {doing} (401 Unauthorized): most likely no EKS "
                "access entry names it; the stacks create one, for admin_principal_arn in the profile. Compare it "
                "with `aws sts get-caller-identity` (`nvrx-eks preflight` does), then use that principal's "
                "credentials or add an access entry for yours (aws eks create-access-entry, then "
                "associate-access-policy); credentials for another account are refused the same way"
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


def unless_missing(request: Callable[[], T], doing: str) -> T | None:
    """request()'s result, None where the API server answers 404, and any other failure as the
    ConfigError of api_error."""
    try:
        return request()
    except ApiException as e:
        if e.status == 404:
            return None
        raise api_error(e, doing) from None
    except Urllib3Error as e:
        raise api_error(e, doing) from None


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

        def discover() -> bool:
            self.custom.get_api_resources(kind.group, kind.version)
            return True

        return unless_missing(discover, f"discovering {kind.api_version}") or False

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
        return unless_missing(
            lambda: self.custom.get_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, name
            ),
            f"reading {kind.kind} {name}",
        )

    def list_jobs(self, selector: str = job_names.MANAGED_BY_SELECTOR) -> list[tuple[JobKind, dict]]:
        jobs: list[tuple[JobKind, dict]] = []
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

    def live_jobs(self) -> list[tuple[JobKind, dict]]:
        """This tool's jobs that have not finished (pending or running: they hold or want nodes)."""
        return [(k, j) for k, j in self.list_jobs() if JobStatus.from_objects(k, j, []).phase not in _FINISHED_PHASES]

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
        self._refuse_a_taken_name(kind, spec.name)
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

    def _refuse_a_taken_name(self, kind: JobKind, name: str) -> None:
        """A job of either kind, running or finished, under this name. A job's pods write only
        /fsx/runs/<name>: a JobSet and a PyTorchJob of one name would write one run directory and
        delete each other's checkpoints. (The cluster would refuse the second only at its ConfigMap,
        by name, with the API server's words.)"""
        for existing in JOB_KINDS.values():
            if (existing == kind or self.serves(existing)) and self._get_job(existing, name) is not None:
                raise ConfigError(
                    f"{existing.kind} {name!r} already exists in {self.namespace!r}; delete it first "
                    f"(`nvrx-eks delete {name}`) or choose another --name (a job writes the run directory "
                    "of its name)"
                )

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
            job_kind = JOB_KIND_BY_NAME.get(kind)
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
        reference = _owner_reference(owner["apiVersion"], owner["kind"], owner["metadata"])
        try:
            self._add_owners(obj["kind"], obj["metadata"]["name"], [reference])
        except (ApiException, Urllib3Error) as e:
            self.console.print(
                f"[yellow]warning:[/] could not make {owner['kind']} {escape(owner['metadata']['name'])} own "
                f"{obj['kind']} {escape(obj['metadata']['name'])} ({escape(str(e))}); `nvrx-eks delete` "
                "removes it explicitly"
            )

    def _add_owners(self, kind: str, name: str, references: list[dict]) -> None:
        patch = {"metadata": {"ownerReferences": references}}
        if kind == "ConfigMap":
            self.core.patch_namespaced_config_map(name, self.namespace, patch)
        else:
            self.networking.patch_namespaced_network_policy(name, self.namespace, patch)

    def _delete_quietly(self, obj: dict) -> None:
        try:
            self._delete_object(obj["kind"], obj["metadata"]["name"])
        except ConfigError as e:
            self.console.print(f"[yellow]warning:[/] could not roll back {obj['kind']} {obj['metadata']['name']}: {e}")

    def _delete_object(self, kind: str, name: str) -> bool:
        """Delete one object (foreground, so its pods go first); False if it did not exist."""
        body = k8s.V1DeleteOptions(propagation_policy="Foreground")

        def delete() -> bool:
            if kind == "ConfigMap":
                self.core.delete_namespaced_config_map(name, self.namespace, body=body)
            elif kind == "NetworkPolicy":
                self.networking.delete_namespaced_network_policy(name, self.namespace, body=body)
            else:
                job_kind = JOB_KIND_BY_NAME[kind]
                self.custom.delete_namespaced_custom_object(
                    job_kind.group, job_kind.version, self.namespace, job_kind.plural, name, body=body
                )
            return True

        return unless_missing(delete, f"deleting {kind} {name}") or False

    # ----- delete ---------------------------------------------------------------------------

    def delete(self, name: str, *, wait: bool = False, timeout_s: float = 600, poll_s: float = 2.0) -> JobKind:
        kind, _ = self.find(name)
        policy = job_names.network_policy_name(name)
        pods = self.pods(kind, name)
        if pods:
            self._hand_policy_to_pods(policy, pods)
        self._delete_object(kind.kind, name)
        # Owned by the job, but delete it explicitly too in case the ownership patch failed.
        self._delete_object("ConfigMap", job_names.config_map_name(name))
        if wait:
            self.wait_gone(kind, name, timeout_s=timeout_s, poll_s=poll_s)
        if wait or not pods:
            self._delete_object("NetworkPolicy", policy)
        return kind

    def _hand_policy_to_pods(self, policy: str, pods: list[k8s.V1Pod]) -> None:
        """Make the job's pods owners of its NetworkPolicy too, so that it outlives them. The
        garbage collector deletes the job's dependents as soon as the job's deletion starts, while
        its pods still run for up to their grace period; but it keeps a dependent while any owner
        remains that is not itself waiting on its dependents, and a terminating pod is such an
        owner until it is gone."""
        references = [
            _owner_reference("v1", "Pod", self.api_client.sanitize_for_serialization(p.metadata)) for p in pods
        ]
        try:
            self._add_owners("NetworkPolicy", policy, references)
        except ApiException as e:
            if e.status != 404:  # no policy: nothing to keep
                self._warn_policy_goes_early(policy, e)
        except Urllib3Error as e:
            self._warn_policy_goes_early(policy, e)

    def _warn_policy_goes_early(self, policy: str, error: Exception) -> None:
        self.console.print(
            f"[yellow]warning:[/] could not make the pods own NetworkPolicy {escape(policy)} "
            f"({escape(str(error))}); it goes with the job, while its pods may still run for their grace period"
        )

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


#: Phases of a job that holds and wants no nodes any more (JobStatus's, for either kind).
_FINISHED_PHASES = ("Succeeded", "Failed")


def _owner_reference(api_version: str, kind: str, metadata: dict) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "blockOwnerDeletion": False,
    }
