"""The import graph, read from the source with every lazy and TYPE_CHECKING import counted: no
circles in the packages that have none."""

from __future__ import annotations

import pytest

from tests.support.import_graph import circles, import_graph, imports_in, own_modules


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(own_modules())


@pytest.mark.parametrize("package", ["infra", "workloads", "nvrx_eks.facts"])
def test_no_import_circle_runs_through(graph, package):
    """A circle hidden by a lazy or TYPE_CHECKING import (the add-on catalog and the config model
    read each other) still forces an import order on readers and tools."""
    inside = [c for c in circles(graph) if any(m == package or m.startswith(package + ".") for m in c)]
    assert not inside, f"import circles through {package}: {inside}"


def test_the_reader_sees_deferred_and_guarded_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "if TYPE_CHECKING:\n"
        "    from infra.config import DeploymentConfig\n"
        "try:\n"
        "    import matplotlib\n"
        "except ImportError:\n"
        "    matplotlib = None\n"
        "def draw():\n"
        "    from .sibling import thing\n"
    )
    found = {(i.module, i.at_import_time, i.guarded) for i in imports_in(source, "pkg.sub.mod")}
    assert found == {
        ("typing", True, False),
        ("json", True, False),
        ("infra.config", False, False),
        ("matplotlib", True, True),
        ("pkg.sub.sibling", False, False),
    }


def test_the_circle_finder_finds_only_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
