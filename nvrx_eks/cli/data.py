"""`nvrx-eks data`: text into the trainer's token shards, and the shards into the data bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nvrx_eks.cli.options import Config, Profile, deployment

app = typer.Typer(no_args_is_help=True, help="Turn text into the trainer's token shards and upload them.")


@app.command("prepare")
def data_prepare(
    inputs: Annotated[list[Path], typer.Argument(help="Text, JSONL, .gz or .zst files, read in this order.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the shards and manifest.json (rerun to resume).")],
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", help="A Hugging Face tokenizer.json, or byte (vocabulary 256).")
    ],
    text_field: Annotated[str, typer.Option("--text-field", help="The JSONL field holding the text.")] = "text",
    shard_tokens: Annotated[
        int | None, typer.Option("--shard-tokens", min=2, help="Tokens per shard (default 64 Mi).")
    ] = None,
    eval_fraction: Annotated[
        float,
        typer.Option(
            "--eval-fraction",
            help="Hold out this fraction of the text (whole documents) for evaluation, e.g. 0.01.",
        ),
    ] = 0.0,
    upload_to: Annotated[
        str | None, typer.Option("--upload", help="Then upload to s3://BUCKET/PREFIX (the data bucket).")
    ] = None,
    profile: Profile = None,
    config: Config = None,
) -> None:
    """Tokenize text into token shards + manifest, streaming and resumable."""
    from nvrx_eks.data.commands import prepare
    from nvrx_eks.data.upload import upload
    from nvrx_eks.jobs.data_path import parse_s3_url, pod_path

    deployed = None
    if upload_to is not None:  # a wrong URL is refused before the work, not after
        deployed = deployment(profile, config).config
        pod_path(deployed, parse_s3_url(upload_to)[1])
    prepare(inputs, out, tokenizer, text_field, shard_tokens, Console(), eval_fraction)
    if deployed is not None and upload_to is not None:
        upload(deployed, out, upload_to, Console())


@app.command("upload")
def data_upload(
    directory: Annotated[Path, typer.Argument(help="A `data prepare` output directory.")],
    url: Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX under the data bucket's data prefix.")],
    profile: Profile = None,
    config: Config = None,
) -> None:
    """Upload a shard set to the data bucket; print where the pods will see it under /fsx."""
    from nvrx_eks.data.upload import upload

    upload(deployment(profile, config).config, directory, url, Console())
