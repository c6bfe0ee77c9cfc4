"""`nvrx-eks`: the operator CLI.

Each command is a thin wrapper that imports its module lazily, so `nvrx-eks render` does not pay
for importing torch and `nvrx-eks local` does not pay for importing aws-cdk-lib. User mistakes
raise ConfigError and end here as one message with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from nvrx_eks.facts.errors import ConfigError, terminal_safe
from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR
from nvrx_eks.jobs.options import FROM_JOB_FLAGS, JOB_FLAGS, JobOptions, data_overrides, job_flags
from nvrx_eks.jobs.output_format import (
    ManifestFormatOption,
    OutputFormatOption,
    check_format,
    check_manifest_format,
    table_console,
    write_data,
)

if TYPE_CHECKING:
    from nvrx_eks.deploy.deployment import Deployment

app = typer.Typer(
    name="nvrx-eks",
    no_args_is_help=True,
    # `nvrx-eks --install-completion` installs shell completion (bash, zsh, fish).
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Fault-tolerant multi-node GPU training on AWS: EKS + p5/EFA + FSx, trained with NVIDIA Resiliency Extension.",
)
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"nvrx-eks {version('nvrx-eks')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    # Options of `nvrx-eks` itself; the help text is the app's.
    return None


#: The highest TCP port is 65535; `local` uses --port and --port + 1.
MAX_TCP_PORT = 65535

#: The profile every command uses when neither --profile nor --config is given.
PROFILE_ENV = "NVRX_EKS_PROFILE"
ProfileOption = typer.Option(
    None, "--profile", "-p", envvar=PROFILE_ENV, help="Profile name in infra/profiles (default: p5)."
)
ConfigOption = typer.Option(None, "--config", "-c", help="Path to a deployment config YAML instead of a profile.")


@app.command()
def synth(profile: str | None = ProfileOption, config: str | None = ConfigOption) -> None:
    """Synthesize a profile offline (with cdk-nag) and summarize what `cdk deploy` would create."""
    from nvrx_eks.deploy.synth import run

    run(profile, config, Console())


@app.command()
def plan(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    train_config: str | None = typer.Option(
        None, "--train-config", help="Trainer config YAML: preset, batch, sequence length and checkpoint interval."
    ),
    nodes: int | None = typer.Option(None, min=1, help="GPU nodes (default: desired_size, or max_size if 0)."),
    node_mtbf_hours: float | None = typer.Option(None, min=1, help="Mean time between failures of one node."),
    sync_stall_s: float | None = typer.Option(None, min=0, help="Measured stall of a synchronous save."),
    async_stall_s: float | None = typer.Option(None, min=0, help="Measured stall of an NVRx async save."),
    step_time_s: float | None = typer.Option(None, min=0, help="Measured time of one training step."),
    node_loss_share: float | None = typer.Option(
        None, help="Share of faults that lose a node and its local checkpoints (default: Llama 3's hardware, 0.75)."
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help="Trainer config override KEY=VALUE (repeatable), as render takes it: model.shape_from=..."
    ),
    output: str = OutputFormatOption,
) -> None:
    """Optimal checkpoint interval (Young/Daly), expected goodput and the cost of lost time."""
    from nvrx_eks.ops.plan import DEFAULT_NODE_LOSS_SHARE, plan_as_data, run

    check_format(output)

    if step_time_s == 0:
        raise ConfigError("--step-time-s must be above 0; give the measured seconds of one training step")
    if node_loss_share is not None and not 0 < node_loss_share < 1:
        raise ConfigError(f"--node-loss-share {node_loss_share:g}: give a fraction above 0 and below 1, e.g. 0.5")

    result = run(
        profile,
        config,
        train_config,
        nodes,
        node_mtbf_hours,
        sync_stall_s,
        async_stall_s,
        step_time_s,
        table_console(output),
        node_loss_share=DEFAULT_NODE_LOSS_SHARE if node_loss_share is None else node_loss_share,
        overrides=overrides,
    )
    write_data(plan_as_data(result), output)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A trainer run directory (holds events/rank*.jsonl)."),
    png: Path | None = typer.Option(None, "--png", help="Timeline image (default: RUN_DIR/timeline.png)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the breakdown as JSON."),
) -> None:
    """Where a run's time went (productive, stalls, lost, recovery per fault) and a timeline PNG."""
    from nvrx_eks.local.report import run

    run(run_dir, png, json_out, Console())


