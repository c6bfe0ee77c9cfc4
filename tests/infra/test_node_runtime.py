"""jsii's end-of-life banner for old Node.js releases is replaced by one line, and only then."""

from __future__ import annotations

import pytest

from infra import node_runtime

SILENCE = node_runtime.SILENCE_VARIABLE


@pytest.fixture
def node(monkeypatch):
    monkeypatch.delenv(SILENCE, raising=False)

    def use(major):
        monkeypatch.setattr(node_runtime, "node_major", lambda: major)

    return use


def test_old_node_gets_one_line_instead_of_the_banner(node):
    node(20)
    note = node_runtime.quiet_end_of_life_banner()
    assert "Node.js 20" in note and "Node.js 22 or newer" in note
    assert node_runtime.os.environ[SILENCE] == "20"


@pytest.mark.parametrize("major", [22, 24, None])
def test_supported_or_missing_node_changes_nothing(node, major):
    node(major)
    assert node_runtime.quiet_end_of_life_banner() is None
    assert SILENCE not in node_runtime.os.environ


def test_a_users_own_setting_is_left_alone(node, monkeypatch):
    node(20)
    monkeypatch.setenv(SILENCE, "18")
    assert node_runtime.quiet_end_of_life_banner() is None
    assert node_runtime.os.environ[SILENCE] == "18"


def test_the_installed_node_version_is_read():
    assert node_runtime.node_major() >= 20
