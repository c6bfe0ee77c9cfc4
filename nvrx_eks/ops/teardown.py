"""`nvrx-eks teardown`: remove a deployment without leaving billable orphans or losing data.

What goes depends on the data:
- without `--delete-data`, only the cluster stack is destroyed. The network and storage stacks
  stay: the FSx file system (kept: checkpoints, datasets) keeps its network interfaces in the GPU
  subnet and its security group, so the network stack could not be deleted anyway, and the
  storage stack's data repository associations keep exporting `/runs` to the data bucket;
- with `--delete-data`, everything goes, file system and data bucket included.

Order matters:
1. training jobs (their pods hold the FSx claim and GPU nodes busy), then the PVC and PV, waiting
   until they are gone: a claim still mounted by a pod blocks `cdk destroy` at the kubectl
   provider until CloudFormation times out;
2. `cdk destroy` of the cluster stack, by name (through an injectable runner, so tests never run it);
3. with `--delete-data` only: the FSx file system is deleted and waited for until it is gone (its
   network interfaces block the subnet and security group deletes), then the data buckets are
   emptied and deleted, then `cdk destroy` of the storage stack, then of the network stack;
4. a sweep for what outlives a stack: ENIs the VPC CNI created, unused Lambda ENIs in the
   deployment's VPC, the EKS-created cluster security group, placement groups, control-plane,
   Container Insights and the destroyed stacks' Lambda log groups, FSx backups, and detached EBS
   volumes, found by the deployment tag, the cluster's own tags and the stack names. What a stack
   that still exists owns is left to CloudFormation.

A `cdk destroy` that fails is retried once after sweeping the ENIs and security groups that commonly
block it (VPC CNI and Lambda ENIs are released late); a second failure stops the teardown with
what is still in the VPC.

Data (the S3 data bucket and the FSx file system) is never deleted without `--delete-data`; FSx
backups and the EKS control-plane log groups (`/aws/eks/<cluster>/`, which hold the API audit
log: who did what to the cluster, wanted most after an incident) count as data too, so they are
only reported unless `--delete-data` is given. Nothing is deleted without confirmation unless
`--yes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial

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


#: Destroy order: a stack goes only after the stacks that import its outputs (the cluster stack
#: imports the storage and network stacks' outputs, the storage stack the network stack's).
DESTROY_ORDER = tuple(reversed(STACK_ROLES))
#: The stacks the FSx file system needs (its subnet and security group; its data repository
#: associations): destroyed only together with the data.
DATA_STACK_ROLES = ("storage", "network")
#: The tag CloudFormation puts on every taggable resource of a stack.
STACK_NAME_TAG = "aws:cloudformation:stack-name"
#: How Lambda describes the ENIs it creates for a function in a VPC.
LAMBDA_ENI_DESCRIPTION = "AWS Lambda VPC ENI"
#: The kinds of leftover that block a stack's subnets, security groups or VPC from being deleted.
BLOCKER_KINDS = frozenset({"network interface", "security group"})
#: At most this many leftovers are named in an error message, to keep it one readable line.
MAX_NAMED = 10


def cdk_destroy_argv(deployment: Deployment, stack_name: str) -> list[str]:
    """`cdk destroy` of one stack. --exclusively: without it the CDK also destroys the stacks that
    depend on this one, and teardown decides the order and which stacks stay."""
    return cdk_argv("destroy", stack_name, "--exclusively", "--force", "--no-notices", *deployment.cdk_context_args)


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
    #: Existing stacks teardown left in place (the network and storage stacks, unless --delete-data).
    stacks_kept: list[str] = field(default_factory=list)
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


def _tags(resource: dict) -> dict[str, str]:
    # EC2 names the list "Tags" on most resources and "TagSet" on network interfaces.
    return {t["Key"]: t["Value"] for t in resource.get("Tags", resource.get("TagSet", []))}


def _owned_by_living_stack(resource: dict, living_stacks: Collection[str]) -> bool:
    """CloudFormation deletes its own resources (and a network stack kept for the file system
    still needs its security groups); the sweep takes only what no remaining stack owns."""
    return _tags(resource).get(STACK_NAME_TAG) in living_stacks


def _deployment_vpcs(ec2, config: DeploymentConfig) -> list[str]:
    vpcs = ec2.describe_vpcs(Filters=[_tag_filter(DEPLOYMENT_TAG_KEY, config.name)])["Vpcs"]
    return sorted(vpc["VpcId"] for vpc in vpcs)


def _is_function_log_group(name: str, stack_name: str) -> bool:
    """Whether `name` is the log group of a Lambda function CloudFormation created in the stack.

    CloudFormation names such a function `<stack>-<logical id>-<random suffix>`, and logical ids
    have no hyphen. Checking that shape keeps another deployment whose name starts with
    `<ours>-<role>` out: its functions are `<ours>-<role>-<its role>-<logical id>-<suffix>`.
    """
    prefix = f"/aws/lambda/{stack_name}-"
    if not name.startswith(prefix):
        return False
    parts = name[len(prefix) :].split("-")
    return len(parts) == 2 and all(part.isalnum() for part in parts)


def find_orphans(
    session: boto3.Session,
    config: DeploymentConfig,
    *,
    living_stacks: Collection[str] = (),
    blockers_only: bool = False,
) -> list[Orphan]:
    """Resources of this deployment that survived its stacks, by tag and by the cluster's name.

    `living_stacks`: the deployment's stacks that still exist; what they own is left to them, and
    their Lambda functions' log groups are still in use. `blockers_only`: just the network
    interfaces and security groups, which can block a stack's deletion.
    """
    ec2 = session.client("ec2", region_name=config.region)
    ours = _tag_filter(DEPLOYMENT_TAG_KEY, config.name)
    orphans: list[Orphan] = []

    enis: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("cluster.k8s.amazonaws.com/name", config.cluster_name)):
        for eni in ec2.describe_network_interfaces(Filters=[tag_filter])["NetworkInterfaces"]:
            enis[eni["NetworkInterfaceId"]] = eni
    # Lambda releases a VPC function's ENIs minutes after the function is deleted, and carries no
    # tag of ours over to them; an unused one in the deployment's VPC still blocks its subnet.
    vpcs = _deployment_vpcs(ec2, config)
    if vpcs:
        lambda_enis = ec2.describe_network_interfaces(
            Filters=[
                {"Name": "vpc-id", "Values": vpcs},
                {"Name": "status", "Values": ["available"]},
                {"Name": "description", "Values": [f"{LAMBDA_ENI_DESCRIPTION}*"]},
            ]
        )["NetworkInterfaces"]
        for eni in lambda_enis:
            enis[eni["NetworkInterfaceId"]] = eni
    for eni_id, eni in sorted(enis.items()):
        if not _owned_by_living_stack(eni, living_stacks):
            orphans.append(Orphan("network interface", eni_id, f"{eni.get('Status')} in {eni.get('VpcId')}"))

    groups: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("aws:eks:cluster-name", config.cluster_name)):
        for group in ec2.describe_security_groups(Filters=[tag_filter])["SecurityGroups"]:
            if group.get("GroupName") != "default":
                groups[group["GroupId"]] = group
    for group_id, group in sorted(groups.items()):
        if not _owned_by_living_stack(group, living_stacks):
            orphans.append(Orphan("security group", group_id, group.get("GroupName", "")))
    if blockers_only:
        return orphans

    for group in ec2.describe_placement_groups(Filters=[ours])["PlacementGroups"]:
        if not _owned_by_living_stack(group, living_stacks):
            orphans.append(Orphan("placement group", group["GroupName"], group.get("Strategy", "")))

    for volume in ec2.describe_volumes(Filters=[ours, {"Name": "status", "Values": ["available"]}])["Volumes"]:
        if not _owned_by_living_stack(volume, living_stacks):
            orphans.append(Orphan("EBS volume", volume["VolumeId"], f"{volume['Size']} GiB, detached"))

    logs = session.client("logs", region_name=config.region)
    # (prefix, what it holds if it is data, which names under the prefix are ours): Container
    # Insights metrics and Lambda logs (the kubectl provider's, kept by DeletionPolicy Retain, and
    # those Lambda creates itself) are not worth keeping.
    prefixes: list[tuple[str, str | None, Callable[[str], bool]]] = [
        (f"/aws/eks/{config.cluster_name}/", "control-plane and audit logs", lambda _name: True),
        (f"/aws/containerinsights/{config.cluster_name}/", None, lambda _name: True),
    ]
    for role in STACK_ROLES:
        stack_name = config.stack_name(role)
        if stack_name not in living_stacks:  # a living stack's functions still write there
            prefixes.append(
                (f"/aws/lambda/{stack_name}-", None, partial(_is_function_log_group, stack_name=stack_name))
            )
    for prefix, data_note, is_ours in prefixes:
        for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            for group in page["logGroups"]:
                if not is_ours(group["logGroupName"]):
                    continue
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


def sweep(
    session: boto3.Session, config: DeploymentConfig, orphans: list[Orphan], *, delete_data: bool
) -> list[Orphan]:
    """Delete what find_orphans found, data only with delete_data; sets and returns each outcome."""
    for orphan in orphans:
        if orphan.is_data and not delete_data:
            orphan.outcome = f"kept ({orphan.data_note}; --delete-data deletes it)"
        else:
            orphan.outcome = delete_orphan(session, config, orphan)
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


def vpc_contents(
    session: boto3.Session, config: DeploymentConfig, *, other_stacks: Collection[str] = ()
) -> dict[str, list[str]]:
    """What is still in the deployment's VPC besides its default security group: file systems,
    network interfaces (their description names their owner) and security groups, less what
    `other_stacks` (stacks that stay for now) own, which is meant to be there."""
    ec2 = session.client("ec2", region_name=config.region)
    contents: dict[str, list[str]] = {}
    for vpc in _deployment_vpcs(ec2, config):
        found: list[str] = []
        in_vpc = [{"Name": "vpc-id", "Values": [vpc]}]
        subnets = {s["SubnetId"] for s in ec2.describe_subnets(Filters=in_vpc)["Subnets"]}
        for fs_id, fs in sorted(_file_systems(session, config, None, subnets=subnets).items()):
            if not _owned_by_living_stack(fs, other_stacks):
                found.append(f"FSx file system {fs_id}")
        for eni in sorted(
            ec2.describe_network_interfaces(Filters=in_vpc)["NetworkInterfaces"], key=lambda e: e["NetworkInterfaceId"]
        ):
            if not _owned_by_living_stack(eni, other_stacks):
                what = ", ".join(filter(None, [eni.get("Status"), eni.get("Description")]))
                found.append(f"{eni['NetworkInterfaceId']} ({what})")
        for group in sorted(ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"], key=lambda g: g["GroupId"]):
            if group.get("GroupName") != "default" and not _owned_by_living_stack(group, other_stacks):
                found.append(f"{group['GroupId']} ({group.get('GroupName', '')})")
        if found:
            contents[vpc] = found
    return contents


def _file_systems(
    session: boto3.Session,
    config: DeploymentConfig,
    outputs: StackOutputs | None,
    *,
    subnets: Collection[str] | None = None,
) -> dict[str, dict]:
    """This deployment's FSx file systems (by tag or the cluster stack's output) by id, any
    lifecycle; with `subnets`, any file system in one of those subnets instead."""
    fsx = session.client("fsx", region_name=config.region)
    found = {}
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page["FileSystems"]:
            if subnets is not None:
                if set(fs.get("SubnetIds", [])) & set(subnets):
                    found[fs["FileSystemId"]] = fs
                continue
            tags = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == config.name or (
                outputs and fs["FileSystemId"] == outputs.fsx_file_system_id
            ):
                found[fs["FileSystemId"]] = fs
    return found


def find_retained_data(session: boto3.Session, config: DeploymentConfig, outputs: StackOutputs | None) -> RetainedData:
    """The data bucket(s) and FSx file system(s) of this deployment, from the outputs or by tag."""
    data = RetainedData()
    for fs_id, fs in _file_systems(session, config, outputs).items():
        if fs.get("Lifecycle") != "DELETING":
            data.file_systems.append(fs_id)
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


def delete_file_systems(
    session: boto3.Session,
    config: DeploymentConfig,
    file_system_ids: list[str],
    outputs: StackOutputs | None,
    console: Console,
    *,
    timeout_s: float,
    poll_s: float,
) -> list[str]:
    """Delete the file systems, then wait until the deployment has none left (including any a
    previous run left DELETING): until FSx has removed a file system's network interfaces, its
    subnet and security group cannot be deleted, so the network stack's destroy would fail."""
    fsx = session.client("fsx", region_name=config.region)
    deleted = []
    for file_system_id in file_system_ids:
        try:
            fsx.delete_file_system(FileSystemId=file_system_id)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "FileSystemNotFound":
                raise aws_error(e, config, f"deleting file system {file_system_id}") from None
        deleted.append(file_system_id)
        console.print(f"deleting FSx file system {file_system_id}")
    deadline = time.monotonic() + timeout_s
    announced = False
    while left := _file_systems(session, config, outputs):
        for file_system_id, fs in sorted(left.items()):
            lifecycle = fs.get("Lifecycle", "")
            if lifecycle != "DELETING":
                reason = fs.get("FailureDetails", {}).get("Message", "")
                raise ConfigError(
                    f"FSx file system {file_system_id} is {lifecycle or 'still there'} after its deletion was "
                    f"requested{f' ({reason})' if reason else ''}; nothing after it was deleted. Fix the cause "
                    "(see the file system in the FSx console), or delete it there, then run teardown "
                    "--delete-data again"
                )
        if time.monotonic() > deadline:
            raise ConfigError(
                f"FSx file system {', '.join(sorted(left))} is still DELETING after {timeout_s:.0f} s; the "
                "storage and network stacks were not destroyed because they cannot go before it. Wait until "
                f"`aws fsx describe-file-systems --region {config.region}` no longer lists it, then run "
                "teardown --delete-data again"
            )
        if not announced:
            console.print(f"waiting for FSx to finish deleting {', '.join(sorted(left))} (this takes minutes)")
            announced = True
        time.sleep(poll_s)
    return deleted


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


