"""`nvrx-eks preflight`: what must be true in the AWS account before `cdk deploy` can succeed.

Each check is one small function over a boto3 session that returns a CheckResult with the fix
when it fails, so a user learns about a missing quota or an expired reservation in seconds
instead of after a 40-minute rollback. The checks only read (Describe/Get/List). Two need no
AWS credentials and always run: the profile must hold no documentation placeholder (account,
admin role, endpoint CIDRs: infra/config/placeholders.py), and with a public API endpoint this
machine's address, as https://checkip.amazonaws.com sees it, must be in endpoint.public_cidrs.

A config with a `cluster:` section names a cluster that exists already: nothing is deployed, so
the checks are of that cluster instead (cluster_checks): its kubeconfig context, its Kubernetes
version, the namespace, the claim, the job API and the GPU nodes the pods can land on.
"""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import math
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.addon_catalog import JOBSET as JOBSET_CHART
from infra.addon_catalog import managed_addons
from infra.config import DeploymentConfig, documentation_placeholders
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import INSTANCE_FACTS, InstanceFacts, VcpuQuota
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS
from nvrx_eks.output_format import write_data

if TYPE_CHECKING:
    from nvrx_eks.jobs.client import JobClient

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"

#: EKS version states in which new clusters can be created.
_EKS_VERSION_OK = {"STANDARD_SUPPORT", "EXTENDED_SUPPORT"}


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""


#: Where this machine learns its public IPv4 address: an AWS service, answering with the address alone.
CHECKIP_URL = "https://checkip.amazonaws.com"
#: It answers in well under a second; a few seconds cover a slow link without stalling preflight.
CHECKIP_TIMEOUT_S = 5.0


def fetch_egress_ip() -> str:
    """This machine's public IPv4 address as AWS sees it (what the API endpoint's CIDR filter sees)."""
    with urllib.request.urlopen(CHECKIP_URL, timeout=CHECKIP_TIMEOUT_S) as response:
        return response.read(64).decode("ascii").strip()


@dataclass(frozen=True)
class PreflightContext:
    config: DeploymentConfig
    nodes: int
    session: boto3.Session
    #: How to learn this machine's egress address; None: fetch_egress_ip (tests pass their own).
    egress_ip: Callable[[], str] | None = None

    @property
    def facts(self) -> InstanceFacts:
        return self.config.gpu_nodes.facts

    def client(self, service: str):
        return self.session.client(service, region_name=self.config.region)


def _denied(e: ClientError) -> bool:
    return e.response.get("Error", {}).get("Code", "") in {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
    }


def _error_result(name: str, e: Exception, permission: str) -> CheckResult:
    if isinstance(e, ClientError) and _denied(e):
        return CheckResult(name, FAIL, f"not allowed: {e.response['Error'].get('Message', '')}", f"grant {permission}")
    return CheckResult(name, FAIL, f"could not check: {e}", "retry; if it persists, check the AWS service health page")


# ----- the checks ---------------------------------------------------------------------------


def check_credentials(ctx: PreflightContext) -> CheckResult:
    name = "AWS credentials"
    try:
        identity = ctx.client("sts").get_caller_identity()
    except NoCredentialsError:
        return CheckResult(
            name,
            FAIL,
            "no credentials found",
            "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws sso login`",
        )
    except (ClientError, BotoCoreError) as e:
        return CheckResult(name, FAIL, f"the credentials do not work: {e}", "refresh or replace them")
    if identity["Account"] != ctx.config.account:
        return CheckResult(
            name,
            FAIL,
            f"credentials are for account {identity['Account']}, the profile deploys to {ctx.config.account}",
            "use credentials for the profile's account, or fix `account` in the profile",
        )
    return CheckResult(name, PASS, f"{identity['Arn']} in {identity['Account']}")


def _quota_value(ctx: PreflightContext, service: str, code: str) -> float:
    quotas = ctx.client("service-quotas")
    try:
        return quotas.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"]
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
    # Never raised by the account: the default applies.
    return quotas.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"]


