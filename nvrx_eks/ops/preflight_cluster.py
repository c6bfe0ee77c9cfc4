"""`nvrx-eks preflight` for a config with a `cluster:` section: a cluster that exists already, so
nothing is deployed and the checks are of that cluster: its kubeconfig context, its Kubernetes
version, the namespace, the claim, the job API and the GPU nodes the pods can land on.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console

from infra.addons.catalog import JOBSET as JOBSET_CHART
from infra.config import DeploymentConfig
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS
from nvrx_eks.ops.preflight_context import FAIL, PASS, WARN, Check, CheckResult

if TYPE_CHECKING:
    from nvrx_eks.jobs.client import JobClient


def cluster_checks(config: DeploymentConfig, nodes: int) -> list[CheckResult]:
    """What must be true of the config's existing cluster before a job of `nodes` nodes can run."""
    from nvrx_eks.jobs.client import JobClient
    from nvrx_eks.jobs.cluster import api_client

    assert config.cluster is not None
    cluster = config.cluster
    name = f"kubeconfig context {cluster.context}"
    try:
        client = JobClient(api_client(cluster), cluster.namespace, Console(file=io.StringIO()))
    except ConfigError as e:
        return [CheckResult(name, FAIL, str(e), "fix cluster.context or cluster.kubeconfig in the config")] + [
            check.skipped("needs a usable kubeconfig context") for check in CLUSTER_CHECKS
        ]
    results = [CheckResult(name, PASS, f"API server {client.api_client.configuration.host}")]
    for check in CLUSTER_CHECKS:
        try:
            results.append(check.run(client, config, nodes))
        except ConfigError as e:  # what the API server, or the way to it, said
            results.append(CheckResult(check.name, FAIL, str(e), "see the detail"))
    return results


