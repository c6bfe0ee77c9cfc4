"""`nvrx-eks teardown`: remove a deployment without leaving billable orphans or losing data.

Order matters:
1. training jobs (their pods hold the FSx claim and GPU nodes busy), then the PVC and PV, waiting
   until they are gone: a claim still mounted by a pod blocks `cdk destroy` at the kubectl
   provider until CloudFormation times out;
2. `cdk destroy` of the three stacks (through an injectable runner, so tests never run it);
3. a sweep for what outlives a stack: ENIs the VPC CNI created, the EKS-created cluster security
   group, placement groups, control-plane and Container Insights log groups, FSx backups, and
   detached EBS volumes, found by the deployment tag and the cluster's own tags.

Data (the S3 data bucket and the FSx file system) is never deleted without `--delete-data`; FSx
backups and the EKS control-plane log groups (`/aws/eks/<cluster>/`, which hold the API audit
log: who did what to the cluster, wanted most after an incident) count as data too, so they are
only reported unless `--delete-data` is given. Nothing is deleted without confirmation unless
`--yes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from kubernetes import client as k8s
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.config import STACK_ROLES, DeploymentConfig
from nvrx_eks.deploy.cdk_cli import cdk_argv, run_command
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_error, describe_stack, read_stack_outputs
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.names import DEPLOYMENT_TAG_KEY, FSX_PV_NAME
from nvrx_eks.resources import checkout_root

#: Runs a command (argv) from the project root and returns its exit status.
CommandRunner = Callable[[list[str]], int]
Confirm = Callable[[str], bool]


def cdk_destroy_argv(deployment: Deployment) -> list[str]:
    return cdk_argv("destroy", "--all", "--force", "--no-notices", *deployment.cdk_context_args)


@dataclass
class Orphan:
    kind: str
    identifier: str
    detail: str = ""
    #: Deleting it would delete data: only with --delete-data.
    is_data: bool = False
    #: What data it holds, for the "kept" outcome.
    data_note: str = "data"
    outcome: str = "found"


@dataclass
class RetainedData:
    buckets: list[str] = field(default_factory=list)
    file_systems: list[str] = field(default_factory=list)


@dataclass
class TeardownResult:
    aborted: bool = False
    jobs_deleted: list[str] = field(default_factory=list)
    stacks_destroyed: list[str] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    data_kept: RetainedData = field(default_factory=RetainedData)
    data_deleted: RetainedData = field(default_factory=RetainedData)


# ----- Kubernetes side ----------------------------------------------------------------------


def delete_kubernetes_objects(
    api_client: k8s.ApiClient,
    namespace: str,
    pvc_name: str,
    console: Console,
    *,
    timeout_s: float = 900,
    poll_s: float = 5,
) -> list[str]:
    """Delete this project's jobs, then the FSx claim and volume, waiting for each to be gone."""
    from nvrx_eks.jobs.client import JobClient

    jobs = JobClient(api_client, namespace, console)
    deleted = []
    found = jobs.list_jobs()
    for kind, obj in found:
        name = obj["metadata"]["name"]
        console.print(f"deleting {kind.kind} {name}")
        jobs._delete_object(kind.kind, name)
        deleted.append(f"{kind.kind}/{name}")
    for kind, obj in found:
        jobs.wait_gone(kind, obj["metadata"]["name"], timeout_s=timeout_s, poll_s=poll_s)

    core = k8s.CoreV1Api(api_client)
    _delete_and_wait(
        f"PersistentVolumeClaim {pvc_name}",
        lambda: core.delete_namespaced_persistent_volume_claim(pvc_name, namespace),
        lambda: core.read_namespaced_persistent_volume_claim(pvc_name, namespace),
        console,
        timeout_s,
        poll_s,
    )
    # The PV's reclaim policy is Retain: deleting the object never touches the file system.
    _delete_and_wait(
        f"PersistentVolume {FSX_PV_NAME}",
        lambda: core.delete_persistent_volume(FSX_PV_NAME),
        lambda: core.read_persistent_volume(FSX_PV_NAME),
        console,
        timeout_s,
        poll_s,
    )
    return deleted


