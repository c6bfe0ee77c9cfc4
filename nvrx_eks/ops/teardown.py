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
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
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
    #: The cluster stack's name: it goes first, before the data and the stacks the data needs.
    cluster: str

    @property
    def after_the_data(self) -> list[str]:
        """The stacks destroyed after the data is deleted (with --delete-data: storage, network)."""
        return [name for name in self.destroy if name != self.cluster]


def plan_stacks(config: DeploymentConfig, existing: Collection[str], delete_data: bool) -> Plan:
    """Without delete_data only the cluster stack goes: the kept file system needs the network
    stack's subnet and security group (its ENIs would fail that stack's deletion), and the
    storage stack's data repository associations keep exporting /runs to the bucket."""
    roles = DESTROY_ORDER if delete_data else tuple(r for r in DESTROY_ORDER if r not in DATA_STACK_ROLES)
    destroy = [config.stack_name(role) for role in roles if config.stack_name(role) in existing]
    keep = [config.stack_name(role) for role in DESTROY_ORDER if config.stack_name(role) in existing]
    return Plan(destroy, [name for name in keep if name not in destroy], config.stack_name("cluster"))


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
    """Each step of the module docstring's order in turn (a method of _Teardown); returns what went,
    what stayed and what stays billed."""
    checkout_root()  # cdk destroy runs from the checkout: without one, stop before deleting anything
    steps = _Teardown(
        deployment,
        session or boto3.Session(region_name=deployment.config.region),
        console,
        delete_data=delete_data,
        skip_kubernetes=skip_kubernetes,
        run_cdk=run_cdk or run_command,
        api_client_factory=api_client_factory,
        waits=_Waits(timeout_s, poll_s, file_system_timeout_s, bucket_retry_wait_s),
    )
    found = steps.look_up()
    plan = steps.plan(found)
    steps.show_plan(plan, found)
    if not yes and not confirm("Proceed with the teardown?"):
        return steps.abort()
    steps.delete_kubernetes_objects(found.outputs)
    if plan.cluster in plan.destroy:
        steps.destroy(plan.cluster)
    steps.delete_or_keep_data(found)
    for stack_name in plan.after_the_data:
        steps.destroy(stack_name)
    steps.sweep_orphans()
    _print_report(console, steps.result)
    return steps.result


@dataclass(frozen=True)
class _Waits:
    """How long teardown waits for what it deletes, and how often it looks."""

    #: For each job, the claim and the volume to go.
    timeout_s: float
    poll_s: float
    #: For FSx to remove a file system.
    file_system_timeout_s: float
    #: Between tries to delete a bucket that late access logs refilled.
    bucket_retry_wait_s: float


@dataclass(frozen=True)
class _Found:
    """The deployment as teardown found it before deleting anything."""

    #: Its stacks that exist, by role; None where there is none.
    stacks: dict[str, dict | None]
    #: The cluster stack's outputs; None without a cluster stack.
    outputs: StackOutputs | None
    #: Its file systems and buckets.
    retained: RetainedData

    def existing(self, config: DeploymentConfig) -> list[str]:
        return [config.stack_name(role) for role, stack in self.stacks.items() if stack is not None]


@contextmanager
def _aws_errors(config: DeploymentConfig, doing: str) -> Iterator[None]:
    """An AWS failure (credentials, permissions) while `doing` as one line naming the fix."""
    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise aws_error(e, config, doing) from None