def _vcpus_in_use(ctx: PreflightContext, quota: VcpuQuota) -> int:
    """vCPUs of running/pending instances that count against the quota (P or G) in the region."""
    ec2 = ctx.client("ec2")
    unknown: dict[str, int] = {}
    used = 0
    paginator = ec2.get_paginator("describe_instances")
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    for page in paginator.paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                instance_type = instance["InstanceType"]
                if not quota.counts(instance_type):
                    continue
                if instance_type in INSTANCE_FACTS:
                    used += INSTANCE_FACTS[instance_type].vcpus
                else:
                    unknown[instance_type] = unknown.get(instance_type, 0) + 1
    if unknown:
        described = ec2.describe_instance_types(InstanceTypes=sorted(unknown))["InstanceTypes"]
        for item in described:
            used += item["VCpuInfo"]["DefaultVCpus"] * unknown[item["InstanceType"]]
    return used


def check_vcpu_quota(ctx: PreflightContext, reservation: dict | None = None) -> CheckResult:
    facts = ctx.facts
    quota = facts.on_demand_vcpu_quota
    name = f"vCPU quota: {quota.name}"
    needed = ctx.nodes * facts.vcpus
    if reservation is not None and reservation.get("AvailableInstanceCount", 0) >= ctx.nodes:
        return CheckResult(
            name, PASS, f"{ctx.nodes} instances covered by capacity reservation {reservation['CapacityReservationId']}"
        )
    try:
        limit = _quota_value(ctx, "ec2", quota.code)
        used = _vcpus_in_use(ctx, quota)
    except (ClientError, BotoCoreError) as e:
        return _error_result(name, e, "servicequotas:GetServiceQuota and ec2:DescribeInstances")
    free = limit - used
    detail = f"need {needed} ({ctx.nodes} x {facts.vcpus}), quota {limit:g}, in use {used}"
    if free >= needed:
        return CheckResult(name, PASS, detail)
    return CheckResult(
        name,
        FAIL,
        detail,
        f"request a quota increase to at least {math.ceil(used + needed)} vCPUs (Service Quotas > Amazon EC2 > "
        f"{quota.name}, code {quota.code}) or use a capacity reservation",
    )


def check_instance_offered(ctx: PreflightContext) -> CheckResult:
    instance_type, az = ctx.facts.instance_type, ctx.config.gpu_availability_zone
    name = f"{instance_type} offered in {az}"
    try:
        offerings = ctx.client("ec2").describe_instance_type_offerings(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )["InstanceTypeOfferings"]
    except (ClientError, BotoCoreError) as e:
        return _error_result(name, e, "ec2:DescribeInstanceTypeOfferings")
    zones = sorted(o["Location"] for o in offerings)
    if az in zones:
        return CheckResult(name, PASS, f"offered in {', '.join(zones)}")
    return CheckResult(
        name,
        FAIL,
        f"not offered in {az}"
        + (f"; offered in {', '.join(zones)}" if zones else f" nor anywhere in {ctx.config.region}"),
        f"set gpu_availability_zone to one of {', '.join(zones)}"
        if zones
        else "choose another region or instance type",
    )


