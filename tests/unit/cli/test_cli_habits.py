"""The CLI habits of kubectl: -h beside --help, shell completion, a profile from the environment,
and a hint that names this command's own flag."""

from __future__ import annotations

import os

import pytest

from nvrx_eks.cli.options import PROFILE_ENV
from tests.support.cli_harness import run_cli
from tests.support.cli_process import WIDE_TERMINAL, cli_process


@pytest.mark.parametrize("args", [("-h",), ("render", "-h"), ("data", "prepare", "-h")])
def test_dash_h_is_help(args):
    result = cli_process(*args, env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    assert "Usage: " in result.stdout and "[OPTIONS]" in result.stdout


def test_shell_completion_can_be_shown():
    result = cli_process("--show-completion", "bash", env={**WIDE_TERMINAL, "SHELL": "/bin/bash"})
    assert result.returncode == 0, result.stderr
    assert "complete" in result.stdout and "nvrx-eks" in result.stdout.lower().replace("_", "-")


def test_the_profile_can_come_from_the_environment():
    result = cli_process("render", env={**WIDE_TERMINAL, "PATH": os.environ["PATH"], PROFILE_ENV: "g5-smoke"})
    assert result.returncode == 0, result.stderr
    assert "x g5.8xlarge" in result.stderr


def test_an_unknown_profile_names_this_commands_flag():
    result = run_cli("render", "--profile", "p6")
    assert result.code == 2
    assert "or give a deployment config file (nvrx-eks: --config PATH; cdk: -c config=PATH)" in result.stderr