@app.command("eval")
def evaluate(
    run: Path = typer.Argument(..., help="A run directory (or its checkpoint directory)."),
    step: int | None = typer.Option(None, "--step", help="The committed step to evaluate (default: the newest)."),
    train_config: Path | None = typer.Option(
        None, "--train-config", help="The run's trainer config (default: RUN/config.yaml, which local runs write)."
    ),
) -> None:
    """Held-out loss of a committed checkpoint, on CPU (the trainer's evaluation, on the run's data)."""
    import math

    from nvrx_eks.ops.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(run, step=step, train_config=train_config)
    Console().print(
        f"step {result.step}: eval loss {result.loss:.4f} (perplexity {math.exp(result.loss):.2f}) over "
        f"{result.sequences} held-out sequences, {result.tokens:,} tokens ({escape(str(result.checkpoint))})",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def demo(
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Where the training run goes (default: runs/demo-<time>)."
    ),
) -> None:
    """The offline demo: synthesize the default profile, render and validate its full-size job, train on CPU
    through an exception, a hang and a SIGKILL, and report how each was recovered."""
    from nvrx_eks.local.demo import run

    raise typer.Exit(run(run_dir, Console()))


# ----- training jobs: render, validate, submit, follow, delete -------------------------------

LiveOption = typer.Option(False, "--live", help="Take namespace, claim, image and versions from the deployed stack.")
OutDirOption = typer.Option(
    None, "--out", help="Write one file per object into this directory instead of stdout (-o: their format)."
)


def _deployment(profile: str | None, config: str | None) -> Deployment:
    from nvrx_eks.deploy.deployment import load_deployment

    return load_deployment(profile, config)


@app.command()
@job_flags()
def render(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    options: JobOptions = FROM_JOB_FLAGS,
    live: bool = LiveOption,
    output: str = ManifestFormatOption,
    out_dir: Path | None = OutDirOption,
) -> None:
    """Render the training job (JobSet or PyTorchJob + trainer ConfigMap + NetworkPolicy) to stdout or a directory."""
    from nvrx_eks.jobs import commands as job_commands

    output = check_manifest_format(output)
    job_commands.render(
        _deployment(profile, config), options, live=live, output=output, out_dir=out_dir, err=err_console
    )


@app.command()
@job_flags(without=("data",))
def validate(
    path: str | None = typer.Argument(None, help="Manifest file, or - for stdin (default: render with the flags)."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    options: JobOptions = FROM_JOB_FLAGS,
    live: bool = LiveOption,
    output: str = OutputFormatOption,
) -> None:
    """Validate manifests offline: strict Kubernetes schemas, the JobSet/PyTorchJob CRDs, project rules."""
    from nvrx_eks.jobs import commands as job_commands

    console = table_console(check_format(output))
    job_commands.validate(_deployment(profile, config), options, path=path, live=live, console=console, output=output)


@app.command()
@job_flags()
def submit(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    options: JobOptions = FROM_JOB_FLAGS,
    dry_run: bool = typer.Option(False, "--dry-run", help="Render and validate offline and print; no cluster needed."),
) -> None:
    """Render, validate, server-side dry-run, then create the job on the deployed cluster."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.submit(_deployment(profile, config), options, dry_run=dry_run, out=Console(), err=err_console)


@app.command()
def status(
    name: str | None = typer.Argument(None, help="Job name (default: list this project's jobs)."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    output: str = OutputFormatOption,
) -> None:
    """Job phase, pods, restarts per resilience layer."""
    from nvrx_eks.jobs import commands as job_commands

    deployment, console = _deployment(profile, config), table_console(check_format(output))
    if job_commands.status(deployment, name, console, output) is not None and name is not None:
        from nvrx_eks.jobs.logs import last_metrics

        for line in last_metrics(job_commands.job_client(deployment, console), name):
            console.print(f"last metrics: {escape(line)}", highlight=False, soft_wrap=True)


@app.command()
def logs(
    name: str = typer.Argument(..., help="Job name."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the pods end."),
    node: int | None = typer.Option(None, "--node", min=0, help="Only this node's pod."),
    rank: int | None = typer.Option(None, "--rank", min=0, help="Only this global rank's lines."),
    tail: int | None = typer.Option(None, "--tail", min=0, help="Only the last N lines of each pod."),
    events: bool = typer.Option(
        False, "--events", help="Only the event lines: faults, restarts, checkpoint commits and the run's end."
    ),
) -> None:
    """Logs of all pods (prefixed by node), one node, or one rank; with -f as they happen."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.logs(
        _deployment(profile, config),
        name,
        node=node,
        rank=rank,
        follow=follow,
        tail=tail,
        events=events,
        console=Console(),
    )