def describe_reservation(ctx: PreflightContext) -> tuple[dict | None, CheckResult]:
    reservation_id = ctx.config.gpu_nodes.capacity_reservation_id
    name = "capacity reservation"
    if reservation_id is None:
        return None, CheckResult(name, SKIP, "none configured (on-demand capacity)")
    name = f"capacity reservation {reservation_id}"
    try:
        found = ctx.client("ec2").describe_capacity_reservations(CapacityReservationIds=[reservation_id])[
            "CapacityReservations"
        ]
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in {
            "InvalidCapacityReservationId.NotFound",
            "InvalidCapacityReservationId.Malformed",
        }:
            found = []
        else:
            return None, _error_result(name, e, "ec2:DescribeCapacityReservations")
    except BotoCoreError as e:
        return None, _error_result(name, e, "ec2:DescribeCapacityReservations")
    if not found:
        return None, CheckResult(
            name,
            FAIL,
            f"does not exist in {ctx.config.region}",
            "check gpu_nodes.capacity_reservation_id and the region",
        )
    reservation = found[0]
    problems = []
    if reservation["InstanceType"] != ctx.facts.instance_type:
        problems.append(f"is for {reservation['InstanceType']}, not {ctx.facts.instance_type}")
    if reservation["AvailabilityZone"] != ctx.config.gpu_availability_zone:
        problems.append(f"is in {reservation['AvailabilityZone']}, not {ctx.config.gpu_availability_zone}")
    state = reservation["State"]
    # A purchased Capacity Block is `scheduled` until its start time; nodes launch once it is active.
    acceptable = {"active"} | ({"scheduled"} if ctx.config.gpu_nodes.capacity_type == "capacity-block" else set())
    if state not in acceptable:
        problems.append(f"is {state}")
    available = reservation.get("AvailableInstanceCount", 0)
    if available < ctx.nodes:
        problems.append(
            f"has {available} of {reservation.get('TotalInstanceCount', '?')} instances available, need {ctx.nodes}"
        )
    if problems:
        return reservation, CheckResult(
            name,
            FAIL,
            "; ".join(problems),
            "use a reservation that is active (or a scheduled Capacity Block), in the GPU AZ, for this "
            "instance type and with enough free instances; or remove capacity_reservation_id",
        )
    note = f" (starts {reservation.get('StartDate')})" if state == "scheduled" else ""
    return reservation, CheckResult(
        name,
        PASS,
        f"{state}{note}, {available} x {reservation['InstanceType']} available in {reservation['AvailabilityZone']}",
    )


def _lustre_storage_quota(ctx: PreflightContext) -> dict | None:
    """The account's FSx for Lustre SSD storage quota, found by name: FSx publishes one per
    deployment type ("... Persistent_2 ..." for this project's file systems)."""
    paginator = ctx.client("service-quotas").get_paginator("list_service_quotas")
    candidates = []
    for page in paginator.paginate(ServiceCode="fsx"):
        for quota in page["Quotas"]:
            text = quota["QuotaName"].lower().replace(" ", "_")
            if "lustre" in text and "storage" in text and "backup" not in text:
                candidates.append(quota)
    persistent_2 = [q for q in candidates if "persistent_2" in q["QuotaName"].lower().replace(" ", "_")]
    return (persistent_2 or candidates or [None])[0]


def check_fsx_quota(ctx: PreflightContext) -> CheckResult:
    name = "FSx for Lustre storage quota"
    needed = ctx.config.fsx.storage_gib
    try:
        quota = _lustre_storage_quota(ctx)
        used = 0
        for page in ctx.client("fsx").get_paginator("describe_file_systems").paginate():
            used += sum(fs["StorageCapacity"] for fs in page["FileSystems"] if fs["FileSystemType"] == "LUSTRE")
    except (ClientError, BotoCoreError) as e:
        return _error_result(name, e, "servicequotas:ListServiceQuotas and fsx:DescribeFileSystems")
    if quota is None:
        return CheckResult(
            name, WARN, "no Lustre storage quota found in Service Quotas", "check Service Quotas > Amazon FSx by hand"
        )
    limit = quota["Value"]
    detail = f"need {needed} GiB, quota {limit:g} GiB ({quota['QuotaName']}), in use {used} GiB"
    if used + needed <= limit:
        return CheckResult(name, PASS, detail)
    return CheckResult(
        name,
        FAIL,
        detail,
        f"request an increase of '{quota['QuotaName']}' (code {quota['QuotaCode']}) to at least {used + needed} GiB, "
        "or lower fsx.storage_gib",
    )


def check_kubernetes_version(ctx: PreflightContext) -> CheckResult:
    version = ctx.config.kubernetes_version
    name = f"EKS offers Kubernetes {version}"
    try:
        versions = ctx.client("eks").describe_cluster_versions(clusterVersions=[version])["clusterVersions"]
    except (ClientError, BotoCoreError) as e:
        return _error_result(name, e, "eks:DescribeClusterVersions")
    usable = [v for v in versions if v.get("clusterVersion") == version and v.get("versionStatus") in _EKS_VERSION_OK]
    if usable:
        return CheckResult(name, PASS, f"{usable[0]['versionStatus'].replace('_', ' ').lower()}")
    status = versions[0].get("versionStatus") if versions else "not offered"
    return CheckResult(
        name,
        FAIL,
        f"{version} is {status} in {ctx.config.region}",
        "set kubernetes_version to a version EKS offers (aws eks describe-cluster-versions)",
    )