def _delete_and_wait(what: str, delete, read, console: Console, timeout_s: float, poll_s: float) -> None:
    from nvrx_eks.jobs.client import unless_missing

    def delete_it() -> bool:
        delete()
        return True

    if unless_missing(delete_it, f"deleting {what}") is None:
        return  # already gone
    console.print(f"deleting {what}")
    deadline = time.monotonic() + timeout_s
    while unless_missing(read, f"waiting for {what} to go") is not None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{what} still exists after {timeout_s:.0f} s: a pod still uses it; find it with "
                "`kubectl get pods -A` (or `nvrx-eks status`) and delete it, then run teardown again"
            )
        time.sleep(poll_s)


# ----- AWS side -----------------------------------------------------------------------------


def _tag_filter(key: str, value: str) -> dict:
    return {"Name": f"tag:{key}", "Values": [value]}


def find_orphans(session: boto3.Session, config: DeploymentConfig) -> list[Orphan]:
    """Resources of this deployment that survived its stacks, by tag and by the cluster's name."""
    ec2 = session.client("ec2", region_name=config.region)
    ours = _tag_filter(DEPLOYMENT_TAG_KEY, config.name)
    orphans: list[Orphan] = []

    enis: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("cluster.k8s.amazonaws.com/name", config.cluster_name)):
        for eni in ec2.describe_network_interfaces(Filters=[tag_filter])["NetworkInterfaces"]:
            enis[eni["NetworkInterfaceId"]] = eni
    for eni_id, eni in sorted(enis.items()):
        orphans.append(Orphan("network interface", eni_id, f"{eni.get('Status')} in {eni.get('VpcId')}"))

    groups: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("aws:eks:cluster-name", config.cluster_name)):
        for group in ec2.describe_security_groups(Filters=[tag_filter])["SecurityGroups"]:
            if group.get("GroupName") != "default":
                groups[group["GroupId"]] = group
    for group_id, group in sorted(groups.items()):
        orphans.append(Orphan("security group", group_id, group.get("GroupName", "")))

    for group in ec2.describe_placement_groups(Filters=[ours])["PlacementGroups"]:
        orphans.append(Orphan("placement group", group["GroupName"], group.get("Strategy", "")))

    for volume in ec2.describe_volumes(Filters=[ours, {"Name": "status", "Values": ["available"]}])["Volumes"]:
        orphans.append(Orphan("EBS volume", volume["VolumeId"], f"{volume['Size']} GiB, detached"))

    logs = session.client("logs", region_name=config.region)
    # (prefix, what it holds if it is data): Container Insights metrics are not worth keeping.
    prefixes = (
        (f"/aws/eks/{config.cluster_name}/", "control-plane and audit logs"),
        (f"/aws/containerinsights/{config.cluster_name}/", None),
    )
    for prefix, data_note in prefixes:
        for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            for group in page["logGroups"]:
                detail = f"{group.get('storedBytes', 0)} bytes"
                if data_note is None:
                    orphans.append(Orphan("log group", group["logGroupName"], detail))
                else:
                    orphans.append(Orphan("log group", group["logGroupName"], detail, True, data_note))

    fsx = session.client("fsx", region_name=config.region)
    for page in fsx.get_paginator("describe_backups").paginate():
        for backup in page["Backups"]:
            tags = {t["Key"]: t["Value"] for t in backup.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == config.name:
                orphans.append(Orphan("FSx backup", backup["BackupId"], backup.get("Lifecycle", ""), is_data=True))
    return orphans


def delete_orphan(session: boto3.Session, config: DeploymentConfig, orphan: Orphan) -> str:
    ec2 = session.client("ec2", region_name=config.region)
    try:
        if orphan.kind == "network interface":
            ec2.delete_network_interface(NetworkInterfaceId=orphan.identifier)
        elif orphan.kind == "security group":
            ec2.delete_security_group(GroupId=orphan.identifier)
        elif orphan.kind == "placement group":
            ec2.delete_placement_group(GroupName=orphan.identifier)
        elif orphan.kind == "EBS volume":
            ec2.delete_volume(VolumeId=orphan.identifier)
        elif orphan.kind == "log group":
            session.client("logs", region_name=config.region).delete_log_group(logGroupName=orphan.identifier)
        elif orphan.kind == "FSx backup":
            session.client("fsx", region_name=config.region).delete_backup(BackupId=orphan.identifier)
        else:  # pragma: no cover - every kind find_orphans returns is handled above
            return f"kept: unknown kind {orphan.kind}"
    except ClientError as e:
        error = e.response.get("Error", {})
        return f"failed: {error.get('Code')}: {error.get('Message')}"
    return "deleted"


def find_retained_data(session: boto3.Session, config: DeploymentConfig, outputs: StackOutputs | None) -> RetainedData:
    """The data bucket(s) and FSx file system(s) of this deployment, from the outputs or by tag."""
    data = RetainedData()
    fsx = session.client("fsx", region_name=config.region)
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page["FileSystems"]:
            tags = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == config.name or (
                outputs and fs["FileSystemId"] == outputs.fsx_file_system_id
            ):
                if fs.get("Lifecycle") != "DELETING":
                    data.file_systems.append(fs["FileSystemId"])
    s3 = session.client("s3", region_name=config.region)
    for bucket in s3.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        if outputs and name == outputs.data_bucket_name:
            data.buckets.append(name)
            continue
        if not name.startswith(config.stack_name("storage")):
            continue  # CloudFormation names our buckets <stack>-<logical id>-<suffix>
        try:
            tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name)["TagSet"]}
        except ClientError:
            continue
        if tags.get(DEPLOYMENT_TAG_KEY) == config.name:
            data.buckets.append(name)
    return data


