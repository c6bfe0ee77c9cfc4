"""`-o table|json|yaml` of the read commands (plan, status, validate, preflight), as kubectl's
`-o`: a table for people, or the same facts as data on stdout for scripts; and `render -o
yaml|json`, the manifests' format (they are data already: no table). Cheap to import: the CLI
declares its options from here. It sits in jobs, the lowest floor whose commands write data
(validate, status), so ops (plan, preflight) and the CLI read it from below."""

from __future__ import annotations

import io
import json
import sys
from typing import Annotated

import typer
import yaml
from rich.console import Console

from nvrx_eks.facts.errors import ConfigError

FORMATS = ("table", "json", "yaml")
#: `render -o`: YAML first, as kubectl writes manifests and the golden files hold them.
MANIFEST_FORMATS = ("yaml", "json")

#: The option, as an `Annotated` alias; a command sets the default (FORMATS[0], "table") with `=`.
OutputFormat = Annotated[
    str, typer.Option("-o", "--output", help="table (default), json or yaml: what the table shows, as data.")
]
#: `render -o`; its default is MANIFEST_FORMATS[0], "yaml".
ManifestFormat = Annotated[
    str,
    typer.Option(
        "-o",
        "--output",
        help="yaml (default: one document per object) or json (one kubectl List) on stdout; "
        "with --out, the files' format (.yaml or .json).",
    ),
]


def _choices(formats: tuple[str, ...]) -> str:
    return f"{', '.join(formats[:-1])} or {formats[-1]}"


def check_format(output: str) -> str:
    if output not in FORMATS:
        raise ConfigError(f"-o/--output {output!r}: use {_choices(FORMATS)}")
    return output


def check_manifest_format(output: str) -> str:
    """`render -o`; `-o` once named render's directory, so a value that is no format points to --out."""
    if output not in MANIFEST_FORMATS:
        raise ConfigError(
            f"-o/--output {output!r}: use {_choices(MANIFEST_FORMATS)} "
            f"(write files into a directory with --out {output})"
        )
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
