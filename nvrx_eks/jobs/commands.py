"""The job commands behind the CLI: render, validate, submit, status, logs, delete, and the
cluster credentials (token, kubeconfig). Each takes plain arguments, so the Typer layer in
nvrx_eks/cli/ stays a list of flags.

Offline vs live: `render`, `validate` and `submit --dry-run` need no AWS account and no cluster;
they derive the namespace, claim, instance type and Kubernetes version from the deployment
config (see nvrx_eks/jobs/spec.py for how the image is chosen). With `--live` (and always for
`submit`, `status`, `logs`, `delete`) they come from the deployed cluster stack's outputs.

A config with a `cluster:` section names a cluster this project did not create: every command
takes the namespace, claim, image and node selector from it, reaches the API server through its
kubeconfig context (nvrx_eks/jobs/cluster.py), and reads no stack.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.deploy.node_count import default_nodes
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_session, read_stack_outputs
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_kinds import JOB_KINDS, Api
from nvrx_eks.jobs.capacity import NodeLimit, deployed_nodes, live_limits, profile_limit, refuse_beyond
from nvrx_eks.jobs.data_path import data_in_pods
from nvrx_eks.jobs.options import JobOptions, data_overrides
from nvrx_eks.jobs.output_format import write_data
from nvrx_eks.jobs.render import RenderedJob, list_items, render_job, write_documents
from nvrx_eks.jobs.spec import JobSpec, build_jobspec, check_faults, check_global_batch, load_train_config
from nvrx_eks.jobs.summary import job_summary
from nvrx_eks.jobs.validate import Expectations, ValidationReport, load_documents, validate_documents

if TYPE_CHECKING:
    from nvrx_eks.jobs.client import JobClient

DEFAULT_JOB_NAME = {"train": "train", "nccl-test": "nccl-test"}


def _check_api(api: str) -> Api:
    for kind in JOB_KINDS.values():
        if kind.api == api:
            return kind.api
    raise ConfigError(f"--api {api!r}: use jobset (default) or pytorchjob")


def build_spec(deployment: Deployment, options: JobOptions, outputs: StackOutputs | None) -> JobSpec:
    api = _check_api(options.api)
    if options.data is not None and options.data.startswith("s3://") and deployment.config.cluster is not None:
        raise ConfigError(
            f"--data {options.data}: an existing cluster's claim (cluster.pvc) has no data repository this "
            "config describes; give the path where the shards are on the claim, relative to /fsx"
        )
    if options.data is not None:
        data = data_in_pods(options.data, deployment.config, outputs.data_bucket_name if outputs else None)
        options = replace(options, overrides=[*options.overrides, *data_overrides(data)], data=None)
    if options.fabric_test and (options.train_config or options.overrides or options.faults or options.trainer):
        raise ConfigError(
            "--fabric-test runs nccl-tests, not the trainer: drop --train-config, --set, --faults and --trainer"
        )
    if options.spare_nodes and (options.fabric_test or api != "jobset"):
        raise ConfigError(
            "--spare-nodes: hot spares are rendered for the training JobSet only; drop --spare-nodes "
            "or use --api jobset without --fabric-test"
        )
    if options.train_config and Path(options.train_config).is_dir():
        raise ConfigError(f"--train-config {options.train_config} is a directory; give a trainer config YAML file")
    if options.train_config and not Path(options.train_config).exists():
        raise ConfigError(f"--train-config {options.train_config} does not exist; give a trainer config YAML file")
    nodes = options.nodes or default_nodes(deployment.config, outputs)
    train = (
        None
        if options.fabric_test
        else load_train_config(
            options.train_config, options.overrides, options.faults, config=deployment.config, nodes=nodes
        )
    )
    spec = build_jobspec(
        deployment.config,
        nodes=nodes,
        name=DEFAULT_JOB_NAME[options.workload] if options.name is None else options.name,
        api=api,
        workload=options.workload,
        image=options.image,
        train=train,
        max_restarts=options.max_restarts,
        max_step_time_s=options.max_step_time_s,
        outputs=outputs,
        spare_nodes=options.spare_nodes,
        ranks_per_node=options.ranks_per_node,
        trainer=options.trainer,
    )
    # Here, not in build_jobspec: render, validate and submit all build their job through this
    # function, and a job the profile's node group cannot hold is refused before anything else.
    refuse_beyond(spec, [_config_limit(deployment)])
    check_global_batch(spec)
    check_faults(spec)
    return spec


def _config_limit(deployment: Deployment) -> NodeLimit:
    if deployment.config.cluster is not None:
        from nvrx_eks.jobs.cluster import config_limit

        return config_limit(deployment.config, deployment.source)
    return profile_limit(deployment)


def _stack_outputs(deployment: Deployment, live: bool) -> StackOutputs | None:
    """The cluster stack's outputs with --live, else None (offline, or a config that names its cluster)."""
    if live and deployment.config.cluster is not None:
        raise ConfigError(
            "--live reads the outputs of the cluster stack this project deploys; the config's cluster: "
            "section names the cluster already, so drop --live"
        )
    return read_stack_outputs(deployment) if live else None