def empty_and_delete_bucket(session: boto3.Session, config: DeploymentConfig, name: str) -> None:
    """Versioned bucket: every object version and delete marker must go before the bucket can."""
    s3 = session.client("s3", region_name=config.region)
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        keys = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for start in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=name, Delete={"Objects": keys[start : start + 1000], "Quiet": True})
    s3.delete_bucket(Bucket=name)


# ----- the command --------------------------------------------------------------------------


def teardown(
    deployment: Deployment,
    *,
    yes: bool,
    delete_data: bool,
    console: Console,
    confirm: Confirm,
    run_cdk: CommandRunner | None = None,
    session: boto3.Session | None = None,
    api_client_factory: Callable[[StackOutputs], k8s.ApiClient] | None = None,
    skip_kubernetes: bool = False,
    timeout_s: float = 900,
    poll_s: float = 5,
) -> TeardownResult:
    checkout_root()  # cdk destroy runs from the checkout: without one, stop before deleting anything
    config = deployment.config
    session = session or boto3.Session(region_name=config.region)
    result = TeardownResult()

    try:
        stacks = {role: describe_stack(session, config.stack_name(role), config) for role in STACK_ROLES}
        existing = [config.stack_name(role) for role, stack in stacks.items() if stack is not None]
        outputs = read_stack_outputs(deployment, session) if stacks["cluster"] is not None else None
        retained = find_retained_data(session, config, outputs)
    except (ClientError, BotoCoreError) as e:
        raise aws_error(e, config, "looking up the deployment") from None

    if config.fsx.removal_policy == "destroy" and not delete_data and stacks["storage"] is not None:
        raise ConfigError(
            "this profile sets fsx.removal_policy: destroy, so `cdk destroy` itself would delete the "
            "file system and the data bucket; pass --delete-data to confirm that, or set removal_policy: "
            f"retain and run `{deployment.deploy_command}` before tearing down"
        )

    _print_plan(console, deployment, existing, outputs, retained, delete_data, skip_kubernetes)
    if not yes and not confirm("Proceed with the teardown?"):
        console.print("aborted; nothing was deleted")
        result.aborted = True
        return result

    if outputs is not None and not skip_kubernetes:
        factory = api_client_factory or _default_api_client_factory(deployment, session)
        try:
            result.jobs_deleted = delete_kubernetes_objects(
                factory(outputs), outputs.namespace, outputs.pvc_name, console, timeout_s=timeout_s, poll_s=poll_s
            )
        except ConfigError as e:
            raise ConfigError(
                f"{e}; nothing was destroyed. If the cluster cannot be reached from here, --skip-kubernetes "
                "leaves the jobs and the claim to cdk destroy"
            ) from None

    if delete_data:
        # Before destroy: a non-empty bucket would fail the stack deletion.
        for bucket in retained.buckets:
            console.print(f"emptying and deleting bucket {bucket}")
            empty_and_delete_bucket(session, config, bucket)
            result.data_deleted.buckets.append(bucket)
    else:
        result.data_kept = retained

    if existing:
        argv = cdk_destroy_argv(deployment)
        console.print(f"running {' '.join(argv[1:])}")
        status = (run_cdk or run_command)(argv)
        if status != 0:
            raise ConfigError(
                f"cdk destroy failed (exit {status}); see its output above, fix the cause and run teardown again "
                "(it skips what is already gone)"
            )
        result.stacks_destroyed = existing

    if delete_data:
        fsx = session.client("fsx", region_name=config.region)
        for file_system_id in retained.file_systems:
            try:
                fsx.delete_file_system(FileSystemId=file_system_id)
                result.data_deleted.file_systems.append(file_system_id)
                console.print(f"deleting FSx file system {file_system_id}")
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") != "FileSystemNotFound":
                    raise aws_error(e, config, f"deleting file system {file_system_id}") from None

    try:
        result.orphans = find_orphans(session, config)
        for orphan in result.orphans:
            if orphan.is_data and not delete_data:
                orphan.outcome = f"kept ({orphan.data_note}; --delete-data deletes it)"
            else:
                orphan.outcome = delete_orphan(session, config, orphan)
    except (ClientError, BotoCoreError) as e:
        raise aws_error(e, config, "sweeping leftover resources") from None
    _print_report(console, result)
    return result