@dataclass
class Plan:
    """Which of the deployment's existing stacks go, in order, and which stay."""

    destroy: list[str]
    keep: list[str]


def plan_stacks(config: DeploymentConfig, existing: Collection[str], delete_data: bool) -> Plan:
    """Without delete_data only the cluster stack goes: the kept file system needs the network
    stack's subnet and security group (its ENIs would fail that stack's deletion), and the
    storage stack's data repository associations keep exporting /runs to the bucket."""
    roles = DESTROY_ORDER if delete_data else tuple(r for r in DESTROY_ORDER if r not in DATA_STACK_ROLES)
    destroy = [config.stack_name(role) for role in roles if config.stack_name(role) in existing]
    keep = [config.stack_name(role) for role in DESTROY_ORDER if config.stack_name(role) in existing]
    return Plan(destroy, [name for name in keep if name not in destroy])


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
    file_system_timeout_s: float = 3600,
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
            "this profile sets fsx.removal_policy: destroy, so its storage stack cannot be destroyed "
            "without deleting the file system and the data bucket; pass --delete-data to confirm that, or set "
            f"removal_policy: retain and run `{deployment.deploy_command}` before tearing down"
        )

    plan = plan_stacks(config, existing, delete_data)
    result.stacks_kept = plan.keep
    _print_plan(console, deployment, plan, outputs, retained, delete_data, skip_kubernetes)
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

    runner = run_cdk or run_command
    cluster_stack = config.stack_name("cluster")
    if cluster_stack in plan.destroy:
        _destroy_stack(deployment, session, cluster_stack, runner, console, result)

    if delete_data:
        # Only now that the cluster is gone (nothing mounts the file system or writes the bucket),
        # and before the stacks the file system needs: its ENIs block the network stack's delete.
        try:
            result.data_deleted.file_systems = delete_file_systems(
                session, config, retained.file_systems, outputs, console, timeout_s=file_system_timeout_s, poll_s=poll_s
            )
            # Before the storage stack: a bucket that is not empty fails its deletion.
            for bucket in retained.buckets:
                console.print(f"emptying and deleting bucket {bucket}")
                empty_and_delete_bucket(session, config, bucket)
                result.data_deleted.buckets.append(bucket)
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, config, "deleting the data") from None
    else:
        result.data_kept = retained

    for stack_name in plan.destroy:
        if stack_name != cluster_stack:
            _destroy_stack(deployment, session, stack_name, runner, console, result)

    try:
        living = _living_stacks(session, config)
        result.orphans += sweep(
            session, config, find_orphans(session, config, living_stacks=living), delete_data=delete_data
        )
    except (ClientError, BotoCoreError) as e:
        raise aws_error(e, config, "sweeping leftover resources") from None
    _print_report(console, result)
    return result


