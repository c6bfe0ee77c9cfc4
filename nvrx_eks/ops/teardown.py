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
   network interfaces block the subnet and security group deletes), then the buckets are emptied
   and deleted, the access-log bucket last (teardown_data.py), then `cdk destroy` of the storage
   stack, then of the network stack;
4. a sweep for what outlives a stack (teardown_sweep.py).

What stays billed after the teardown (the kept data, the kept stacks' NAT gateway and key, the
audit log groups) is listed with a monthly estimate in the plan, before anything is deleted, and
again in the final report (still_billed.py).

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
from nvrx_eks.facts.checkout import checkout_root
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.names import FSX_PV_NAME
from nvrx_eks.ops.still_billed import BilledLine, print_still_billed, still_billed
from nvrx_eks.ops.teardown_data import (
    BUCKET_RETRY_WAIT_S,
    RetainedData,
    delete_buckets,
    delete_file_systems,
    find_retained_data,
)
from nvrx_eks.ops.teardown_sweep import Orphan, find_orphans, sweep, vpc_contents

#: Runs a command (argv) from the project root and returns its exit status.
CommandRunner = Callable[[list[str]], int]
Confirm = Callable[[str], bool]


#: Destroy order: a stack goes only after the stacks that import its outputs (the cluster stack
#: imports the storage and network stacks' outputs, the storage stack the network stack's).
DESTROY_ORDER = tuple(reversed(STACK_ROLES))
#: The stacks the FSx file system needs (its subnet and security group; its data repository
#: associations): destroyed only together with the data.
DATA_STACK_ROLES = ("storage", "network")
#: At most this many leftovers are named in an error message, to keep it one readable line.
MAX_NAMED = 10


def cdk_destroy_argv(deployment: Deployment, stack_name: str) -> list[str]:
    """`cdk destroy` of one stack. --exclusively: without it the CDK also destroys the stacks that
    depend on this one, and teardown decides the order and which stacks stay."""
    return cdk_argv("destroy", stack_name, "--exclusively", "--force", "--no-notices", *deployment.cdk_context_args)


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
    #: What bills by the month after the teardown, priced (still_billed.py).
    still_billed: list[BilledLine] = field(default_factory=list)


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
    bucket_retry_wait_s: float = BUCKET_RETRY_WAIT_S,
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
    try:
        result.still_billed = still_billed(
            session,
            config,
            kept=RetainedData() if delete_data else retained,
            kept_stacks=plan.keep,
            keeps_audit_logs=not delete_data,
        )
    except (ClientError, BotoCoreError) as e:
        raise aws_error(e, config, "pricing what the teardown keeps") from None
    print_still_billed(console, result.still_billed, "Still billed after this teardown")
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
            delete_buckets(
                session,
                config,
                retained.buckets,
                console,
                on_deleted=result.data_deleted.buckets.append,
                wait_s=bucket_retry_wait_s,
            )
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
    print_still_billed(console, result.still_billed, "Still billed after this teardown")
    if result.still_billed and (result.data_kept.buckets or result.data_kept.file_systems or result.stacks_kept):
        console.print("teardown --delete-data deletes the data and its stacks, and with them these charges")