def _check_version(client: JobClient, config: DeploymentConfig, nodes: int) -> CheckResult:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    from nvrx_eks.jobs.client import api_error

    name = f"Kubernetes {config.kubernetes_version}"
    try:
        # As kubectl asks (`/version`, as data): VersionApi asks `/version/`, which not every server
        # routes, and refuses an answer without every build field.
        code: dict = client.api_client.call_api(
            "/version",
            "GET",
            header_params={"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
    except (ApiException, Urllib3Error) as e:
        raise api_error(e, "reading the server's version") from None
    # EKS and others append "+" (or more) to the minor: "35+".
    served = f"{code.get('major')}.{''.join(c for c in str(code.get('minor')) if c.isdigit())}"
    build = code.get("gitVersion", served)
    if served == config.kubernetes_version:
        return CheckResult(name, PASS, f"the server runs {build}")
    return CheckResult(
        name,
        WARN,
        f"the server runs {served} ({build}); manifests are validated against kubernetes_version "
        f"{config.kubernetes_version}",
        f'set kubernetes_version: "{served}" in the config'
        if served in SUPPORTED_KUBERNETES_VERSIONS
        else f"Kubernetes {served} is not one this project validates; use a supported minor "
        f"({', '.join(SUPPORTED_KUBERNETES_VERSIONS)})",
    )


def _check_namespace(client: JobClient, config: DeploymentConfig, nodes: int) -> CheckResult:
    from nvrx_eks.jobs.client import unless_missing

    namespace = client.namespace
    name = f"namespace {namespace}"
    if unless_missing(lambda: client.core.read_namespace(namespace), f"reading namespace {namespace}") is None:
        return CheckResult(
            name,
            FAIL,
            "does not exist",
            f"create it (kubectl create namespace {namespace}) or set cluster.namespace to one that exists",
        )
    return CheckResult(name, PASS, "exists")


def _check_claim(client: JobClient, config: DeploymentConfig, nodes: int) -> CheckResult:
    from nvrx_eks.jobs.client import unless_missing

    assert config.cluster is not None
    pvc, namespace = config.cluster.pvc, client.namespace
    name = f"claim {pvc}"
    claim = unless_missing(
        lambda: client.core.read_namespaced_persistent_volume_claim(pvc, namespace), f"reading claim {pvc}"
    )
    if claim is None:
        return CheckResult(
            name,
            FAIL,
            f"no PersistentVolumeClaim {pvc} in {namespace}",
            "create a ReadWriteMany claim there (for FSx for Lustre: a static PersistentVolume of the FSx CSI "
            "driver and a claim bound to it) or set cluster.pvc to yours",
        )
    problems = []
    if "ReadWriteMany" not in (claim.spec.access_modes or []):
        problems.append(
            f"access modes {claim.spec.access_modes}: every pod of a job mounts it, so it must be ReadWriteMany"
        )
    phase = claim.status.phase if claim.status else None
    if phase != "Bound":
        problems.append(f"is {phase or 'not bound'}: the pods would wait in Pending")
    if problems:
        return CheckResult(name, FAIL, "; ".join(problems), "use a ReadWriteMany claim that is Bound")
    capacity = (claim.status.capacity or {}).get("storage", "?")
    return CheckResult(name, PASS, f"Bound, ReadWriteMany, {capacity}")


def _check_job_api(client: JobClient, config: DeploymentConfig, nodes: int) -> CheckResult:
    from nvrx_eks.facts.job_kinds import JOBSET, PYTORCHJOB

    served = [kind for kind in (JOBSET, PYTORCHJOB) if client.serves(kind)]
    name = "job API"
    if JOBSET in served:
        return CheckResult(name, PASS, ", ".join(f"{k.kind} ({k.api_version})" for k in served))
    if served:
        return CheckResult(
            name,
            WARN,
            f"no {JOBSET.kind}; {PYTORCHJOB.kind} is served",
            "submit with --api pytorchjob, or install JobSet",
        )
    return CheckResult(
        name,
        FAIL,
        f"serves neither {JOBSET.kind} ({JOBSET.api_version}) nor {PYTORCHJOB.kind} ({PYTORCHJOB.api_version})",
        f"install the JobSet controller {JOBSET_CHART.version} (chart {JOBSET_CHART.repository})",
    )


def _check_gpu_nodes(client: JobClient, config: DeploymentConfig, nodes: int) -> CheckResult:
    from nvrx_eks.facts.names import EFA_RESOURCE, GPU_RESOURCE
    from nvrx_eks.jobs.cluster import label_command, matching_nodes, node_selector, selector_text

    facts = config.gpu_nodes.facts
    name = f"{nodes} GPU node(s) for the pods"
    found = matching_nodes(client.api_client, config)
    short = [
        node.metadata.name
        for node in found
        if int((node.status.allocatable or {}).get(GPU_RESOURCE, "0")) < facts.gpus
        or int((node.status.allocatable or {}).get(EFA_RESOURCE, "0")) < facts.efa_interfaces
    ]
    detail = f"{len(found)} node(s) match {selector_text(node_selector(config))}"
    if short:
        return CheckResult(
            name,
            FAIL,
            f"{detail}; {', '.join(short)} do not offer {facts.gpus} {GPU_RESOURCE} and {facts.efa_interfaces} "
            f"{EFA_RESOURCE}, which each pod requests",
            "install the NVIDIA and EFA device plugins on them, or check gpu_nodes.instance_type",
        )
    if len(found) < nodes:
        return CheckResult(name, FAIL, detail, f"add GPU nodes or label them: `{label_command(config)}`")
    return CheckResult(name, PASS, detail)


#: The cluster's checks after its kubeconfig context's, in the order of their rows; each needs the
#: context.
CLUSTER_CHECKS: tuple[Check[[JobClient, DeploymentConfig, int]], ...] = (
    Check("Kubernetes version", _check_version),
    Check("namespace", _check_namespace),
    Check("claim", _check_claim),
    Check("job API", _check_job_api),
    Check("GPU nodes", _check_gpu_nodes),
)
