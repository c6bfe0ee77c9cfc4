"""`nvrx-eks capacity up|down`: scale the deployed GPU node group, and say why when AWS cannot.

A GPU node group that launches its nodes inside `cdk deploy` makes the deploy all or nothing on
GPU capacity: a p5 shortfall fails the node group and CloudFormation rolls back the whole cluster
stack after ~40 minutes. Deployed at 0 nodes, the group is scaled here instead (EKS
UpdateNodegroupConfig on the stack output GpuNodegroupName), and a shortfall fails this command,
with the reason: EKS reports it as a node group health issue (AsgInstanceLaunchFailures: "Could
not launch On-Demand Instances. InsufficientInstanceCapacity ..."), printed one per line with what
to do about it.

`up` waits, with progress, until the group is ACTIVE and the nodes are Ready in Kubernetes, or a
bound. A quota lets the account run instances; it does not mean AWS has them free in the AZ: for
capacity you can count on, a Capacity Block or an On-Demand Capacity Reservation. For a Capacity
Block (EC2 User Guide, "Capacity Blocks"; EKS guide, "Capacity Blocks for ML" with managed node
groups):
- nodes launch only once the block is `active`: `up` refuses before, naming the start time;
- EKS updates such a node group (a new AMI or launch template: a `cdk deploy` that changes it)
  only at desired size 0: `down` first;
- EC2 begins terminating the block's instances 30 minutes before its end, and the block is paid up
  front: `down` says how much of it is left unused.
`down` refuses while a training job of this tool is pending or running (it would lose its nodes)
unless --force.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.markup import escape
from urllib3.exceptions import HTTPError as Urllib3Error

from infra.config import DeploymentConfig
from nvrx_eks.deploy import reservations
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.deploy.node_count import default_nodes, require_nodes
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_error, aws_session, read_stack_outputs
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import node_price
from nvrx_eks.facts.names import NODEGROUP_LABEL_KEY
from nvrx_eks.facts.stack_outputs import OutputKey

#: How long `up` waits for the nodes: a p5 boots, installs the Lustre client and registers in
#: 10-15 minutes; a launch AWS keeps retrying gets the rest.
DEFAULT_TIMEOUT_S = 30 * 60
POLL_S = 15.0
#: What to do about each node group health issue EKS reports (its code), where there is more to
#: say than its message; launch failures are told apart by the EC2 error in their message.
_ADVICE = {
    "InsufficientInstanceCapacity": (
        "AWS has no free {instance_type} in {az} now: run `nvrx-eks capacity up` again later, hold capacity "
        "with a Capacity Block or an On-Demand Capacity Reservation (gpu_nodes.capacity_reservation_id), or "
        "deploy to another AZ (gpu_availability_zone)"
    ),
    "VcpuLimitExceeded": "the account's vCPU quota is too small: `nvrx-eks preflight` names it and the increase",
    "InsufficientFreeAddresses": "the GPU subnet has no free IP addresses: free some, or deploy a larger VPC",
    "NodeCreationFailure": (
        "instances launched but did not join the cluster: read a node's system log (EC2 console, Get system "
        "log), where the Lustre client unit and nodeadm report"
    ),
}
_DEFAULT_ADVICE = "see the node group's Health issues in the EKS console"


@dataclass(frozen=True)
class NodeGroup:
    cluster: str
    name: str
    status: str
    min_size: int
    max_size: int
    desired_size: int
    #: (code, message) of each health issue EKS reports.
    issues: tuple[tuple[str, str], ...]


def advice(issue: tuple[str, str], config: DeploymentConfig) -> str:
    code, message = issue
    key = next((error for error in _ADVICE if error in message), code)
    return _ADVICE.get(key, _DEFAULT_ADVICE).format(
        instance_type=config.gpu_nodes.instance_type, az=config.gpu_availability_zone
    )


def issue_lines(group: NodeGroup, config: DeploymentConfig) -> list[str]:
    """One line per health issue: its code, its message, and what to do."""
    return [f"{code}: {message.strip()} -> {advice((code, message), config)}" for code, message in group.issues]


class _Scaler:
    """The node group of one deployment, through EKS and the cluster's Node objects."""

    def __init__(
        self,
        deployment: Deployment,
        console: Console,
        session: boto3.Session | None,
        api_client_factory: Callable[[StackOutputs], k8s.ApiClient] | None,
    ):
        config = deployment.config
        if config.cluster is not None:
            raise ConfigError(
                "capacity scales the GPU node group this project deploys; the config's cluster: section names a "
                "cluster it did not create: scale that cluster's nodes with its own tools"
            )
        self.deployment, self.config, self.console = deployment, config, console
        self.session = session or aws_session(config)
        self.outputs = read_stack_outputs(deployment, self.session)
        self.eks = self.session.client("eks", region_name=config.region)
        self._api_client_factory = api_client_factory
        self._api_client: k8s.ApiClient | None = None

    def _aws(self, doing: str, call: Callable):
        try:
            return call()
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, self.config, doing) from None

    def group(self) -> NodeGroup:
        name = self.outputs[OutputKey.GPU_NODEGROUP_NAME]
        described = self._aws(
            f"reading node group {name}",
            lambda: self.eks.describe_nodegroup(clusterName=self.outputs.cluster_name, nodegroupName=name)["nodegroup"],
        )
        scaling = described.get("scalingConfig", {})
        health = described.get("health", {}).get("issues", [])
        issues = tuple((issue.get("code", "?"), issue.get("message", "")) for issue in health)
        return NodeGroup(
            self.outputs.cluster_name,
            name,
            described.get("status", "?"),
            scaling.get("minSize", 0),
            scaling.get("maxSize", 0),
            scaling.get("desiredSize", 0),
            issues,
        )

    def scale(self, group: NodeGroup, desired: int) -> str | None:
        """Ask EKS for `desired` nodes; the update's id, None where the group asks for them already:
        then there is nothing to update (and an update that changes nothing may be refused: EKS
        refuses some, e.g. "No changes needed" for cluster configs; not verified for node groups)."""
        if group.desired_size == desired:
            self.console.print(f"{group.name} is set to {desired} nodes already")
            return None
        self.console.print(
            f"scaling {group.name} ({self.config.gpu_nodes.instance_type}, {self.config.gpu_availability_zone}) "
            f"from {group.desired_size} to {desired} nodes"
        )
        scaling = {"minSize": min(group.min_size, desired), "maxSize": group.max_size, "desiredSize": desired}
        update = self._aws(
            f"scaling node group {group.name}",
            lambda: self.eks.update_nodegroup_config(
                clusterName=group.cluster, nodegroupName=group.name, scalingConfig=scaling
            )["update"],
        )
        return update["id"]

    def update_status(self, group: NodeGroup, update_id: str) -> tuple[str, list[str]]:
        update = self._aws(
            "reading the node group update",
            lambda: self.eks.describe_update(name=group.cluster, nodegroupName=group.name, updateId=update_id)[
                "update"
            ],
        )
        return update.get("status", "?"), [f"{e.get('errorCode')}: {e.get('errorMessage')}" for e in update["errors"]]

    def api_client(self) -> k8s.ApiClient:
        if self._api_client is None:
            if self._api_client_factory is not None:
                self._api_client = self._api_client_factory(self.outputs)
            else:
                from nvrx_eks.deploy.kube import api_client_for

                self._api_client = api_client_for(self.outputs, self.config, self.session)
        return self._api_client

    def ready_nodes(self, group: NodeGroup) -> tuple[int, int]:
        """(Ready, all) Node objects of the group in the cluster."""
        from nvrx_eks.jobs.client import api_error

        try:
            nodes = k8s.CoreV1Api(self.api_client()).list_node(label_selector=f"{NODEGROUP_LABEL_KEY}={group.name}")
        except (ApiException, Urllib3Error) as e:
            raise api_error(e, f"listing the nodes of {group.name}") from None
        ready = sum(1 for node in nodes.items if _is_ready(node))
        return ready, len(nodes.items)

    def block(self) -> dict | None:
        """The Capacity Block the group launches into, as EC2 describes it; None for on-demand."""
        reservation_id = self.config.gpu_nodes.capacity_reservation_id
        if reservation_id is None:
            return None
        found = self._aws(
            f"reading capacity reservation {reservation_id}",
            lambda: reservations.describe(self.session, self.config.region, reservation_id),
        )
        if found is None:
            raise ConfigError(
                f"capacity reservation {reservation_id} (gpu_nodes.capacity_reservation_id) does not exist in "
                f"{self.config.region}: it ended or was cancelled, and the node group launches only into it; set a "
                f"current one and run `{self.deployment.deploy_command}`"
            )
        return found


