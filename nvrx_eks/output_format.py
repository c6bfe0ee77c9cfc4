"""`-o table|json|yaml` of the read commands (plan, status, validate, preflight), as kubectl's
`-o`: a table for people, or the same facts as data on stdout for scripts. Cheap to import: the
CLI declares its option from here."""

from __future__ import annotations

import io
import json
import sys

import typer
import yaml
from rich.console import Console

from nvrx_eks.facts.errors import ConfigError

FORMATS = ("table", "json", "yaml")

OutputFormatOption = typer.Option(
    "table", "-o", "--output", help="table (default), json or yaml: what the table shows, as data."
)


def check_format(output: str) -> str:
    if output not in FORMATS:
        raise ConfigError(f"-o/--output {output!r}: use {', '.join(FORMATS[:-1])} or {FORMATS[-1]}")
    return output


def table_console(output: str) -> Console:
    """Where the tables go: the terminal for `-o table`; nowhere when stdout carries data."""
    return Console() if output == "table" else Console(file=io.StringIO())


def write_data(data: object, output: str) -> None:
    """`data` on stdout as JSON or YAML; nothing for `-o table` (the tables were printed)."""
    if output == "json":
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