def print_summary(spec: JobSpec, deployment: Deployment, err: Console) -> None:
    for line in job_summary(spec, deployment.config):
        err.print(line)


def expectations(deployment: Deployment, outputs: StackOutputs | None, *, live: bool = False) -> Expectations:
    """What the manifests must match; `live`: they are about to be sent to a cluster."""
    config = deployment.config
    if config.cluster is not None:
        cluster = config.cluster
        return Expectations(
            config.kubernetes_version, cluster.namespace, cluster.pvc, config.gpu_nodes.instance_type, live=live
        )
    if outputs is not None:
        return Expectations(
            kubernetes_version=outputs.kubernetes_version,
            namespace=outputs.namespace,
            pvc_name=outputs.pvc_name,
            instance_type=outputs.instance_type,
            live=True,
        )
    from nvrx_eks.facts.names import FSX_PVC_NAME, TRAINING_NAMESPACE

    return Expectations(config.kubernetes_version, TRAINING_NAMESPACE, FSX_PVC_NAME, config.gpu_nodes.instance_type)


def checked_documents(rendered: RenderedJob) -> list[dict]:
    """What validation checks of a rendered job. A job that runs the user's own trainer (--trainer)
    is checked as the same job running ours: the validator derives the expected ft_launcher and
    preflight commands from workloads/launch.py, and the trainer's entry is the one difference
    (nvrx_eks.jobs.render.trainer_entrypoint_args puts it in)."""
    if rendered.spec.trainer is None:
        return rendered.documents
    return render_job(rendered.spec.model_copy(update={"trainer": None})).documents


def print_report(report: ValidationReport, console: Console) -> None:
    for message in report.skipped:
        console.print(f"[yellow]note:[/] {escape(message)}")
    if report.findings:
        table = Table(title="Validation findings")
        for column in ("severity", "layer", "object", "field", "problem"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            style = "red" if f.severity == "error" else "yellow"
            table.add_row(f"[{style}]{f.severity}[/]", f.layer, escape(f.document), escape(f.path), escape(f.message))
        console.print(table)
    layers = "kubernetes, project" + ("" if report.skipped else ", crd")
    verdict = "[green]valid[/]" if report.ok else f"[red]{len(report.errors)} error(s)[/]"
    console.print(f"{report.documents_checked} document(s) checked ({layers}): {verdict}")


# ----- commands -----------------------------------------------------------------------------


def render(
    deployment: Deployment, options: JobOptions, *, live: bool, output: str, out_dir: Path | None, err: Console
) -> RenderedJob:
    """The manifests in `output`'s format (yaml or json) on stdout, or one file per object in
    `out_dir`; the job summary and the files written on `err`, so stdout holds only data."""
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a directory (created if missing) for the manifests")
    outputs = _stack_outputs(deployment, live)
    rendered = render_job(build_spec(deployment, options, outputs))
    print_summary(rendered.spec, deployment, err)
    if out_dir is None:
        sys.stdout.write(rendered.formatted(output))
    else:
        for path in write_documents(rendered, out_dir, output):
            err.print(f"wrote {escape(str(path))}", soft_wrap=True)  # a path is one unbroken line
    return rendered


def validate(
    deployment: Deployment,
    options: JobOptions,
    *,
    path: str | None,
    live: bool,
    console: Console,
    output: str = "table",
) -> ValidationReport:
    outputs = _stack_outputs(deployment, live)
    if path is None:
        documents = checked_documents(render_job(build_spec(deployment, options, outputs)))
    elif path == "-":
        documents = list_items(load_documents(sys.stdin.read(), "standard input"))
    else:
        file = Path(path)
        if file.is_dir():
            raise ConfigError(f"{path} is a directory; give a rendered manifest file, '-' for stdin, or no path")
        if not file.is_file():
            raise ConfigError(f"{path} does not exist; give a rendered manifest file, '-' for stdin, or no path")
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not a text file (not UTF-8); give a rendered manifest YAML file") from None
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}; check its permissions") from None
        documents = list_items(load_documents(text, path))
    report = validate_documents(documents, expectations(deployment, outputs))
    print_report(report, console)
    write_data(report_as_data(report), output)
    report.raise_for_errors("the manifests")
    return report


