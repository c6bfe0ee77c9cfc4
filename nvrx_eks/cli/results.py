"""What a run left, read on this machine: where its time went (`report`), a checkpoint's held-out
loss (`eval`), a checkpoint as a Hugging Face model (`export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from nvrx_eks.facts.errors import ConfigError

RunDir = Annotated[Path, typer.Argument(help="A run directory (or its checkpoint directory).")]


def report(
    run_dir: Annotated[Path, typer.Argument(help="A trainer run directory (holds events/rank*.jsonl).")],
    png: Annotated[Path | None, typer.Option("--png", help="Timeline image (default: RUN_DIR/timeline.png).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the breakdown as JSON.")] = None,
) -> None:
    """Where a run's time went (productive, stalls, lost, recovery per fault) and a timeline PNG."""
    from nvrx_eks.local.report import run

    run(run_dir, png, json_out, Console())


def evaluate(
    run: RunDir,
    step: Annotated[
        int | None, typer.Option("--step", help="The committed step to evaluate (default: the newest).")
    ] = None,
    train_config: Annotated[
        Path | None,
        typer.Option(
            "--train-config", help="The run's trainer config (default: RUN/config.yaml, which local runs write)."
        ),
    ] = None,
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


def export(
    run: RunDir,
    out: Annotated[Path, typer.Option("--out", help="New or empty directory for the exported model.")],
    step: Annotated[
        int | None, typer.Option("--step", help="The committed step to export (default: the newest).")
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", help="hf: a Hugging Face Llama checkpoint (safetensors).")
    ] = "hf",
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="tokenizer.json or byte (default: the one the run's data was prepared with)."),
    ] = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Weights as float32 (as trained), bfloat16 or float16.")
    ] = "float32",
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
