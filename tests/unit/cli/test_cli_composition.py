"""The CLI as a package of command groups (nvrx_eks/cli/): help that lists choices reads them
from where they are stated, and starting it imports none of the heavy packages its commands use."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO_ROOT
from tests.support.cli_process import WIDE_TERMINAL, cli_process

#: What a command imports only once it runs: `--help` and `render` must not wait for them.
HEAVY = ("torch", "aws_cdk", "jsii", "matplotlib", "kubernetes", "boto3", "botocore", "numpy")


def _help_with(setup: str, *args: str) -> str:
    """`nvrx-eks ARGS` in a new interpreter after `setup` ran (before the CLI was imported)."""
    probe = f"import sys\n{setup}\nfrom nvrx_eks.cli import main\nsys.argv = ['nvrx-eks', *{list(args)!r}]\nmain()\n"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, env=WIDE_TERMINAL, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.replace("│", " ").split())


def test_local_help_lists_the_model_presets_of_workloads_presets():
    """The help restated "tiny, small, 1b, 8b": a preset added to MODEL_PRESETS was missing there."""
    text = _help_with(
        "import workloads.presets as p\np.MODEL_PRESETS['70b'] = p.MODEL_PRESETS['8b']", "local", "--help"
    )
    assert "Model preset: tiny, small, 1b, 8b, 70b." in text


def test_local_help_lists_the_checkpoint_backends_the_config_accepts():
    """The help restated the backends of checkpoint.backend's Literal."""
    text = _help_with(
        "import workloads.checkpoint.backends as b\nb.CHECKPOINT_BACKENDS += ('tiered',)", "local", "--help"
    )
    assert "Checkpoint backend: nvrx, dcp-async, sync, none, tiered." in text


def test_the_config_validates_against_the_backends_the_help_lists():
    from typing import get_args

    from workloads.checkpoint.backends import CHECKPOINT_BACKENDS
    from workloads.config import CheckpointConfig

    assert get_args(CheckpointConfig.model_fields["backend"].annotation) == CHECKPOINT_BACKENDS


def test_starting_the_cli_imports_no_heavy_package():
    """Every command imports its module lazily: `--help` (and so every command's start) pays for
    Typer and the job flags only, never torch, the CDK, matplotlib or the AWS and Kubernetes clients."""
    probe = (
        "import json, sys\n"
        "from nvrx_eks.cli import main\n"
        "sys.argv = ['nvrx-eks', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, env=WIDE_TERMINAL, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_python_dash_m_runs_the_cli():
    result = cli_process("--version", env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nvrx-eks ")