def report_as_data(report: ValidationReport) -> dict:
    """The validation report for `validate -o json|yaml`."""
    return {
        "valid": report.ok,
        "documents_checked": report.documents_checked,
        "skipped_layers": list(report.skipped),
        "findings": [dataclasses.asdict(f) for f in report.findings],
    }


def submit(deployment: Deployment, options: JobOptions, *, dry_run: bool, out: Console, err: Console) -> RenderedJob:
    if dry_run:
        # No cluster and no credentials: render and validate offline, print what would be created.
        rendered = render_job(build_spec(deployment, options, None))
        report = validate_documents(checked_documents(rendered), expectations(deployment, None))
        print_report(report, err)
        report.raise_for_errors("the rendered job")
        print_summary(rendered.spec, deployment, err)
        sys.stdout.write(rendered.text)
        err.print("dry run: nothing was sent to a cluster")
        return rendered

    if deployment.config.cluster is not None:
        return _submit_to_existing_cluster(deployment, options, err)
    session = aws_session(deployment.config)
    outputs, client = connect(deployment, err, session)
    rendered = render_job(build_spec(deployment, options, outputs))
    spec = rendered.spec
    # The profile may have been raised without a deploy, or the node group changed by hand.
    deployed = deployed_nodes(deployment, outputs, session)
    for skipped in deployed.skipped:
        err.print(f"[yellow]note:[/] not checked: {escape(skipped)}")
    refuse_beyond(spec, live_limits(deployment, outputs, deployed))
    report = validate_documents(checked_documents(rendered), expectations(deployment, outputs, live=True))
    print_report(report, err)
    report.raise_for_errors("the rendered job")
    print_summary(spec, deployment, err)
    if deployed.desired_size is not None and spec.launched_nodes > deployed.desired_size:
        # Within the maximum, but nothing in the cluster scales a managed node group up by itself.
        err.print(
            f"[yellow]note:[/] the job launches {spec.launched_nodes} nodes and the GPU node group "
            f"{escape(deployed.nodegroup)} runs {deployed.desired_size}; pods wait in Pending until it is scaled "
            f"up: `nvrx-eks capacity up --nodes {spec.launched_nodes}{escape(_flags(deployment))}`",
            soft_wrap=True,  # a command to copy: never broken inside a path
        )
    return _create(client, rendered, deployment, err)


def _submit_to_existing_cluster(deployment: Deployment, options: JobOptions, err: Console) -> RenderedJob:
    """Submit to the config's cluster: as to ours, but the nodes the job may take are those its
    pods' node selector matches now (nothing here scales that cluster)."""
    from nvrx_eks.jobs.cluster import nodes_limit

    client = job_client(deployment, err)
    rendered = render_job(build_spec(deployment, options, None))
    refuse_beyond(rendered.spec, [nodes_limit(client.api_client, deployment.config)])
    report = validate_documents(checked_documents(rendered), expectations(deployment, None, live=True))
    print_report(report, err)
    report.raise_for_errors("the rendered job")
    print_summary(rendered.spec, deployment, err)
    return _create(client, rendered, deployment, err)


def _create(client: JobClient, rendered: RenderedJob, deployment: Deployment, err: Console) -> RenderedJob:
    job = client.submit(rendered)
    spec = rendered.spec
    err.print(
        f"created {job['kind']} {job['metadata']['name']} in {client.namespace} "
        f"({spec.nodes} x {spec.instance_type}, world size {spec.world_size})"
    )
    again = _flags(deployment)
    err.print(f"follow it: nvrx-eks status {spec.name}{again}   nvrx-eks logs {spec.name}{again} -f")
    return rendered


def _flags(deployment: Deployment) -> str:
    """A space and the flags that make another command use this deployment, or nothing for the default."""
    return f" {deployment.cli_flags}" if deployment.cli_flags else ""


