"""Support code the tests share: the CLI harness, the local Kubernetes API server, trainer fixtures, manifest cases."""

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout the tests run in."""


def checkout_files() -> list[str]:
    """The checkout's files as a fresh clone would have them plus untracked ones git does not
    ignore, relative to REPO_ROOT (what a build from the working tree can see)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [p for p in listed if (REPO_ROOT / p).is_file()]
