"""The README's status block says what is proven, and stays true to BENCHMARKS.md.

The rule, stated in the README's status block and here:
- BENCHMARKS.md's "On GPUs" section says one of two things: "No GPU was available" (nothing was
  measured on a GPU), or a line of its own `GPU run: YYYY-MM-DD` (GPU figures measured that day).
- While it says "No GPU was available", the README's "Never run yet" list names "a GPU run", and
  the proven lists above it do not mention a GPU at all.
- Once it holds `GPU run: DATE`, "a GPU run" leaves "Never run yet" and the proven lists carry the
  same `GPU run: DATE`.

The block is also the README's first screen, and every command it cites exists: a `make` target
or an `nvrx-eks` command, so "proven by X" cannot point at a command that is gone.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

import pytest
import typer

from nvrx_eks.cli import app
from tests.support import REPO_ROOT

README = REPO_ROOT / "README.md"
BENCHMARKS = REPO_ROOT / "BENCHMARKS.md"

STATUS_HEADING = "## Status: what is proven"
GPU_SECTION_HEADING = "## On GPUs"
#: What BENCHMARKS.md's GPU section says while nothing was measured on a GPU.
NO_GPU_SENTENCE = "No GPU was available"
#: The line BENCHMARKS.md's GPU section gains with the first GPU figures.
GPU_RUN_MARKER = re.compile(r"^GPU run: (\d{4}-\d{2}-\d{2})\b", re.MULTILINE)
#: The labels that open the status block's three lists, in order.
PROVEN_OFFLINE = "**Proven offline**"
CHECKED_ONLY = "**Checked only against published data**"
NEVER_RUN = "**Never run yet**"
#: How "a GPU run" is named in the lists.
GPU_RUN_ITEM = "a GPU run"
#: The most lines the block may take and still be read before anything else.
FIRST_SCREEN_LINES = 40


def section(text: str, heading: str) -> str:
    """The text under a level-2 heading, up to the next level-2 heading."""
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


@dataclass(frozen=True)
class Status:
    proven: str  # the proven-offline and checked-only lists
    never_run: str


def readme_status() -> Status:
    block = section(README.read_text(), STATUS_HEADING)
    offline, checked, never = (block.index(label) for label in (PROVEN_OFFLINE, CHECKED_ONLY, NEVER_RUN))
    assert offline < checked < never, (
        f"the status block's lists come in this order: {PROVEN_OFFLINE}, {CHECKED_ONLY}, {NEVER_RUN}"
    )
    return Status(proven=block[offline:never], never_run=block[never:])


def gpu_run_date() -> str | None:
    """The date of the GPU figures in BENCHMARKS.md, None while it says no GPU was available."""
    gpus = section(BENCHMARKS.read_text(), GPU_SECTION_HEADING)
    marker = GPU_RUN_MARKER.search(gpus)
    said_no_gpu = NO_GPU_SENTENCE in gpus
    assert said_no_gpu != bool(marker), (
        f"BENCHMARKS.md, {GPU_SECTION_HEADING!r}: say either {NO_GPU_SENTENCE!r} or, with the first GPU "
        f"figures, a line 'GPU run: YYYY-MM-DD' (found {'both' if said_no_gpu else 'neither'})"
    )
    return marker.group(1) if marker else None


def test_status_block_is_the_first_screen():
    lines = README.read_text().splitlines()
    first_section = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert lines[first_section] == STATUS_HEADING, "the status block is the README's first section"
    block_lines = section(README.read_text(), STATUS_HEADING).rstrip().count("\n") + 1
    assert block_lines <= FIRST_SCREEN_LINES, f"the status block takes {block_lines} lines; keep it to a screen"


def test_gpu_run_is_where_benchmarks_puts_it():
    status = readme_status()
    date = gpu_run_date()
    if date is None:
        assert GPU_RUN_ITEM in status.never_run, (
            f"BENCHMARKS.md has no GPU run: list {GPU_RUN_ITEM!r} under {NEVER_RUN}"
        )
        claims = [line for line in status.proven.splitlines() if "GPU" in line]
        assert not claims, f"BENCHMARKS.md has no GPU figures, but the README's proven lists mention a GPU: {claims}"
    else:
        assert GPU_RUN_ITEM not in status.never_run, f"BENCHMARKS.md has GPU figures from {date}: move the GPU run up"
        assert f"GPU run: {date}" in status.proven, f"the README's proven lists name the GPU run: 'GPU run: {date}'"


def make_targets() -> set[str]:
    makefile = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))


def cli_command(words: list[str]) -> bool:
    """Whether `nvrx-eks WORDS...` names a command: a command, or a group and one of its own
    (a word after a plain command is its argument)."""
    command = typer.main.get_command(app).commands.get(words[0])
    if command is None or not hasattr(command, "commands"):
        return command is not None
    return len(words) > 1 and words[1] in command.commands


@pytest.mark.parametrize("kind", ["make", "nvrx-eks"])
def test_every_cited_command_exists(kind):
    block = section(README.read_text(), STATUS_HEADING)
    cited = re.findall(rf"`{kind} ([a-z][\w-]*(?: [a-z][\w-]*)?)", block)
    assert cited, f"the status block cites the {kind} commands that prove each item"
    targets = make_targets()
    exists = (lambda c: c in targets) if kind == "make" else (lambda c: cli_command(c.split(" ")))
    missing = sorted({c for c in cited if not exists(c)})
    assert not missing, f"the status block cites {kind} commands that do not exist: {missing}"


def test_linked_files_exist():
    block = section(README.read_text(), STATUS_HEADING)
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", block):
        assert (REPO_ROOT / target).exists(), f"the status block links to {target}, which does not exist"


def test_license_matches_pyproject():
    licence = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert licence == "Apache-2.0"
    assert (REPO_ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