def job_client(deployment: Deployment, console: Console) -> JobClient:
    """A JobClient for the cluster the config names (cluster:), else for the deployed one."""
    cluster = deployment.config.cluster
    if cluster is None:
        return connect(deployment, console)[1]
    from nvrx_eks.jobs.client import JobClient
    from nvrx_eks.jobs.cluster import api_client

    return JobClient(api_client(cluster), cluster.namespace, console)


def connect(deployment: Deployment, console: Console, session: boto3.Session | None = None):
    """(stack outputs, JobClient) for the deployed cluster, on one AWS session (`session`, or a new one)."""
    from nvrx_eks.deploy.kube import api_client_for
    from nvrx_eks.jobs.client import JobClient

    session = session or aws_session(deployment.config)
    outputs = read_stack_outputs(deployment, session)
    client = JobClient(api_client_for(outputs, deployment.config, session), outputs.namespace, console)
    return outputs, client


def status(deployment: Deployment, name: str | None, console: Console, output: str = "table"):
    client = job_client(deployment, console)
    if name is None:
        jobs = []
        for kind, job in client.list_jobs():
            meta = job["metadata"]
            jobs.append({"name": meta["name"], "kind": kind.kind, "created": meta.get("creationTimestamp", "")})
        table = Table(title=f"Training jobs in {client.namespace}")
        for column in ("name", "kind", "created"):
            table.add_column(column)
        for job in jobs:
            table.add_row(job["name"], job["kind"], job["created"])
        console.print(table)
        write_data({"namespace": client.namespace, "jobs": jobs}, output)
        return None
    result = client.status(name)
    result.render(console)
    write_data(result.as_data(), output)
    return result


def logs(
    deployment: Deployment,
    name: str,
    *,
    node: int | None,
    rank: int | None,
    follow: bool,
    tail: int | None,
    events: bool,
    console: Console,
):
    if node is not None and rank is not None:
        raise ConfigError("give either --node or --rank, not both")
    from nvrx_eks.jobs.logs import stream_logs

    client = job_client(deployment, console)
    return stream_logs(client, name, node=node, rank=rank, follow=follow, tail_lines=tail, events=events)


def delete(deployment: Deployment, name: str, *, wait: bool, console: Console):
    client = job_client(deployment, console)
    kind = client.delete(name, wait=wait)
    console.print(
        f"deleted {kind.kind} {name}" + (" and its pods" if wait else " (pods stop within their grace period)")
    )


def _our_cluster_only(deployment: Deployment, command: str) -> None:
    cluster = deployment.config.cluster
    if cluster is not None:
        raise ConfigError(
            f"{command} is for the cluster this project deploys; the config's cluster: section names kubeconfig "
            f"context {cluster.context!r} already: use it (kubectl --context {cluster.context})"
        )


def token(deployment: Deployment) -> dict:
    """An ExecCredential, the same document `aws eks get-token` prints, for kubectl."""
    import datetime

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from nvrx_eks.deploy.kube import eks_token
    from nvrx_eks.deploy.stack_outputs import aws_error

    config = deployment.config
    _our_cluster_only(deployment, "token")
    try:
        value = eks_token(boto3.Session(region_name=config.region), config.cluster_name, config.region).value
    except (BotoCoreError, ClientError) as e:
        raise aws_error(e, config, "signing the EKS token") from None
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=14)
    credential = {
        "kind": "ExecCredential",
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "spec": {},
        "status": {"expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"), "token": value},
    }
    sys.stdout.write(json.dumps(credential) + "\n")
    return credential


def kubeconfig(deployment: Deployment) -> dict:
    """A kubeconfig for kubectl whose credentials come from `nvrx-eks token` (no aws CLI)."""
    _our_cluster_only(deployment, "kubeconfig")
    outputs = read_stack_outputs(deployment)
    name = outputs.cluster_name
    args = ["token", *(["--config", deployment.config_path] if deployment.config_path else [])]
    if deployment.profile:
        args += ["--profile", deployment.profile]
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": outputs.endpoint,
                    "certificate-authority-data": outputs.certificate_authority_data,
                },
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "nvrx-eks",
                        "args": args,
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": outputs.namespace}}],
        "current-context": name,
    }
    sys.stdout.write(yaml.safe_dump(document, sort_keys=False))
    return document