def _offered_addon_versions(ctx: PreflightContext, addon: str) -> tuple[list[str], str | None]:
    """Builds EKS offers of `addon` for the profile's Kubernetes minor, and its default build."""
    minor = ctx.config.kubernetes_version
    offered, default = [], None
    paginator = ctx.client("eks").get_paginator("describe_addon_versions")
    for page in paginator.paginate(kubernetesVersion=minor, addonName=addon):
        for item in page["addons"]:
            for version in item["addonVersions"]:
                for compatibility in version.get("compatibilities", []):
                    if compatibility.get("clusterVersion") == minor:
                        offered.append(version["addonVersion"])
                        if compatibility.get("defaultVersion"):
                            default = version["addonVersion"]
    return offered, default


def check_addon_versions(ctx: PreflightContext) -> CheckResult:
    """Every EKS managed add-on the stacks install, at its pinned build, must be offered for the
    profile's Kubernetes minor; CloudFormation would otherwise fail mid-deploy with "Addon version
    specified is not supported"."""
    minor = ctx.config.kubernetes_version
    name = f"EKS add-on versions for {minor}"
    problems, fixes, pinned = [], [], []
    try:
        for addon in managed_addons(ctx.config):
            offered, default = _offered_addon_versions(ctx, addon.name)
            if not offered:
                problems.append(f"{addon.name} is not offered for Kubernetes {minor}")
                fixes.append(
                    "check kubernetes_version and the add-on "
                    f"(aws eks describe-addon-versions --addon-name {addon.name})"
                )
            elif addon.version is None:
                pinned.append(f"{addon.name} (EKS default {default or '?'})")
            elif addon.version not in offered:
                problems.append(
                    f"{addon.name} {addon.version} is not offered for Kubernetes {minor} "
                    f"(EKS default: {default or 'none'})"
                )
                fixes.append(
                    f"set addons.versions.{addon.config_field}: {default or offered[0]} in the profile "
                    "(or update the pin in nvrx_eks/facts/kubernetes_versions.py)"
                )
            else:
                pinned.append(f"{addon.name} {addon.version}")
    except (ClientError, BotoCoreError) as e:
        return _error_result(name, e, "eks:DescribeAddonVersions")
    if problems:
        return CheckResult(name, FAIL, "; ".join(problems), "; ".join(fixes))
    return CheckResult(name, PASS, ", ".join(pinned))


def check_placeholders(ctx: PreflightContext) -> CheckResult:
    name = "profile has no placeholders"
    found = documentation_placeholders(ctx.config)
    if not found:
        return CheckResult(name, PASS, "account, admin_principal_arn and endpoint.public_cidrs are your own")
    # One line per field in both columns, so each problem sits beside its fix.
    return CheckResult(
        name,
        FAIL,
        "\n".join(p.problem for p in found),
        "\n".join(f"{p.field}: {p.fix}" for p in found),
    )


def check_endpoint_reachable(ctx: PreflightContext) -> CheckResult:
    """With a public endpoint, EKS drops every request from outside endpoint.public_cidrs: a list
    that leaves this machine out deploys fine, then locks its user out of the cluster."""
    endpoint = ctx.config.endpoint
    name = "API endpoint allows this machine"
    if endpoint.access == "private":
        return CheckResult(name, SKIP, "endpoint.access is private: reach the API from inside the VPC (VPN, bastion)")
    by_hand = f"check by hand: `curl {CHECKIP_URL}` must print an address inside endpoint.public_cidrs"
    try:
        answer = (ctx.egress_ip or fetch_egress_ip)()
    except (OSError, UnicodeDecodeError) as e:  # urllib's URLError and timeouts are OSErrors
        reason = getattr(e, "reason", None) or e
        return CheckResult(name, SKIP, f"not run: could not reach {CHECKIP_URL} ({reason})", by_hand)
    try:
        address = ipaddress.IPv4Address(answer)
    except ValueError:
        return CheckResult(name, SKIP, f"not run: {CHECKIP_URL} answered {answer[:40]!r}, not an IPv4 address", by_hand)
    for cidr in endpoint.public_cidrs:
        if address in ipaddress.IPv4Network(cidr):
            return CheckResult(name, PASS, f"this machine's egress address {address} is in {cidr}")
    return CheckResult(
        name,
        FAIL,
        f"this machine's egress address {address} is in none of endpoint.public_cidrs "
        f"({', '.join(endpoint.public_cidrs)}): EKS would refuse its kubectl and nvrx-eks requests",
        f"add {address}/32 (or your network's range) to endpoint.public_cidrs, or run from a network inside them",
    )