def _living_stacks(session: boto3.Session, config: DeploymentConfig) -> list[str]:
    names = [config.stack_name(role) for role in STACK_ROLES]
    return [name for name in names if describe_stack(session, name, config) is not None]


def _destroy_stack(
    deployment: Deployment,
    session: boto3.Session,
    stack_name: str,
    runner: CommandRunner,
    console: Console,
    result: TeardownResult,
) -> None:
    """`cdk destroy` one stack; on failure sweep what commonly blocks it and retry once.

    VPC CNI ENIs, Lambda ENIs (released minutes after their function) and the EKS-created cluster
    security group are not the stack's own, so CloudFormation cannot delete them, and while they
    exist the stack's subnets, security groups or VPC cannot go (DependencyViolation).
    """
    config = deployment.config
    argv = cdk_destroy_argv(deployment, stack_name)
    console.print(f"running {' '.join(argv[1:])}")
    status = runner(argv)
    if status != 0:
        console.print(
            f"[yellow]cdk destroy of {stack_name} failed (exit {status})[/]; deleting leftover network "
            "interfaces and security groups that can block it, then retrying once"
        )
        try:
            living = _living_stacks(session, config)
            blockers = find_orphans(session, config, living_stacks=living, blockers_only=True)
            # ENIs, then security groups: an ENI holds its groups until it is deleted.
            result.orphans += sweep(session, config, blockers, delete_data=False)
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, config, f"sweeping what blocks {stack_name}") from None
        for orphan in blockers:
            console.print(f"  {orphan.kind} {escape(orphan.identifier)}: {escape(orphan.outcome)}")
        console.print(f"running {' '.join(argv[1:])}")
        status = runner(argv)
    if status != 0:
        try:
            others = [name for name in _living_stacks(session, config) if name != stack_name]
            remaining = vpc_contents(session, config, other_stacks=others)
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, config, f"listing what is left in the VPC of {stack_name}") from None
        if remaining:
            items = [item for found in remaining.values() for item in found]
            named = ", ".join(items[:MAX_NAMED])
            if len(items) > MAX_NAMED:
                named += f" and {len(items) - MAX_NAMED} more"
            left = f"still in the deployment's VPC {', '.join(remaining)}: {named}"
            fix = (
                "delete those or what holds them (an ENI's description names its owner), or read the "
                "stack's DELETE_FAILED events in the CloudFormation console"
            )
        else:
            left = "no file system, network interface or security group that could block it is left in the VPC"
            fix = "the cause is elsewhere: read the cdk output above and the stack's DELETE_FAILED events"
        raise ConfigError(
            f"cdk destroy of stack {stack_name} failed again after the sweep of leftover network interfaces and "
            f"security groups (exit {status}); {left}; {fix}, then run teardown again (it skips what is already gone)"
        )
    result.stacks_destroyed.append(stack_name)


