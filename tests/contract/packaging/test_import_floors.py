"""The operator package's floors, every lazy and TYPE_CHECKING import counted: a module of
nvrx_eks imports only its own part and the floors below it, and no import circle runs through it.
(test_layers.py holds the ground floor, the trainer and the CDK app to theirs.)"""

from __future__ import annotations

import pytest

from tests.support.import_graph import circles, import_graph, own_modules

#: Bottom to top. A module's part is the longest name here that prefixes it; it may import its own
#: part and anything on a lower floor, nothing beside it or above it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("nvrx_eks.facts",),
    # The trainer, the CDK app, and where the package data is.
    ("workloads", "infra", "nvrx_eks.resources"),
    ("nvrx_eks.deploy",),
    ("nvrx_eks.planning",),
    ("nvrx_eks.jobs",),
    ("nvrx_eks.data", "nvrx_eks.local"),
    ("nvrx_eks.rehearse", "nvrx_eks.ops", "nvrx_eks.bench"),
    ("nvrx_eks.cli",),
)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(own_modules())


def _part(module: str) -> str | None:
    parts = [p for floor in FLOORS for p in floor if module == p or module.startswith(p + ".")]
    return max(parts, key=len, default=None)


def _floor(part: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if part in floor)


def _operator(module: str) -> bool:
    """A module of the operator package above the ground floor (the package root is a namespace)."""
    return module.startswith("nvrx_eks.") and _part(module) != "nvrx_eks.facts"


def imports_against_the_floors(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each operator module's import beside or above its own floor."""
    wrong = []
    for module, targets in sorted(graph.items()):
        part = _part(module)
        if not _operator(module) or part is None:
            continue
        for target in sorted(targets):
            target_part = _part(target)
            if target_part is not None and target_part != part and _floor(target_part) >= _floor(part):
                wrong.append((module, target))
    return wrong


def test_every_operator_module_has_a_floor(graph):
    """A new top-level module or subpackage is placed on a floor before anything imports it."""
    homeless = sorted(m for m in graph if m.startswith("nvrx_eks.") and _part(m) is None)
    assert not homeless, f"modules on no floor (add their part to FLOORS): {homeless}"


def test_the_operator_imports_only_its_own_part_and_the_floors_below(graph):
    """jobs reached up into ops for the goodput model (a default job's interval, the job summary)
    and into data for where --data is in the pods."""
    wrong = imports_against_the_floors(graph)
    assert not wrong, f"imports beside or above the importer's floor: {wrong}"


def test_no_import_circle_runs_through_the_operator(graph):
    """jobs/spec, ops/plan and ops/plan_spares closed one, hidden by function-local imports."""
    through = [c for c in circles(graph) if any(_operator(m) for m in c)]
    assert not through, f"import circles through the operator package: {through}"


def test_the_floor_check_flags_imports_upward_and_sideways_only():
    graph = {
        "nvrx_eks.planning.model": {"nvrx_eks.jobs.spec", "nvrx_eks.deploy.node_count", "nvrx_eks.planning.spares"},
        "nvrx_eks.data.upload": {"nvrx_eks.local.runner", "nvrx_eks.jobs.data_path", "workloads.shards"},
        "nvrx_eks.cli": {"nvrx_eks.ops.plan"},
    }
    assert imports_against_the_floors(graph) == [
        ("nvrx_eks.data.upload", "nvrx_eks.local.runner"),
        ("nvrx_eks.planning.model", "nvrx_eks.jobs.spec"),
    ]