@dataclass
class _Teardown:
    """One teardown: its settings, and what it has done so far (`result`). Each method is a step
    of teardown(), which calls them in order."""

    deployment: Deployment
    session: boto3.Session
    console: Console
    delete_data: bool
    skip_kubernetes: bool
    run_cdk: CommandRunner
    api_client_factory: Callable[[StackOutputs], k8s.ApiClient] | None
    waits: _Waits
    result: TeardownResult = field(default_factory=TeardownResult)

    @property
    def config(self) -> DeploymentConfig:
        return self.deployment.config

    def look_up(self) -> _Found:
        config = self.config
        with _aws_errors(config, "looking up the deployment"):
            stacks = {role: describe_stack(self.session, config.stack_name(role), config) for role in STACK_ROLES}
            outputs = read_stack_outputs(self.deployment, self.session) if stacks["cluster"] is not None else None
            return _Found(stacks, outputs, find_retained_data(self.session, config, outputs))

    def plan(self, found: _Found) -> Plan:
        """Which stacks go; refused when the storage stack cannot go without its data and
        --delete-data was not given."""
        config = self.config
        if config.fsx.removal_policy == "destroy" and not self.delete_data and found.stacks["storage"] is not None:
            raise ConfigError(
                "this profile sets fsx.removal_policy: destroy, so its storage stack cannot be destroyed "
                "without deleting the file system and the data bucket; pass --delete-data to confirm that, or set "
                f"removal_policy: retain and run `{self.deployment.deploy_command}` before tearing down"
            )
        plan = plan_stacks(config, found.existing(config), self.delete_data)
        self.result.stacks_kept = plan.keep
        return plan

    def show_plan(self, plan: Plan, found: _Found) -> None:
        """What goes and what stays, and what stays billed, before anything is deleted."""
        _print_plan(
            self.console, self.deployment, plan, found.outputs, found.retained, self.delete_data, self.skip_kubernetes
        )
        with _aws_errors(self.config, "pricing what the teardown keeps"):
            self.result.still_billed = still_billed(
                self.session,
                self.config,
                kept=RetainedData() if self.delete_data else found.retained,
                kept_stacks=plan.keep,
                keeps_audit_logs=not self.delete_data,
            )
        print_still_billed(self.console, self.result.still_billed, "Still billed after this teardown")

    def abort(self) -> TeardownResult:
        self.console.print("aborted; nothing was deleted")
        self.result.aborted = True
        return self.result

    def delete_kubernetes_objects(self, outputs: StackOutputs | None) -> None:
        """The jobs, then the FSx claim and volume, while the cluster is there to ask."""
        if outputs is None or self.skip_kubernetes:
            return
        factory = self.api_client_factory or _default_api_client_factory(self.deployment, self.session)
        try:
            self.result.jobs_deleted = delete_kubernetes_objects(
                factory(outputs),
                outputs.namespace,
                outputs.pvc_name,
                self.console,
                timeout_s=self.waits.timeout_s,
                poll_s=self.waits.poll_s,
            )
        except ConfigError as e:
            raise ConfigError(
                f"{e}; nothing was destroyed. If the cluster cannot be reached from here, --skip-kubernetes "
                "leaves the jobs and the claim to cdk destroy"
            ) from None

    def delete_or_keep_data(self, found: _Found) -> None:
        """With --delete-data, the file systems and buckets: only once the cluster is gone (nothing
        mounts the file system or writes the bucket), and before the stacks the file system needs
        (its ENIs block the network stack's delete)."""
        if not self.delete_data:
            self.result.data_kept = found.retained
            return
        with _aws_errors(self.config, "deleting the data"):
            self.result.data_deleted.file_systems = delete_file_systems(
                self.session,
                self.config,
                found.retained.file_systems,
                found.outputs,
                self.console,
                timeout_s=self.waits.file_system_timeout_s,
                poll_s=self.waits.poll_s,
            )
            # Before the storage stack: a bucket that is not empty fails its deletion.
            delete_buckets(
                self.session,
                self.config,
                found.retained.buckets,
                self.console,
                on_deleted=self.result.data_deleted.buckets.append,
                wait_s=self.waits.bucket_retry_wait_s,
            )

    def sweep_orphans(self) -> None:
        with _aws_errors(self.config, "sweeping leftover resources"):
            living = _living_stacks(self.session, self.config)
            orphans = find_orphans(self.session, self.config, living_stacks=living)
            self.result.orphans += sweep(self.session, self.config, orphans, delete_data=self.delete_data)

    def destroy(self, stack_name: str) -> None:
        """`cdk destroy` one stack; on failure sweep what commonly blocks it and retry once.

        VPC CNI ENIs, Lambda ENIs (released minutes after their function) and the EKS-created
        cluster security group are not the stack's own, so CloudFormation cannot delete them, and
        while they exist the stack's subnets, security groups or VPC cannot go (DependencyViolation).
        """
        argv = cdk_destroy_argv(self.deployment, stack_name)
        self.console.print(f"running {' '.join(argv[1:])}")
        status = self.run_cdk(argv)
        if status != 0:
            self.console.print(
                f"[yellow]cdk destroy of {stack_name} failed (exit {status})[/]; deleting leftover network "
                "interfaces and security groups that can block it, then retrying once"
            )
            self._sweep_blockers(stack_name)
            self.console.print(f"running {' '.join(argv[1:])}")
            status = self.run_cdk(argv)
        if status != 0:
            raise self._destroy_failed_again(stack_name, status)
        self.result.stacks_destroyed.append(stack_name)

    def _sweep_blockers(self, stack_name: str) -> None:
        with _aws_errors(self.config, f"sweeping what blocks {stack_name}"):
            living = _living_stacks(self.session, self.config)
            blockers = find_orphans(self.session, self.config, living_stacks=living, blockers_only=True)
            self.result.orphans += sweep(self.session, self.config, blockers, delete_data=False)
        for orphan in blockers:
            self.console.print(f"  {orphan.kind} {escape(orphan.identifier)}: {escape(orphan.outcome)}")

    def _destroy_failed_again(self, stack_name: str, status: int) -> ConfigError:
        """The error for a stack that the sweep did not free: what is still in its VPC."""
        with _aws_errors(self.config, f"listing what is left in the VPC of {stack_name}"):
            others = [name for name in _living_stacks(self.session, self.config) if name != stack_name]
            remaining = vpc_contents(self.session, self.config, other_stacks=others)
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
        return ConfigError(
            f"cdk destroy of stack {stack_name} failed again after the sweep of leftover network interfaces and "
            f"security groups (exit {status}); {left}; {fix}, then run teardown again (it skips what is already gone)"
        )


def _living_stacks(session: boto3.Session, config: DeploymentConfig) -> list[str]:
    names = [config.stack_name(role) for role in STACK_ROLES]
    return [name for name in names if describe_stack(session, name, config) is not None]


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
    if plan.cluster in plan.destroy:
        console.print(f"  - cdk destroy {plan.cluster}")
    file_systems = ", ".join(retained.file_systems)
    buckets = ("bucket " if len(retained.buckets) == 1 else "buckets ") + ", ".join(retained.buckets)
    if delete_data:
        if retained.file_systems:
            console.print(f"  - [red]DELETE[/] FSx file system {file_systems}, and wait until it is gone")
        if retained.buckets:
            console.print(f"  - [red]DELETE[/] {buckets} (every object version)")
        if plan.after_the_data:
            console.print(f"  - cdk destroy {', then '.join(plan.after_the_data)}")
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
