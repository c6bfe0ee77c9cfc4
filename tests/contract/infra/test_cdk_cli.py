"""The CDK CLI environment: jsii's end-of-life banner is replaced by one line, and only then; `cdk` runs offline."""

from __future__ import annotations

import pytest

from nvrx_eks.deploy import cdk_cli

SILENCE = cdk_cli.SILENCE_VARIABLE


@pytest.fixture
def node(monkeypatch):
    monkeypatch.delenv(SILENCE, raising=False)

    def use(major):
        monkeypatch.setattr(cdk_cli, "node_major", lambda: major)

    return use


def test_old_node_gets_one_line_instead_of_the_banner(node):
    node(20)
    note = cdk_cli.quiet_end_of_life_banner()
    assert "Node.js 20" in note and "Node.js 22 or newer" in note
    assert cdk_cli.os.environ[SILENCE] == "20"


@pytest.mark.parametrize("major", [22, 24, None])
def test_supported_or_missing_node_changes_nothing(node, major):
    node(major)
    assert cdk_cli.quiet_end_of_life_banner() is None
    assert SILENCE not in cdk_cli.os.environ


def test_a_users_own_setting_is_left_alone(node, monkeypatch):
    node(20)
    monkeypatch.setenv(SILENCE, "18")
    assert cdk_cli.quiet_end_of_life_banner() is None
    assert cdk_cli.os.environ[SILENCE] == "18"


def test_the_installed_node_version_is_read():
    assert cdk_cli.node_major() >= 20


def test_cdk_runs_offline_with_this_interpreter_first_on_path(node, monkeypatch):
    node(20)
    env = cdk_cli.cdk_environment()
    assert env["CDK_DISABLE_VERSION_CHECK"] == "1" and env["CDK_DISABLE_CLI_TELEMETRY"] == "true"
    assert env[SILENCE] == "20" and SILENCE not in cdk_cli.os.environ  # only the child's environment
    assert env["PATH"].split(cdk_cli.os.pathsep)[0] == str(cdk_cli.Path(cdk_cli.sys.executable).parent)


def test_cdk_is_the_checkouts_own_cli():
    argv = cdk_cli.cdk_argv("synth", "--quiet")
    assert argv[0].endswith("node_modules/.bin/cdk") and argv[1:] == ["synth", "--quiet"]
