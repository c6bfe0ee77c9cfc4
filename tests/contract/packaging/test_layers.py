"""The import graph, read from the source with every lazy and TYPE_CHECKING import counted: the
ground floor of facts imports nothing else of ours, the trainer and the CDK app import only it of
the operator's package, and no circles in the packages that have none."""

from __future__ import annotations

import pytest

from tests.support.import_graph import circles, import_graph, imports_in, own_modules


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(own_modules())


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


#: What each package may import of ours besides itself.
ALLOWED = {
    "nvrx_eks.facts": (),
    "infra": ("nvrx_eks.facts",),
    "workloads": ("nvrx_eks.facts",),
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_the_package_imports_only_the_floors_below_it(graph, package):
    """The CDK app reaching into the operator's modules (for the checkout's root) put the
    operator's package both above and below it."""
    crossing = sorted(
        (importer, target)
        for importer, targets in graph.items()
        if _in(importer, package)
        for target in targets
        if not _in(target, package) and not any(_in(target, allowed) for allowed in ALLOWED[package])
    )
    assert not crossing, f"{package} imports above its floor: {crossing}"


@pytest.mark.parametrize("package", ["infra", "workloads", "nvrx_eks.facts"])
def test_no_import_circle_runs_through(graph, package):
    """A circle hidden by a lazy or TYPE_CHECKING import (the add-on catalog and the config model
    read each other) still forces an import order on readers and tools."""
    inside = [c for c in circles(graph) if any(_in(m, package) for m in c)]
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