def _default_api_client_factory(deployment: Deployment, session: boto3.Session):
    from nvrx_eks.deploy.kube import api_client_for

    return lambda outputs: api_client_for(outputs, deployment.config, session)


def _print_plan(
    console: Console,
    deployment: Deployment,
    plan: Plan,
    outputs: StackOutputs | None,
    retained: RetainedData,
    delete_data: bool,
    skip_kubernetes: bool,
) -> None:
    config = deployment.config
    console.print(f"[bold]Teardown of {config.name}[/] (account {config.account}, {config.region})")
    if outputs is not None and not skip_kubernetes:
        console.print(
            f"  - delete training jobs in namespace {outputs.namespace}, "
            f"then PVC {outputs.pvc_name} and PV {FSX_PV_NAME}"
        )
    cluster_stack = config.stack_name("cluster")
    data_stacks = [name for name in plan.destroy if name != cluster_stack]
    if cluster_stack in plan.destroy:
        console.print(f"  - cdk destroy {cluster_stack}")
    file_systems = ", ".join(retained.file_systems)
    buckets = ("bucket " if len(retained.buckets) == 1 else "buckets ") + ", ".join(retained.buckets)
    if delete_data:
        if retained.file_systems:
            console.print(f"  - [red]DELETE[/] FSx file system {file_systems}, and wait until it is gone")
        if retained.buckets:
            console.print(f"  - [red]DELETE[/] {buckets} (every object version)")
        if data_stacks:
            console.print(f"  - cdk destroy {', then '.join(data_stacks)}")
    if not plan.destroy:
        console.print("  - cdk destroy: nothing (no stack to destroy is left)")
    console.print(
        "  - sweep leftover ENIs, security groups, placement groups, EBS volumes and log groups "
        "(Container Insights, the destroyed stacks' Lambda functions) that no remaining stack owns"
        + ("; with FSx backups and the control-plane (audit) log groups" if delete_data else "")
    )
    if delete_data:
        return
    if retained.file_systems:
        console.print(f"  - [green]keep[/] FSx file system {file_systems}")
    if retained.buckets:
        console.print(f"  - [green]keep[/] {buckets}")
    if plan.keep:
        why = (
            "the file system needs their VPC, subnet and security group, and its data repository "
            "associations keep exporting /runs to the bucket"
            if retained.file_systems
            else "without --delete-data teardown keeps the data's stacks (the storage stack holds the bucket)"
        )
        console.print(f"  - [green]keep[/] stacks {' and '.join(plan.keep)}: {why}")
    console.print("  - [green]keep[/] FSx backups and the EKS control-plane (audit) log groups")
    gone = [f"FSx file system {file_systems} (waiting until it is gone)"] if retained.file_systems else []
    gone += [buckets] if retained.buckets else []
    gone.append("the FSx backups and control-plane log groups")
    then = f", then cdk destroy {', then '.join(plan.keep)}" if plan.keep else ""
    console.print(f"    --delete-data would also delete {', '.join(gone)}{then}")


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
    billed = [f"bucket {b}" for b in kept.buckets] + [f"FSx {f}" for f in kept.file_systems]
    if result.stacks_kept:
        billed.append(f"stacks {' and '.join(result.stacks_kept)} (NAT gateway)")
    if billed:
        console.print(f"[yellow]still billed:[/] kept {', '.join(billed)}; run teardown --delete-data to delete them")
