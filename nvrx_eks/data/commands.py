"""`nvrx-eks data prepare`: nvrx_eks.data.prepare with a progress display and a closing summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from nvrx_eks.data.prepare import DEFAULT_SHARD_TOKENS, check_arguments
from nvrx_eks.data.prepare import prepare as prepare_shards
from workloads.shards import read_manifest


def prepare(
    inputs: list[Path],
    out: Path,
    tokenizer: str,
    text_field: str,
    shard_tokens: int | None,
    console: Console,
    eval_fraction: float = 0.0,
) -> dict:
    check_arguments(inputs, out, tokenizer, shard_tokens or DEFAULT_SHARD_TOKENS, eval_fraction)
    before = read_manifest(out) if out.is_dir() else None
    if before is not None and before["shards"] and not before["complete"]:
        console.print(f"resuming {escape(str(out))} after {len(before['shards'])} completed shard(s)")
    total = sum(p.stat().st_size for p in inputs if p.is_file())
    shards = {"n": 0, "tokens": 0}
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("reading", total=total)

        def progress(kind: str, n: int) -> None:
            if kind == "bytes":
                bar.advance(task, n)
            else:
                shards["n"], shards["tokens"] = shards["n"] + 1, shards["tokens"] + n
                bar.update(task, description=f"{shards['n']} shard(s), {shards['tokens']:,} tokens")

        try:
            manifest = prepare_shards(
                inputs,
                out,
                tokenizer,
                text_field=text_field,
                shard_tokens=shard_tokens or DEFAULT_SHARD_TOKENS,
                eval_fraction=eval_fraction,
                progress=progress,
            )
        except KeyboardInterrupt:
            console.print(f"stopped after {shards['n']} new shard(s); rerun the same command to resume")
            raise
    held_out = manifest.get("eval")
    if held_out:
        console.print(
            f"held out for evaluation: {len(held_out['shards'])} shard(s), {held_out['total_tokens']:,} tokens "
            f"({manifest['eval_fraction']:g} of the text)",
            highlight=False,
        )
    console.print(
        f"{escape(str(out))}: {len(manifest['shards'])} shard(s), {manifest['total_tokens']:,} tokens, "
        f"vocab_size {manifest['vocab_size']}, dtype {manifest['dtype']} (train on it with "
        f"`nvrx-eks local --data {escape(str(out))}`, or upload it and `render --data`)",
        highlight=False,
    )
    return manifest