# ----- the run ------------------------------------------------------------------------------


def run_checks(
    config: DeploymentConfig, nodes: int, session: boto3.Session, egress_ip: Callable[[], str] | None = None
) -> list[CheckResult]:
    ctx = PreflightContext(config, nodes, session, egress_ip)
    results = [check_credentials(ctx)]
    # These need no AWS credentials: they run, and are listed last, either way.
    offline = [check_placeholders(ctx), check_endpoint_reachable(ctx)]
    if results[0].status == FAIL:
        skipped = (
            "vCPU quota",
            "instance offered",
            "capacity reservation",
            "FSx storage quota",
            "EKS version",
            "EKS add-on versions",
        )
        return results + [CheckResult(n, SKIP, "needs working credentials") for n in skipped] + offline
    reservation, reservation_result = describe_reservation(ctx)
    checks: list[Callable[[], CheckResult]] = [
        lambda: check_vcpu_quota(ctx, reservation if reservation_result.status == PASS else None),
        lambda: check_instance_offered(ctx),
        lambda: reservation_result,
        lambda: check_fsx_quota(ctx),
        lambda: check_kubernetes_version(ctx),
        lambda: check_addon_versions(ctx),
    ]
    return results + [check() for check in checks] + offline


# ----- an existing cluster -----------------------------------------------------------------


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
        skipped = ("Kubernetes version", "namespace", "claim", "job API", "GPU nodes")
        return [CheckResult(name, FAIL, str(e), "fix cluster.context or cluster.kubeconfig in the config")] + [
            CheckResult(n, SKIP, "needs a usable kubeconfig context") for n in skipped
        ]
    results = [CheckResult(name, PASS, f"API server {client.api_client.configuration.host}")]
    checks = {
        "Kubernetes version": _check_version,
        "namespace": _check_namespace,
        "claim": _check_claim,
        "job API": _check_job_api,
        "GPU nodes": _check_gpu_nodes,
    }
    for what, check in checks.items():
        try:
            results.append(check(client, config, nodes))
        except ConfigError as e:  # what the API server, or the way to it, said
            results.append(CheckResult(what, FAIL, str(e), "see the detail"))
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


def results_as_data(results: list[CheckResult]) -> dict:
    """The checks for `preflight -o json|yaml`."""
    return {
        "passed": not any(r.status == FAIL for r in results),
        "checks": [dataclasses.asdict(r) for r in results],
    }


def print_results(results: list[CheckResult], console: Console) -> None:
    styles = {PASS: "green", FAIL: "bold red", WARN: "yellow", SKIP: "dim"}
    table = Table(title="Preflight", show_lines=False)
    for column in ("check", "result", "detail", "fix"):
        table.add_column(column)
    for r in results:
        table.add_row(escape(r.name), f"[{styles[r.status]}]{r.status}[/]", escape(r.detail), escape(r.fix))
    console.print(table)


def run(
    deployment: Deployment,
    nodes: int | None,
    console: Console,
    session: boto3.Session | None = None,
    *,
    output: str = "table",
) -> list[CheckResult]:
    config = deployment.config
    nodes = nodes or config.gpu_nodes.max_size
    if config.cluster is None:
        results = run_checks(config, nodes, session or boto3.Session(region_name=config.region))
        before = f"`{deployment.deploy_command}`"
    else:
        results = cluster_checks(config, nodes)
        before = "submitting a job to the cluster"
    print_results(results, console)
    write_data(results_as_data(results), output)
    failed = [r for r in results if r.status == FAIL]
    if failed:
        raise ConfigError(
            f"{len(failed)} preflight check(s) failed ({', '.join(r.name for r in failed)}); fix them before {before}"
        )
    return results
