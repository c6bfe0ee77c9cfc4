"""Running `nvrx-eks` as its own process (`python -m nvrx_eks.cli`) from the repository root: what
a user's shell sees, the exit code, stdout and stderr, with nothing of the test process shared."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO_ROOT

#: A wide terminal (Rich sizes its tables to it, so names stay whole for the assertions) and only
#: the system PATH, so the command finds no tool of the test environment by accident.
WIDE_TERMINAL = {"COLUMNS": "160", "PATH": "/usr/bin:/bin"}


def cli_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`nvrx-eks ARGS` in a new interpreter; `env` replaces the environment when given."""
    return subprocess.run(
        [sys.executable, "-m", "nvrx_eks.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
