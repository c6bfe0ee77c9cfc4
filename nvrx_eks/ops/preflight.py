"""`nvrx-eks preflight`: what must be true in the AWS account before `cdk deploy` can succeed.

Each check is one small function over a boto3 session that returns a CheckResult with the fix
when it fails, so a user learns about a missing quota or an expired reservation in seconds
instead of after a 40-minute rollback. The checks only read (Describe/Get/List). Two need no
AWS credentials and always run: the profile must hold no documentation placeholder (account,
admin role, endpoint CIDRs: infra/config/placeholders.py), and with a public API endpoint this
machine's address, as https://checkip.amazonaws.com sees it, must be in endpoint.public_cidrs.

Quota is not capacity: a vCPU quota lets the account run that many instances, it does not mean
AWS has them free in the GPU AZ when `nvrx-eks capacity up` asks. Where AWS gives a capacity
signal (an On-Demand Capacity Reservation's free instances, a Capacity Block's state and size)
preflight checks it; without a reservation it says the capacity is unchecked.

The identity checks (preflight_identity.py): admin_principal_arn must exist as written, and the
caller must be it, or nvrx-eks cannot reach the cluster it deploys. A config with a `cluster:`
section names a cluster that exists already: nothing is deployed, so the checks are of that
cluster instead (preflight_cluster.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import urllib.request
from collections.abc import Callable

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.addons.install import managed_addons
from infra.config import DeploymentConfig, documentation_placeholders
from nvrx_eks.deploy import reservations
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.facts.errors import ConfigError, terminal_safe
from nvrx_eks.facts.instances import INSTANCE_FACTS, VcpuQuota
from nvrx_eks.jobs.output_format import write_data
from nvrx_eks.ops.preflight_cluster import cluster_checks
from nvrx_eks.ops.preflight_context import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    CheckResult,
    PreflightContext,
    error_code,
    error_result,
)
from nvrx_eks.ops.preflight_identity import NAME as ADMIN_PRINCIPAL
from nvrx_eks.ops.preflight_identity import check_admin_principal

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "Check", "CheckResult", "PreflightContext", "run", "run_checks"]

#: EKS version states in which new clusters can be created.
_EKS_VERSION_OK = {"STANDARD_SUPPORT", "EXTENDED_SUPPORT"}


#: Where this machine learns its public IPv4 address: an AWS service, answering with the address alone.
CHECKIP_URL = "https://checkip.amazonaws.com"
#: It answers in well under a second; a few seconds cover a slow link without stalling preflight.
CHECKIP_TIMEOUT_S = 5.0


def fetch_egress_ip() -> str:
    """This machine's public IPv4 address as AWS sees it (what the API endpoint's CIDR filter sees)."""
    with urllib.request.urlopen(CHECKIP_URL, timeout=CHECKIP_TIMEOUT_S) as response:
        return response.read(64).decode("ascii").strip()


# ----- the checks ---------------------------------------------------------------------------

#: The rows of the checks that need no AWS credentials.
PLACEHOLDERS = "profile has no placeholders"
ENDPOINT_REACHABLE = "API endpoint allows this machine"


def check_credentials(ctx: PreflightContext) -> CheckResult:
    """The check of access: the checks that need credentials run only when it passes."""
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
        if error_code(e) != "NoSuchResourceException":
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
    if reservation is not None and reservations.free_instances(reservation) >= ctx.nodes:
        return CheckResult(
            name, PASS, f"{ctx.nodes} instances covered by capacity reservation {reservation['CapacityReservationId']}"
        )
    try:
        limit = _quota_value(ctx, "ec2", quota.code)
        used = _vcpus_in_use(ctx, quota)
    except (ClientError, BotoCoreError) as e:
        return error_result(name, e, "servicequotas:GetServiceQuota and ec2:DescribeInstances")
    free = limit - used
    detail = f"need {needed} ({ctx.nodes} x {facts.vcpus}), quota {limit:g}, in use {used} (a limit, not capacity)"
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
        return error_result(name, e, "ec2:DescribeInstanceTypeOfferings")
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
    """The GPU capacity AWS will hold for the nodes: the reservation's, checked; without one, a
    warning that the quota checked above is not capacity."""
    reservation_id = ctx.config.gpu_nodes.capacity_reservation_id
    if reservation_id is None:
        return None, CheckResult(
            "GPU capacity",
            WARN,
            f"not reserved: the vCPU quota is a limit, not capacity; {ctx.nodes} x {ctx.facts.instance_type} start "
            f"only if {ctx.config.gpu_availability_zone} has them free when `nvrx-eks capacity up` asks (after "
            "deploy, so a shortfall fails that command, not the deploy)",
            "for capacity you can count on, buy a Capacity Block or an On-Demand Capacity Reservation in the GPU "
            "AZ and set gpu_nodes.capacity_reservation_id",
        )
    name = f"capacity reservation {reservation_id}"
    try:
        reservation = reservations.describe(ctx.session, ctx.config.region, reservation_id)
    except (ClientError, BotoCoreError) as e:
        return None, error_result(name, e, "ec2:DescribeCapacityReservations")
    if reservation is None:
        return None, CheckResult(
            name,
            FAIL,
            f"does not exist in {ctx.config.region}",
            "check gpu_nodes.capacity_reservation_id and the region",
        )
    problems = []
    if reservation["InstanceType"] != ctx.facts.instance_type:
        problems.append(f"is for {reservation['InstanceType']}, not {ctx.facts.instance_type}")
    if reservation["AvailabilityZone"] != ctx.config.gpu_availability_zone:
        problems.append(f"is in {reservation['AvailabilityZone']}, not {ctx.config.gpu_availability_zone}")
    state = reservation["State"]
    # A purchased Capacity Block is `scheduled` until its start time; nodes launch once it is active.
    block = ctx.config.gpu_nodes.capacity_type == "capacity-block"
    if state not in {reservations.ACTIVE} | ({reservations.SCHEDULED} if block else set()):
        problems.append(f"is {state}")
    # A scheduled block reports 0 available until it starts: its size is in a tag (reservations.py).
    free, held = reservations.free_instances(reservation), reservations.reserved_instances(reservation)
    if free < ctx.nodes:
        problems.append(f"has {free} of {held} instances free, need {ctx.nodes}")
    if problems:
        return reservation, CheckResult(
            name,
            FAIL,
            "; ".join(problems),
            "use a reservation that is active (or a scheduled Capacity Block), in the GPU AZ, for this "
            "instance type and with enough free instances; or remove capacity_reservation_id",
        )
    if state == reservations.SCHEDULED:
        detail = (
            f"scheduled: starts {reservations.utc_text(reservation.get('StartDate'))}, then holds {held} x "
            f"{reservation['InstanceType']} in {reservation['AvailabilityZone']} until "
            f"{reservations.utc_text(reservation.get('EndDate'))}; deploy now, `nvrx-eks capacity up` once it starts"
        )
    else:
        detail = f"{state}, {free} of {held} x {reservation['InstanceType']} free in {reservation['AvailabilityZone']}"
    return reservation, CheckResult(name, PASS, detail)


def check_capacity(ctx: PreflightContext) -> CheckResult:
    return ctx.once(describe_reservation)[1]


def check_vcpu_quota_unless_reserved(ctx: PreflightContext) -> CheckResult:
    """The vCPU quota, unless a reservation that passed its own check holds the nodes."""
    reservation, result = ctx.once(describe_reservation)
    return check_vcpu_quota(ctx, reservation if result.status == PASS else None)


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
        return error_result(name, e, "servicequotas:ListServiceQuotas and fsx:DescribeFileSystems")
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
        return error_result(name, e, "eks:DescribeClusterVersions")
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
        return error_result(name, e, "eks:DescribeAddonVersions")
    if problems:
        return CheckResult(name, FAIL, "; ".join(problems), "; ".join(fixes))
    return CheckResult(name, PASS, ", ".join(pinned))


def check_placeholders(ctx: PreflightContext) -> CheckResult:
    name = PLACEHOLDERS
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
    name = ENDPOINT_REACHABLE
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


#: The account's checks after the credentials', in the order of their rows. Those that need no
#: credentials run either way, and are listed last.
ACCOUNT_CHECKS: tuple[Check[[PreflightContext]], ...] = (
    Check(ADMIN_PRINCIPAL, check_admin_principal),
    Check("vCPU quota", check_vcpu_quota_unless_reserved),
    Check("instance offered", check_instance_offered),
    Check("GPU capacity", check_capacity),
    Check("FSx storage quota", check_fsx_quota),
    Check("EKS version", check_kubernetes_version),
    Check("EKS add-on versions", check_addon_versions),
    Check(PLACEHOLDERS, check_placeholders, needs_access=False),
    Check(ENDPOINT_REACHABLE, check_endpoint_reachable, needs_access=False),
)


def run_checks(
    config: DeploymentConfig, nodes: int, session: boto3.Session, egress_ip: Callable[[], str] | None = None
) -> list[CheckResult]:
    ctx = PreflightContext(config, nodes, session, egress_ip)
    credentials = check_credentials(ctx)
    usable = credentials.status != FAIL
    return [credentials] + [
        check.run(ctx) if usable or not check.needs_access else check.skipped("needs working credentials")
        for check in ACCOUNT_CHECKS
    ]


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
        # Details echo what a kubeconfig or the account holds (a context name, a principal): shown, never obeyed.
        name, detail, fix = (escape(terminal_safe(text)) for text in (r.name, r.detail, r.fix))
        table.add_row(name, f"[{styles[r.status]}]{r.status}[/]", detail, fix)
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