@app.command()
def delete(
    name: str = typer.Argument(..., help="Job name."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    wait: bool = typer.Option(False, "--wait", help="Wait until the job's pods are gone."),
) -> None:
    """Delete a training job and its ConfigMap (checkpoints on FSx stay)."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.delete(_deployment(profile, config), name, wait=wait, console=Console())


@app.command()
def token(profile: str | None = ProfileOption, config: str | None = ConfigOption) -> None:
    """Print an EKS ExecCredential (as `aws eks get-token` does), for kubectl."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.token(_deployment(profile, config))


@app.command()
def kubeconfig(profile: str | None = ProfileOption, config: str | None = ConfigOption) -> None:
    """Print a kubeconfig for the deployed cluster that authenticates through `nvrx-eks token`."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.kubeconfig(_deployment(profile, config))


@app.command()
def preflight(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    nodes: int | None = typer.Option(None, "--nodes", "-n", min=1, help="GPU nodes to plan for (default: max_size)."),
    output: str = OutputFormatOption,
) -> None:
    """Before deploying: credentials, the admin principal (exists, is you), vCPU quota, instance offering,
    GPU capacity (a reservation or block; quota is not capacity), FSx quota, EKS version, no documentation
    placeholders in the profile, and API endpoint access from this machine. With a cluster: section, the
    existing cluster instead: its context, namespace, claim, job API and GPU nodes."""
    from nvrx_eks.ops import preflight as checks

    checks.run(_deployment(profile, config), nodes, table_console(check_format(output)), output=output)


@app.command()
def deploy(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    yes: bool = typer.Option(False, "--yes", "-y", help="Deploy without asking, even when running GPU nodes change."),
    no_rollback: bool = typer.Option(
        False, "--no-rollback", help="Keep what a failed deploy created, to fix and deploy again (cdk's flag)."
    ),
) -> None:
    """`cdk deploy --all` for the profile. First says what it would do to running GPU nodes (replace each
    one for a new launch template version, replace the node group, reset its size) and asks."""
    from nvrx_eks.deploy.deploy import deploy as run_deploy

    status = run_deploy(
        _deployment(profile, config),
        yes=yes,
        no_rollback=no_rollback,
        console=Console(),
        confirm=lambda question: typer.confirm(question, default=False),
    )
    if status:
        raise typer.Exit(status)


@app.command()
def teardown(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting."),
    delete_data: bool = typer.Option(
        False,
        "--delete-data",
        help="Also delete the FSx file system (waiting until it is gone), its backups, the data bucket and the "
        "audit log groups, then the storage and network stacks.",
    ),
    skip_kubernetes: bool = typer.Option(
        False, "--skip-kubernetes", help="Do not delete jobs and the FSx claim first (API unreachable)."
    ),
) -> None:
    """Delete jobs, the FSx claim and the cluster stack, then sweep leftovers. Keeps the data, and the network
    and storage stacks it needs, unless --delete-data."""
    from nvrx_eks.ops.teardown import teardown as run_teardown

    result = run_teardown(
        _deployment(profile, config),
        yes=yes,
        delete_data=delete_data,
        skip_kubernetes=skip_kubernetes,
        console=Console(),
        confirm=lambda question: typer.confirm(question, default=False),
    )
    if result.aborted:
        raise typer.Exit(1)


# ----- GPU capacity: scale the deployed GPU node group --------------------------------------

capacity_app = typer.Typer(no_args_is_help=True, help="Scale the deployed GPU node group up to a job's nodes, or to 0.")
app.add_typer(capacity_app, name="capacity")
WaitOption = typer.Option(30, "--wait-minutes", min=1, help="How long to wait for the nodes before giving up.")


@capacity_app.command("up")
def capacity_up(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    nodes: int | None = typer.Option(None, "--nodes", "-n", min=1, help="GPU nodes (default: desired_size, or max)."),
    wait_minutes: int = WaitOption,
) -> None:
    """Scale the GPU node group up (a Capacity Block: once it is active) and wait until the nodes are Ready;
    a shortfall is named with what to do."""
    from nvrx_eks.ops.gpu_capacity import capacity_up as scale_up

    scale_up(_deployment(profile, config), nodes, Console(), timeout_s=wait_minutes * 60)


@capacity_app.command("down")
def capacity_down(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    force: bool = typer.Option(False, "--force", help="Scale down even while a training job is running."),
    wait_minutes: int = WaitOption,
) -> None:
    """Scale the GPU node group to 0 (refused while a training job of this tool runs, unless --force)."""
    from nvrx_eks.ops.gpu_capacity import capacity_down as scale_down

    scale_down(_deployment(profile, config), Console(), force=force, timeout_s=wait_minutes * 60)


@app.command()
def local(
    nproc: int = typer.Option(2, "--nproc", help="CPU ranks (gloo) per simulated node."),
    nodes: int = typer.Option(
        1, "--nodes", help="Active simulated nodes: one ft_launcher each, own local checkpoint root."
    ),
    spare_nodes: int = JOB_FLAGS["spare_nodes"][1],  # the cluster commands' option: one meaning
    local_interval: int | None = typer.Option(
        None,
        "--local-interval",
        min=1,
        help="Steps between node-local checkpoints, replicated to another node (default off).",
    ),
    steps: int = typer.Option(60, help="Training steps."),
    faults: str = typer.Option("", help='Faults to inject, e.g. "exception@20:1,sigkill@40:0".'),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Default: runs/local-<time>."),
    preset: str = typer.Option("tiny", help="Model preset: tiny, small, 1b, 8b."),
    checkpoint_interval: int = typer.Option(10, "--checkpoint-interval", help="Steps between FSx-tier saves."),
    backend: str = typer.Option("nvrx", help="Checkpoint backend: nvrx, dcp-async, sync, none."),
    resume: bool = typer.Option(False, help="Continue the run already in --run-dir."),
    overrides: list[str] = typer.Option([], "--set", help="TrainConfig override key=value (repeatable)."),
    port: int | None = typer.Option(None, help="Rendezvous port (P and P+1 are used). Default: a free one."),
    data: Path | None = typer.Option(None, "--data", help="Train on the token shards of a `data prepare` directory."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Start more ranks ((--nodes + --spare-nodes) x --nproc) than this machine's CPU cores are allowed.",
    ),
    relaunches: int = typer.Option(
        2,
        "--relaunches",
        min=0,
        help="Times a launch that lost its coordinator or more nodes than it has spares starts again "
        "(as the JobSet recreates its pods).",
    ),
) -> None:
    """Run the trainer under ft_launcher on this machine, inject faults, print how it recovered."""
    from nvrx_eks.local.runner import run_local

    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file; give a directory (new, or a run's with --resume)")
    if data is not None and not data.is_dir():
        raise ConfigError(f"--data {data} is not a directory; give the --out directory of `nvrx-eks data prepare`")
    if port is not None and not 1 <= port < MAX_TCP_PORT:
        raise ConfigError(f"--port {port}: give a TCP port from 1 to {MAX_TCP_PORT - 1} (the run also uses port + 1)")

    code = run_local(
        nproc=nproc,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset=preset,
        checkpoint_interval=checkpoint_interval,
        backend=backend,
        resume=resume,
        overrides=list(overrides) + data_overrides(str(data.resolve()) if data else None),
        port=port,
        console=Console(),
        nodes=nodes,
        local_interval=local_interval,
        spare_nodes=spare_nodes,
        force=force,
        max_relaunches=relaunches,
    )
    raise typer.Exit(code)


@app.command()
def rehearse(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    nodes: int = typer.Option(2, "--nodes", min=1, help="Active nodes: one pod each."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="CPU ranks (gloo) per pod, in place of its GPUs."),
    spare_nodes: int = JOB_FLAGS["spare_nodes"][1],  # the cluster commands' option: one meaning
    local_interval: int | None = typer.Option(
        None, "--local-interval", min=1, help="Steps between node-local checkpoints (default: the profile's job)."
    ),
    steps: int = typer.Option(30, help="Training steps."),
    faults: str = typer.Option(
        "",
        help='Trainer and pod faults (pod-kill@STEP:NODE, pod-stop@STEP:NODE), e.g. "exception@9:1,pod-stop@17:1".',
    ),
    checkpoint_interval: int = typer.Option(10, "--checkpoint-interval", help="Steps between FSx-tier saves."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Default: runs/rehearse-<time>."),
    overrides: list[str] = typer.Option([], "--set", help="TrainConfig override key=value (repeatable)."),
) -> None:
    """Run the profile's rendered training pods in podman, under their own security context."""
    from nvrx_eks.rehearse.runner import rehearse as run_rehearsal

    code = run_rehearsal(
        profile=profile,
        config_path=config,
        nodes=nodes,
        nproc=nproc,
        spare_nodes=spare_nodes,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        checkpoint_interval=checkpoint_interval,
        local_interval=local_interval,
        overrides=list(overrides),
        console=Console(),
    )
    raise typer.Exit(code)


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="Fewer repetitions and steps: ~9 min on 2 CPU cores (full: ~21)"),
    out: Path | None = typer.Option(None, "--out", help="Results directory (default: runs/bench-<time>)."),
    scenarios: str = typer.Option(
        "p1,p2,p3,p4",
        "--scenarios",
        help="Comma-separated subset of p1,p2,p3,p4,p5,p6,p7 (p5: checkpoint tiers, p6: hot spares, p7: gloo release).",
    ),
    repeats: int | None = typer.Option(
        None, "--repeats", min=1, help="P1 runs per backend, P2 faults per kind, P3 faults per recovery path."
    ),
    preset: str | None = typer.Option(None, "--preset", help="Model for P1 and P4 (default: small)."),
    recovery_preset: str | None = typer.Option(None, "--recovery-preset", help="Model for P2 and P3."),
    interval: int | None = typer.Option(None, "--interval", min=1, help="Checkpoint every N steps (default: 2)."),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Ranks: CPU processes, or GPUs on a GPU node."),
    p4_steps: int | None = typer.Option(None, "--p4-steps", min=1, help="Steps of each P4 run."),
    p4_faults: int | None = typer.Option(None, "--p4-faults", min=1, help="Faults in the P4 schedule."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the P4 fault schedule."),
    dist_backend: str | None = typer.Option(
        None, "--dist-backend", help="auto (NCCL when GPUs are visible, else gloo), gloo or nccl."
    ),
    overrides: list[str] = typer.Option([], "--set", help="Trainer config override key=value, every run (repeatable)."),
) -> None:
    """Benchmark the resilience layers side by side: checkpoint efficiency, soft- and hard-fault recovery, goodput."""
    import shlex

    from nvrx_eks.bench.suite import run_bench

    result = run_bench(
        quick=quick,
        out=out,
        scenarios=scenarios,
        command=shlex.join(["nvrx-eks", *sys.argv[1:]]),
        console=Console(),
        repeats=repeats,
        preset=preset,
        recovery_preset=recovery_preset,
        interval=interval,
        nproc=nproc,
        p4_steps=p4_steps,
        p4_faults=p4_faults,
        seed=seed,
        dist_backend=dist_backend,
        overrides=overrides,
    )
    if result["errors"]:
        raise typer.Exit(1)