def _default_api_client_factory(deployment: Deployment, session: boto3.Session):
    from nvrx_eks.deploy.kube import api_client_for

    return lambda outputs: api_client_for(outputs, deployment.config, session)


def _print_plan(console, deployment, existing, outputs, retained, delete_data, skip_kubernetes) -> None:
    config = deployment.config
    console.print(f"[bold]Teardown of {config.name}[/] (account {config.account}, {config.region})")
    if outputs is not None and not skip_kubernetes:
        console.print(
            f"  - delete training jobs in namespace {outputs.namespace}, "
            f"then PVC {outputs.pvc_name} and PV {FSX_PV_NAME}"
        )
    console.print(f"  - cdk destroy: {', '.join(existing) if existing else 'no stacks left'}")
    console.print("  - sweep leftover ENIs, security groups, placement groups, log groups, EBS volumes")
    verb = "[red]DELETE[/]" if delete_data else "[green]keep[/]"
    for bucket in retained.buckets:
        console.print(f"  - {verb} data bucket {bucket}")
    for file_system in retained.file_systems:
        console.print(f"  - {verb} FSx file system {file_system}")
    if not delete_data:
        console.print("    (data is kept; --delete-data deletes it, and FSx backups)")


def _print_report(console: Console, result: TeardownResult) -> None:
    table = Table(title="Leftover resources")
    for column in ("resource", "id", "detail", "outcome"):
        table.add_column(column)
    for orphan in result.orphans:
        table.add_row(orphan.kind, escape(orphan.identifier), escape(orphan.detail), escape(orphan.outcome))
    if result.orphans:
        console.print(table)
    else:
        console.print("no leftover resources found")
    kept = result.data_kept
    if kept.buckets or kept.file_systems:
        console.print(
            "[yellow]still billed:[/] kept data "
            + ", ".join([f"bucket {b}" for b in kept.buckets] + [f"FSx {f}" for f in kept.file_systems])
            + "; run teardown --delete-data to delete it"
        )
