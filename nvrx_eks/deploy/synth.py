"""`nvrx-eks synth`: synthesize a profile offline (with cdk-nag) and summarize what `cdk deploy`
would create, without touching AWS.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.config import DeploymentConfig, documentation_placeholders, resolve_config
from nvrx_eks.deploy.cdk_cli import quiet_end_of_life_banner
from nvrx_eks.facts.checkout import checkout_root

#: Resource types worth naming in the summary, with a readable label.
_NOTABLE = {
    "AWS::EC2::VPC": "VPC",
    "AWS::EC2::Subnet": "subnets",
    "AWS::EC2::NatGateway": "NAT gateways",
    "AWS::EC2::VPCEndpoint": "VPC endpoints",
    "AWS::EC2::FlowLog": "flow logs",
    "AWS::EC2::SecurityGroup": "security groups",
    "AWS::EKS::Cluster": "EKS cluster",
    "AWS::EKS::Nodegroup": "managed node groups",
    "AWS::EC2::LaunchTemplate": "launch templates",
    "AWS::EC2::PlacementGroup": "placement groups",
    "AWS::EKS::Addon": "EKS add-ons",
    "Custom::AWSCDK-EKS-HelmChart": "Helm charts",
    "Custom::AWSCDK-EKS-KubernetesResource": "Kubernetes manifests",
    "AWS::EKS::AccessEntry": "access entries",
    "AWS::FSx::FileSystem": "FSx for Lustre file systems",
    "AWS::FSx::DataRepositoryAssociation": "data repository associations",
    "AWS::S3::Bucket": "S3 buckets",
    "AWS::KMS::Key": "KMS keys",
    "AWS::IAM::Role": "IAM roles",
}


@dataclass
class SynthResult:
    config: DeploymentConfig
    stack_names: dict[str, str]  # role (network, storage, cluster) -> stack name
    templates: dict[str, dict]  # role -> CloudFormation template
    acknowledged_findings: int
    outdir: Path

    @property
    def resource_counts(self) -> dict[str, Counter]:
        return {
            self.stack_names[role]: Counter(r["Type"] for r in template["Resources"].values())
            for role, template in self.templates.items()
        }


def cdk_context() -> dict:
    """The context the CDK CLI passes: cdk.json's feature flags + the pinned lookups of
    cdk.context.json. An in-process App() reads neither file, and would otherwise synthesize a
    different template than `cdk synth`."""
    context = json.loads((checkout_root() / "cdk.json").read_text())["context"]
    context.update(json.loads((checkout_root() / "cdk.context.json").read_text()))
    return context


def synthesize_profile(config: DeploymentConfig, outdir: Path) -> SynthResult:
    """Synthesize in-process with cdk-nag on; raises if cdk-nag reports an unacknowledged finding.
    The CloudFormation Validate plugin is off (it costs ~10 s and ~400 MB); cfn-lint runs instead."""
    from aws_cdk import App

    from infra.stacks.environment import build_environment
    from infra.stacks.nag import acknowledge_findings, enable_nag

    app = App(context=cdk_context(), outdir=str(outdir), builtin_cloud_formation_validation=False)
    environment = build_environment(app, config)
    acknowledged = acknowledge_findings(environment)
    enable_nag(app)
    assembly = app.synth()
    roles = {"network": environment.network, "storage": environment.storage, "cluster": environment.cluster}
    return SynthResult(
        config=config,
        stack_names={role: stack.stack_name for role, stack in roles.items()},
        templates={role: assembly.get_stack_by_name(stack.stack_name).template for role, stack in roles.items()},
        acknowledged_findings=acknowledged,
        outdir=outdir,
    )


def print_summary(result: SynthResult, console: Console) -> None:
    cfg = result.config
    facts = cfg.gpu_nodes.facts
    nodes = cfg.gpu_nodes
    console.print(
        f"[bold]Profile[/] {cfg.name}: account {cfg.account}, {cfg.region} (GPU AZ {cfg.gpu_availability_zone})"
    )
    table = Table(title="What `cdk deploy` would create", show_lines=False)
    table.add_column("stack")
    table.add_column("resources", justify="right")
    table.add_column("notable")
    for stack, counts in result.resource_counts.items():
        notable = ", ".join(f"{n} {_NOTABLE[t]}" for t, n in sorted(counts.items()) if t in _NOTABLE)
        table.add_row(stack, str(sum(counts.values())), notable)
    console.print(table)

    capacity = {"on-demand": "on-demand", "capacity-block": "Capacity Block"}[nodes.capacity_type]
    if nodes.capacity_reservation_id:
        capacity += f" ({nodes.capacity_reservation_id})"
    facts_table = Table(show_header=False, box=None, pad_edge=False)
    facts_table.add_column(style="bold")
    facts_table.add_column()
    facts_table.add_row(
        "Kubernetes",
        f"EKS {cfg.kubernetes_version}, endpoint {cfg.endpoint.access}"
        + (f" from {', '.join(cfg.endpoint.public_cidrs)}" if cfg.endpoint.public_cidrs else ""),
    )
    facts_table.add_row(
        "GPU nodes",
        f"up to {nodes.max_size}x {facts.instance_type}, created with none; `nvrx-eks capacity up` starts "
        f"{nodes.desired_size} ({facts.gpus}x {facts.gpu_model} {facts.gpu_memory_gib} GB, "
        f"{facts.efa_interfaces} EFA interfaces each), {capacity}, placement group "
        f"{'on' if nodes.placement_group else 'off'}",
    )
    facts_table.add_row("Training world", f"{nodes.max_size * facts.gpus} GPUs")
    efa = "EFA" if cfg.fsx.efa_enabled else "TCP"
    facts_table.add_row(
        "FSx for Lustre",
        f"{cfg.fsx.storage_gib} GiB PERSISTENT_2, {cfg.fsx.throughput_per_tib} MB/s/TiB "
        f"(~{cfg.fsx.throughput_mbps} MB/s), {efa} clients, {cfg.fsx.compression}, "
        f"data {'kept' if cfg.fsx.removal_policy == 'retain' else 'deleted'} on destroy",
    )
    facts_table.add_row("Image", "built from workloads/Dockerfile at deploy time" if cfg.image.build else cfg.image.uri)
    facts_table.add_row(
        "cdk-nag",
        f"AwsSolutions: 0 unacknowledged findings, {result.acknowledged_findings} acknowledged "
        "with reasons (infra/stacks/nag.py)",
    )
    console.print(facts_table)


def run(profile: str | None, config_path: str | None, console: Console) -> SynthResult:
    config = resolve_config(profile, config_path)  # exits 2 on a bad config, before any construct
    note = quiet_end_of_life_banner()
    if note:
        console.print(f"[yellow]{note}[/]", highlight=False)
    # Warn, not fail: the offline rehearsal synthesizes the shipped profiles unchanged;
    # `nvrx-eks preflight` fails on the same fields before a real deploy.
    for placeholder in documentation_placeholders(config):
        console.print(f"[yellow]warning:[/] {escape(str(placeholder))}", highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-synth-") as tmp:
        with console.status(f"Synthesizing {config.name} (CDK + cdk-nag, offline)..."):
            result = synthesize_profile(config, Path(tmp))
    print_summary(result, console)
    return result