@app.command("gpu-smoke")
def gpu_smoke(
    out: Path = typer.Option(..., "--out", help="A new directory for the runs and gpu_smoke.json."),
    dry_run: bool = typer.Option(False, "--dry-run", help="CPU, gloo, tiny preset: the same code path."),
    preset: str | None = typer.Option(None, "--preset", help="Model preset (default: 1b on GPU, tiny dry)."),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Ranks (default: one per visible GPU)."),
    budget_s: float | None = typer.Option(
        None,
        "--budget-s",
        help="Seconds the smoke may take (default: under 8 minutes); a phase that would not fit is skipped.",
    ),
) -> None:
    """On one GPU machine: NCCL, bf16, async checkpoints, faults recovered in process, resume, stall, memory."""
    from nvrx_eks.ops.gpu_smoke import smoke

    result = smoke(out_dir=out, dry_run=dry_run, preset=preset, nproc=nproc, console=Console(), budget_s=budget_s)
    raise typer.Exit(0 if result["ok"] else 1)


@app.command()
def export(
    run: Path = typer.Argument(..., help="A run directory (or its checkpoint directory)."),
    out: Path = typer.Option(..., "--out", help="New or empty directory for the exported model."),
    step: int | None = typer.Option(None, "--step", help="The committed step to export (default: the newest)."),
    output_format: str = typer.Option("hf", "--format", help="hf: a Hugging Face Llama checkpoint (safetensors)."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tokenizer.json or byte (default: the one the run's data was prepared with)."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="Weights as float32 (as trained), bfloat16 or float16."),
) -> None:
    """Export a committed checkpoint as a Hugging Face model, on CPU, streaming tensor by tensor."""
    if output_format != "hf":
        raise ConfigError(f"--format {output_format!r}: use hf (the only export format)")
    from nvrx_eks.ops.hf_export import export_hf

    result = export_hf(run, out, step=step, tokenizer=tokenizer, dtype=dtype)
    console = Console()
    for note in result.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    console.print(
        f"exported step {result.step} ({escape(str(result.checkpoint))}) to {escape(str(result.out))}: "
        f"{len(result.files)} safetensors file(s), {result.nbytes / 2**20:,.1f} MiB of {dtype} weights, "
        f"tokenizer {escape(result.tokenizer)}",
        highlight=False,
        soft_wrap=True,
    )


data_app = typer.Typer(no_args_is_help=True, help="Turn text into the trainer's token shards and upload them.")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    inputs: list[Path] = typer.Argument(..., help="Text, JSONL, .gz or .zst files, read in this order."),
    out: Path = typer.Option(..., "--out", help="Directory for the shards and manifest.json (rerun to resume)."),
    tokenizer: str = typer.Option(..., "--tokenizer", help="A Hugging Face tokenizer.json, or byte (vocabulary 256)."),
    text_field: str = typer.Option("text", "--text-field", help="The JSONL field holding the text."),
    shard_tokens: int | None = typer.Option(None, "--shard-tokens", min=2, help="Tokens per shard (default 64 Mi)."),
    eval_fraction: float = typer.Option(
        0.0, "--eval-fraction", help="Hold out this fraction of the text (whole documents) for evaluation, e.g. 0.01."
    ),
    upload_to: str | None = typer.Option(None, "--upload", help="Then upload to s3://BUCKET/PREFIX (the data bucket)."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
) -> None:
    """Tokenize text into token shards + manifest, streaming and resumable."""
    from nvrx_eks.data.commands import prepare
    from nvrx_eks.data.upload import upload
    from nvrx_eks.jobs.data_path import parse_s3_url, pod_path

    deployment = None
    if upload_to is not None:  # a wrong URL is refused before the work, not after
        deployment = _deployment(profile, config).config
        pod_path(deployment, parse_s3_url(upload_to)[1])
    prepare(inputs, out, tokenizer, text_field, shard_tokens, Console(), eval_fraction)
    if deployment is not None and upload_to is not None:
        upload(deployment, out, upload_to, Console())


@data_app.command("upload")
def data_upload(
    directory: Path = typer.Argument(..., help="A `data prepare` output directory."),
    url: str = typer.Argument(..., help="s3://BUCKET/PREFIX under the data bucket's data prefix."),
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
) -> None:
    """Upload a shard set to the data bucket; print where the pods will see it under /fsx."""
    from nvrx_eks.data.upload import upload

    upload(_deployment(profile, config).config, directory, url, Console())


def main() -> None:
    try:
        app()
    except ConfigError as e:
        # Messages echo user input (paths, names, specs): escape it, or a '[' in it is read as
        # markup and an ESC in it as a terminal's escape sequence.
        err_console.print(f"[bold red]error:[/] {escape(terminal_safe(str(e)))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
