"""`nvrx-eks deploy`: `cdk deploy --all` for a profile, after saying what it would do to running
GPU nodes (nvrx_eks/deploy/gpu_changes.py) and asking, when it would replace them, restart them
or reset their count.

The profile is synthesized once, by the CDK CLI into a cloud assembly of our own; the cluster
stack's template there is compared with the one CloudFormation holds, and that same assembly is
what `cdk deploy --app` deploys, so what was compared is what goes out.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console
from rich.markup import escape

from nvrx_eks.deploy.cdk_cli import cdk_argv, run_command
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.deploy.gpu_changes import GpuChange, gpu_changes
from nvrx_eks.deploy.stack_outputs import aws_error, aws_session, describe_stack

#: Runs a command (argv) from the project root and returns its exit status.
CommandRunner = Callable[[list[str]], int]
Confirm = Callable[[str], bool]

#: Stack states whose template describes no resources that exist (a failed first create).
_NOTHING_DEPLOYED = {"ROLLBACK_COMPLETE", "REVIEW_IN_PROGRESS", "DELETE_COMPLETE"}
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


def deployed_cluster_template(deployment: Deployment, session: boto3.Session) -> dict | None:
    """The cluster stack's template as CloudFormation holds it; None when nothing is deployed."""
    config = deployment.config
    name = config.stack_name("cluster")
    stack = describe_stack(session, name, config)
    if stack is None or stack["StackStatus"] in _NOTHING_DEPLOYED:
        return None
    try:
        body = session.client("cloudformation").get_template(StackName=name, TemplateStage="Original")["TemplateBody"]
    except (BotoCoreError, ClientError) as e:
        raise aws_error(e, config, f"reading the template of stack {name}") from None
    return json.loads(body) if isinstance(body, str) else dict(body)


def running_gpu_nodes(deployment: Deployment, session: boto3.Session) -> int | None:
    """The GPU node group's desired size as EKS has it: 0 without the group, None when the
    caller may not read it (then assume nodes run)."""
    config = deployment.config
    try:
        group = session.client("eks").describe_nodegroup(
            clusterName=config.cluster_name, nodegroupName=config.gpu_nodegroup_name
        )["nodegroup"]
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            return 0
        if code in _DENIED:
            return None
        raise aws_error(e, config, f"reading node group {config.gpu_nodegroup_name}") from None
    except BotoCoreError as e:
        raise aws_error(e, config, f"reading node group {config.gpu_nodegroup_name}") from None
    return int(group.get("scalingConfig", {}).get("desiredSize", 0))


def _report(changes: list[GpuChange], running: int | None, console: Console) -> None:
    nodes = "an unknown number of GPU nodes (eks:DescribeNodegroup denied)" if running is None else f"{running}"
    console.print(f"[yellow]This deploy changes the GPU nodes[/] (running now: {escape(nodes)}):", highlight=False)
    for change in changes:
        console.print(f"  - {escape(str(change))}", highlight=False, soft_wrap=True)


def deploy(
    deployment: Deployment,
    *,
    yes: bool,
    no_rollback: bool,
    console: Console,
    confirm: Confirm,
    runner: CommandRunner | None = None,
    session: boto3.Session | None = None,
) -> int:
    """Synthesize, warn about the GPU nodes, ask when nodes run, then deploy; the exit status.
    `runner` runs the `cdk` command lines (default: the checkout's CDK CLI)."""
    config = deployment.config
    runner = runner or run_command
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-deploy-") as tmp:
        assembly = Path(tmp) / "cdk.out"
        console.print(f"Synthesizing {escape(deployment.source)} ...", highlight=False)
        status = runner(cdk_argv("synth", "--quiet", "--output", str(assembly), *deployment.cdk_context_args))
        if status:
            return status  # cdk printed why
        synthesized = json.loads((assembly / f"{config.stack_name('cluster')}.template.json").read_text())
        session = session or aws_session(config)
        deployed = deployed_cluster_template(deployment, session)
        changes = gpu_changes(deployed, synthesized, config)
        if changes:
            running = running_gpu_nodes(deployment, session)
            _report(changes, running, console)
            if running == 0:
                console.print("No GPU node runs, so none is disturbed.")
            elif not yes and not confirm("Deploy anyway?"):
                console.print("Not deployed.")
                return 1
        argv = cdk_argv("deploy", "--all", "--app", str(assembly), *(["--no-rollback"] if no_rollback else []))
        return runner(argv)