def _is_ready(node: k8s.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _now(clock: Callable[[], datetime.datetime] | None) -> datetime.datetime:
    return (clock or (lambda: datetime.datetime.now(datetime.UTC)))()


def _refuse_before_its_start(config: DeploymentConfig, found: dict, nodes: int, now: datetime.datetime) -> None:
    reservation_id, state = found["CapacityReservationId"], found.get("State")
    block = config.gpu_nodes.capacity_type == "capacity-block"
    if block and state == reservations.SCHEDULED:
        start = found.get("StartDate")
        wait = f" (in {reservations.duration_text(start - now)})" if start else ""
        raise ConfigError(
            f"Capacity Block {reservation_id} is scheduled: it starts {reservations.utc_text(start)}{wait}, and no "
            "node can launch into it before; run `nvrx-eks capacity up` then"
        )
    if state != reservations.ACTIVE:
        raise ConfigError(
            f"capacity reservation {reservation_id} is {state}, so no node can launch into it; set "
            "gpu_nodes.capacity_reservation_id to an active one and deploy"
        )
    held = reservations.reserved_instances(found)
    if nodes > held:
        raise ConfigError(
            f"capacity reservation {reservation_id} holds {held} instances, fewer than the {nodes} asked for; use "
            f"--nodes {held} or a larger reservation"
        )


def capacity_up(
    deployment: Deployment,
    nodes: int | None,
    console: Console,
    *,
    session: boto3.Session | None = None,
    api_client_factory: Callable[[StackOutputs], k8s.ApiClient] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = POLL_S,
    clock: Callable[[], datetime.datetime] | None = None,
) -> NodeGroup:
    """Scale the GPU node group to `nodes` (default: default_nodes) and wait until they are Ready."""
    scaler = _Scaler(deployment, console, session, api_client_factory)
    config = scaler.config
    wanted = default_nodes(config) if nodes is None else require_nodes(nodes, "--nodes")
    group = scaler.group()
    if wanted > group.max_size:
        raise ConfigError(
            f"--nodes {wanted}: node group {group.name} holds at most {group.max_size} (maxSize); raise "
            f"gpu_nodes.max_size in {deployment.source} and run `{deployment.deploy_command}`"
        )
    found = scaler.block()
    if found is not None:
        _refuse_before_its_start(config, found, wanted, _now(clock))
    update_id = scaler.scale(group, wanted)
    group = _wait(scaler, update_id, wanted, console, timeout_s=timeout_s, poll_s=poll_s)
    console.print(f"[green]{wanted} of {wanted} nodes Ready[/] in {group.name}: submit jobs with `nvrx-eks submit`")
    price = node_price(config.gpu_nodes.facts, config.gpu_nodes.capacity_type)
    if found is not None and config.gpu_nodes.capacity_type == "capacity-block":
        end = found.get("EndDate")
        console.print(
            f"the block ends {reservations.utc_text(end)}; EC2 begins terminating its instances 30 minutes before. "
            "EKS updates a Capacity Block node group (a new AMI or launch template: a `cdk deploy` that changes it) "
            "only at 0 nodes: run `nvrx-eks capacity down` before such a deploy"
        )
    elif price is not None:
        console.print(
            f"billed ~${price.usd_per_hour * wanted:,.2f}/h while they run ({price.source}); "
            "`nvrx-eks capacity down` stops it"
        )
    return group


def _wait(scaler: _Scaler, update_id: str | None, wanted: int, console: Console, *, timeout_s: float, poll_s: float):
    """Until the update succeeded, the group is ACTIVE and `wanted` nodes are Ready (0: none is
    left); ConfigError with the group's health issues if it fails, degrades or times out."""
    started = time.monotonic()
    seen: set[tuple[str, str]] = set()
    update_done, last = update_id is None, None
    while True:
        group = scaler.group()
        if update_id is not None and not update_done:
            status, errors = scaler.update_status(group, update_id)
            if status in ("Failed", "Cancelled"):
                _fail(scaler, group, f"EKS reports the update {status}: {'; '.join(errors) or 'no reason given'}")
            update_done = status == "Successful"
        ready, present = scaler.ready_nodes(group)
        done = ready >= wanted if wanted else present == 0
        if update_done and group.status == "ACTIVE" and done:
            return group
        if group.status == "DEGRADED" or group.status.endswith("FAILED"):
            _fail(scaler, group, f"node group {group.name} is {group.status}")
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            _fail(scaler, group, f"{ready} of {wanted} nodes Ready after {elapsed / 60:.0f} min")
        for issue in group.issues:  # EKS may still recover from it: said once, waited on
            if issue not in seen:
                seen.add(issue)
                console.print(f"  [yellow]{escape(issue[0])}[/]: {escape(issue[1])}", soft_wrap=True)
        progress = (group.status, ready, present)
        if progress != last:
            state = f"{ready} of {wanted} nodes Ready" if wanted else f"{present} node(s) left"
            console.print(f"  {group.name} {group.status}, {state} ({elapsed / 60:.0f} min)")
            last = progress
        time.sleep(poll_s)


def _fail(scaler: _Scaler, group: NodeGroup, what: str) -> NoReturn:
    lines = issue_lines(group, scaler.config)
    for line in lines:
        scaler.console.print(f"  [red]{escape(line)}[/]", soft_wrap=True)
    cause = f"; {len(lines)} health issue(s) above, each with what to do" if lines else ""
    raise ConfigError(
        f"{what}{cause}; the node group keeps trying to reach its desired size until `nvrx-eks capacity down`"
    )


def capacity_down(
    deployment: Deployment,
    console: Console,
    *,
    force: bool = False,
    session: boto3.Session | None = None,
    api_client_factory: Callable[[StackOutputs], k8s.ApiClient] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = POLL_S,
    clock: Callable[[], datetime.datetime] | None = None,
) -> NodeGroup:
    """Scale the GPU node group to 0, unless a job of this tool still needs its nodes (or --force)."""
    scaler = _Scaler(deployment, console, session, api_client_factory)
    group = scaler.group()
    if not force:
        _refuse_while_jobs_run(scaler)
    found = scaler.block()
    if found is not None and scaler.config.gpu_nodes.capacity_type == "capacity-block":
        end = found.get("EndDate")
        if found.get("State") == reservations.ACTIVE and end is not None:
            left = end - reservations.BLOCK_END_TERMINATION - _now(clock)
            console.print(
                f"[yellow]note:[/] Capacity Block {found['CapacityReservationId']} runs until "
                f"{reservations.utc_text(end)}: this stops its nodes {reservations.duration_text(left)} before EC2 "
                "would; the block is paid up front, so those hours go unused (`capacity up` again while it lasts)"
            )
    update_id = scaler.scale(group, 0)
    group = _wait(scaler, update_id, 0, console, timeout_s=timeout_s, poll_s=poll_s)
    console.print(f"[green]{group.name} has no nodes[/]; `nvrx-eks capacity up` brings them back")
    return group


def _refuse_while_jobs_run(scaler: _Scaler) -> None:
    from nvrx_eks.jobs.client import JobClient

    client = JobClient(scaler.api_client(), scaler.outputs.namespace, scaler.console)
    try:
        live = client.live_jobs()
    except ConfigError as e:
        raise ConfigError(f"{e}; could not check for running jobs: --force scales down without checking") from None
    if live:
        names = ", ".join(f"{kind.kind} {job['metadata']['name']}" for kind, job in live)
        first = live[0][1]["metadata"]["name"]
        raise ConfigError(
            f"{names} still running in {client.namespace}: scaling the GPU nodes to 0 takes its nodes away (its "
            f"pods would wait in Pending, the run stopped); delete it first (`nvrx-eks delete {first}`), or pass "
            "--force"
        )
